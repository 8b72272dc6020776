#include "harness/builder.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/harness/test_specs.h"

namespace gradfuzz::harness {
namespace {

using testing::op;

/// Dispatch (public logits; probs bound hidden, split sizes public-and-bound, routing map
/// public) -> GroupedLinear(scale_bias) with split sizes bound and scales public ->
/// Boundary -> AddExtraInput (public).
CaseSpec moe_spec() {
  CaseSpec spec;
  spec.input_shape = {6, 4};
  spec.ops = {op("Dispatch", {{"groups", 3}}, {}, {{std::string("splits"), true}, {std::string("probs"), false}}),
              op("GroupedLinear", {{"groups", 3}, {"out", 5}, {"scale_bias", 1}}, {std::string("splits")}),
              op("ScaledSReLU", {}, {std::string("probs")}), op(kBoundaryOp), op("AddExtraInput")};
  spec.seed = 11;
  return spec;
}

struct Drawn {
  CasePlan plan;
  BuiltCase built;
  CaseTensors tensors;
};

Drawn draw(const CaseSpec& spec) {
  Drawn d;
  d.plan = plan_case(spec);
  create_ops(spec, d.plan, nullptr, BuildOptions{}, d.built);
  at::Generator gen = at::detail::createCPUGenerator(spec.seed);
  d.tensors = draw_case_tensors(spec, d.plan, param_shapes(d.built.ops), gen);
  return d;
}

// An optimizer step's parameters: the previous ones rolled by one element and halved (every
// element moves, amaxes halve), held per call from the step on, nothing more drawn.
TEST(Builder, StepParamsRollAndHalveFromTheirStepOn) {
  CaseSpec spec = moe_spec();
  spec.repeat_calls.resize(3);
  spec.repeat_calls[1].update = true;
  spec.repeat_calls[2].update = true;
  CaseSpec plain = spec;
  for (auto& c : plain.repeat_calls) c.update = false;
  const Drawn d = draw(spec);
  EXPECT_TRUE(d.tensors.input.equal(draw(plain).tensors.input));
  ASSERT_EQ(d.tensors.step_params.size(), 3u);
  EXPECT_TRUE(d.tensors.step_params[0].empty());
  for (size_t i = 0; i < d.tensors.params.size(); ++i) {
    for (size_t j = 0; j < d.tensors.params[i].size(); ++j) {
      const at::Tensor& p = d.tensors.params[i][j];
      const at::Tensor once = p.reshape({-1}).roll(1).reshape(p.sizes()) * 0.5;
      EXPECT_TRUE(d.tensors.step_params[1][i][j].equal(once));
      EXPECT_TRUE(d.tensors.params_of_call(0)[i][j].equal(p));
      EXPECT_TRUE(d.tensors.params_of_call(1)[i][j].equal(once));
      EXPECT_TRUE(d.tensors.for_call(2).params[i][j].equal(step_param(once, at::kDouble)));
    }
  }
}

TEST(Builder, PlanPropagatesShapesAndOrdersPublicSlots) {
  const CasePlan plan = plan_case(moe_spec());
  ASSERT_EQ(plan.ops.size(), 5u);
  EXPECT_EQ(plan.ops[1].input_shape, (std::vector<int64_t>{6, 4}));
  EXPECT_EQ(plan.ops[2].input_shape, (std::vector<int64_t>{6, 5}));
  EXPECT_EQ(plan.output_shape, (std::vector<int64_t>{6, 5}));
  EXPECT_EQ(plan.num_fusers, 2);
  EXPECT_EQ(plan.ops[4].fuser, 1);
  EXPECT_EQ(plan.ops[4].ordinal, 3);
  EXPECT_TRUE(plan.ops[3].boundary);
  // Public inputs in (op, slot) order: logits, scales, e.
  ASSERT_EQ(plan.public_inputs.size(), 3u);
  EXPECT_EQ(plan.public_inputs[0].op, 0);
  EXPECT_EQ(plan.public_inputs[1].op, 1);
  EXPECT_EQ(plan.public_inputs[1].slot, 1);
  EXPECT_EQ(plan.public_inputs[2].op, 4);
  // Public outputs: split sizes (bound, to caller) and routing map (unbound).
  ASSERT_EQ(plan.public_outputs.size(), 2u);
  EXPECT_EQ(plan.public_outputs[0].slot, 0);
  EXPECT_EQ(plan.public_outputs[1].slot, 2);
}

TEST(Builder, DrawsAreAFunctionOfTheSeed) {
  const CaseSpec spec = moe_spec();
  const Drawn a = draw(spec);
  const Drawn b = draw(spec);
  EXPECT_TRUE(a.tensors.input.equal(b.tensors.input));
  EXPECT_TRUE(a.tensors.params[1][0].equal(b.tensors.params[1][0]));
  EXPECT_TRUE(a.tensors.cotangents[0].equal(b.tensors.cotangents[0]));
  CaseSpec other = spec;
  other.seed = 12;
  EXPECT_FALSE(a.tensors.input.equal(draw(other).tensors.input));
}

TEST(Builder, DrawnValuesAvoidKinksTiesAndOnes) {
  const Drawn d = draw(moe_spec());
  EXPECT_GE(d.tensors.input.abs().min().item<double>(), 0.1);
  EXPECT_GE(d.tensors.extra_inputs[2].abs().min().item<double>(), 0.1);
  // Router logits: the winner leads every other logit of its row by at least the margin.
  const at::Tensor logits = d.tensors.extra_inputs[0];
  const at::Tensor top2 = std::get<0>(logits.topk(2, 1));
  EXPECT_GE((top2.select(1, 0) - top2.select(1, 1)).min().item<double>(), 1.0);
  ASSERT_EQ(d.tensors.cotangents.size(), 3u);
  EXPECT_FALSE(d.tensors.cotangents[0].eq(1).all().item<bool>());
  EXPECT_FALSE(d.tensors.cotangents[1].defined());  // integer split sizes get no cotangent
  // Parameters (weights [3,5,4], bias, ...) drawn from the seed, not the catalog's init.
  EXPECT_EQ(d.tensors.params[1].size(), d.built.ops[1]->parameters().size());
  EXPECT_TRUE(d.tensors.extra_input_requires_grad[1]);  // scales
}

TEST(Builder, SplitSizesComposeRowsUnlessCorrupted) {
  CaseSpec spec;
  spec.input_shape = {7, 4};
  spec.ops = {op("GroupedLinear", {{"groups", 4}, {"out", 3}})};
  for (uint64_t seed = 0; seed < 20; ++seed) {
    spec.seed = seed;
    spec.corrupt_split_sizes = false;
    at::Tensor sizes = draw(spec).tensors.extra_inputs[0];
    EXPECT_EQ(sizes.scalar_type(), at::kLong);
    EXPECT_EQ(sizes.numel(), 4);
    EXPECT_EQ(sizes.sum().item<int64_t>(), 7);
    EXPECT_GE(sizes.min().item<int64_t>(), 0);
    spec.corrupt_split_sizes = true;
    EXPECT_NE(draw(spec).tensors.extra_inputs[0].sum().item<int64_t>(), 7);
  }
}

TEST(Builder, RoutingMapsArePermutations) {
  CaseSpec spec;
  spec.input_shape = {9, 2};
  spec.ops = {op("Combine")};
  const at::Tensor map = draw(spec).tensors.extra_inputs[0];
  EXPECT_TRUE(std::get<0>(map.sort()).equal(at::arange(9, at::kLong)));
}

TEST(Builder, ExtraInputCountDeltaAddsOrDropsTensors) {
  CaseSpec spec = moe_spec();
  spec.extra_input_count_delta = 2;
  EXPECT_EQ(draw(spec).tensors.extra_inputs.size(), 5u);
  spec.extra_input_count_delta = -1;
  EXPECT_EQ(draw(spec).tensors.extra_inputs.size(), 2u);
}

TEST(Builder, LowPrecisionDrawsAreRoundedToTheDtype) {
  CaseSpec spec = moe_spec();
  spec.dtype = "bfloat16";
  const at::Tensor x = draw(spec).tensors.input;
  EXPECT_EQ(x.scalar_type(), at::kDouble);
  EXPECT_TRUE(x.to(at::kBFloat16).to(at::kDouble).equal(x));
}

TEST(Builder, BuildsBindsAndLocks) {
  const CaseSpec spec = moe_spec();
  Drawn d = draw(spec);
  BuiltCase built;
  create_ops(spec, d.plan, &d.tensors, BuildOptions{}, built);
  build_case(spec, d.plan, d.tensors, BuildOptions{}, built);
  EXPECT_EQ(built.stage, BuildStage::kDone);
  ASSERT_TRUE(built.sequential);
  EXPECT_EQ(built.sequential->fusers().size(), 2u);
  EXPECT_TRUE(built.ops[1]->locked());
  EXPECT_EQ(built.ops[1]->extra_input_channel(0), std::optional<std::string>("splits"));
  EXPECT_TRUE(built.ops[1]->parameters()[0].equal(d.tensors.params[1][0]));
}

}  // namespace
}  // namespace gradfuzz::harness
