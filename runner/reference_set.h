#pragma once

// The float64 reference of a case (fuzzer.md "Paths and oracle"): the catalog's reference
// math under plain autograd, on the CPU (or a big CUDA case's GPU), over the case's drawn
// values; in another compute dtype, the rounding baseline. A reference set is the reference
// for one set of quantization points (runner/quantization_points.h) with its calls' references:
// every such evaluation of run_case goes through ReferenceSet::evaluate.

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "harness/builder.h"
#include "harness/capabilities.h"
#include "harness/case_spec.h"
#include "harness/path_run.h"
#include "ops/quantization.h"
#include "ops/reference.h"

namespace gradfuzz::runner {

/// A case's plan, drawn values and float64 reference ops (holding those values), exactly as
/// run_case makes them.
struct PreparedCase {
  harness::CasePlan plan;
  harness::CaseTensors tensors;
  harness::BuiltCase reference_ops;
  /// The case's generator, positioned after the last value drawn (finite differences go on
  /// drawing from it).
  at::Generator generator;
};
/// Throws what plan_case and create_ops throw (gradfuzz::Error for an op that cannot be
/// made for its shape: every path's error).
PreparedCase prepare_case(const harness::CaseSpec& spec);

/// What the float64 reference does with `spec`: nullopt when it runs, else the error kind
/// it raises (building or running).
std::optional<std::string> reference_error_kind(const harness::CaseSpec& spec);

/// Whether an evaluation records its trace: each basic op's tensors, forward and backward,
/// as a group of its own (PathRun::trace; the reference's side of a traced path).
enum class Trace { kOff, kOn };

/// What every reference evaluation of one case shares: the case and its prepared values
/// (both outlive every ReferenceSet of it), where the reference computes, how it quantizes.
struct ReferenceCase {
  const harness::CaseSpec* spec = nullptr;
  const PreparedCase* prepared = nullptr;
  at::Device device = at::kCPU;
  /// The case's recipe, parsed (ops/quantization.h).
  std::optional<ops::QuantRecipe> recipe;
  /// Whether an evaluation quantizes: a recipe, or an activation caching its input in FP8.
  bool quantizes = false;
  /// The backend's FP8 GEMM accumulation under the recipe (nullopt: exact GEMMs).
  std::optional<ops::Fp8GemmAccumulation> accumulation;
  /// RunOptions::trace where the case can be traced: its references record their trace.
  Trace trace = Trace::kOff;
};
/// run_case's reference of `spec` as `prepared`: on the CPU unless the case runs on CUDA and
/// is big; the accumulation of `caps` (fp8_gemm_accumulation) under `recipe`.
ReferenceCase reference_case(const harness::CaseSpec& spec, const PreparedCase& prepared,
                             std::optional<ops::QuantRecipe> recipe, const harness::BackendCapabilities& caps,
                             Trace trace);

/// Per quantization of an evaluation, in order: the float64 reference's scaled values and how
/// far from them an element may round (EvidenceSampler's FP8 windows; empty: every element).
struct Fp8Windows {
  std::vector<at::Tensor> windows;
  std::vector<at::Tensor> reference;
};

/// How one evaluation quantizes, with a state of its own (each evaluation moves delayed
/// scaling's histories); nothing for a case that quantizes nothing.
struct Quantization {
  /// Each quantized element moved by one FP8 value with probability 1/2, drawn from
  /// `jitter`: with `windows`, only the elements within their window; where the backend's
  /// GEMMs accumulate inexactly, each GEMM also off by its accumulation term, up or down.
  at::Generator* jitter = nullptr;
  const Fp8Windows* windows = nullptr;
  /// Receives every quantization's scaled values, in order.
  std::vector<at::Tensor>* record = nullptr;
  /// Without `jitter`: what every FP8 GEMM gives (up or down by its accumulation term).
  ops::AccumulationMode accumulation = ops::AccumulationMode::kExact;
};

/// Every op's results, forward and backward, rounded once more by a relative `relative`
/// drawn from `generator` (ReferenceEvaluator::set_output_noise); none by default.
struct Noise {
  double relative = 0;
  at::Generator* generator = nullptr;
};

/// The float64 reference of a case's paths with one set of quantization points (the basic
/// ops': empty), its calls' references and what it evaluates for the low-precision evidence.
class ReferenceSet {
 public:
  /// A set of `reference_case` (which must outlive it); nothing evaluated yet.
  explicit ReferenceSet(const ReferenceCase& reference_case, ops::QuantizationPoints points = {});
  ReferenceSet(const ReferenceSet&) = delete;
  ReferenceSet& operator=(const ReferenceSet&) = delete;

  /// The basic ops' set: its references on `prepared_ops` (the case's prepared ops, which
  /// finite differences go on using): the first call's (kinks recorded), under delayed
  /// scaling each repeat call's on the quantization state the calls before it left, and
  /// the first call with the input requiring grad where a repeat call takes the input's
  /// gradient and the case does not; that run, where it runs, is what the evidence is
  /// measured against (evidence_spec).
  void run_references(harness::BuiltCase& prepared_ops);
  /// A further set: the same on ops of its own, its evidence measured as `first`'s is.
  void run_references(const ReferenceSet& first);
  /// A set of its own (runner/recipe_off.h): the same on ops of its own, its evidence
  /// measured against its own case's calls.
  void run_references_alone();
  /// Whether run_references ran.
  bool ran() const { return ran_; }

  /// One evaluation of the set's math on `values` (with their parameters, on fresh ops) in
  /// `dtype`, as evidence_spec's first call: kinks recorded into `probe`, when given.
  harness::PathRun evaluate(const harness::CaseTensors& values, at::ScalarType dtype,
                            const Quantization& quantization = {}, ops::KinkProbe* probe = nullptr,
                            const Noise& noise = {}, Trace trace = Trace::kOff) const;

  /// The case's calls on `values` in `dtype`, in order on one quantization state as
  /// `quantization` says: the first as evidence_spec's, then the repeat calls as
  /// run_references evaluates their references. The first call's run, then per repeat call
  /// its run (skipped where the first call's stands for it; none after a first that failed).
  std::vector<harness::PathRun> evaluate_calls(const harness::CaseTensors& values, at::ScalarType dtype,
                                               const Quantization& quantization = {}) const;
  /// Whether the case's recipe is DelayedScaling: a call's scales then come from the calls
  /// before it.
  bool delayed() const;

  const ReferenceCase& reference_case() const { return case_; }
  const ops::QuantizationPoints& points() const { return points_; }
  /// The first call's float64 reference, and the kinks it recorded.
  const harness::PathRun& reference() const { return reference_; }
  const std::vector<ops::KinkProbe::Site>& reference_kinks() const { return reference_kinks_.sites(); }
  /// What repeat call `k` of the case is expected to give: its own reference under delayed
  /// scaling, else the first call's values (with the input's gradient where it takes it).
  harness::PathRun expected_for_call(size_t k) const;
  /// The spec the evidence is measured against: the case's, or with the input requiring grad
  /// (run_references); its reference, and that reference's tensors by name.
  const harness::CaseSpec& evidence_spec() const { return evidence_spec_; }
  const harness::PathRun& evidence_reference() const { return evidence_reference_ ? *evidence_reference_ : reference_; }
  std::map<std::string, at::Tensor> evidence_values() const;

 private:
  /// One call of the set's math: `spec`'s call, on `ops` (null: fresh ones holding
  /// `values`' parameters), quantized by `state` (null: a fresh one as `quantization` says).
  struct Call {
    const harness::CaseSpec& spec;
    harness::BuiltCase* ops = nullptr;
    ops::ReferenceQuantization* state = nullptr;
    bool no_grad = false;
  };
  /// What a call with the recipe off quantizes (cache_quantized_input alone), nullptr where
  /// the case quantizes nothing.
  std::unique_ptr<ops::ReferenceQuantization> without_recipe() const;
  harness::PathRun evaluate_call(const Call& call, const harness::CaseTensors& values, at::ScalarType dtype,
                                 const Quantization& quantization, ops::KinkProbe* probe, const Noise& noise,
                                 Trace trace) const;
  std::unique_ptr<ops::ReferenceQuantization> fresh_quantization(const Quantization& quantization) const;
  /// The repeat calls after a first call that left `state` (null: the case quantizes
  /// nothing), on `values` in `dtype`.
  std::vector<harness::PathRun> run_repeats(const harness::CaseTensors& values, at::ScalarType dtype,
                                            ops::ReferenceQuantization* state) const;
  void run_references(harness::BuiltCase* prepared_ops, const ReferenceSet* first);

  const ReferenceCase& case_;
  ops::QuantizationPoints points_;
  bool ran_ = false;
  harness::PathRun reference_;
  ops::KinkProbe reference_kinks_;
  /// The quantization state of the calls in order (delayed scaling: call k's scales come from
  /// calls 1..k-1), and per repeat call its own reference run.
  std::unique_ptr<ops::ReferenceQuantization> call_quantization_;
  std::vector<harness::PathRun> repeat_references_;
  at::Tensor repeat_grad_input_;
  harness::CaseSpec evidence_spec_;
  std::optional<harness::PathRun> evidence_reference_;
};

}  // namespace gradfuzz::runner
