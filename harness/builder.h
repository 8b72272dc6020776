#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <c10/core/TensorOptions.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "harness/case_spec.h"
#include "ops/fusion_registry.h"
#include "ops/op_registry.h"
#include "ops/sequential.h"

namespace gradfuzz::harness {

/// Static description of one module of a case (no op is built for it).
struct OpPlan {
  bool boundary = false;
  /// Fuser index (fusers are the runs of catalog ops between Boundary modules); -1 for Boundary.
  int64_t fuser = -1;
  /// Index among catalog ops (the reference's grad_params index); -1 for Boundary.
  int64_t ordinal = -1;
  std::vector<int64_t> input_shape;
  /// For Boundary: output_shape = input_shape and no slots.
  ops::OpSignature signature;
};

/// A public extra input or output slot, in the order the Sequential takes or returns them.
struct PublicSlot {
  int64_t op = 0;  // spec op index
  int64_t slot = 0;
  ops::SlotSpec slot_spec;
  /// Inputs: the tensor passed requires grad (floating slots only, per spec). Outputs: unused.
  bool requires_grad = false;
};

/// Shapes, slot kinds and public slot orders of a case, from the ops' signatures.
struct CasePlan {
  std::vector<OpPlan> ops;
  std::vector<int64_t> output_shape;
  std::vector<PublicSlot> public_inputs;
  std::vector<PublicSlot> public_outputs;
  int64_t num_fusers = 0;
  /// Longest sum any op computes (largest row or feature count seen), for tolerances.
  int64_t max_reduction_length = 1;
};

/// Propagates shapes through OpRegistry::signature. Throws what signature() throws
/// (InvalidArgumentError when the attrs do not fit the shape, UnknownNameError...).
CasePlan plan_case(const CaseSpec& spec);

/// Inputs of one call-then-bind step: all of the op's slots are public at that time.
struct CallInputs {
  at::Tensor input;
  std::vector<at::Tensor> extra_inputs;
};

/// Every tensor value of a case, drawn in float64 on the CPU from one generator in a fixed
/// order (input, parameters in op order, public extra inputs, surplus extra inputs,
/// cotangents, call-then-bind inputs) and rounded to the case dtype (cast there and back),
/// so that the fused, unfused and reference paths see identical values.
struct CaseTensors {
  at::Tensor input;
  /// Per spec op (empty for Boundary), per parameter.
  std::vector<std::vector<at::Tensor>> params;
  /// Per spec op, per parameter: requires_grad.
  std::vector<std::vector<bool>> param_requires_grad;
  /// What Sequential::forward receives (extra_input_count_delta applied): float64 or int64.
  std::vector<at::Tensor> extra_inputs;
  /// Per passed extra input: requires_grad.
  std::vector<bool> extra_input_requires_grad;
  /// Main output first, then one per public extra output; undefined for integer outputs.
  std::vector<at::Tensor> cotangents;
  /// Per call_then_bind step.
  std::vector<CallInputs> call_inputs;
  /// Per repeat call: the parameters it runs with where it or an earlier call updates them
  /// (RepeatCall::update; step_params), else empty (the first call's `params`).
  std::vector<std::vector<std::vector<at::Tensor>>> step_params;

  /// The parameters repeat call `k` runs with (its step's, or the first call's).
  const std::vector<std::vector<at::Tensor>>& params_of_call(size_t k) const;
  /// These values as repeat call `k` sees them (its parameters in `params`).
  CaseTensors for_call(size_t k) const;
};

/// An optimizer step's parameters from `previous` (one parameter tensor), in `dtype`: the
/// values rolled by one element in their flattened order and halved. Every element moves (a
/// cache of the old values gives other outputs); magnitudes shrink, so the first call's
/// rounding allowances still cover the call; every amax halves (delayed scaling's histories
/// and scales move with the steps). Exact in every dtype short of underflow.
at::Tensor step_param(const at::Tensor& previous, at::ScalarType dtype);

/// Parameter shapes of built ops: per spec op (empty for Boundary), per parameter.
using ParamShapes = std::vector<std::vector<std::vector<int64_t>>>;
ParamShapes param_shapes(const std::vector<ops::BasicOpPtr>& ops);

/// Draws every tensor of `spec` from `generator` (a CPU generator seeded with spec.seed);
/// the generator is left positioned after the last draw so callers may continue from it.
CaseTensors draw_case_tensors(const CaseSpec& spec, const CasePlan& plan, const ParamShapes& shapes,
                              at::Generator& generator);

/// Copies `tensors` to `options` (always a new tensor, never an alias), with the given
/// requires_grad for floating tensors; integer tensors only change device.
std::vector<at::Tensor> to_path(const std::vector<at::Tensor>& tensors, const std::vector<bool>& requires_grad,
                                const at::TensorOptions& options);

/// How one path is built.
struct BuildOptions {
  at::ScalarType dtype = at::kDouble;
  at::Device device = at::kCPU;
  ops::FusionRegistry fusions;
  /// Run the spec's call-then-bind steps (the reference path does not).
  bool call_then_bind = true;
};

/// Where a build stopped (for messages and for the lock check after a failed construction).
enum class BuildStage { kCreate, kCallThenBind, kBind, kConstruct, kLateBind, kDone };
const char* build_stage_name(BuildStage stage);

/// One path's modules and Sequential, filled step by step so a failure leaves what was built.
struct BuiltCase {
  /// Per spec op; nullptr for Boundary.
  std::vector<ops::BasicOpPtr> ops;
  std::vector<ops::Module> modules;
  std::shared_ptr<ops::Sequential> sequential;
  BuildStage stage = BuildStage::kCreate;
  /// Per spec op: whether it was locked right before the Sequential was constructed.
  std::vector<bool> locked_before_construct;
};

/// Creates the ops of `spec` for `options` (parameters of the right dtype and device, values
/// from `tensors` when given, requires_grad per spec, output style), without binding them.
/// Throws what OpRegistry::create throws.
void create_ops(const CaseSpec& spec, const CasePlan& plan, const CaseTensors* tensors, const BuildOptions& options,
                BuiltCase& out);

/// Runs the remaining build steps on ops made by create_ops: call-then-bind calls (standalone,
/// before binding, grad mode as the step says), bindings, Sequential construction, late
/// binds. Throws whatever the runtime raises; `out.stage` says where it stopped.
void build_case(const CaseSpec& spec, const CasePlan& plan, const CaseTensors& tensors, const BuildOptions& options,
                BuiltCase& out);

}  // namespace gradfuzz::harness
