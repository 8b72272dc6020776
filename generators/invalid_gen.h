#pragma once

#include <rapidcheck.h>

#include <string>
#include <vector>

#include "generators/case_gen.h"
#include "harness/case_spec.h"

namespace gradfuzz::generators {

/// A configuration the runtime must reject, with the gradfuzz::Error::kind() every path must
/// raise for it (and, for construction errors, with no op left locked).
struct InvalidCase {
  harness::CaseSpec spec;
  /// "producer-not-earlier", "duplicate-producer", "missing-producer", "extra-input-count",
  /// "invalid-argument", "locked", "slot-out-of-range" or "invalid-channel-name".
  std::string expected_kind;
  /// Which mutation made it invalid, for messages ("consumer before producer at op 3").
  std::string description;
};

std::ostream& operator<<(std::ostream& os, const InvalidCase& c);

/// Every kind gen_invalid_case can promise, in the order of its mutation table.
const std::vector<std::string>& invalid_case_kinds();

/// Invalid cases: a valid gen_case(options) case with exactly one defect added, drawn
/// uniformly from: consumer before its producer (producer-not-earlier); two producers of one
/// channel (duplicate-producer); a channel across a Boundary or with no producer at all
/// (missing-producer); one public extra input too many or too few (extra-input-count);
/// public split sizes that do not sum to the rows (invalid-argument); a binding set after
/// construction (locked); a late bind of an out-of-range input slot (slot-out-of-range);
/// a late bind with an empty channel name (invalid-channel-name). Late binds address input
/// slots. validate_case(spec) reports expected_kind first.
rc::Gen<InvalidCase> gen_invalid_case(const GenOptions& options = {});

/// Deterministic driver, as generate_case.
InvalidCase generate_invalid_case(uint64_t seed, int size, const GenOptions& options = {});

}  // namespace gradfuzz::generators
