#include "ops/sequential.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "ops/basic/activations.h"
#include "ops/basic/channel_ops.h"
#include "ops/basic/linear.h"
#include "ops/errors.h"
#include "tests/ops/test_util.h"

namespace gradfuzz::ops {
namespace {

using testing::fused_matches_reference;
using ::testing::HasSubstr;
using testing::kFloat64Tol;
using testing::make_generator;
using testing::seeded_randn;
using ::testing::StartsWith;
using testing::test_options;

TEST(Sequential, ConsecutiveBasicOpsFormOneFuserPerRun) {
  Sequential seq({std::make_shared<Identity>(), std::make_shared<ReLU>(), make_boundary(),
                  std::make_shared<AddExtraInput>(), make_boundary(), make_boundary(), std::make_shared<ReLU>()},
                 FusionRegistry{});
  ASSERT_EQ(seq.fusers().size(), 3u);
  EXPECT_EQ(seq.fusers()[0]->ops().size(), 2u);
  EXPECT_EQ(seq.fusers()[1]->ops().size(), 1u);
  EXPECT_EQ(seq.num_public_extra_inputs(), 1);
}

TEST(Sequential, ChannelAcrossABoundaryIsRejectedAtConstructionWithMissingProducer) {
  auto make = std::make_shared<MakeExtraOutput>();
  make->set_extra_output_channel(0, "skip", false);
  auto add = std::make_shared<AddExtraInput>();
  add->set_extra_input_channel(0, "skip");
  try {
    Sequential seq({make, make_boundary(), add}, FusionRegistry{});
    FAIL() << "a channel crossing a boundary was accepted";
  } catch (const MissingProducerError& e) {
    EXPECT_THAT(e.what(), StartsWith("missing-producer"));
    EXPECT_THAT(e.what(), HasSubstr("'skip'"));
  }
  // The first run was valid on its own; the failed construction must still lock nothing.
  EXPECT_FALSE(make->locked());
  EXPECT_FALSE(add->locked());
  // Both ops remain configurable.
  EXPECT_NO_THROW(add->set_extra_input_channel(0, std::nullopt));
}

TEST(Sequential, SuccessfulConstructionLocksEveryOp) {
  auto a = std::make_shared<Identity>();
  auto b = std::make_shared<ReLU>();
  Sequential seq({a, make_boundary(), b}, FusionRegistry{});
  EXPECT_TRUE(a->locked());
  EXPECT_TRUE(b->locked());
}

TEST(Sequential, ExtraInputSurplusThrows) {
  Sequential seq({std::make_shared<AddExtraInput>(), make_boundary(), std::make_shared<Identity>()}, FusionRegistry{});
  const at::Tensor x = at::ones({2, 2}, test_options());
  try {
    seq.forward(x, {x, x});
    FAIL() << "surplus extra input accepted (TE ignores it; we must not)";
  } catch (const ExtraInputCountError& e) {
    EXPECT_THAT(e.what(), StartsWith("extra-input-count"));
    EXPECT_THAT(e.what(), HasSubstr("expected 1"));
    EXPECT_THAT(e.what(), HasSubstr("got 2"));
    EXPECT_THAT(e.what(), HasSubstr("surplus"));
  }
}

TEST(Sequential, ExtraInputShortfallThrows) {
  Sequential seq({std::make_shared<AddExtraInput>(), make_boundary(), std::make_shared<AddExtraInput>()},
                 FusionRegistry{});
  const at::Tensor x = at::ones({2, 2}, test_options());
  try {
    seq.forward(x, {x});
    FAIL() << "shortfall accepted";
  } catch (const ExtraInputCountError& e) {
    EXPECT_THAT(e.what(), HasSubstr("expected 2"));
    EXPECT_THAT(e.what(), HasSubstr("shortfall"));
    EXPECT_THAT(e.what(), HasSubstr("fuser 1 takes 1"));
  }
}

TEST(Sequential, EachFuserTakesItsExtrasFrontToBackAndOutputsComeInFuserOrder) {
  at::Generator gen = make_generator(5);
  auto dual0 = std::make_shared<DualExtraOutput>(2.0, 3.0);
  dual0->set_extra_output_channel(1, "hidden", false);
  auto dual1 = std::make_shared<DualExtraOutput>(5.0, 7.0);
  dual1->set_extra_output_channel(0, "hidden1", false);
  Sequential seq({std::make_shared<AddExtraInput>(), dual0, make_boundary(), std::make_shared<AddExtraInput>(), dual1},
                 FusionRegistry{});
  const at::Tensor x = seeded_randn({3, 2}, gen);
  const at::Tensor e0 = seeded_randn({3, 2}, gen);
  const at::Tensor e1 = seeded_randn({3, 2}, gen);
  const std::vector<at::Tensor> out = seq.forward(x, {e0, e1});
  ASSERT_EQ(out.size(), 3u);
  EXPECT_TRUE(out[0].allclose(x + e0 + e1));
  EXPECT_TRUE(out[1].allclose(2.0 * (x + e0)));       // fuser 0's public output first
  EXPECT_TRUE(out[2].allclose(7.0 * (x + e0 + e1)));  // then fuser 1's
  EXPECT_TRUE(fused_matches_reference(seq, x.clone().requires_grad_(true),
                                      {e0.clone().requires_grad_(true), e1.clone().requires_grad_(true)}, kFloat64Tol));
}

TEST(Sequential, SameChannelNameInTwoFusersIsTwoIndependentChannels) {
  at::Generator gen = make_generator(6);
  auto make0 = std::make_shared<MakeExtraOutput>();
  make0->set_extra_output_channel(0, "c", false);
  auto add0 = std::make_shared<AddExtraInput>();
  add0->set_extra_input_channel(0, "c");
  auto make1 = std::make_shared<MakeExtraOutput>();
  make1->set_extra_output_channel(0, "c", false);
  auto add1 = std::make_shared<AddExtraInput>();
  add1->set_extra_input_channel(0, "c");
  Sequential seq({make0, std::make_shared<Linear>(LinearOptions(3, 3), test_options()), add0, make_boundary(), make1,
                  std::make_shared<GELU>(), add1},
                 FusionRegistry{});
  EXPECT_TRUE(fused_matches_reference(seq, seeded_randn({4, 3}, gen, at::kDouble, true), {}, kFloat64Tol));
}

}  // namespace
}  // namespace gradfuzz::ops
