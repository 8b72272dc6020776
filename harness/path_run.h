#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace gradfuzz::harness {

/// One group of a fuser's forward or backward plan, in spec op indices.
struct PlanGroup {
  /// Fused op or basic op name ("ForwardLinearBiasAdd", "Linear").
  std::string name;
  /// Spec op index range [begin, end) the group covers.
  int64_t begin = 0;
  int64_t end = 0;
  bool fused = false;
  bool operator==(const PlanGroup& o) const {
    return name == o.name && begin == o.begin && end == o.end && fused == o.fused;
  }
};

/// The plans one fuser ran with.
struct FuserPlans {
  std::vector<PlanGroup> forward;
  std::vector<PlanGroup> backward;
};

/// The plan group during whose run a caller tensor changed ("forward" or "backward" pass).
struct Writer {
  PlanGroup group;
  std::string pass;
};

/// A tensor at one plan group's boundary (PathRequest::trace): in forward the main output the
/// group handed on, in backward the gradient it returned for its main input. The float64
/// reference traces every basic op (group [k, k+1)). The oracle compares a path's entries with
/// the reference's at the same boundary to find where values first diverge (oracle/divergence.h).
struct TraceEntry {
  /// "forward" or "backward".
  std::string pass;
  int64_t fuser = 0;
  /// The group, in spec op indices.
  PlanGroup group;
  /// The implementation that computed the tensor: the backend's class ("BasicLinear",
  /// "ForwardLinearBiasActivation") and method ("op_backward", "fuser_forward").
  std::string impl_class;
  std::string method;
  /// Undefined where the group returned none (an input that needs no gradient).
  at::Tensor tensor;
  /// The group produced a quantized tensor, sent dequantized.
  bool quantized = false;
  /// The extra tensors of the group's ops: in forward each op's extra outputs, in backward the
  /// gradient each op returned for each of its extra inputs (bound or public).
  struct Extra {
    /// Spec op index and the op's slot.
    int64_t op = 0;
    int64_t slot = 0;
    at::Tensor tensor;
    bool quantized = false;
  };
  std::vector<Extra> extras;
};

/// How a path ended.
enum class PathStatus {
  kOk,
  /// The backend raised (error_* say what).
  kError,
  /// The backend declined a valid case it documents as unsupported (reason in error_message).
  kUnsupported,
  /// Not run: it would have repeated the previous path (no fused op ran there).
  kSkipped,
};

/// Everything one path of a backend produced, in float64-comparable form, or the error it
/// raised. Tensors may live on any device and dtype; the oracle widens them.
struct PathRun {
  std::string name;
  PathStatus status = PathStatus::kOk;
  bool ok() const { return status == PathStatus::kOk; }
  /// Runtime error kind (ops/errors.h kinds; "unrecognized", "c10-error", "std-exception").
  std::string error_kind;
  std::string error_message;
  /// "op creation", "call-then-bind call", "binding", "Sequential construction",
  /// "late binding", "forward", "backward".
  std::string error_stage;
  /// Python exception type (remote backends), empty otherwise.
  std::string error_type;
  /// The function that raised, as "Class.method" (remote backends: the innermost frame in the
  /// code under test), empty when unknown.
  std::string error_origin;
  /// Spec op indices that a failed construction left locked.
  std::vector<int64_t> left_locked;
  /// Delayed scaling's quantizer states the backend judged after this call by the rule TE
  /// documents (adapter fp8_state.py), and what broke it.
  struct Fp8StateViolation {
    int64_t op = -1;
    /// "input[0]", "weight[1]", "grad_output[0]": the quantizer's role and group.
    std::string quantizer;
    /// "update" (an amax left unconsumed), "rule", "amax", "checkpoint", "history".
    std::string what;
    std::string note;
  };
  int64_t fp8_states_checked = 0;
  /// Quantized tensors whose representation the backend checked exactly (issue 26 item 2:
  /// FP8 codes, column-wise copy, dequantize); their violations are in fp8_state_violations.
  int64_t fp8_tensors_checked = 0;
  std::vector<Fp8StateViolation> fp8_state_violations;
  /// An evaluation pass (a no_grad or inference_mode repeat call): the outputs, by index
  /// (0 the main output), that carry an autograd graph (requires_grad or a grad_fn).
  std::vector<int64_t> graph_outputs;

  /// Main output, then the public extra outputs.
  std::vector<at::Tensor> outputs;
  at::Tensor grad_input;
  /// Per spec op, per parameter (the model's layout).
  std::vector<std::vector<at::Tensor>> grad_params;
  /// Per passed extra input.
  std::vector<at::Tensor> grad_extra_inputs;
  /// Per fuser: channel name -> total gradient that reached the producer's slot.
  std::vector<std::map<std::string, at::Tensor>> channel_grads;
  /// Per fuser: the groups each pass ran.
  std::vector<FuserPlans> plans;
  /// Caller-owned tensors whose values changed while the path ran ("input",
  /// "extra_input[1]", "cotangent[0]").
  std::vector<std::string> modified;
  /// For some of `modified`: the group that wrote it (where the backend can tell).
  std::map<std::string, Writer> modified_by;
  /// One per CaseSpec::repeat_calls entry, named "<path>.call[k]" (k from 1: the first call
  /// is this run): what that call of the same Sequential gave (no channel gradients), with
  /// `expected_plans` set to the plans a fresh Sequential builds for the same call.
  std::vector<PathRun> repeats;
  /// Repeat runs only: per fuser, the plans computed afresh (runtime.md section 5, no
  /// cache) for this call's first_op_requiring_backward (empty when the path has no fusions).
  std::vector<FuserPlans> expected_plans;
  /// With PathRequest::trace: the first call's tensors at every plan group's boundary, in the
  /// order they were computed (forward groups, then backward groups).
  std::vector<TraceEntry> trace;
  /// A distributed case (harness/sharding.h): what each rank's run of this path gave, its own
  /// slices of the tensors, rank 0 first. The path's tensors above are then assembled from
  /// them: the unsharded tensors the reference computes.
  std::vector<PathRun> ranks;
};

/// How a backend names the writer of a changed caller tensor (PathRun::modified_by).
enum class WriterSearch {
  /// Watching the path's own first call (the default): a comparison of the caller's tensors
  /// per plan group of every path.
  kDuringRun,
  /// Running the path a second time, watched, where a caller tensor changed: a path's time
  /// again, only then.
  kRerun,
  /// Not at all (the in-place ablation's rerun reads only its findings' kinds and tensors).
  kNone,
};

/// How a backend plans the repeat calls' expected plans (PathRun::expected_plans).
enum class ExpectedPlans {
  /// One fresh Sequential per requires-grad pattern, the path's own first call serving for
  /// its pattern (it is a fresh Sequential's first call); the default.
  kPerPattern,
  /// One fresh Sequential per repeat call (the earlier way).
  kPerCall,
  /// None: expected_plans stays empty, so no plan is checked.
  kNone,
};

/// "fused", "unfused", "forward_fused", "backward_fused": which fusions a path enables.
struct PathRequest {
  std::string name;
  std::vector<std::string> fusions;
  /// Skip when the first path ran without error and no fused op ran in it (this path would
  /// repeat it).
  bool skip_if_nothing_fused = false;
  WriterSearch writers = WriterSearch::kDuringRun;
  ExpectedPlans expected_plans = ExpectedPlans::kPerPattern;
  /// Non-empty: skip unless the first path ran without error and its plans hold, for each
  /// list, a fused group named in it (the single-pass paths, sent in the case's one request).
  std::vector<std::vector<std::string>> only_if_fired = {};
  /// Record the first call's trace (PathRun::trace): what localises a failure, asked for by
  /// the runs that look for a finding's first divergence (RunOptions::trace).
  bool trace = false;
};

/// Whether a request's only_if_fired condition holds for `first`, the first path's run.
bool fired_each_of(const PathRun& first, const std::vector<std::vector<std::string>>& lists);

/// Whether any group of any pass of `run` (or of its repeat calls) is a fused op.
bool any_fused(const PathRun& run);

/// Describes an error path: "<name> raised <kind> during <stage>: <message>".
std::string describe_error(const PathRun& run);

/// Runs `body`, which sets run.error_stage before each step. A runtime error (gradfuzz::Error,
/// c10::Error, other std::exception) becomes the run's error (status kError, kind, message,
/// the stage it happened in); std::logic_error (an internal assertion) propagates. On success
/// the status is kOk and the stage cleared.
void run_guarded(PathRun& run, const std::function<void()>& body);

}  // namespace gradfuzz::harness
