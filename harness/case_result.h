#pragma once

#include <array>
#include <cstdint>
#include <iosfwd>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace gradfuzz::harness {

/// Finding kinds of fuzzer.md "Paths and oracle", plus:
/// - kModifiedInput: a path changed a caller-owned tensor (input, extra input, cotangent);
/// - kUnsupported: the backend declined a valid case it documents as unsupported (counted,
///   not a finding);
/// - kSanitizer: compute-sanitizer reported an error while the case ran.
/// kPass is only ever a case's verdict, never a finding's kind.
enum class VerdictKind {
  kPass,
  kMismatch,
  kMissingGradient,
  kUnexpectedError,
  kCrash,
  kTimeout,
  kModifiedInput,
  kUnsupported,
  kSanitizer
};
/// "pass", "mismatch", "missing_gradient", "unexpected_error", "crash", "timeout",
/// "modified_input", "unsupported", "sanitizer".
const char* verdict_name(VerdictKind kind);
/// Inverse of verdict_name; throws std::invalid_argument listing the known names.
VerdictKind verdict_from_name(const std::string& name);

/// One failed check of a case (fuzzer.md: a case yields every finding it has): a tensor
/// outside its bound, a gradient the path did not return, a caller tensor a path wrote, an
/// error where the reference raised none (or another one), a failed construction that left
/// ops locked, a plan that differs from a fresh fuser's, a crash. Holds everything needed to
/// read it without rerunning, and the root-cause key it clusters by.
struct Finding {
  VerdictKind kind = VerdictKind::kMismatch;
  /// What was compared: "fused~reference", "unfused~reference", "fused~unfused",
  /// "fused.call[1]~reference", "fused.call[1]~fresh_plans", "reference~finite_difference",
  /// "fused~caller" (a modified caller tensor), "fused~reference" for an error of the fused
  /// path, "every path" for an outcome all paths share.
  std::string path_pair;
  /// Tensor role and name: "output", "extra_output[1]", "grad_input", "grad_param[2].Linear[0]",
  /// "grad_extra_input[0]", "grad_channel[probs]", "extra_input[1]" (modified), "error",
  /// "op[3]" (left locked), "plan[fuser 0].forward".
  std::string tensor;
  /// Role without indices or names: "output", "grad_param", "grad_channel", "input",
  /// "cotangent", "error", "no_error", "left_locked", "plan", "crash"...
  std::string role;

  /// Values: the worst element (by excess over its bound) and the tensor's errors.
  std::vector<int64_t> index;
  double expected = 0;
  double got = 0;
  double max_abs_err = 0;
  double max_rel_err = 0;
  /// The element bound: |got - expected| <= atol + rtol * |expected| (+ the element's rounding
  /// allowance, `rounding`).
  double atol = 0;
  double rtol = 0;
  /// Largest |expected| of the tensor (0 when unknown): how big a structural error there is.
  double scale = 0;
  /// The low-precision allowance at the worst element (oracle/rounding.h; 0 without one).
  double rounding = 0;
  /// Norm-wise: ||got - expected||_2 and the bound it was held to (0: not checked).
  double norm_err = 0;
  double norm_bound = 0;

  /// Errors: the path's runtime error kind ("locked"), exception type, phase ("binding",
  /// "forward"...), message, and the function that raised ("BasicOperation.set_extra_input_channel").
  std::string error_kind;
  std::string error_type;
  std::string phase;
  std::string message;
  std::string origin;

  /// Where the cause sits (oracle/signature.h): the op class that raised, the fused op (or op)
  /// nearest to where values first diverge, or the op that wrote a caller tensor; and the
  /// options of that op that matter ("in_place=1").
  std::string op;
  std::string option;
  /// What the check saw, in words ("fused error 5.2x the unfused path's", "passes in float32").
  std::string note;
  /// Root-cause key: findings with equal signatures are one cluster (oracle/signature.h).
  std::string signature;
  /// Id of the known issue the finding matches (campaign/known_issues.h); empty: new.
  std::string known;
  bool is_known() const { return !known.empty(); }
};

/// Where one path's values first leave the reference (runner::RunOptions::trace,
/// oracle/divergence.h): the first tensor outside its bound, in forward order for values
/// (earliest op first) and backward order for gradients (latest op first), among the tensors
/// at every plan group's boundary and the compared ones. Its op, role and pass are the root-cause
/// key of the path's value findings (oracle/signature.h), whichever tensor showed the error
/// downstream.
struct Divergence {
  /// The path ("fused", "unfused", "forward_fused", ...).
  std::string path;
  /// "mismatch" or "missing_gradient": what is wrong with the tensor where values diverge.
  std::string kind = "mismatch";
  /// "forward" or "backward".
  std::string pass;
  /// Spec op index and catalog type of the op whose tensor diverges.
  int64_t op_index = -1;
  std::string op;
  /// The plan group of the path that computed it ("ForwardLinearBiasAdd", "Linear") and the
  /// backend's class and method ("BasicLinear", "op_backward"; empty where unknown).
  std::string group;
  bool fused = false;
  std::string impl_class;
  std::string method;
  /// "output" (an op's main output), "grad_input" (the gradient an op returned for its main
  /// input), or a compared tensor's role ("grad_param", "extra_output", ...).
  std::string role;
  /// The tensor: "trace.forward[k]", "trace.backward[k]" or a compared tensor's name.
  std::string tensor;
  /// Its worst element's error and bound (as Finding), and the error norm against its bound.
  double max_abs_err = 0;
  double max_rel_err = 0;
  double norm_err = 0;
  double norm_bound = 0;
  bool operator==(const Divergence& o) const;
};

/// The outcome of one case: every finding, and a verdict that summarises them. A value,
/// never a bare bool.
struct CaseResult {
  /// kPass without findings; kUnsupported when the backend declined; else the kind of the
  /// most telling finding (summarize()).
  VerdictKind verdict = VerdictKind::kPass;
  std::vector<Finding> findings;
  /// What happened in words: errors per path, notes of the checks.
  std::string notes;
  uint64_t seed = 0;
  /// Catalog op types of the case, in order (Boundary excluded).
  std::vector<std::string> op_types;
  /// Backend the case ran on ("model", "te", "torch").
  std::string backend = "model";
  /// Fusion registrations that fired in the fused path's plans (either pass).
  std::vector<std::string> fusions_fired;
  /// Fused ops that ran in the fused path's forward and backward plans, by name.
  std::vector<std::string> fused_forward;
  std::vector<std::string> fused_backward;
  /// Fused ops whose values were compared (the fused path ran, and so did the reference).
  std::vector<std::string> fused_compared;
  /// Hand-written CUDA kernels the case launched: name -> {launches, launches with more
  /// than one block} (model backend on CUDA).
  std::map<std::string, std::array<int64_t, 2>> kernels;
  /// Coverage features the case exercised (fuzzer.md coverage.features names).
  std::vector<std::string> features;
  /// Low-precision bookkeeping (oracle/rounding.h): elements whose reference lies within
  /// rounding distance of a kink (their crossing's effect allowed), tensors whose bound was
  /// widened because they are a small difference of large terms.
  int64_t kink_elements = 0;
  int64_t cancellation_tensors = 0;
  /// Delayed-scaling quantizer states the backend judged by TE's rule, over the case's paths
  /// and calls (PathRun::fp8_states_checked).
  int64_t fp8_states_checked = 0;
  /// Quantized tensors the backend checked exactly (PathRun::fp8_tensors_checked).
  int64_t fp8_tensors_checked = 0;
  /// Per failing path of a traced run (runner::RunOptions::trace): where its values first
  /// diverge. Empty when the run was not traced or no value diverged.
  std::vector<Divergence> divergences;
  /// The divergence of the path `path_pair` names first ("fused" of "fused~reference"), or
  /// nullptr.
  const Divergence* divergence_of(const std::string& path_pair) const;

  bool passed() const { return verdict == VerdictKind::kPass; }
  /// A finding: neither a pass nor a case the backend declined.
  bool failed() const { return verdict != VerdictKind::kPass && verdict != VerdictKind::kUnsupported; }
  /// Sets `verdict` from the findings: pass without any; else the first kind present of
  /// crash, timeout, sanitizer, missing_gradient, unexpected_error, modified_input, mismatch.
  void summarize();
  /// The distinct signatures of the findings, in order of first appearance.
  std::vector<std::string> signatures() const;
  /// The first finding with `signature`, or nullptr.
  const Finding* finding(const std::string& signature) const;
  /// Whether some finding is not known (campaign/known_issues.h).
  bool has_new_findings() const;
};

std::ostream& operator<<(std::ostream& os, const Finding& finding);
void to_json(nlohmann::json& j, const Divergence& d);
void from_json(const nlohmann::json& j, Divergence& d);
std::ostream& operator<<(std::ostream& os, const CaseResult& result);

/// Lossless JSON form (workers send results to the supervisor this way). from_json throws
/// std::invalid_argument on an unknown verdict name and nlohmann errors on a bad shape.
void to_json(nlohmann::json& j, const Finding& f);
void from_json(const nlohmann::json& j, Finding& f);
void to_json(nlohmann::json& j, const CaseResult& result);
void from_json(const nlohmann::json& j, CaseResult& result);

}  // namespace gradfuzz::harness
