#include "ops/reference.h"

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

using ::testing::HasSubstr;
using testing::make_generator;
using testing::on_device;
using testing::seeded_randn;
using testing::test_options;

TEST(ReferenceEvaluator, ComputesLinearGradientsByHandFormula) {
  at::Generator gen = make_generator(71);
  auto lin = std::make_shared<Linear>(LinearOptions(3, 2), test_options());
  Sequential seq({lin}, FusionRegistry{});
  const at::Tensor x = seeded_randn({4, 3}, gen, at::kDouble, true);
  ReferenceEvaluator ref(seq);
  const std::vector<at::Tensor> out = ref.forward(x, {});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].scalar_type(), at::kDouble);
  const at::Tensor w = lin->weight().detach();
  EXPECT_TRUE(out[0].allclose(x.detach().mm(w.t()).cpu()));
  const at::Tensor g = seeded_randn({4, 2}, gen);
  const ReferenceGradients grads = ref.backward({g});
  EXPECT_TRUE(grads.grad_input.allclose(g.mm(w).cpu()));                      // g [4,2] · W [2,3]
  EXPECT_TRUE(grads.grad_params[0][0].allclose(g.t().mm(x.detach()).cpu()));  // gᵀ [2,4] · x [4,3]
}

TEST(ReferenceEvaluator, DoesNotTouchTheOpsParametersOrTheCallersTensors) {
  at::Generator gen = make_generator(72);
  auto lin = std::make_shared<Linear>(LinearOptions(3, 3), test_options());
  Sequential seq({lin}, FusionRegistry{});
  const at::Tensor x = seeded_randn({2, 3}, gen, at::kDouble, true);
  const at::Tensor w_before = lin->weight().detach().clone();
  ReferenceEvaluator ref(seq);
  const std::vector<at::Tensor> out = ref.forward(x, {});
  // The reference output is float64 CPU; the cotangent comes from the test device.
  ref.backward({on_device(at::ones_like(out[0]))});
  EXPECT_TRUE(lin->weight().equal(w_before));
  EXPECT_FALSE(lin->weight().grad().defined());  // gradients go to float64 copies
  EXPECT_FALSE(x.grad().defined());
}

TEST(ReferenceEvaluator, FloatInputsAreCopiedToFloat64AndIntegerInputsStayInteger) {
  auto make = std::make_shared<MakeExtraOutput>();
  Sequential seq({make}, FusionRegistry{});
  ReferenceEvaluator ref(seq);
  const std::vector<at::Tensor> out = ref.forward(at::ones({2, 2}, test_options(at::kFloat)).requires_grad_(true), {});
  EXPECT_EQ(out[0].scalar_type(), at::kDouble);
  EXPECT_EQ(out[1].scalar_type(), at::kDouble);
}

TEST(ReferenceEvaluator, WiresChannelsByNameAndReportsChannelGradients) {
  at::Generator gen = make_generator(73);
  auto make = std::make_shared<MakeExtraOutput>();
  make->set_extra_output_channel(0, "c", false);
  auto add = std::make_shared<AddExtraInput>();
  add->set_extra_input_channel(0, "c");
  Sequential seq({make, std::make_shared<ConstantScale>(3.0), add}, FusionRegistry{});
  const at::Tensor x = seeded_randn({2, 3}, gen, at::kDouble, true);
  ReferenceEvaluator ref(seq);
  const std::vector<at::Tensor> out = ref.forward(x, {});
  EXPECT_TRUE(out[0].allclose((4 * x.detach()).cpu()));  // 3x + x
  ASSERT_EQ(ref.channel_values().size(), 1u);
  EXPECT_TRUE(ref.channel_values()[0].at("c").allclose(x.detach().cpu()));
  const at::Tensor g = seeded_randn({2, 3}, gen);
  const ReferenceGradients grads = ref.backward({g});
  EXPECT_TRUE(grads.grad_input.allclose((4 * g).cpu()));
  EXPECT_TRUE(grads.channel_grads[0].at("c").allclose(g.cpu()));  // the consumer's gradient
}

TEST(ReferenceEvaluator, GradientOfAnUnusedDifferentiableTensorIsZeroNotNone) {
  auto dual = std::make_shared<DualExtraOutput>();
  dual->set_extra_output_channel(0, "unused", false);
  Sequential seq({dual}, FusionRegistry{});
  ReferenceEvaluator ref(seq);
  const std::vector<at::Tensor> out = ref.forward(at::ones({2, 2}, test_options()).requires_grad_(true), {});
  ASSERT_EQ(out.size(), 2u);  // main + public slot 1
  const ReferenceGradients grads = ref.backward({at::ones({2, 2}, test_options()), at::zeros({2, 2}, test_options())});
  ASSERT_TRUE(grads.channel_grads[0].at("unused").defined());
  EXPECT_EQ(at::count_nonzero(grads.channel_grads[0].at("unused")).item<int64_t>(), 0);
}

TEST(ReferenceEvaluator, ExtraInputCountMismatchThrows) {
  Sequential seq({std::make_shared<AddExtraInput>()}, FusionRegistry{});
  ReferenceEvaluator ref(seq);
  try {
    ref.forward(at::ones({2, 2}, test_options()), {});
    FAIL() << "missing extra input accepted by the reference";
  } catch (const ExtraInputCountError& e) {
    EXPECT_THAT(e.what(), HasSubstr("expected 1"));
  }
}

TEST(ReferenceEvaluator, ParametersThatDoNotRequireGradGetNoGradient) {
  auto lin = std::make_shared<Linear>(LinearOptions(2, 2), test_options());
  lin->weight().requires_grad_(false);
  Sequential seq({lin}, FusionRegistry{});
  ReferenceEvaluator ref(seq);
  const std::vector<at::Tensor> out = ref.forward(at::ones({2, 2}, test_options()).requires_grad_(true), {});
  const ReferenceGradients grads = ref.backward({at::ones({2, 2}, test_options())});
  EXPECT_FALSE(grads.grad_params[0][0].defined());
  EXPECT_TRUE(grads.grad_input.defined());
  lin->weight().requires_grad_(true);
}

}  // namespace
}  // namespace gradfuzz::ops
