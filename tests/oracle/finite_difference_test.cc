#include "oracle/finite_difference.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "ops/reference.h"
#include "runner/run_case.h"
#include "tests/harness/test_specs.h"

namespace gradfuzz::oracle {

using harness::build_case;
using harness::BuildOptions;
using harness::CaseSpec;
using harness::Finding;
using harness::PathRun;
using harness::to_path;
using runner::prepare_case;
using runner::PreparedCase;
namespace {

using harness::testing::op;
using ::testing::HasSubstr;

/// The float64 reference of `spec` (as the runner computes it) and what the finite-difference
/// check says of it, with the reference's input gradient scaled by `scale` first.
struct Checked {
  std::vector<Finding> findings;
  std::vector<std::string> notes;
};

Checked check(const CaseSpec& spec, double scale = 1.0) {
  PreparedCase prepared = prepare_case(spec);
  BuildOptions build;
  build.call_then_bind = false;
  build_case(spec, prepared.plan, prepared.tensors, build, prepared.reference_ops);
  const auto dbl = at::TensorOptions().dtype(at::kDouble);
  at::Tensor input = prepared.tensors.input.to(dbl, false, true).requires_grad_(spec.input_requires_grad);
  ops::ReferenceEvaluator evaluator(*prepared.reference_ops.sequential);
  PathRun reference;
  const std::vector<at::Tensor> extras =
      to_path(prepared.tensors.extra_inputs, prepared.tensors.extra_input_requires_grad, dbl);
  reference.outputs = evaluator.forward(input, extras);
  const ops::ReferenceGradients grads = evaluator.backward(prepared.tensors.cotangents);
  reference.grad_input = grads.grad_input * scale;
  reference.grad_extra_inputs = grads.grad_extra_inputs;
  reference.grad_params.resize(spec.ops.size());
  for (size_t i = 0; i < prepared.plan.ops.size(); ++i) {
    const int64_t ordinal = prepared.plan.ops[i].ordinal;
    if (ordinal >= 0) reference.grad_params[i] = grads.grad_params[static_cast<size_t>(ordinal)];
  }
  Checked out;
  check_finite_differences(spec, prepared.tensors, reference, prepared.reference_ops, FiniteDifferenceOptions{},
                           prepared.generator, out.findings, out.notes);
  return out;
}

/// Found by a 1,000,000-case soak: a ReLU pre-activation within 1e-6 of zero along the
/// random direction, where the central difference averages the two slopes (off by 6%).
CaseSpec relu_near_its_kink() {
  CaseSpec spec;
  spec.ops = {op("Linear", {{"out", 2}}),
              op("ConstantScale", {{"scale", -0.5}}),
              op("AddExtraInput"),
              op("Linear", {{"out", 6}}),
              op("Bias"),
              op("ReLU")};
  spec.input_shape = {5, 7};
  spec.seed = 17668173065661163055ull;
  return spec;
}

TEST(FiniteDifferences, AKinkWithinTheStepIsNotAFindingWhenASmallerStepAgrees) {
  const Checked c = check(relu_near_its_kink());
  EXPECT_TRUE(c.findings.empty());
  ASSERT_EQ(c.notes.size(), 1u);
  EXPECT_THAT(c.notes[0], HasSubstr("not smooth within a step"));
}

TEST(FiniteDifferences, AWrongGradientDisagreesAtEveryStep) {
  // The same case with the input's gradient 2% too large, and a smooth one 0.1% too large.
  const Checked kink = check(relu_near_its_kink(), 1.02);
  ASSERT_EQ(kink.findings.size(), 1u);
  EXPECT_EQ(kink.findings[0].path_pair, "reference~finite_difference");
  CaseSpec smooth;
  smooth.ops = {op("Linear", {{"out", 3}}), op("GELU")};
  smooth.input_shape = {2, 4};
  smooth.seed = 7;
  EXPECT_TRUE(check(smooth).findings.empty());
  EXPECT_EQ(check(smooth, 1.001).findings.size(), 1u);
}

}  // namespace
}  // namespace gradfuzz::oracle
