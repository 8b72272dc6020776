#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "harness/case_spec.h"

namespace gradfuzz::generators {

/// Limits of one shrink run.
struct ShrinkOptions {
  /// Stop after this many predicate calls (the result is then not known to be minimal).
  int64_t max_predicate_calls = 2000;
  /// Skip candidates that fail validate_case(). Only applied when the failing case itself
  /// is valid: an invalid case (an expected-error case) is shrunk by the predicate alone.
  bool require_valid = true;

  /// Fluent setters, one per field.
  ShrinkOptions& set_max_predicate_calls(int64_t v) {
    max_predicate_calls = v;
    return *this;
  }
  ShrinkOptions& set_require_valid(bool v) {
    require_valid = v;
    return *this;
  }
};

/// Outcome of shrink().
struct ShrinkResult {
  /// The smallest failing case found (the input itself when nothing smaller fails).
  harness::CaseSpec minimal;
  /// Accepted shrink steps.
  int64_t steps = 0;
  int64_t predicate_calls = 0;
  /// True when every candidate of `minimal` was tried and none still fails.
  bool locally_minimal = false;
};

/// One-step simplifications of `spec`, in the order shrink() tries them, each canonical and
/// different from `spec`: remove one module (unbinding consumers of the channels it
/// produced, dropping call-then-bind steps and late binds that point at it, renumbering the
/// rest; when that leaves a binding whose slots no longer match, also a variant with those
/// bindings unbound), remove one fusion, remove one call-then-bind step, remove one repeat
/// call, remove one input binding, remove one output binding (its consumers unbound), halve
/// rows / features /
/// Linear out / GroupedLinear out / every op's groups at once / one op's groups, set one
/// op's output style to vector, reset the main input's and each op's requires-grad flags.
/// Candidates may be statically invalid; shrink() filters them.
std::vector<harness::CaseSpec> shrink_candidates(const harness::CaseSpec& spec);

/// `spec` without op `index` (its channels' consumers unbound, steps that name it dropped, and
/// where the shapes then break a binding, those bindings unbound), canonical; nullopt when no
/// such case is valid (a confirmation's "each op removed where the case stays valid").
std::optional<harness::CaseSpec> without_op(const harness::CaseSpec& spec, int64_t index);

/// Greedy shrink on the CaseSpec: repeatedly replaces the case by the first candidate (in
/// shrink_candidates order, resuming after the last accepted one) for which `still_fails`
/// is true, until a full round of candidates passes or the call cap is reached. Candidates
/// that are statically invalid (see ShrinkOptions::require_valid) are skipped without a
/// predicate call. Deterministic for a deterministic predicate. `failing` itself is not
/// re-checked.
ShrinkResult shrink(const harness::CaseSpec& failing, const std::function<bool(const harness::CaseSpec&)>& still_fails,
                    const ShrinkOptions& options = {});

}  // namespace gradfuzz::generators
