#include "ops/basic_op.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "ops/basic/channel_ops.h"
#include "ops/basic/grouped_linear.h"
#include "ops/basic/linear.h"
#include "ops/errors.h"
#include "ops/faults.h"
#include "ops/sequential.h"
#include "tests/ops/test_util.h"

namespace gradfuzz::ops {
namespace {

using ::testing::HasSubstr;
using testing::make_generator;
using testing::seeded_randn;
using ::testing::StartsWith;
using testing::test_options;

std::shared_ptr<GroupedLinear> scale_bias_linear() {
  return std::make_shared<GroupedLinear>(GroupedLinearOptions(2, 4, 3).scale_bias(true), test_options());
}

/// Locks `op` the way the runtime does: by placing it in a persistent Sequential.
std::unique_ptr<Sequential> lock_in_sequential(const BasicOpPtr& op) {
  auto seq = std::make_unique<Sequential>(std::vector<Module>{op}, FusionRegistry{});
  EXPECT_TRUE(op->locked());
  return seq;
}

TEST(BasicOpBinding, InputSlotOutOfRangeThrowsNamingOpSlotAndChannel) {
  auto op = std::make_shared<AddExtraInput>();
  try {
    op->set_extra_input_channel(1, "c");
    FAIL() << "slot 1 of a one-slot op accepted";
  } catch (const SlotOutOfRangeError& e) {
    EXPECT_THAT(e.what(), StartsWith("slot-out-of-range"));
    EXPECT_THAT(e.what(), HasSubstr("AddExtraInput"));
    EXPECT_THAT(e.what(), HasSubstr("slot 1"));
    EXPECT_THAT(e.what(), HasSubstr("'c'"));
    EXPECT_THAT(e.what(), HasSubstr("has 1 extra input"));
  }
  EXPECT_THROW(op->set_extra_input_channel(-1, "c"), SlotOutOfRangeError);
}

TEST(BasicOpBinding, OutputSlotOutOfRangeThrows) {
  auto op = std::make_shared<MakeExtraOutput>();
  try {
    op->set_extra_output_channel(2, "c");
    FAIL() << "slot 2 of a one-slot op accepted";
  } catch (const SlotOutOfRangeError& e) {
    EXPECT_THAT(e.what(), HasSubstr("MakeExtraOutput"));
    EXPECT_THAT(e.what(), HasSubstr("output slot 2"));
  }
  // An op without outputs rejects slot 0.
  EXPECT_THROW(std::make_shared<Identity>()->set_extra_output_channel(0, "c"), SlotOutOfRangeError);
}

TEST(BasicOpBinding, EmptyChannelNameThrowsInvalidName) {
  auto add = std::make_shared<AddExtraInput>();
  try {
    add->set_extra_input_channel(0, "");
    FAIL() << "empty channel name accepted";
  } catch (const InvalidChannelNameError& e) {
    EXPECT_THAT(e.what(), StartsWith("invalid-channel-name"));
    EXPECT_THAT(e.what(), HasSubstr("AddExtraInput extra input slot 0"));
    EXPECT_THAT(e.what(), HasSubstr("non-empty"));
  }
  EXPECT_THROW(std::make_shared<MakeExtraOutput>()->set_extra_output_channel(0, ""), InvalidChannelNameError);
}

TEST(BasicOpBinding, LockedOpRejectsBindingEvenWithTheSameValue) {
  auto add = std::make_shared<AddExtraInput>();
  auto make = std::make_shared<MakeExtraOutput>();
  make->set_extra_output_channel(0, "c", false);
  add->set_extra_input_channel(0, "c");
  Sequential seq({make, add}, FusionRegistry{});
  try {
    add->set_extra_input_channel(0, "c");  // same value
    FAIL() << "re-binding a locked op to the same channel was accepted";
  } catch (const LockedError& e) {
    EXPECT_THAT(e.what(), StartsWith("locked"));
    EXPECT_THAT(e.what(), HasSubstr("AddExtraInput extra input slot 0"));
    EXPECT_THAT(e.what(), HasSubstr("'c'"));
  }
  EXPECT_THROW(make->set_extra_output_channel(0, "c", false), LockedError);  // same value
  EXPECT_THROW(add->set_extra_input_channel(0, std::nullopt), LockedError);  // unbinding
  EXPECT_THROW(make->set_extra_output_channel(0, "d"), LockedError);
  EXPECT_EQ(add->extra_input_channel(0), std::optional<std::string>("c"));  // unchanged
}

TEST(BasicOpBinding, ValidationOrderIsOutOfRangeThenEmptyNameThenLocked) {
  auto add = std::make_shared<AddExtraInput>();
  auto seq = lock_in_sequential(add);
  // All three problems at once: out of range wins.
  EXPECT_THROW(add->set_extra_input_channel(3, ""), SlotOutOfRangeError);
  // Empty name and locked: invalid name wins.
  EXPECT_THROW(add->set_extra_input_channel(0, ""), InvalidChannelNameError);
  // Only locked.
  EXPECT_THROW(add->set_extra_input_channel(0, "c"), LockedError);

  auto make = std::make_shared<MakeExtraOutput>();
  auto seq2 = lock_in_sequential(make);
  EXPECT_THROW(make->set_extra_output_channel(1, ""), SlotOutOfRangeError);
  EXPECT_THROW(make->set_extra_output_channel(0, ""), InvalidChannelNameError);
  EXPECT_THROW(make->set_extra_output_channel(0, "c"), LockedError);
}

TEST(BasicOpBinding, SettersAreChainableAndUnbindingForcesOutputToCaller) {
  auto op = std::make_shared<DualExtraOutput>();
  BasicOp& same = op->set_extra_output_channel(0, "a", false).set_extra_output_channel(1, "b", false);
  EXPECT_EQ(&same, op.get());
  EXPECT_FALSE(op->extra_output_binding(0).output_to_caller);
  op->set_extra_output_channel(0, std::nullopt, false);
  EXPECT_FALSE(op->extra_output_binding(0).channel.has_value());
  EXPECT_TRUE(op->extra_output_binding(0).output_to_caller);
  EXPECT_EQ(op->extra_output_binding(1).channel, std::optional<std::string>("b"));
}

TEST(BasicOpBinding, GroupedLinearSlotCountDependsOnScaleBias) {
  auto plain = std::make_shared<GroupedLinear>(GroupedLinearOptions(2, 4, 3), test_options());
  EXPECT_EQ(plain->num_extra_inputs(), 1);
  EXPECT_THROW(plain->set_extra_input_channel(1, "s"), SlotOutOfRangeError);
  auto scaled = scale_bias_linear();
  EXPECT_EQ(scaled->num_extra_inputs(), 2);
  EXPECT_NO_THROW(scaled->set_extra_input_channel(1, "s"));
}

TEST(BasicOp, ForwardChecksExtraInputArity) {
  auto add = std::make_shared<AddExtraInput>();
  OpContext ctx;
  at::Tensor x = at::ones({2, 3}, test_options());
  try {
    add->forward(ctx, x, {});
    FAIL() << "missing extra input accepted";
  } catch (const ExtraCountError& e) {
    EXPECT_THAT(e.what(), HasSubstr("AddExtraInput forward: expected 1 extra inputs, got 0"));
  }
}

// Review finding 3: a standalone call must not lock the op.
void expect_call_then_bind_works(bool grad_enabled) {
  at::Generator gen = make_generator(3);
  auto add = std::make_shared<AddExtraInput>();
  const at::Tensor x = seeded_randn({4, 3}, gen, at::kDouble, grad_enabled);
  const at::Tensor e = seeded_randn({4, 3}, gen);
  {
    at::AutoGradMode mode(grad_enabled);
    const std::vector<at::Tensor> out = (*add)(x, {e});
    ASSERT_EQ(out.size(), 1u);
    EXPECT_TRUE(out[0].allclose(x + e));
  }
  EXPECT_FALSE(add->locked());
  add->set_extra_input_channel(0, "res");
  auto make = std::make_shared<MakeExtraOutput>();
  make->set_extra_output_channel(0, "res", false);
  Sequential seq({make, add}, FusionRegistry{});
  EXPECT_TRUE(add->locked());
  const std::vector<at::Tensor> out = seq.forward(x, {});
  EXPECT_TRUE(out[0].allclose(2 * x));
}

TEST(BasicOpCall, CallThenBindWorksWithGradOn) { expect_call_then_bind_works(true); }

TEST(BasicOpCall, CallThenBindWorksWithGradOff) { expect_call_then_bind_works(false); }

TEST(BasicOpCall, TransientLockFaultMakesCallThenBindFail) {
  FaultScope fault(Fault::kTransientLock);
  auto add = std::make_shared<AddExtraInput>();
  at::Tensor x = at::ones({2, 2}, test_options());
  (*add)(x, {x});
  EXPECT_TRUE(add->locked());
  EXPECT_THROW(add->set_extra_input_channel(0, "res"), LockedError);
}

TEST(BasicOpCall, StandaloneCallValidatesBindings) {
  auto add = std::make_shared<AddExtraInput>();
  add->set_extra_input_channel(0, "nowhere");
  at::Tensor x = at::ones({2, 2}, test_options());
  try {
    (*add)(x, {});
    FAIL() << "a standalone call with an unproduced channel ran";
  } catch (const MissingProducerError& e) {
    EXPECT_THAT(e.what(), HasSubstr("'nowhere'"));
  }
  EXPECT_FALSE(add->locked());
}

TEST(BasicOpCall, StandaloneCallReturnsPublicExtraOutputs) {
  auto dual = std::make_shared<DualExtraOutput>(0.5, -1.5);
  at::Tensor x = at::arange(6, test_options()).reshape({2, 3});
  const std::vector<at::Tensor> out = (*dual)(x);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_TRUE(out[0].equal(x));
  EXPECT_TRUE(out[1].allclose(0.5 * x));
  EXPECT_TRUE(out[2].allclose(-1.5 * x));
}

}  // namespace
}  // namespace gradfuzz::ops
