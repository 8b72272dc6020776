#pragma once

#include <cstdint>
#include <iosfwd>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "ops/op_registry.h"

namespace gradfuzz::harness {

/// Name of the plain module that splits a Sequential into several fusers.
inline constexpr const char* kBoundaryOp = "Boundary";

/// Binding of one extra output slot in a case.
struct OutputBindingSpec {
  std::optional<std::string> channel;
  bool output_to_caller = true;
  bool operator==(const OutputBindingSpec& o) const {
    return channel == o.channel && output_to_caller == o.output_to_caller;
  }
};

/// One module of the case's Sequential: a catalog op or the Boundary plain module.
/// Feature sizes of an op's input are not stored: they follow from the shapes before it,
/// so removing an op while shrinking leaves a case that still describes a whole chain.
struct OpSpec {
  std::string name;
  /// Construction options (ops::OpAttrs keys); absent keys take the catalog default.
  ops::OpAttrs attrs;
  /// Per extra input slot: the bound channel, or nullopt for a public slot. Shorter than
  /// the op's slot count means the remaining slots are public.
  std::vector<std::optional<std::string>> input_channels;
  /// Per extra output slot; shorter means unbound (public) for the rest.
  std::vector<OutputBindingSpec> output_bindings;
  ops::OutputStyle output_style = ops::OutputStyle::kVector;
  /// Per parameter: requires_grad. Shorter means true for the rest.
  std::vector<bool> param_requires_grad;
  /// Per extra input slot (meaningful for public floating slots): requires_grad. Shorter
  /// means true for the rest.
  std::vector<bool> extra_input_requires_grad;

  bool operator==(const OpSpec& o) const;
};

/// An op called standalone before it is bound and placed in the Sequential.
struct CallThenBindStep {
  int64_t op = 0;
  bool grad_mode = true;
  bool operator==(const CallThenBindStep& o) const { return op == o.op && grad_mode == o.grad_mode; }
};

/// Invalid-configuration step: set a binding after the Sequential was built (must raise
/// the locked error).
struct LateBindStep {
  int64_t op = 0;
  int64_t slot = 0;
  std::string channel;
  bool operator==(const LateBindStep& o) const { return op == o.op && slot == o.slot && channel == o.channel; }
};

/// A further call of the built Sequential after the first forward and backward, with the
/// same values (input, extra inputs, parameters, cotangents): the same fusers and locked ops
/// must give the same outputs and gradients, and plans equal to those a fresh Sequential
/// builds for this call's requires-grad pattern (runtime.md sections 4 and 5: plans are
/// rebuilt when first_op_requiring_backward changes).
struct RepeatCall {
  /// Forward only, with grad mode off (first_op_requiring_backward = n).
  bool no_grad = false;
  /// Whether the main input requires grad in this call.
  bool input_requires_grad = true;

  // What a training loop does around this call (issue "usage surface", the per-case script
  // of steps; docs/BACKENDS.md "Steps"). Each is false in every case written before them.
  /// Before the call, an optimizer step: every parameter written in place (under no_grad)
  /// with the step's values (harness::step_params: the previous values rolled by one
  /// element and halved), which every cache of a weight must follow.
  bool update = false;
  /// With no_grad: the evaluation pass under torch.inference_mode rather than no_grad.
  bool inference_mode = false;
  /// Before the call (after its update), a checkpoint round trip: the ops' state saved,
  /// fresh ops made (their parameters scrambled) and the state loaded into them, the
  /// Sequential rebuilt; the run goes on exactly as the uninterrupted one.
  bool checkpoint = false;
  /// The forward under activation recompute (torch.utils.checkpoint, non-reentrant): the
  /// backward runs the forward again. Not with no_grad.
  bool recompute = false;
  /// Before the call, the same op objects put into a second Sequential (a fuser of their
  /// own), which runs this call and the ones after it.
  bool second_sequential = false;
  /// The call runs with the case's recipe disabled (TE: autocast(enabled=False)), in high
  /// precision; it must leave every quantizer's state (delayed scaling's scale and amax
  /// history) as it found it, and the calls after it run under the recipe again. Needs a
  /// recipe.
  bool recipe_off = false;
  /// From this call on, DelayedScaling's amax_history_len is this (0: unchanged): each
  /// history keeps its first slots or is padded with zeros at its end, the scale kept
  /// (op.py: BasicOperation.reset_recipe_state). Needs a DelayedScaling recipe.
  int64_t amax_history_len = 0;

  /// Whether the call changes the recipe (coverage.usage "recipe_change").
  bool changes_recipe() const { return recipe_off || amax_history_len > 0; }
  /// Whether the call does anything beyond a plain repeat call.
  bool uses_steps() const {
    return update || inference_mode || checkpoint || recompute || second_sequential || changes_recipe();
  }
  bool operator==(const RepeatCall& o) const {
    return no_grad == o.no_grad && input_requires_grad == o.input_requires_grad && update == o.update &&
           inference_mode == o.inference_mode && checkpoint == o.checkpoint && recompute == o.recompute &&
           second_sequential == o.second_sequential && recipe_off == o.recipe_off &&
           amax_history_len == o.amax_history_len;
  }
};

/// A quantization recipe every path of the case runs under (docs/BACKENDS.md "Recipes"):
/// TE's recipe class name ("DelayedScaling", "Float8CurrentScaling", "Float8BlockScaling",
/// "MXFP8BlockScaling", "NVFP4BlockScaling"), its fp8_format ("E4M3", "HYBRID") and its
/// documented options as the backend's capabilities name them, values as strings.
struct RecipeSpec {
  std::string name;
  std::string fp8_format = "E4M3";
  std::map<std::string, std::string> options;
  bool operator==(const RecipeSpec& o) const {
    return name == o.name && fp8_format == o.fp8_format && options == o.options;
  }
};

/// Everything that describes one test case, independent of any generator (fuzzer.md "Case").
struct CaseSpec {
  std::vector<OpSpec> ops;
  /// Enabled fusion registrations (names of ops::FusionRegistry::catalog()).
  std::vector<std::string> fusions;
  std::vector<CallThenBindStep> call_then_bind;
  bool input_requires_grad = true;
  /// Main input shape [rows, features].
  std::vector<int64_t> input_shape{4, 8};
  std::string dtype = "float64";  // float64 | float32 | bfloat16 | float16
  std::string device = "cpu";     // cpu | cuda
  /// Seed of every tensor value (inputs, parameters, cotangents).
  uint64_t seed = 0;
  /// Calls after the first (empty: one call, as most cases).
  std::vector<RepeatCall> repeat_calls;
  /// The quantization recipe (nullopt: none, the paths run in `dtype`).
  std::optional<RecipeSpec> recipe;
  /// The caller holds every call's outputs and reads them again after the call's backward
  /// and after the case's later calls (nothing may change them unless documented).
  bool read_after_backward = false;
  /// Every op is built without storage (device "meta", as deferred initialisation does) and
  /// materialised on the case's device before its values are copied in: the case must run
  /// as the one built directly.
  bool deferred_init = false;
  /// Each run of ops between Boundary modules is a Sequential of its own, the Sequentials
  /// and Boundaries called one after another in one autocast (the case must hold a
  /// Boundary): the same results and quantization states as the one Sequential.
  bool several_sequentials = false;
  /// Every Linear's weight built as a quantized tensor of the case's recipe (TE:
  /// quantized_model_init around the op's construction), written through it at every
  /// optimizer step; the weight's quantizer derives its scale from the weight itself, so
  /// the results are the recipe's as before. Needs a recipe other than DelayedScaling.
  bool quantized_params = false;
  /// With quantized_params: the caller holds every quantized weight and reads it after each
  /// call: dequantize() within one FP8 step of the values last written (it follows every
  /// optimizer step), carrying autograd, its shape, and its column-wise copy the row-wise
  /// one's transpose.
  bool held_quantized_tensor = false;
  /// Ranks the case runs on (harness/sharding.h): 1 is one process, as every case before
  /// distributed cases; N > 1 runs the same Sequential on N processes, each on its slice of
  /// the same values. At most kMaxWorldSize.
  int64_t world_size = 1;
  /// How the main input lies on the ranks: "replicated" (every rank holds all of it), "rows"
  /// (rank r holds the r-th of N equal row slices: sequence parallelism) or "features" (the
  /// r-th feature slice: tensor parallelism). Meaningless on one rank.
  std::string input_layout = "replicated";

  // Invalid-configuration knobs (the invalid generator sets them; valid cases leave them).
  /// Added to the number of public extra inputs passed (surplus > 0, shortfall < 0).
  int64_t extra_input_count_delta = 0;
  /// Public split-size inputs are drawn so that they do not sum to the rows.
  bool corrupt_split_sizes = false;
  std::vector<LateBindStep> late_binds;

  bool operator==(const CaseSpec& o) const;
  bool operator!=(const CaseSpec& o) const { return !(*this == o); }
  /// The usage elements the case's script of steps uses, by capability name (capabilities.h:
  /// BackendCapabilities::usage), each once, in a fixed order.
  std::vector<std::string> usage_elements() const;
  /// The report's coverage.usage names the case counts in (fuzzer.md "Coverage"):
  /// "training_steps" (an optimizer step between calls), "eval_pass" (a no_grad call),
  /// "inference_mode", "checkpoint_roundtrip", "recompute", "read_after_backward",
  /// "op_in_two_fusers", "deferred_init", "recipe_change", "several_sequentials",
  /// "quantized_params", "held_quantized_tensor".
  std::vector<std::string> usage_coverage() const;
  /// The case without any element of its usage script (the shrinker's first try).
  void clear_usage();
  /// Drops each usage element whose need the case does not meet (case files with them are
  /// refused at load): several_sequentials without a Boundary, quantized_params without a
  /// Linear or a recipe other than DelayedScaling, held_quantized_tensor without
  /// quantized_params, recipe_off without a recipe or with quantized_params (its weights
  /// keep no high-precision values; nor under backward_override high_precision),
  /// amax_history_len without DelayedScaling.
  void drop_unmet_usage();
  /// Number of catalog ops (Boundary modules not counted).
  int64_t num_ops() const;
};

std::ostream& operator<<(std::ostream& os, const CaseSpec& spec);

/// Every coverage.usage name (CaseSpec::usage_coverage), in the report's order.
const std::vector<std::string>& usage_coverage_names();

void to_json(nlohmann::json& j, const CaseSpec& spec);
/// Throws SpecError naming the JSON path of the first problem ("/ops/2/name").
void from_json(const nlohmann::json& j, CaseSpec& spec);

/// A case or case file that cannot be used: bad JSON shape, unknown op, inconsistent bindings.
class SpecError : public std::runtime_error {
 public:
  SpecError(std::string json_path, const std::string& message)
      : std::runtime_error(json_path + ": " + message), json_path_(std::move(json_path)) {}
  const std::string& json_path() const { return json_path_; }

 private:
  std::string json_path_;
};

/// Largest world_size a case may have (what one host's GPUs and a CPU's processes reach).
inline constexpr int64_t kMaxWorldSize = 64;
/// The values of CaseSpec::input_layout.
bool is_known_input_layout(const std::string& layout);
/// Whether the case runs as ranks: world_size > 1, or a collective or a tensor-parallel
/// option in its ops (te.ops needs a process group for those even on one rank).
bool is_distributed(const CaseSpec& spec);

/// Whether `dtype` is one of float64, float32, bfloat16, float16.
bool is_known_dtype(const std::string& dtype);
/// Whether `device` is cpu or cuda.
bool is_known_device(const std::string& device);

/// A wiring problem visible from the spec alone, without building any op.
struct SpecProblem {
  /// JSON path inside the spec ("/ops/3/input_channels/0").
  std::string json_path;
  /// The gradfuzz error kind the runtime is expected to raise ("missing-producer").
  std::string kind;
  std::string message;
};

/// First static wiring problem of `spec` in fuser order: a channel produced twice in one
/// fuser (duplicate-producer), a bound input whose channel no op of the same fuser produces
/// (missing-producer) or whose producer is not earlier (producer-not-earlier). Slot counts
/// and shapes are not checked (they need the ops). Intentionally invalid cases have one.
std::optional<SpecProblem> check_static_wiring(const CaseSpec& spec);

}  // namespace gradfuzz::harness
