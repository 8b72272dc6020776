#include "runner/reference_set.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <string>
#include <vector>

#include "tests/harness/test_specs.h"

namespace gradfuzz::runner {
namespace {

using harness::CaseSpec;
using harness::PathRun;
using harness::RepeatCall;
using harness::testing::op;

/// Linear [4, 5] -> 3, Bias, ReLU in float64.
CaseSpec linear_bias_relu() {
  CaseSpec spec;
  spec.ops = {op("Linear", {{"out", 3}}), op("Bias"), op("ReLU")};
  spec.input_shape = {4, 5};
  spec.seed = 17;
  return spec;
}

/// `spec` under a recipe (Linear -> GELU -> Linear, float32).
CaseSpec fp8_chain(const std::string& recipe, const std::string& format) {
  CaseSpec spec;
  spec.ops = {op("Linear", {{"out", 8}}), op("GELU"), op("Linear", {{"out", 4}})};
  spec.input_shape = {8, 16};
  spec.dtype = "float32";
  spec.recipe = harness::RecipeSpec{recipe, format, {}};
  spec.seed = 21;
  return spec;
}

/// A case's reference, as run_case makes it (on the CPU, no backend's accumulation).
struct Reference {
  explicit Reference(CaseSpec s, Trace trace = Trace::kOff) : spec(std::move(s)), prepared(prepare_case(spec)) {
    std::optional<ops::QuantRecipe> recipe;
    if (spec.recipe) recipe = ops::QuantRecipe::parse(spec.recipe->name, spec.recipe->fp8_format, {});
    reference_case = runner::reference_case(spec, prepared, recipe, harness::BackendCapabilities{}, trace);
  }
  CaseSpec spec;
  PreparedCase prepared;
  ReferenceCase reference_case;
};

bool same(const at::Tensor& a, const at::Tensor& b) {
  return a.defined() == b.defined() && (!a.defined() || (a.sizes() == b.sizes() && at::equal(a, b)));
}

TEST(ReferenceSet, EvaluatesAHandWrittenCaseAsPlainFloat64Autograd) {
  Reference r(linear_bias_relu());
  ReferenceSet set(r.reference_case);
  set.run_references(r.prepared.reference_ops);
  const PathRun& reference = set.reference();
  ASSERT_TRUE(reference.ok()) << reference.error_message;
  EXPECT_EQ(reference.name, "reference");
  // The same math written out: relu(x W^T + b), its gradients for the case's cotangent.
  const auto& t = r.prepared.tensors;
  const at::Tensor x = t.input.to(at::kDouble).detach().requires_grad_(true);
  const at::Tensor w = t.params[0][0].to(at::kDouble).detach().requires_grad_(true);
  const at::Tensor b = t.params[1][0].to(at::kDouble).detach().requires_grad_(true);
  const at::Tensor y = at::relu(at::matmul(x, w.t()) + b);
  const auto grads = torch::autograd::grad({y}, {x, w, b}, {t.cotangents[0].to(at::kDouble)});
  // Tolerances: a float64 matmul may sum in another order than the catalog's; 1e-12 of the
  // values is far below any bound the oracle uses.
  EXPECT_TRUE(at::allclose(reference.outputs[0], y, 1e-12, 1e-12));
  EXPECT_TRUE(at::allclose(reference.grad_input, grads[0], 1e-12, 1e-12));
  EXPECT_TRUE(at::allclose(reference.grad_params[0][0], grads[1], 1e-12, 1e-12));
  EXPECT_TRUE(at::allclose(reference.grad_params[1][0], grads[2], 1e-12, 1e-12));
  // evaluate (fresh ops holding the values) gives the first call's reference bit for bit.
  const PathRun again = set.evaluate(r.prepared.tensors, at::kDouble);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(same(again.outputs[0], reference.outputs[0]));
  EXPECT_TRUE(same(again.grad_input, reference.grad_input));
  EXPECT_TRUE(same(again.grad_params[0][0], reference.grad_params[0][0]));
}

TEST(ReferenceSet, InTheCaseDtypeItIsTheRoundingBaseline) {
  const Reference r(linear_bias_relu());
  const ReferenceSet set(r.reference_case);
  const PathRun exact = set.evaluate(r.prepared.tensors, at::kDouble);
  const PathRun baseline = set.evaluate(r.prepared.tensors, at::kBFloat16);
  ASSERT_TRUE(baseline.ok());
  EXPECT_EQ(baseline.name, "rounding_baseline");
  EXPECT_FALSE(same(baseline.outputs[0], exact.outputs[0]));
  // bfloat16 keeps 8 bits: a few roundings of values of order 1 stay within a few percent.
  EXPECT_TRUE(at::allclose(baseline.outputs[0].to(at::kDouble), exact.outputs[0], 0.05, 0.05));
}

TEST(ReferenceSet, TracedEvaluationsRecordEveryBasicOpBothWays) {
  const Reference r(linear_bias_relu(), Trace::kOn);
  const ReferenceSet set(r.reference_case);
  const PathRun traced = set.evaluate(r.prepared.tensors, at::kDouble, {}, nullptr, {}, Trace::kOn);
  ASSERT_EQ(traced.trace.size(), 6u);
  EXPECT_EQ(traced.trace[0].pass, "forward");
  EXPECT_EQ(traced.trace[0].group.name, "Linear");
  EXPECT_EQ(traced.trace[3].pass, "backward");
  EXPECT_EQ(traced.trace[3].group.name, "ReLU");
  EXPECT_TRUE(set.evaluate(r.prepared.tensors, at::kDouble).trace.empty());
}

TEST(ReferenceSet, ARepeatCallTakingTheInputsGradientIsMeasuredWithIt) {
  CaseSpec spec = linear_bias_relu();
  spec.input_requires_grad = false;
  RepeatCall call;
  call.input_requires_grad = true;
  spec.repeat_calls = {call};
  Reference r(spec);
  ReferenceSet first(r.reference_case);
  first.run_references(r.prepared.reference_ops);
  EXPECT_FALSE(first.reference().grad_input.defined());
  EXPECT_TRUE(first.evidence_spec().input_requires_grad);
  EXPECT_TRUE(first.evidence_reference().grad_input.defined());
  EXPECT_TRUE(same(first.expected_for_call(0).grad_input, first.evidence_reference().grad_input));
  EXPECT_EQ(first.evidence_values().count("grad_input"), 1u);
  // A further set follows the first set's choice.
  ReferenceSet further(r.reference_case);
  further.run_references(first);
  EXPECT_TRUE(further.evidence_spec().input_requires_grad);
  EXPECT_TRUE(same(further.evidence_reference().grad_input, first.evidence_reference().grad_input));
}

TEST(ReferenceSet, DelayedScalingRepeatCallsHaveReferencesOfTheirOwn) {
  for (const auto& [recipe, format] : {std::pair<std::string, std::string>{"DelayedScaling", "HYBRID"},
                                       std::pair<std::string, std::string>{"Float8CurrentScaling", "E4M3"}}) {
    SCOPED_TRACE(recipe);
    CaseSpec spec = fp8_chain(recipe, format);
    spec.repeat_calls = {RepeatCall{}, RepeatCall{}};
    Reference r(spec);
    ReferenceSet set(r.reference_case);
    set.run_references(r.prepared.reference_ops);
    ASSERT_TRUE(set.reference().ok()) << set.reference().error_message;
    // Current scaling: every call quantizes the same values alike. Delayed: call 2 quantizes
    // with the amaxes call 1 left, so its values are its own.
    const bool own = recipe == "DelayedScaling";
    EXPECT_EQ(!same(set.expected_for_call(1).outputs[0], set.reference().outputs[0]), own);
  }
}

// The calls in order on one state, as the repeat calls' coarse evidence samples them: in
// float64 without jitter they are the references (each repeat call on the scales the calls
// before it left), and a jittered sequence moves them.
TEST(ReferenceSet, TheCallsInOrderOnOneStateAreTheReferencesUnjittered) {
  CaseSpec spec = fp8_chain("DelayedScaling", "HYBRID");
  spec.repeat_calls = {RepeatCall{}, RepeatCall{}};
  Reference r(spec);
  ReferenceSet set(r.reference_case);
  set.run_references(r.prepared.reference_ops);
  ASSERT_TRUE(set.delayed());
  const std::vector<PathRun> runs = set.evaluate_calls(r.prepared.tensors, at::kDouble);
  ASSERT_EQ(runs.size(), 3u);
  for (const PathRun& run : runs) ASSERT_TRUE(run.ok()) << run.error_message;
  EXPECT_TRUE(same(runs[0].outputs[0], set.reference().outputs[0]));
  for (size_t k = 0; k < 2; ++k) {
    EXPECT_TRUE(same(runs[k + 1].outputs[0], set.expected_for_call(k).outputs[0])) << k;
    EXPECT_TRUE(same(runs[k + 1].grad_params[0][0], set.expected_for_call(k).grad_params[0][0])) << k;
  }
  at::Generator jitter = at::detail::createCPUGenerator(5);
  const std::vector<PathRun> jittered = set.evaluate_calls(r.prepared.tensors, at::kDouble, {&jitter});
  ASSERT_EQ(jittered.size(), 3u);
  EXPECT_FALSE(same(jittered[2].outputs[0], set.expected_for_call(1).outputs[0]));
}

TEST(ReferenceSet, AQuantizingEvaluationRecordsEachQuantizationsScaledValues) {
  const Reference r(fp8_chain("Float8CurrentScaling", "E4M3"));
  ASSERT_TRUE(r.reference_case.quantizes);
  const ReferenceSet set(r.reference_case);
  std::vector<at::Tensor> scaled;
  Quantization record;
  record.record = &scaled;
  ASSERT_TRUE(set.evaluate(r.prepared.tensors, at::kDouble, record).ok());
  // Two Linears: input and weight forward, grad_output backward, each.
  EXPECT_EQ(scaled.size(), 6u);
  // Jittered with a generator, the values move; from the same generator state, alike.
  at::Generator a = at::detail::createCPUGenerator(5);
  at::Generator b = at::detail::createCPUGenerator(5);
  const PathRun plain = set.evaluate(r.prepared.tensors, at::kDouble);
  const PathRun ja = set.evaluate(r.prepared.tensors, at::kDouble, {&a});
  const PathRun jb = set.evaluate(r.prepared.tensors, at::kDouble, {&b});
  EXPECT_FALSE(same(ja.outputs[0], plain.outputs[0]));
  EXPECT_TRUE(same(ja.outputs[0], jb.outputs[0]));
}

TEST(ReferenceSet, TheReferencesErrorKindIsWhatItRaises) {
  EXPECT_EQ(reference_error_kind(linear_bias_relu()), std::nullopt);
  CaseSpec wrong = linear_bias_relu();
  wrong.ops.push_back(op("AddExtraInput", {}, {std::string("nowhere")}));
  EXPECT_TRUE(reference_error_kind(wrong).has_value());
}

}  // namespace
}  // namespace gradfuzz::runner
