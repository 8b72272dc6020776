#pragma once

#include <cstdint>
#include <string>

#include "harness/case_spec.h"

namespace gradfuzz::harness {

/// What one case may ask for. A case file past these is malformed (exit 2), never an
/// allocation of tens of GB or an endless loop; generated cases stay far inside them.
struct CaseLimits {
  /// Modules (catalog ops and Boundary) in a case.
  int64_t max_ops = 256;
  /// Any single dimension (rows, features, an op's `out`, `groups`).
  int64_t max_dim = int64_t{1} << 20;
  /// Elements of any one tensor (input, outputs, extra slots, parameters): 1 GiB in float32.
  int64_t max_tensor_elements = int64_t{1} << 28;
  /// Elements of all of a case's tensors together (activations and parameters once).
  int64_t max_case_elements = int64_t{1} << 30;
  /// GroupedLinear and Dispatch groups.
  int64_t max_groups = 1024;
  /// |extra_input_count_delta| (surplus or missing public extra inputs).
  int64_t max_extra_input_count_delta = 64;
  /// call_then_bind and late_binds steps.
  int64_t max_steps = 256;
  /// repeat_calls (each is another forward and backward of every path).
  int64_t max_repeat_calls = 16;
  /// Nesting of a case file's JSON (a case file nests about 6 deep).
  int64_t max_json_depth = 64;
};

/// Checks `spec` against `limits` from its JSON-level values and the ops' signatures
/// (shapes and parameter shapes; nothing is allocated). Throws SpecError naming the JSON
/// path of the first value past a limit ("/input_shape/0", "/ops/3/attrs/out", "/ops/3":
/// a tensor of that op). Attrs that do not fit their op are not a limit matter: those
/// raise in every path like any invalid configuration.
void check_case_limits(const CaseSpec& spec, const CaseLimits& limits = {});

/// Deepest nesting of arrays and objects in `text` (strings skipped), without parsing it:
/// a parser's recursion on a 60000-deep document would exhaust the stack first.
int64_t json_nesting_depth(const std::string& text);

}  // namespace gradfuzz::harness
