#pragma once

#include <string>
#include <vector>

#include "harness/builder.h"
#include "harness/case_result.h"
#include "harness/case_spec.h"
#include "harness/path_run.h"

namespace gradfuzz::oracle {

/// Sets `op`, `option` and `signature` of every finding of `result`: the root-cause key a
/// campaign clusters by (fuzzer.md "Reports"), independent of the case's op set:
/// - an error: "unexpected_error|<class that raised>|<phase>|<error kind>|<message>", the
///   class from the backend's error origin ("BasicOperation.set_extra_input_channel") or the
///   op a runtime message names, the message normalised (normalize_message);
/// - no error where the reference raised one: "unexpected_error|no_error|<phase>|<kind>";
///   ops a failed construction left locked: "unexpected_error|left_locked|<phase>";
/// - a modified caller tensor: "modified_input|<op>|<options>|<role>", the op that wrote it
///   (the backend's writer, else the op owning the tensor's slot) and its non-default flags;
/// - a wrong or missing value: "<kind>|<op>|<role>": per path, the tensor where values first
///   diverge (forward tensors before backward ones; in forward the earliest op, in backward
///   the latest) gives the role, and the op is the fused op covering it in that path's plan,
///   else the nearest fused op on the side the error came from, else the basic op there (also
///   when the unfused path fails on the same tensor: not a fusion's defect); every value
///   finding of that path shares it;
/// - a plan that differs: "mismatch|<fused op of the differing plan>|plan"; a crash or time-out:
///   "<kind>|<op types>"; a sanitizer error: "sanitizer|<kernel>".
/// `runs` are the case's path runs (their repeat calls inside them), looked up by name.
/// `set_apart`: indices of findings another cause accounts for (the in-place ablation's: gone
/// with in_place=0), left out of where values first diverge, so that the other value findings
/// of their path are signed by their own first divergence (a weight gradient wrong by a
/// factor with the in-place write and by one FP8 rounding without it is the second cause's,
/// not the in-place op's tensor's); their own signatures are the caller's to set.
void assign_signatures(const harness::CaseSpec& spec, const harness::CasePlan& plan,
                       const std::vector<const harness::PathRun*>& runs, harness::CaseResult& result,
                       const std::vector<size_t>& set_apart = {});

/// The signature of a finding about the process that ran a case (crash, timeout: "<kind>|<op
/// types>"; sanitizer: "sanitizer|<kernel>", the kernel in `op`).
std::string process_signature(const harness::Finding& finding, const std::vector<std::string>& op_types);

/// `message` with what varies between cases of one cause taken out: quoted names, numbers,
/// hex ids and shapes become placeholders, whitespace is collapsed, at most 160 characters.
std::string normalize_message(const std::string& message);

/// The class part of an error origin: "BasicOperation" for "BasicOperation.set_extra_input_channel",
/// "OperationFuser" for "OperationFuser.__init__.<locals>.f"; empty for a bare function name.
std::string origin_class(const std::string& origin);

}  // namespace gradfuzz::oracle
