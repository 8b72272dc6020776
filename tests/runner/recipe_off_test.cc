#include "runner/recipe_off.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "harness/dtype.h"
#include "oracle/oracle.h"
#include "tests/harness/test_specs.h"
#include "tests/runner/prepared_set.h"

namespace gradfuzz::runner {
namespace {

using harness::CaseSpec;
using harness::RepeatCall;
using harness::testing::op;

/// Linear -> Linear under Float8CurrentScaling in float32, its repeat call with the recipe
/// off.
CaseSpec two_linears() {
  CaseSpec spec;
  spec.ops = {op("Linear", {{"out", 16}}), op("Linear", {{"out", 8}})};
  spec.input_shape = {8, 32};
  spec.dtype = "float32";
  spec.recipe = harness::RecipeSpec{"Float8CurrentScaling", "E4M3", {}};
  RepeatCall off;
  off.recipe_off = true;
  spec.repeat_calls = {off};
  spec.seed = 7;
  return spec;
}

using Case = testing::PreparedSet;

/// The output of the two Linears on the case's values in float32, each weight as `weight`
/// hands it on.
template <typename F>
at::Tensor float32_output(const Case& c, F weight) {
  at::Tensor y = c.prepared.tensors.input.to(at::kFloat);
  for (const auto& params : c.prepared.tensors.params) y = at::matmul(y, weight(params.at(0).to(at::kFloat)).t());
  return y;
}

/// `w` as an E4M3 cast with the scale from its amax gives it back.
at::Tensor e4m3_round_trip(const at::Tensor& w) {
  const double scale = 448.0 / w.abs().max().item<double>();
  return (w * scale).to(at::kFloat8_e4m3fn).to(at::kFloat) / scale;
}

/// Whether `got` passes `bounds` for the call's output.
bool output_passes(const Case& c, const oracle::CaseBounds& bounds, const at::Tensor& got) {
  std::vector<oracle::Finding> findings;
  std::vector<std::string> notes;
  oracle::Comparer comparer(findings, notes);
  const harness::PathRun expected = c.set->expected_for_call(0);
  comparer.compare("call", "output", "output", expected.outputs.at(0), got, false, bounds.bound("output"));
  return findings.empty();
}

TEST(RecipeOffBounds, AreWantedForACallWithTheRecipeOffOnly) {
  EXPECT_TRUE(RecipeOffBounds::wanted(two_linears()));
  CaseSpec plain = two_linears();
  plain.repeat_calls[0].recipe_off = false;
  EXPECT_FALSE(RecipeOffBounds::wanted(plain));
}

// The coarse FP8 bounds of the case's quantized calls let a call with the recipe off that
// computes with an FP8-cast weight through; its own bounds pass the float32 computation and
// fail that one.
TEST(RecipeOffBounds, HoldACallWithTheRecipeOffToHighPrecision) {
  Case c(two_linears());
  EvidenceSampler sampler(*c.set, c.options);
  ASSERT_TRUE(sampler.gather());
  const auto coarse = sampler.repeat_call_bounds();
  ASSERT_TRUE(coarse.has_value());
  RecipeOffBounds off(c.spec, c.prepared, harness::BackendCapabilities{}, Trace::kOff, c.options);
  EXPECT_FALSE(off.spec().recipe.has_value());
  const auto bounds = off.bounds(0);
  ASSERT_TRUE(bounds.has_value());

  const at::Tensor right = float32_output(c, [](const at::Tensor& w) { return w; });
  const at::Tensor cached = float32_output(c, e4m3_round_trip);
  EXPECT_TRUE(output_passes(c, *bounds, right));
  EXPECT_FALSE(output_passes(c, *bounds, cached));
  EXPECT_TRUE(output_passes(c, *coarse, cached)) << "the blind spot these bounds close";
}

TEST(RecipeOffBounds, GrowWithTheRoundsAndDrawTheSameEvidenceEachTime) {
  Case c(two_linears());
  RecipeOffBounds once(c.spec, c.prepared, harness::BackendCapabilities{}, Trace::kOff, c.options);
  RecipeOffBounds stepwise(c.spec, c.prepared, harness::BackendCapabilities{}, Trace::kOff, c.options);
  const auto round0 = stepwise.bounds(0);
  ASSERT_TRUE(round0.has_value());
  (void)stepwise.bounds(1);
  const auto a = stepwise.bounds(2);
  const auto b = once.bounds(2);
  ASSERT_TRUE(a && b);
  for (const auto& [name, bound] : a->tensors) {
    if (!bound.allowance.defined()) continue;
    EXPECT_TRUE(at::equal(bound.allowance, b->tensors.at(name).allowance)) << name;
    EXPECT_TRUE(at::all(bound.allowance >= round0->tensors.at(name).allowance).item<bool>()) << name;
  }
  // A round past the last is the last.
  const auto past = once.bounds(7);
  ASSERT_TRUE(past.has_value());
  EXPECT_TRUE(at::equal(past->tensors.at("output").allowance, b->tensors.at("output").allowance));
}

TEST(RecipeOffBounds, CoverTheInputsGradientACallWithTheRecipeOffTakes) {
  CaseSpec spec = two_linears();
  spec.input_requires_grad = false;
  Case c(spec);
  RecipeOffBounds off(c.spec, c.prepared, harness::BackendCapabilities{}, Trace::kOff, c.options);
  const auto bounds = off.bounds(0);
  ASSERT_TRUE(bounds.has_value());
  EXPECT_TRUE(bounds->tensors.count("grad_input")) << "the call's input requires grad";
}

}  // namespace
}  // namespace gradfuzz::runner
