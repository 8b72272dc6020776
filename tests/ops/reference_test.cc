#include "ops/reference.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "ops/basic/activations.h"
#include "ops/basic/channel_ops.h"
#include "ops/basic/linear.h"
#include "ops/errors.h"
#include "ops/quantization.h"
#include "tests/ops/test_util.h"

namespace gradfuzz::ops {
namespace {

using ::testing::HasSubstr;
using testing::make_generator;
using testing::on_device;
using testing::seeded_randn;
using testing::test_options;
using testing::tolerance_for;

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

// ---------------------------------------------------------------------------------------
// cache_quantized_input: the model's activations against the reference's

/// The activation ops with cache_quantized_input=1 (and their high-precision twins), by name.
BasicOpPtr cached_activation(const std::string& name, InputCache cache) {
  if (name == "ReLU") return std::make_shared<ReLU>(cache);
  if (name == "GELU") return std::make_shared<GELU>(cache);
  if (name == "SReLU") return std::make_shared<SReLU>(cache);
  if (name == "SwiGLU") return std::make_shared<SwiGLU>(0, cache);
  return std::make_shared<SwiGLU>(2, cache);  // "SwiGLU(interleave 2)"
}

TEST(ReferenceEvaluator, OutputNoiseRoundsEveryOpsResultsOnceMoreForwardAndBackward) {
  // Linear then ReLU: y = relu(x W^T); the noise moves the Linear's output, the ReLU's output
  // and the gradients flowing back into both by at most a relative u each, so the output
  // moves by at most (1 + u)^2 - 1 and the input's gradient, through the two hooked
  // gradients and the noisy activation, by a first-order few u.
  at::Generator gen = make_generator(73);
  auto lin = std::make_shared<Linear>(LinearOptions(6, 5), test_options());
  auto relu = std::make_shared<ReLU>();
  Sequential seq({lin, relu}, FusionRegistry{});
  const at::Tensor x = seeded_randn({4, 6}, gen, at::kDouble, true);
  const at::Tensor g = seeded_randn({4, 5}, gen);
  auto run = [&](double relative, uint64_t seed) {
    at::Generator noise = make_generator(seed);
    ReferenceEvaluator ref(seq);
    ref.set_output_noise(relative, &noise);
    const at::Tensor out = ref.forward(x, {})[0];
    return std::make_pair(out.detach(), ref.backward({g}).grad_input);
  };
  const auto [clean_out, clean_grad] = run(0, 1);
  constexpr double kU = 0x1p-11;
  const auto [out, grad] = run(kU, 1);
  EXPECT_FALSE(out.equal(clean_out));
  EXPECT_FALSE(grad.equal(clean_grad));
  EXPECT_TRUE(((out - clean_out).abs() <= 2.01 * kU * clean_out.abs()).all().item<bool>());
  // Each input-gradient element is a sum of noisy terms: bounded by a few u times the sum of
  // the terms' magnitudes (|g| |W| through the ReLU's mask; four noisy factors on each term).
  const at::Tensor mask = (x.detach().mm(lin->weight().detach().to(at::kDouble).cpu().t()) > 0).to(at::kDouble);
  const at::Tensor terms = (g.abs() * mask).mm(lin->weight().detach().to(at::kDouble).cpu().abs());
  EXPECT_TRUE(((grad - clean_grad).abs() <= 4.01 * kU * terms).all().item<bool>());
  // Drawn from the generator alone: the same seed gives the same noise, another seed other.
  EXPECT_TRUE(run(kU, 1).second.equal(grad));
  EXPECT_FALSE(run(kU, 2).second.equal(grad));
}

TEST(ReferenceCachedInput, EveryActivationsModelMatchesTheReferenceAndDiffersFromHighPrecision) {
  for (at::ScalarType dtype : {at::kDouble, at::kFloat}) {
    for (const std::string name : {"ReLU", "GELU", "SReLU", "SwiGLU", "SwiGLU(interleave 2)"}) {
      at::Generator gen = make_generator(81);
      // Away from ReLU's kink: a pre-activation and its FP8 value then lie on the same side.
      const at::Tensor x = seeded_randn({6, 8}, gen, dtype, true, /*away_from_zero=*/true);
      Sequential cached({cached_activation(name, InputCache::kQuantized)}, FusionRegistry{});
      Sequential plain({cached_activation(name, InputCache::kHighPrecision)}, FusionRegistry{});
      const testing::PathResult model = testing::run_fused(cached, x, {});
      const testing::PathResult reference = testing::run_reference(cached, x, {});
      const testing::PathResult high = testing::run_reference(plain, x, {});
      const std::string what = name + " " + c10::toString(dtype);
      // The model rounds x to FP8 by hand, the reference with LibTorch's cast, from the same
      // values (a float32 x is exact in float64): the dtype's usual tolerance.
      EXPECT_TRUE(testing::results_close(model, reference, tolerance_for(dtype))) << what;
      // The forward uses x itself: the value is the high-precision one.
      EXPECT_TRUE(testing::tensors_close(reference.outputs[0], high.outputs[0], testing::kFloat64Tol, "y")) << what;
      if (name != "ReLU") {
        // act' at dq(Q(x)) is not act' at x (ReLU's 0/1 slope is, away from 0): FP8's
        // 2^-4 relative rounding moves these gradients far beyond 1e-4.
        EXPECT_FALSE(reference.grad_input.allclose(high.grad_input, 1e-4, 1e-4)) << what;
      }
    }
  }
}

TEST(ReferenceCachedInput, FusedOpsAroundACachedActivationMatchTheReference) {
  // ForwardLinearBiasActivation saves the cached pre-activation as the activation would;
  // BackwardActivationBias reads what the activation saved (TE: maybe_dequantize of it).
  for (const std::string fusion : {"ForwardLinearBiasActivation", "BackwardActivationBias"}) {
    at::Generator gen = make_generator(82);
    auto linear = std::make_shared<Linear>(LinearOptions(8, 6), test_options());
    auto bias = std::make_shared<Bias>(6, test_options());
    auto gelu = std::make_shared<GELU>(InputCache::kQuantized);
    Sequential fused({linear, bias, gelu}, FusionRegistry::catalog().only({fusion}));
    Sequential unfused({linear, bias, gelu}, FusionRegistry{});
    const at::Tensor x = seeded_randn({5, 8}, gen, at::kDouble, true);
    const testing::PathResult got = testing::run_fused(fused, x, {});
    const testing::PathResult plain = testing::run_fused(unfused, x, {});
    const testing::PathResult expected = testing::run_reference(fused, x, {});
    const auto trace = fused.fusers()[0]->last_trace();
    const PlanEntry* entry = nullptr;
    for (const PlanEntry& e : fusion == "BackwardActivationBias" ? trace->backward_plan : trace->forward_plan) {
      if (e.name == fusion && e.fused) entry = &e;
    }
    ASSERT_NE(entry, nullptr) << fusion << " did not fire";
    // float64 throughout; the pre-activations differ in summation order only (1e-16), far
    // from moving an element across an FP8 rounding boundary.
    EXPECT_TRUE(testing::results_close(got, expected, testing::kFloat64Tol)) << fusion;
    EXPECT_TRUE(testing::results_close(plain, expected, testing::kFloat64Tol)) << fusion;
  }
}

// ---------------------------------------------------------------------------------------
// FP8 recipes through the evaluator

TEST(ReferenceQuantization, QuantizersFollowModuleIndicesAndPersistAcrossCalls) {
  at::Generator gen = make_generator(83);
  auto fc1 = std::make_shared<Linear>(LinearOptions(4, 6), test_options());
  auto fc2 = std::make_shared<Linear>(LinearOptions(6, 3), test_options());
  Sequential seq({fc1, std::make_shared<ReLU>(), fc2}, FusionRegistry{});
  const at::Tensor x = seeded_randn({5, 4}, gen, at::kDouble, true) * 3.0;
  const QuantRecipe recipe = QuantRecipe::parse("DelayedScaling", "E4M3", {{"amax_history_len", "2"}});
  ReferenceQuantization quantization(recipe);
  auto call = [&](ReferenceQuantization& q) {
    ReferenceEvaluator ref(seq);
    ref.set_quantization(&q);
    const at::Tensor y = ref.forward(x, {})[0];
    ref.backward({on_device(at::ones_like(y))});
    return y;
  };
  const at::Tensor y1 = call(quantization);
  // Modules 0 and 2 have quantizers; the ReLU (module 1) none.
  const float amax1 = x.detach().abs().max().item<float>();
  EXPECT_EQ(quantization.delayed_scale(0, QuantRole::kInput), 448.0F / amax1);
  EXPECT_GT(quantization.delayed_scale(2, QuantRole::kInput), 0.0F);
  EXPECT_EQ(quantization.delayed_scale(2, QuantRole::kGradOutput), 448.0F);  // ones: amax 1
  EXPECT_THROW(quantization.delayed_scale(1, QuantRole::kInput), InvalidArgumentError);
  // Call 2 of the same sequence uses call 1's scales, so the same input gives another output;
  // a fresh sequence gives call 1's output again.
  const at::Tensor y2 = call(quantization);
  EXPECT_FALSE(y2.equal(y1));
  ReferenceQuantization fresh(recipe);
  EXPECT_TRUE(call(fresh).equal(y1));
}

TEST(ReferenceQuantization, JitterMovesTheOutputAndZeroProbabilityDoesNot) {
  at::Generator gen = make_generator(84);
  auto linear = std::make_shared<Linear>(LinearOptions(16, 8), test_options());
  Sequential seq({linear}, FusionRegistry{});
  const at::Tensor x = seeded_randn({12, 16}, gen, at::kDouble, true);
  const QuantRecipe recipe = QuantRecipe::parse("Float8CurrentScaling", "E4M3", {});
  auto run = [&](double probability, uint64_t seed) {
    ReferenceQuantization q(recipe);
    if (probability >= 0) q.set_jitter(probability, make_generator(seed));
    ReferenceEvaluator ref(seq);
    ref.set_quantization(&q);
    testing::PathResult r;
    r.outputs = ref.forward(x, {});
    const ReferenceGradients g = ref.backward({on_device(at::ones_like(r.outputs[0]))});
    r.grad_input = g.grad_input;
    r.grad_params = g.grad_params;
    return r;
  };
  const testing::PathResult base = run(-1, 0);
  const testing::PathResult zero = run(0.0, 5);
  EXPECT_TRUE(zero.outputs[0].equal(base.outputs[0]));
  EXPECT_TRUE(zero.grad_input.equal(base.grad_input));
  const testing::PathResult moved = run(0.5, 5);
  EXPECT_FALSE(moved.outputs[0].equal(base.outputs[0]));
  EXPECT_FALSE(moved.grad_input.equal(base.grad_input));  // the gradient's quantization jitters too
  // Yet by no more than one FP8 ulp per operand: each product x_k·w_k moves by at most
  // (1 + 2^-3)^2 - 1 < 0.27 of itself (E4M3's largest relative spacing is 2^-3), bounded here
  // by 0.3 · Σ_k |x_k|·|w_k| (the quantized operands are within 2^-4 of x and W).
  const at::Tensor bound = 0.3 * x.detach().abs().cpu().mm(linear->weight().detach().abs().cpu().t());
  EXPECT_TRUE(((moved.outputs[0] - base.outputs[0]).abs() <= bound).all().item<bool>());
}

TEST(ReferenceQuantization, ComputesInTheEvaluatorsDtypeForTheRoundingBaseline) {
  at::Generator gen = make_generator(85);
  auto linear = std::make_shared<Linear>(LinearOptions(8, 4), test_options());
  Sequential seq({linear}, FusionRegistry{});
  const at::Tensor x = seeded_randn({6, 8}, gen, at::kDouble, true);
  const QuantRecipe recipe = QuantRecipe::parse("Float8BlockScaling", "HYBRID", {});
  ReferenceQuantization q64(recipe);
  ReferenceQuantization q32(recipe);
  ReferenceEvaluator ref64(seq);
  ReferenceEvaluator ref32(seq, at::kFloat);
  ref64.set_quantization(&q64);
  ref32.set_quantization(&q32);
  const at::Tensor y64 = ref64.forward(x, {})[0];
  const at::Tensor y32 = ref32.forward(x, {})[0];
  EXPECT_EQ(y32.scalar_type(), at::kFloat);
  // The same FP8 operands (x's float64 values round to float32 first either way); only the
  // float32 GEMM's rounding differs: float32's tolerance.
  EXPECT_TRUE(testing::tensors_close(y32, y64, testing::kFloat32Tol, "y"));
  const at::Tensor g = on_device(at::ones_like(y64));
  EXPECT_TRUE(testing::tensors_close(ref32.backward({g}).grad_input, ref64.backward({g}).grad_input,
                                     testing::kFloat32Tol, "grad_input"));
}

}  // namespace
}  // namespace gradfuzz::ops
