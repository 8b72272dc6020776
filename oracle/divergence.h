#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "harness/builder.h"
#include "harness/case_result.h"
#include "harness/case_spec.h"
#include "harness/path_run.h"
#include "oracle/oracle.h"

namespace gradfuzz::oracle {

/// Where a tensor is computed: the pass and the spec op index. In forward an op's outputs, in
/// backward the gradients an op's backward returns (of its input, parameters, extra inputs).
struct TensorPosition {
  bool forward = true;
  int64_t op = 0;
};

/// The number in brackets after `prefix` at the start of tensor name `s` ("grad_param[12].Linear[0]"
/// -> 12 for "grad_param["), or -1 where `s` does not start so or holds no number there.
int64_t index_in(const std::string& s, const std::string& prefix);

/// The index of `spec`'s last op (0 for a case without ops).
int64_t last_op(const harness::CaseSpec& spec);

/// Where compared tensor `tensor` ("output", "grad_param[2].Linear[0]", "grad_channel[c]",
/// "trace.backward[3]") is computed in `spec` (a channel's gradient at its producer, an extra
/// input's at its consumer, the main output at the last op); nullopt for a name that is
/// neither (errors, caller tensors, plans).
std::optional<TensorPosition> tensor_position(const std::string& tensor, const harness::CaseSpec& spec,
                                              const harness::CasePlan& plan);

/// Where the values of `run` first leave `reference` (a traced reference run: every basic op's
/// output and input gradient): among the path's trace entries outside their bound (`bounds`,
/// which name them as trace_name does; quantized entries are not compared, the reference holds
/// their values before the cast) and its value findings against the reference (`findings`:
/// mismatches and missing gradients of "<run>~reference"), the first in forward order (earliest
/// op) and then backward order (latest op); at one op a compared tensor comes before a trace
/// entry (so a weight gradient keeps its role where the op's input gradient is wrong too).
/// nullopt when nothing of the path diverges.
std::optional<harness::Divergence> first_divergence(const harness::CaseSpec& spec, const harness::CasePlan& plan,
                                                    const harness::PathRun& reference, const harness::PathRun& run,
                                                    const CaseBounds& bounds,
                                                    const std::vector<harness::Finding>& findings);

}  // namespace gradfuzz::oracle
