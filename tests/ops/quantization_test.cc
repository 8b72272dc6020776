#include "ops/quantization.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ops/basic/activations.h"
#include "ops/basic/grouped_linear.h"
#include "ops/basic/linear.h"
#include "ops/errors.h"
#include "ops/reference.h"
#include "ops/sequential.h"
#include "tests/ops/test_util.h"

namespace gradfuzz::ops {
namespace {

using ::testing::HasSubstr;
using testing::make_generator;
using testing::seeded_randn;
using testing::test_options;

// ---------------------------------------------------------------------------------------
// Hand arithmetic, written apart from ops/quantization.cc: scalar C++ floats, std::frexp and
// std::nearbyint instead of LibTorch's float8 cast and tensor scales.

/// v on an FP8 format's grid: saturated to +-max, rounded to nearest even with 3 (E4M3) or 2
/// (E5M2) mantissa bits, subnormals below 2^-6 (E4M3) or 2^-14 (E5M2).
double round_fp8(double v, Fp8Format format) {
  const int mantissa = format == Fp8Format::kE4M3 ? 3 : 2;
  const int min_exponent = format == Fp8Format::kE4M3 ? -6 : -14;
  const double max = format == Fp8Format::kE4M3 ? 448.0 : 57344.0;
  if (std::isnan(v) || v == 0.0) return v;
  v = std::clamp(v, -max, max);
  int e = 0;
  std::frexp(v, &e);  // |v| in [2^(e-1), 2^e)
  const double spacing = std::ldexp(1.0, std::max(e - 1, min_exponent) - mantissa);
  return std::nearbyint(v / spacing) * spacing;  // the default rounding mode: to nearest even
}

/// TE's scale for an amax (recipe_common.cuh), in C++ floats; the power of two by log2.
float hand_scale(float amax, Fp8Format format, bool power_of_2) {
  if (amax == 0.0F || !std::isfinite(amax)) return 1.0F;
  float scale = (format == Fp8Format::kE4M3 ? 448.0F : 57344.0F) / amax;
  if (std::isinf(scale)) scale = std::numeric_limits<float>::max();
  return power_of_2 ? std::exp2(std::floor(std::log2(scale))) : scale;
}

/// Which elements share a scale in hand_qdq (tensors in these tests are below 128 per dim,
/// so a 1x128 block is a whole row and a 128x1 block a whole column).
enum class Groups { kTensor, kRows, kColumns };

/// dq(Q(x)) of a 2-D tensor by hand: per group amax of float(x), scale, fp32 product,
/// round_fp8, times the fp32 reciprocal; float64 CPU. `fixed_scale` > 0 overrides the scale.
at::Tensor hand_qdq(const at::Tensor& x, Fp8Format format, Groups groups, bool power_of_2, float fixed_scale = 0) {
  const at::Tensor xc = x.detach().to(at::kCPU, at::kDouble).contiguous();
  const auto in = xc.accessor<double, 2>();
  const int64_t m = xc.size(0);
  const int64_t n = xc.size(1);
  std::vector<float> row_amax(m, 0.0F);
  std::vector<float> col_amax(n, 0.0F);
  float amax = 0.0F;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      const float v = std::fabs(static_cast<float>(in[i][j]));
      row_amax[i] = std::max(row_amax[i], v);
      col_amax[j] = std::max(col_amax[j], v);
      amax = std::max(amax, v);
    }
  }
  at::Tensor out = at::empty({m, n}, at::kDouble);
  auto dst = out.accessor<double, 2>();
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      const float group_amax = groups == Groups::kTensor ? amax : groups == Groups::kRows ? row_amax[i] : col_amax[j];
      const float scale = fixed_scale > 0 ? fixed_scale : hand_scale(group_amax, format, power_of_2);
      const float scaled = static_cast<float>(in[i][j]) * scale;  // the fp32 product
      dst[i][j] = round_fp8(scaled, format) * static_cast<double>(1.0F / scale);
    }
  }
  return out;
}

/// A [1, n] float64 CPU tensor.
at::Tensor row(const std::vector<double>& values) { return at::tensor(values, at::kDouble).reshape({1, -1}); }

at::Tensor cpu(const at::Tensor& t) { return t.detach().to(at::kCPU, at::kDouble); }

QuantRecipe recipe(const std::string& name, const std::string& format,
                   const std::map<std::string, std::string>& options = {}) {
  return QuantRecipe::parse(name, format, options);
}

std::string error_message(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

// ---------------------------------------------------------------------------------------
// Formats, scales and the cast

TEST(Fp8Quantization, E4M3ExampleOfBackendsMd) {
  // amax 3.5: scale 448 / 3.5 = 128; 3.5 -> 448/128, 1.0 -> 128/128, 0.3 -> 38.4 -> 40 -> 0.3125
  const at::Tensor amax = at::full({}, 3.5F);
  EXPECT_EQ(compute_scale_from_amax(amax, Fp8Format::kE4M3, ScalePrecision::kFp32, 3.4e38F).item<float>(), 128.0F);
  ReferenceQuantization quantization(recipe("Float8CurrentScaling", "E4M3"));
  quantization.set_current_op(0);
  const at::Tensor x = at::tensor({3.5, 1.0, 0.3, -0.3}, at::kDouble);
  const QuantizedOperand q = quantization.quantize(QuantRole::kInput, 0, x);
  // Exact: an FP8 value times the fp32 reciprocal of 128 is exact in float64.
  EXPECT_TRUE(q.rowwise.equal(at::tensor({3.5, 1.0, 0.3125, -0.3125}, at::kDouble))) << q.rowwise;
  EXPECT_TRUE(q.columnwise.is_same(q.rowwise));  // per-tensor scaling: one copy
  EXPECT_EQ(q.rowwise.scalar_type(), at::kDouble);
}

TEST(Fp8Quantization, E5M2MaxAndSaturationAndTheNonSaturatingLibTorchCast) {
  EXPECT_EQ(fp8_max(Fp8Format::kE5M2), 57344.0F);
  EXPECT_EQ(fp8_max(Fp8Format::kE4M3), 448.0F);
  const at::Tensor one = at::ones({}, at::kFloat);
  const at::Tensor big = at::tensor({60000.0, -1e6, 57344.0, 1e5, 3.0}, at::kDouble);
  const at::Tensor q5 = cast_to_fp8(big, one, Fp8Format::kE5M2);
  EXPECT_EQ(q5.scalar_type(), at::kFloat8_e5m2);
  EXPECT_TRUE(q5.to(at::kDouble).equal(at::tensor({57344.0, -57344.0, 57344.0, 57344.0, 3.0}, at::kDouble)))
      << q5.to(at::kDouble);
  const at::Tensor q4 = cast_to_fp8(at::tensor({500.0, 448.5, -1e9}, at::kDouble), one, Fp8Format::kE4M3);
  EXPECT_TRUE(q4.to(at::kDouble).equal(at::tensor({448.0, 448.0, -448.0}, at::kDouble))) << q4.to(at::kDouble);
  // Why cast_to_fp8 clamps first: LibTorch's own cast turns 500 into NaN.
  EXPECT_TRUE(std::isnan(at::full({}, 500.0F).to(at::kFloat8_e4m3fn).to(at::kFloat).item<float>()));
  // NaN stays NaN.
  EXPECT_TRUE(std::isnan(cast_to_fp8(at::full({}, NAN), one, Fp8Format::kE5M2).to(at::kFloat).item<float>()));
}

TEST(Fp8Quantization, PowerOfTwoScalesAreThePowerAtOrBelowTheQuotient) {
  const at::Tensor amax = at::tensor({3.5F, 3.0F, 0.3F, 0.0F, INFINITY, NAN, 1e-38F});
  const at::Tensor fp32 = compute_scale_from_amax(amax, Fp8Format::kE4M3, ScalePrecision::kFp32, 3.4e38F);
  const at::Tensor pow2 = compute_scale_from_amax(amax, Fp8Format::kE4M3, ScalePrecision::kPowerOf2, 3.4e38F);
  const std::vector<float> expect_fp32{128.0F, 448.0F / 3.0F, 448.0F / 0.3F, 1.0F, 1.0F, 1.0F, 3.4e38F};
  // 448 / 1e-38 overflows fp32: value_for_inf (3.4e38 given), whose power of two is 2^127.
  const std::vector<float> expect_pow2{128.0F, 128.0F, 1024.0F, 1.0F, 1.0F, 1.0F, std::ldexp(1.0F, 127)};
  for (size_t i = 0; i < expect_fp32.size(); ++i) {
    EXPECT_EQ(fp32[static_cast<int64_t>(i)].item<float>(), expect_fp32[i]) << "amax index " << i;
    EXPECT_EQ(pow2[static_cast<int64_t>(i)].item<float>(), expect_pow2[i]) << "amax index " << i;
  }
  EXPECT_EQ(value_for_inf(at::kDouble), std::numeric_limits<float>::max());
  EXPECT_EQ(value_for_inf(at::kHalf), 65504.0F);

  // Through the recipe: amax 3 gives scale 128 with use_power_2_scales, 149.33 without, so
  // 1.1 lands on 144/128 = 1.125 with, on 160/149.33 without.
  const at::Tensor x = at::tensor({3.0, 1.1}, at::kDouble);
  ReferenceQuantization with(recipe("Float8CurrentScaling", "E4M3", {{"use_power_2_scales", "1"}}));
  ReferenceQuantization without(recipe("Float8CurrentScaling", "E4M3", {{"use_power_2_scales", "0"}}));
  const double fp32_inv = static_cast<double>(1.0F / (448.0F / 3.0F));
  EXPECT_EQ(with.quantize(QuantRole::kInput, 0, x).rowwise[1].item<double>(), 1.125);
  EXPECT_EQ(without.quantize(QuantRole::kInput, 0, x).rowwise[1].item<double>(), 160.0 * fp32_inv);
}

TEST(Fp8Quantization, MatchesHandRoundingOverEveryMagnitude) {
  // Log-uniform magnitudes over 2^-30..2^10 with random signs: the saturating cast, the
  // subnormals and every binade of both formats against round_fp8.
  at::Generator gen = make_generator(301);
  const at::Tensor u = at::rand({64, 48}, gen, at::TensorOptions().dtype(at::kDouble));
  const at::Tensor s = at::rand({64, 48}, gen, at::TensorOptions().dtype(at::kDouble));
  const at::Tensor x = at::exp2(u * 40.0 - 30.0) * at::where(s < 0.5, -1.0, 1.0);
  for (const char* format : {"E4M3", "HYBRID"}) {
    ReferenceQuantization quantization(recipe("Float8CurrentScaling", format));
    const Fp8Format grad_format = std::string(format) == "E4M3" ? Fp8Format::kE4M3 : Fp8Format::kE5M2;
    EXPECT_TRUE(quantization.quantize(QuantRole::kInput, 0, x)
                    .rowwise.equal(hand_qdq(x, Fp8Format::kE4M3, Groups::kTensor, false)))
        << format;
    // HYBRID's gradients are E5M2: 57344 / amax and two mantissa bits.
    EXPECT_TRUE(quantization.quantize(QuantRole::kGradOutput, 0, x)
                    .rowwise.equal(hand_qdq(x, grad_format, Groups::kTensor, false)))
        << format;
    // A scale of 1 (DelayedScaling's first call) puts x on the format's own grid.
    const at::Tensor at_one = hand_qdq(x, Fp8Format::kE4M3, Groups::kTensor, false, 1.0F);
    EXPECT_TRUE(dequantize_fp8(cast_to_fp8(x, at::ones({}, at::kFloat), Fp8Format::kE4M3), at::ones({}, at::kFloat),
                               at::kDouble)
                    .equal(at_one));
  }
}

// ---------------------------------------------------------------------------------------
// Block scaling

TEST(Fp8BlockScaling, PartialBlocksTakeTheAmaxOfWhatTheyCover) {
  // [2, 130]: 1x128 blocks are columns 0..127 and the partial 128..129 of each row.
  at::Tensor x = at::full({2, 130}, 0.25, at::kDouble);
  x[0][5] = 100.0;   // row 0, block 0
  x[0][129] = 0.3;   // row 0, partial block
  x[1][128] = -2.0;  // row 1, partial block
  const at::Tensor rows = block_scales(x, BlockShape::k1x128, Fp8Format::kE4M3, ScalePrecision::kFp32);
  EXPECT_EQ(rows[0][0].item<float>(), 448.0F / 100.0F);
  EXPECT_EQ(rows[0][127].item<float>(), 448.0F / 100.0F);
  EXPECT_EQ(rows[0][128].item<float>(), 448.0F / 0.3F);
  EXPECT_EQ(rows[1][0].item<float>(), 448.0F / 0.25F);
  EXPECT_EQ(rows[1][129].item<float>(), 448.0F / 2.0F);
  // 128x1 on the transposed layout [130, 2]: rows 128..129 are each column's partial block.
  const at::Tensor cols = block_scales(x.t().contiguous(), BlockShape::k128x1, Fp8Format::kE4M3, ScalePrecision::kFp32);
  EXPECT_TRUE(cols.equal(rows.t()));
  // 128x128 tiles of [130, 130]: four tiles, the corner one partial in both dimensions.
  at::Tensor square = at::full({130, 130}, 0.5, at::kDouble);
  square[129][129] = 7.0;
  square[3][3] = 56.0;
  const at::Tensor tiles = block_scales(square, BlockShape::k128x128, Fp8Format::kE4M3, ScalePrecision::kPowerOf2);
  EXPECT_EQ(tiles[0][0].item<float>(), 8.0F);      // 448 / 56
  EXPECT_EQ(tiles[0][129].item<float>(), 512.0F);  // 448 / 0.5 = 896 -> 512
  EXPECT_EQ(tiles[129][0].item<float>(), 512.0F);
  EXPECT_EQ(tiles[129][129].item<float>(), 64.0F);  // 448 / 7
}

TEST(Fp8BlockScaling, OneDimensionalBlocksGiveSeparatelyQuantizedCopies) {
  at::Generator gen = make_generator(302);
  const at::Tensor x = at::randn({6, 5}, gen, at::TensorOptions().dtype(at::kDouble));
  ReferenceQuantization quantization(recipe("Float8BlockScaling", "E4M3", {{"block_scaling_dims", "1,2,1"}}));
  const QuantizedOperand qx = quantization.quantize(QuantRole::kInput, 0, x);
  // Power-of-2 scales by default (use_f32_scales = 0): per row for the row-wise copy, per
  // column for the column-wise copy.
  EXPECT_TRUE(qx.rowwise.equal(hand_qdq(x, Fp8Format::kE4M3, Groups::kRows, true)));
  EXPECT_TRUE(qx.columnwise.equal(hand_qdq(x, Fp8Format::kE4M3, Groups::kColumns, true)));
  // Power-of-2 scales leave FP8's relative grid where it is (a floating-point format), so
  // these two copies differ only where a block's scale reaches the subnormals; fp32 scales
  // (below) make them differ.
  // The weight's 2D tile: one copy, the whole [6, 5] tensor one tile.
  const QuantizedOperand qw = quantization.quantize(QuantRole::kWeight, 0, x);
  EXPECT_TRUE(qw.columnwise.is_same(qw.rowwise));
  EXPECT_TRUE(qw.rowwise.equal(hand_qdq(x, Fp8Format::kE4M3, Groups::kTensor, true)));
  // use_f32_scales = 1: fp32 scales.
  ReferenceQuantization f32(recipe("Float8BlockScaling", "E4M3", {{"use_f32_scales", "1"}}));
  const QuantizedOperand fx = f32.quantize(QuantRole::kInput, 0, x);
  EXPECT_TRUE(fx.rowwise.equal(hand_qdq(x, Fp8Format::kE4M3, Groups::kRows, false)));
  EXPECT_TRUE(fx.columnwise.equal(hand_qdq(x, Fp8Format::kE4M3, Groups::kColumns, false)));
  EXPECT_FALSE(fx.rowwise.equal(fx.columnwise));
}

// ---------------------------------------------------------------------------------------
// Delayed scaling

/// One Linear [in 2 -> out 1] under `quantization`: forward (with grad) and backward.
struct DelayedLinear {
  std::shared_ptr<Linear> linear = std::make_shared<Linear>(LinearOptions(2, 1), test_options());
  Sequential seq{{linear}, FusionRegistry{}};
  ReferenceQuantization quantization;

  explicit DelayedLinear(QuantRecipe r) : quantization(std::move(r)) {}
  std::vector<at::Tensor> call(const at::Tensor& x, bool backward = true) {
    ReferenceEvaluator ref(seq);
    ref.set_quantization(&quantization);
    std::vector<at::Tensor> out = ref.forward(testing::on_device(x), {});
    if (backward) ref.backward({at::ones_like(out[0])});
    return out;
  }
};

TEST(Fp8DelayedScaling, ThreeCallExampleOfBackendsMd) {
  DelayedLinear d(
      recipe("DelayedScaling", "E4M3", {{"margin", "0"}, {"amax_compute_algo", "max"}, {"amax_history_len", "2"}}));
  const at::Tensor w = cpu(d.linear->weight());
  // Call 1: amax 3.5 quantized at scale 1 (3.5 is on the E4M3 grid; 0.3 -> 0.3125).
  const at::Tensor x1 = row({3.5, 0.3});
  const at::Tensor y1 = cpu(d.call(x1)[0]);
  const at::Tensor wq1 = hand_qdq(w, Fp8Format::kE4M3, Groups::kTensor, false, 1.0F);
  // float64 products of the same FP8 values: only the summation order may differ.
  EXPECT_TRUE(y1.allclose(row({3.5, 0.3125}).mm(wq1.t()), 1e-15, 0));
  EXPECT_EQ(d.quantization.delayed_scale(0, QuantRole::kInput), 128.0F);
  EXPECT_EQ(d.quantization.amax_history(0, QuantRole::kInput), (std::vector<float>{0.0F, 3.5F}));
  // Call 2: amax 2.0 quantized at scale 128; history [2.0, 3.5] -> 448 / 3.5 = 128 again.
  const at::Tensor x2 = row({2.0, 0.3});
  const at::Tensor y2 = cpu(d.call(x2)[0]);
  EXPECT_EQ(d.quantization.delayed_scale(0, QuantRole::kInput), 128.0F);
  EXPECT_EQ(d.quantization.amax_history(0, QuantRole::kInput), (std::vector<float>{0.0F, 2.0F}));
  // Call 3: scale 128 once more; after it 448 / 2 = 224.
  d.call(x2);
  EXPECT_EQ(d.quantization.delayed_scale(0, QuantRole::kInput), 224.0F);
  // Call 2's input was quantized at scale 128: 0.3 -> 38.4 -> 40 -> 0.3125 (as at scale 1,
  // but 2.0 -> 256 exactly); its output used the weight at the weight's scale after call 1.
  const float w_scale_1 = hand_scale(cpu(d.linear->weight()).abs().max().item<float>(), Fp8Format::kE4M3, false);
  const at::Tensor wq_call2 = hand_qdq(w, Fp8Format::kE4M3, Groups::kTensor, false, w_scale_1);
  EXPECT_TRUE(y2.allclose(hand_qdq(x2, Fp8Format::kE4M3, Groups::kTensor, false, 128.0F).mm(wq_call2.t()), 1e-15, 0));
}

TEST(Fp8DelayedScaling, GradOutputScalesUpdateAfterEachBackwardOnly) {
  DelayedLinear d(recipe("DelayedScaling", "HYBRID", {{"amax_history_len", "1"}}));
  d.call(row({1.0, -2.0}));
  // dy = 1 (ones cotangent): backward format E5M2 under HYBRID, scale 57344 / 1.
  EXPECT_EQ(d.quantization.delayed_scale(0, QuantRole::kGradOutput), 57344.0F);
  EXPECT_EQ(d.quantization.delayed_scale(0, QuantRole::kInput), 224.0F);  // 448 / 2
  // A forward without backward updates the forward quantizers only.
  d.call(row({4.0, 1.0}), /*backward=*/false);
  EXPECT_EQ(d.quantization.delayed_scale(0, QuantRole::kInput), 112.0F);
  EXPECT_EQ(d.quantization.delayed_scale(0, QuantRole::kGradOutput), 57344.0F);
}

TEST(Fp8DelayedScaling, NoGradForwardRecordsItsAmaxButUpdatesNothing) {
  DelayedLinear d(recipe("DelayedScaling", "E4M3", {{"amax_history_len", "4"}}));
  {
    at::NoGradGuard no_grad;
    d.call(row({7.0, 1.0}), /*backward=*/false);
  }
  EXPECT_EQ(d.quantization.delayed_scale(0, QuantRole::kInput), 1.0F);
  EXPECT_EQ(d.quantization.amax_history(0, QuantRole::kInput)[0], 7.0F);
  // The next grad-enabled forward (amax 2) updates from the maximum of both: 448 / 7.
  d.call(row({2.0, 1.0}));
  EXPECT_EQ(d.quantization.delayed_scale(0, QuantRole::kInput), 64.0F);
}

TEST(Fp8DelayedScaling, MarginMostRecentAndTheZeroAmaxKeepTheScale) {
  DelayedLinear d(recipe("DelayedScaling", "E4M3",
                         {{"margin", "1"}, {"amax_compute_algo", "most_recent"}, {"amax_history_len", "16"}}));
  d.call(row({3.5, 0.0}));
  EXPECT_EQ(d.quantization.delayed_scale(0, QuantRole::kInput), 64.0F);  // 448 / 3.5 / 2^1
  d.call(row({1.75, 0.0}));
  EXPECT_EQ(d.quantization.delayed_scale(0, QuantRole::kInput), 128.0F);  // most recent 1.75, not max 3.5
  d.call(at::zeros({1, 2}, at::kDouble));
  EXPECT_EQ(d.quantization.delayed_scale(0, QuantRole::kInput), 128.0F);  // amax 0: scale kept
}

// ---------------------------------------------------------------------------------------
// Linear and GroupedLinear in the reference

/// Forward and backward of one Linear [in 4 -> out 3] under `r`, followed by
/// ConstantScale(`scale`) when given, with `points` (the basic ops' when empty), rows 5 and a
/// seeded cotangent g: {y, grad_input, grad_weight} (float64 CPU), the operands used, and the
/// quantization kept for its state.
struct LinearRun {
  at::Tensor x, w, g, y, dx, dw;
  std::unique_ptr<ReferenceQuantization> quantization;
};

LinearRun run_linear_chain(const QuantRecipe& r, std::optional<double> scale, const QuantizationPoints& points,
                           uint64_t seed) {
  at::Generator gen = make_generator(seed);
  auto linear = std::make_shared<Linear>(LinearOptions(4, 3), test_options());
  Sequential seq = scale ? Sequential({linear, std::make_shared<ConstantScale>(*scale)}, FusionRegistry{})
                         : Sequential({linear}, FusionRegistry{});
  LinearRun run;
  run.x = seeded_randn({5, 4}, gen, at::kDouble, true);
  run.g = cpu(seeded_randn({5, 3}, gen));
  run.w = cpu(linear->weight());
  run.quantization = std::make_unique<ReferenceQuantization>(r);
  if (!points.empty()) run.quantization->set_points(points);
  ReferenceEvaluator ref(seq);
  ref.set_quantization(run.quantization.get());
  run.y = cpu(ref.forward(run.x, {})[0]);
  const ReferenceGradients grads = ref.backward({run.g});
  run.dx = cpu(grads.grad_input);
  run.dw = cpu(grads.grad_params[0][0]);
  run.x = cpu(run.x);
  return run;
}

LinearRun run_linear(const QuantRecipe& r, uint64_t seed) { return run_linear_chain(r, std::nullopt, {}, seed); }

/// float64 GEMMs of the same dequantized values, summed in another order than the
/// reference's autograd: agreement to 1e-12 relative (an FP8 ulp is 2^-3 relative).
void expect_gemm_close(const at::Tensor& got, const at::Tensor& expected, const char* what) {
  EXPECT_TRUE(got.allclose(expected, 1e-12, 1e-12)) << what << ": got\n" << got << "\nexpected\n" << expected;
}

TEST(Fp8Linear, EachRecipeMatchesHandQuantizedGemms) {
  struct Expect {
    const char* name;
    QuantRecipe recipe;
    /// x's and dy's scale groups for the row-/column-wise copies; W's; power-of-2 scales.
    Groups x_row, x_col, w_row, w_col, g_row, g_col;
    bool pow2;
    float fixed_scale;  // > 0: DelayedScaling's first call, every scale 1
    Fp8Format grad_format;
  };
  const std::vector<Expect> cases{
      {"DelayedScaling E4M3", recipe("DelayedScaling", "E4M3"), Groups::kTensor, Groups::kTensor, Groups::kTensor,
       Groups::kTensor, Groups::kTensor, Groups::kTensor, false, 1.0F, Fp8Format::kE4M3},
      {"Float8CurrentScaling E4M3", recipe("Float8CurrentScaling", "E4M3"), Groups::kTensor, Groups::kTensor,
       Groups::kTensor, Groups::kTensor, Groups::kTensor, Groups::kTensor, false, 0, Fp8Format::kE4M3},
      {"Float8CurrentScaling HYBRID", recipe("Float8CurrentScaling", "HYBRID"), Groups::kTensor, Groups::kTensor,
       Groups::kTensor, Groups::kTensor, Groups::kTensor, Groups::kTensor, false, 0, Fp8Format::kE5M2},
      // x [rows, in]: row-wise per row, column-wise per column; W 2D one tile; dy 1D.
      {"Float8BlockScaling 1,2,1", recipe("Float8BlockScaling", "E4M3", {{"block_scaling_dims", "1,2,1"}}),
       Groups::kRows, Groups::kColumns, Groups::kTensor, Groups::kTensor, Groups::kRows, Groups::kColumns, true, 0,
       Fp8Format::kE4M3},
      // fp32 scales: the 1D copies differ in value (with powers of 2 they mostly agree).
      {"Float8BlockScaling 1,1,1 f32",
       recipe("Float8BlockScaling", "E4M3", {{"block_scaling_dims", "1,1,1"}, {"use_f32_scales", "1"}}), Groups::kRows,
       Groups::kColumns, Groups::kRows, Groups::kColumns, Groups::kRows, Groups::kColumns, false, 0, Fp8Format::kE4M3},
      // W 1D: its column-wise copy (dgrad) per column of [out, in]; dy 2D one tile.
      {"Float8BlockScaling 1,1,2 HYBRID", recipe("Float8BlockScaling", "HYBRID", {{"block_scaling_dims", "1,1,2"}}),
       Groups::kRows, Groups::kColumns, Groups::kRows, Groups::kColumns, Groups::kTensor, Groups::kTensor, true, 0,
       Fp8Format::kE5M2},
  };
  for (const Expect& e : cases) {
    const LinearRun run = run_linear(e.recipe, 303);
    auto q = [&](const at::Tensor& t, Groups groups, Fp8Format format) {
      return hand_qdq(t, format, groups, e.pow2, e.fixed_scale);
    };
    const at::Tensor xr = q(run.x, e.x_row, Fp8Format::kE4M3);
    const at::Tensor xc = q(run.x, e.x_col, Fp8Format::kE4M3);
    const at::Tensor wr = q(run.w, e.w_row, Fp8Format::kE4M3);
    const at::Tensor wc = q(run.w, e.w_col, Fp8Format::kE4M3);
    const at::Tensor gr = q(run.g, e.g_row, e.grad_format);
    const at::Tensor gc = q(run.g, e.g_col, e.grad_format);
    expect_gemm_close(run.y, xr.mm(wr.t()), e.name);   // x [5,4] · Wᵀ [4,3]
    expect_gemm_close(run.dx, gr.mm(wc), e.name);      // dy [5,3] · W [3,4]
    expect_gemm_close(run.dw, gc.t().mm(xc), e.name);  // dyᵀ [3,5] · x [5,4]
    // Not the unquantized math: FP8 moves these values by far more than the tolerance.
    EXPECT_FALSE(run.y.allclose(run.x.mm(run.w.t()), 1e-6, 1e-6)) << e.name;
  }
}

TEST(Fp8Linear, HybridQuantizesTheGradientInE5M2) {
  const LinearRun hybrid = run_linear(recipe("Float8CurrentScaling", "HYBRID"), 304);
  const LinearRun e4m3 = run_linear(recipe("Float8CurrentScaling", "E4M3"), 304);
  // Same forward, different gradients: dy on E5M2's grid (2 mantissa bits), not E4M3's.
  EXPECT_TRUE(hybrid.y.equal(e4m3.y));
  EXPECT_FALSE(hybrid.dx.allclose(e4m3.dx, 1e-9, 0));
  const at::Tensor w = hand_qdq(hybrid.w, Fp8Format::kE4M3, Groups::kTensor, false);
  expect_gemm_close(hybrid.dx, hand_qdq(hybrid.g, Fp8Format::kE5M2, Groups::kTensor, false).mm(w), "HYBRID dgrad");
  expect_gemm_close(e4m3.dx, hand_qdq(e4m3.g, Fp8Format::kE4M3, Groups::kTensor, false).mm(w), "E4M3 dgrad");
}

// ---------------------------------------------------------------------------------------
// Per-path quantization points (TE's BackwardLinearScale)

using LinearScaleRun = LinearRun;

LinearScaleRun run_linear_scale(const QuantRecipe& r, double scale, const QuantizationPoints& points, uint64_t seed) {
  return run_linear_chain(r, scale, points, seed);
}

QuantizationPoints linear_scale_points(double scale) {
  QuantizationPoints points;
  points.backward_gemm_alpha[0] = scale;
  points.gradient_passthrough.insert(1);
  return points;
}

// TE's fused BackwardLinearScale quantizes the unscaled gradient and applies the scale as
// the dgrad and wgrad GEMMs' alpha: dx = s dq(Qg(dy)) · dq(Qw(W)), dW = s dq(Qg(dy))ᵀ ·
// dq(Qi(x)); unfused, the Linear quantizes s·dy. DelayedScaling's first call quantizes at
// scale 1, so with s = 1.5 the two land on different E5M2 grids; the histories record the
// amax each quantizer saw.
TEST(Fp8QuantizationPoints, BackwardLinearScaleQuantizesTheUnscaledGradientAndAppliesTheScaleAsAlpha) {
  const double s = 1.5;
  const QuantRecipe delayed = recipe("DelayedScaling", "HYBRID", {{"amax_history_len", "2"}});
  const LinearScaleRun fused = run_linear_scale(delayed, s, linear_scale_points(s), 311);
  const LinearScaleRun unfused = run_linear_scale(delayed, s, {}, 311);
  const at::Tensor xq = hand_qdq(fused.x, Fp8Format::kE4M3, Groups::kTensor, false, 1.0F);
  const at::Tensor wq = hand_qdq(fused.w, Fp8Format::kE4M3, Groups::kTensor, false, 1.0F);
  const at::Tensor gq = hand_qdq(fused.g, Fp8Format::kE5M2, Groups::kTensor, false, 1.0F);
  const at::Tensor sgq = hand_qdq(s * fused.g, Fp8Format::kE5M2, Groups::kTensor, false, 1.0F);
  // The forward is the same computation in both.
  EXPECT_TRUE(fused.y.equal(unfused.y));
  expect_gemm_close(fused.y, s * xq.mm(wq.t()), "forward");
  expect_gemm_close(fused.dx, s * gq.mm(wq), "fused dgrad");
  expect_gemm_close(fused.dw, s * gq.t().mm(xq), "fused wgrad");
  expect_gemm_close(unfused.dx, sgq.mm(wq), "unfused dgrad");
  expect_gemm_close(unfused.dw, sgq.t().mm(xq), "unfused wgrad");
  // Different FP8 grids: the gradients differ by FP8 rounding (not by a factor).
  EXPECT_FALSE(fused.dx.allclose(unfused.dx, 1e-9, 0));
  EXPECT_TRUE(fused.dx.allclose(unfused.dx, 0.25, 0.25 * unfused.dx.abs().max().item<double>()));
  // The grad_output history holds the unscaled gradient's amax where the fused op ran (the
  // update rolled it to slot 1), the scaled one's unfused; its scale follows.
  const float amax = fused.g.abs().max().item<float>();
  const float scaled_amax = (s * fused.g).abs().max().item<float>();
  EXPECT_EQ(fused.quantization->amax_history(0, QuantRole::kGradOutput)[1], amax);
  EXPECT_EQ(unfused.quantization->amax_history(0, QuantRole::kGradOutput)[1], scaled_amax);
  EXPECT_EQ(fused.quantization->delayed_scale(0, QuantRole::kGradOutput), 57344.0F / amax);
  EXPECT_EQ(unfused.quantization->delayed_scale(0, QuantRole::kGradOutput), 57344.0F / scaled_amax);
}

// Float8BlockScaling's power-of-2 scales do not cancel a scale of 1.5 either; current
// scaling's fp32 scales do (up to the scale's fp32 rounding); with backward_override the
// fused op's alpha applies to an unquantized GEMM, the same math as unfused.
TEST(Fp8QuantizationPoints, WhereTheScaleCancelsAndWhereItDoesNot) {
  const double s = 1.5;
  const auto both = [&](const QuantRecipe& r) {
    return std::make_pair(run_linear_scale(r, s, linear_scale_points(s), 312), run_linear_scale(r, s, {}, 312));
  };
  {
    const auto [fused, unfused] = both(recipe("Float8BlockScaling", "HYBRID"));
    const at::Tensor wc = hand_qdq(fused.w, Fp8Format::kE4M3, Groups::kTensor, true);  // W 2D: one tile
    expect_gemm_close(fused.dx, s * hand_qdq(fused.g, Fp8Format::kE5M2, Groups::kRows, true).mm(wc), "block dgrad");
    EXPECT_FALSE(fused.dx.allclose(unfused.dx, 1e-9, 0));
  }
  {
    const auto [fused, unfused] = both(recipe("Float8CurrentScaling", "HYBRID"));
    EXPECT_TRUE(fused.dx.allclose(unfused.dx, 1e-6, 0));
    EXPECT_TRUE(fused.dw.allclose(unfused.dw, 1e-6, 0));
  }
  for (const char* override_value : {"high_precision", "dequantized"}) {
    const auto [fused, unfused] =
        both(recipe("Float8CurrentScaling", "HYBRID", {{"backward_override", override_value}}));
    expect_gemm_close(fused.dx, unfused.dx, override_value);
    expect_gemm_close(fused.dw, unfused.dw, override_value);
  }
}

TEST(Fp8QuantizationPoints, NeedARecipeAndDescribeThemselves) {
  const QuantizationPoints points = linear_scale_points(1.5);
  EXPECT_EQ(points.describe(), "op 0: backward GEMMs alpha 1.5; op 1: gradient passed through");
  EXPECT_EQ(QuantizationPoints{}.describe(), "the basic ops'");
  EXPECT_TRUE(QuantizationPoints{}.empty());
  EXPECT_NE(points, QuantizationPoints{});
  ReferenceQuantization none;
  EXPECT_THAT(error_message([&] { none.set_points(points); }), HasSubstr("need a recipe"));
  none.set_points({});  // the basic ops' points need none
  ReferenceQuantization with(recipe("DelayedScaling", "HYBRID"));
  with.set_points(points);
  EXPECT_EQ(with.backward_gemm_alpha(0), 1.5);
  EXPECT_EQ(with.backward_gemm_alpha(1), 1.0);
  EXPECT_TRUE(with.gradient_passthrough(1));
  EXPECT_FALSE(with.gradient_passthrough(0));
}

TEST(Fp8Linear, BackwardOverrideHighPrecisionAndDequantized) {
  for (const char* name : {"Float8CurrentScaling", "Float8BlockScaling"}) {
    const bool block = std::string(name) == "Float8BlockScaling";
    const Groups x_row = block ? Groups::kRows : Groups::kTensor;
    const LinearRun high = run_linear(recipe(name, "E4M3", {{"backward_override", "high_precision"}}), 305);
    const LinearRun deq = run_linear(recipe(name, "E4M3", {{"backward_override", "dequantized"}}), 305);
    const at::Tensor xq = hand_qdq(high.x, Fp8Format::kE4M3, x_row, block);
    const at::Tensor wq = hand_qdq(high.w, Fp8Format::kE4M3, Groups::kTensor, block);
    // Both forwards quantized; backwards on an unquantized dy.
    expect_gemm_close(high.y, xq.mm(wq.t()), name);
    expect_gemm_close(deq.y, xq.mm(wq.t()), name);
    expect_gemm_close(high.dx, high.g.mm(high.w), name);      // dy · W
    expect_gemm_close(high.dw, high.g.t().mm(high.x), name);  // dyᵀ · x
    expect_gemm_close(deq.dx, deq.g.mm(wq), name);            // dy · dq(Qw(W))
    expect_gemm_close(deq.dw, deq.g.t().mm(xq), name);        // dyᵀ · dq(Qi(x)), row-wise copy
  }
}

TEST(Fp8Linear, GroupedLinearQuantizesPerGroupAndAddsBiasInHighPrecision) {
  at::Generator gen = make_generator(306);
  auto grouped = std::make_shared<GroupedLinear>(GroupedLinearOptions(2, 3, 2).bias(true), test_options());
  Sequential seq({grouped}, FusionRegistry{});
  at::Tensor x = seeded_randn({5, 3}, gen, at::kDouble, true);
  {
    at::NoGradGuard no_grad;
    x.narrow(0, 3, 2).mul_(0.01);  // group 1 far smaller: its own scale matters
  }
  const at::Tensor g = cpu(seeded_randn({5, 2}, gen));
  ReferenceQuantization quantization(recipe("Float8CurrentScaling", "E4M3"));
  ReferenceEvaluator ref(seq);
  ref.set_quantization(&quantization);
  const at::Tensor y = cpu(ref.forward(x, {testing::int_tensor({3, 2})})[0]);
  const ReferenceGradients grads = ref.backward({g});
  const at::Tensor xc = cpu(x);
  const at::Tensor w = cpu(grouped->weight());
  const at::Tensor b = cpu(grouped->bias());
  for (int64_t grp = 0; grp < 2; ++grp) {
    const int64_t begin = grp == 0 ? 0 : 3;
    const int64_t n = grp == 0 ? 3 : 2;
    const at::Tensor xq = hand_qdq(xc.narrow(0, begin, n), Fp8Format::kE4M3, Groups::kTensor, false);
    const at::Tensor wq = hand_qdq(w[grp], Fp8Format::kE4M3, Groups::kTensor, false);
    const at::Tensor gq = hand_qdq(g.narrow(0, begin, n), Fp8Format::kE4M3, Groups::kTensor, false);
    expect_gemm_close(y.narrow(0, begin, n), xq.mm(wq.t()) + b[grp], "grouped y");
    expect_gemm_close(cpu(grads.grad_input).narrow(0, begin, n), gq.mm(wq), "grouped dx");
    expect_gemm_close(cpu(grads.grad_params[0][0])[grp], gq.t().mm(xq), "grouped dW");
    // The bias gradient from the unquantized dy.
    expect_gemm_close(cpu(grads.grad_params[0][1])[grp], g.narrow(0, begin, n).sum(0), "grouped db");
  }
}

// ---------------------------------------------------------------------------------------
// A GroupedLinear whose next op casts its gradient (TE: the next op casts with group 0's
// grad_output quantizer; grouped_linear.py: _fuser_backward_split_quantize reduces the bias
// and scales gradients from the dequantized FP8 dy and quantizes it per group again)

/// GroupedLinear [groups 2, in 3, out 4, bias, scale_bias] then `next` (nullptr: nothing after
/// it; `boundary`: a plain module between them) under `r`, rows 5 split {3, 2}; the cotangent
/// of group 0's rows is 1/64 of group 1's, so the whole tensor's amax is group 1's.
struct GroupedNextRun {
  at::Tensor x, w, b, s, g, y, dx, dw, db, ds;
  std::unique_ptr<ReferenceQuantization> quantization;
};

GroupedNextRun run_grouped_next(const QuantRecipe& r, const BasicOpPtr& next, bool boundary, uint64_t seed) {
  at::Generator gen = make_generator(seed);
  auto grouped =
      std::make_shared<GroupedLinear>(GroupedLinearOptions(2, 3, 4).bias(true).scale_bias(true), test_options());
  // Each list whole (GCC 12's -Wstringop-overflow misreads a variant grown by emplace_back).
  const Module first = BasicOpPtr(grouped);
  const std::vector<Module> modules = boundary && next ? std::vector<Module>{first, make_boundary(), next}
                                      : boundary       ? std::vector<Module>{first, make_boundary()}
                                      : next           ? std::vector<Module>{first, next}
                                                       : std::vector<Module>{first};
  Sequential seq(modules, FusionRegistry{});
  GroupedNextRun run;
  run.x = seeded_randn({5, 3}, gen, at::kDouble, true);
  run.s = seeded_randn({5}, gen, at::kDouble, true);
  run.g = cpu(seeded_randn({5, 4}, gen));
  run.g.narrow(0, 0, 3).div_(64);
  run.w = cpu(grouped->weight());
  run.b = cpu(grouped->bias());
  run.quantization = std::make_unique<ReferenceQuantization>(r);
  ReferenceEvaluator ref(seq);
  ref.set_quantization(run.quantization.get());
  run.y = cpu(ref.forward(run.x, {testing::int_tensor({3, 2}), run.s})[0]);
  const ReferenceGradients grads = ref.backward({run.g});
  run.dx = cpu(grads.grad_input);
  run.dw = cpu(grads.grad_params[0][0]);
  run.db = cpu(grads.grad_params[0][1]);
  run.ds = cpu(grads.grad_extra_inputs.at(1));
  run.x = cpu(run.x);
  run.s = cpu(run.s);
  return run;
}

/// What the GroupedLinear of `run` must give when the gradient reaching it is `dy` and that
/// arrives as `dy_cast` (dy itself, or its whole-tensor quantize-dequantize): the bias and
/// scales gradients reduced from dy_cast, each group's GEMMs on dy_cast quantized per group
/// (`per_group`, fixed_scale as hand_qdq takes it).
void expect_grouped_gradients(const GroupedNextRun& run, const at::Tensor& dy_cast, Fp8Format grad_format,
                              float fixed_scale, const std::string& what) {
  for (int64_t grp = 0; grp < 2; ++grp) {
    const int64_t begin = grp == 0 ? 0 : 3;
    const int64_t n = grp == 0 ? 3 : 2;
    const at::Tensor dy_g = dy_cast.narrow(0, begin, n);
    const at::Tensor s_g = run.s.narrow(0, begin, n);
    const at::Tensor xq = hand_qdq(run.x.narrow(0, begin, n), Fp8Format::kE4M3, Groups::kTensor, false, fixed_scale);
    const at::Tensor wq = hand_qdq(run.w[grp], Fp8Format::kE4M3, Groups::kTensor, false, fixed_scale);
    const at::Tensor gq = hand_qdq(dy_g, grad_format, Groups::kTensor, false, fixed_scale);
    const std::string where = what + ", group " + std::to_string(grp);
    // Σ_r dy [n, out] · s [n, 1] -> db [out]; dy [n, out] · b [out] -> ds [n]
    expect_gemm_close(run.db[grp], (dy_g * s_g.unsqueeze(1)).sum(0), (where + ": bias grad").c_str());
    expect_gemm_close(run.ds.narrow(0, begin, n), dy_g.mv(run.b[grp]), (where + ": scales grad").c_str());
    expect_gemm_close(run.dx.narrow(0, begin, n), gq.mm(wq), (where + ": dgrad").c_str());
    expect_gemm_close(run.dw[grp], gq.t().mm(xq), (where + ": wgrad").c_str());
  }
}

// The H200 false positive (tests/backends/data/te-open-grouped-dbias.json: GroupedLinear ->
// GELU under DelayedScaling HYBRID): the bias and scales gradients come from the E5M2
// quantize-dequantize of the whole dy at group 0's scale (1 at the first call), and group 0's
// history records the whole tensor's amax.
TEST(Fp8GroupedLinearGradientCast, BiasAndScalesGradientsComeFromTheCastGradientUnderDelayedScaling) {
  const QuantRecipe delayed = recipe("DelayedScaling", "HYBRID", {{"amax_history_len", "2"}});
  const GroupedNextRun run = run_grouped_next(delayed, std::make_shared<Bias>(4, test_options()), false, 331);
  // Bias passes the gradient through: dy = g.
  const at::Tensor dy_cast = hand_qdq(run.g, Fp8Format::kE5M2, Groups::kTensor, false, 1.0F);
  expect_grouped_gradients(run, dy_cast, Fp8Format::kE5M2, 1.0F, "DelayedScaling, Bias next");
  // Not the unquantized reduction.
  for (int64_t grp = 0; grp < 2; ++grp) {
    const int64_t begin = grp == 0 ? 0 : 3;
    const int64_t n = grp == 0 ? 3 : 2;
    const at::Tensor unquantized = (run.g.narrow(0, begin, n) * run.s.narrow(0, begin, n).unsqueeze(1)).sum(0);
    EXPECT_FALSE(run.db[grp].allclose(unquantized, 1e-6, 1e-9)) << "group " << grp;
  }
  // Group 0's history (rolled once by the backward update) holds the whole tensor's amax
  // (its cast); group 1's the amax of its part of the dequantized tensor (split_quantize).
  const float whole = run.g.abs().max().item<float>();
  const float part1 = dy_cast.narrow(0, 3, 2).abs().max().item<float>();
  EXPECT_NE(whole, part1);
  EXPECT_EQ(run.quantization->amax_history(0, QuantRole::kGradOutput, 0)[1], whole);
  EXPECT_EQ(run.quantization->amax_history(0, QuantRole::kGradOutput, 1)[1], part1);
  EXPECT_EQ(run.quantization->delayed_scale(0, QuantRole::kGradOutput, 0), 57344.0F / whole);
}

TEST(Fp8GroupedLinearGradientCast, GeluNextCastsWithGroupZerosQuantizer) {
  const QuantRecipe delayed = recipe("DelayedScaling", "HYBRID");
  const GroupedNextRun run = run_grouped_next(delayed, std::make_shared<GELU>(), false, 332);
  // y = dq(Qi(x_g)) · dq(Qw(W_g))ᵀ + s ⊗ b_g per group (scale 1), then dy = g ⊙ gelu'(y).
  std::vector<at::Tensor> parts;
  for (int64_t grp = 0; grp < 2; ++grp) {
    const int64_t begin = grp == 0 ? 0 : 3;
    const int64_t n = grp == 0 ? 3 : 2;
    const at::Tensor xq = hand_qdq(run.x.narrow(0, begin, n), Fp8Format::kE4M3, Groups::kTensor, false, 1.0F);
    const at::Tensor wq = hand_qdq(run.w[grp], Fp8Format::kE4M3, Groups::kTensor, false, 1.0F);
    parts.push_back(xq.mm(wq.t()) + at::outer(run.s.narrow(0, begin, n), run.b[grp]));
  }
  const at::Tensor y = at::cat(parts, 0).requires_grad_(true);
  expect_gemm_close(run.y, at::gelu(y.detach(), "tanh"), "GELU output");
  const at::Tensor dy = torch::autograd::grad({at::gelu(y, "tanh")}, {y}, {run.g})[0].detach();
  const at::Tensor dy_cast = hand_qdq(dy, Fp8Format::kE5M2, Groups::kTensor, false, 1.0F);
  expect_grouped_gradients(run, dy_cast, Fp8Format::kE5M2, 1.0F, "DelayedScaling, GELU next");
}

// Under current scaling the cast takes the whole tensor's amax; each group's GEMMs then
// quantize their part of the dequantized tensor at their own scale (a second rounding).
TEST(Fp8GroupedLinearGradientCast, CurrentScalingCastsTheWholeTensorThenEachGroupAgain) {
  const GroupedNextRun run =
      run_grouped_next(recipe("Float8CurrentScaling", "HYBRID"), std::make_shared<Bias>(4, test_options()), false, 333);
  const at::Tensor dy_cast = hand_qdq(run.g, Fp8Format::kE5M2, Groups::kTensor, false);
  expect_grouped_gradients(run, dy_cast, Fp8Format::kE5M2, 0, "Float8CurrentScaling, Bias next");
}

// No cast: an op that does not cast (ConstantScale), a plain module between them (another
// fuser), a Linear under current scaling (TE raises there), an activation or Bias under a
// backward_override (Bias drops the quantizer; the activation's cast is TE's open defect and
// the override's high-precision gradient the reference's contract).
TEST(Fp8GroupedLinearGradientCast, NothingCastsWhereTeHandsNoQuantizerOrTheOverrideHoldsTheGradient) {
  const QuantRecipe delayed = recipe("DelayedScaling", "HYBRID");
  {
    const GroupedNextRun run = run_grouped_next(delayed, std::make_shared<ConstantScale>(1.0), false, 334);
    expect_grouped_gradients(run, run.g, Fp8Format::kE5M2, 1.0F, "ConstantScale next");
  }
  {
    const GroupedNextRun run = run_grouped_next(delayed, std::make_shared<Bias>(4, test_options()), true, 335);
    expect_grouped_gradients(run, run.g, Fp8Format::kE5M2, 1.0F, "Bias after a boundary");
  }
  {
    const GroupedNextRun run = run_grouped_next(delayed, nullptr, false, 336);
    expect_grouped_gradients(run, run.g, Fp8Format::kE5M2, 1.0F, "nothing next");
  }
  const QuantRecipe current = recipe("Float8CurrentScaling", "HYBRID");
  EXPECT_FALSE(Linear(LinearOptions(4, 2)).casts_grad_input_for_previous_op(current));
  EXPECT_TRUE(Linear(LinearOptions(4, 2)).casts_grad_input_for_previous_op(delayed));
  const QuantRecipe high = recipe("Float8CurrentScaling", "HYBRID", {{"backward_override", "high_precision"}});
  EXPECT_FALSE(Bias(4).casts_grad_input_for_previous_op(high));
  EXPECT_TRUE(Bias(4).casts_grad_input_for_previous_op(current));
  EXPECT_TRUE(GELU().casts_grad_input_for_previous_op(high));  // TE's activation casts even so
  EXPECT_FALSE(SwiGLU(2).casts_grad_input_for_previous_op(current));
  EXPECT_TRUE(SwiGLU(0).casts_grad_input_for_previous_op(current));
  {
    // Under the override the GroupedLinear's backward stays in high precision: dy = g ⊙
    // srelu'(y), y from the quantized forward (current scaling per group), reduced as it is.
    const GroupedNextRun run = run_grouped_next(high, std::make_shared<SReLU>(), false, 337);
    for (int64_t grp = 0; grp < 2; ++grp) {
      const int64_t begin = grp == 0 ? 0 : 3;
      const int64_t n = grp == 0 ? 3 : 2;
      const at::Tensor s_g = run.s.narrow(0, begin, n);
      const at::Tensor xq = hand_qdq(run.x.narrow(0, begin, n), Fp8Format::kE4M3, Groups::kTensor, false);
      const at::Tensor wq = hand_qdq(run.w[grp], Fp8Format::kE4M3, Groups::kTensor, false);
      const at::Tensor y = xq.mm(wq.t()) + at::outer(s_g, run.b[grp]);
      const at::Tensor dy = run.g.narrow(0, begin, n) * 2 * at::relu(y);
      expect_gemm_close(run.db[grp], (dy * s_g.unsqueeze(1)).sum(0), "override: bias grad");
      expect_gemm_close(run.ds.narrow(0, begin, n), dy.mv(run.b[grp]), "override: scales grad");
      expect_gemm_close(run.dx.narrow(0, begin, n), dy.mm(run.w[grp]), "override: dgrad");
    }
  }
}

// ---------------------------------------------------------------------------------------
// cache_quantized_input

TEST(Fp8CachedInput, ValueOfTheInputGradientAtItsQuantizeDequantize) {
  at::Generator gen = make_generator(307);
  const at::Tensor x = seeded_randn({4, 6}, gen, at::kDouble, true).cpu().detach().requires_grad_(true);
  const at::Tensor cached = reference_cached_input(x);
  const at::Tensor xq = hand_qdq(x, Fp8Format::kE4M3, Groups::kTensor, false);
  EXPECT_TRUE(cached.detach().equal(xq));
  const at::Tensor y = value_with_gradient_of(at::gelu(x, "tanh"), at::gelu(cached, "tanh"));
  EXPECT_TRUE(y.detach().equal(at::gelu(x.detach(), "tanh")));  // the forward used x itself
  const at::Tensor g = at::randn({4, 6}, gen, at::TensorOptions().dtype(at::kDouble));
  const at::Tensor dx = torch::autograd::grad({y}, {x}, {g})[0];
  const at::Tensor at_q = xq.clone().requires_grad_(true);
  const at::Tensor expected = torch::autograd::grad({at::gelu(at_q, "tanh")}, {at_q}, {g})[0];
  EXPECT_TRUE(dx.equal(expected));  // g · gelu'(dq(Q(x))), the same float64 ops
  EXPECT_FALSE(dx.allclose(torch::autograd::grad({at::gelu(x, "tanh")}, {x}, {g})[0], 1e-6, 0));
}

TEST(Fp8CachedInput, ModelAndReferenceRoundAlikeInFloat32AndFloat64) {
  // The model's hand-written E4M3 rounding (activation_math::cached_input) against the
  // reference's LibTorch cast, on log-uniform magnitudes: exactly equal (each is one correct
  // rounding of the same exact product in these dtypes).
  at::Generator gen = make_generator(308);
  const at::Tensor u = at::rand({200, 50}, gen, at::TensorOptions().dtype(at::kDouble));
  const at::Tensor x = at::exp2(u * 30.0 - 20.0) * at::where(u < 0.4, -1.0, 1.0);
  ReferenceQuantization none;
  for (at::ScalarType dtype : {at::kFloat, at::kDouble}) {
    const at::Tensor xt = x.to(dtype);
    const at::Tensor model = activation_math::cached_input(xt);
    EXPECT_TRUE(model.equal(none.quantize_cached_input(xt))) << c10::toString(dtype);
  }
}

// ---------------------------------------------------------------------------------------
// Jitter

/// The FP8 codes of dq values at a per-tensor `scale`.
at::Tensor codes(const at::Tensor& dq, float scale, Fp8Format format) {
  return cast_to_fp8(dq, at::full({}, scale), format).contiguous().view(at::kByte).to(at::kInt);
}

TEST(Fp8Jitter, MovesEveryEligibleElementByExactlyOneFp8Ulp) {
  at::Generator gen = make_generator(309);
  at::Tensor x = at::randn({40, 30}, gen, at::TensorOptions().dtype(at::kDouble));
  x[0][0] = 0.0;    // exactly zero: stays
  x[0][1] = 1e-30;  // quantizes to zero: may move to the smallest subnormal
  x[0][2] = -30.0;  // the amax: on -max, can only move inwards
  for (const char* format : {"E4M3", "HYBRID"}) {
    const Fp8Format f = std::string(format) == "E4M3" ? Fp8Format::kE4M3 : Fp8Format::kE5M2;
    ReferenceQuantization plain(recipe("Float8CurrentScaling", format));
    ReferenceQuantization jittered(recipe("Float8CurrentScaling", format));
    jittered.set_jitter(1.0, make_generator(310));
    const at::Tensor a = plain.quantize(QuantRole::kGradOutput, 0, x).rowwise;
    const at::Tensor b = jittered.quantize(QuantRole::kGradOutput, 0, x).rowwise;
    const float scale = fp8_max(f) / 30.0F;
    const at::Tensor ca = codes(a, scale, f);
    const at::Tensor cb = codes(b, scale, f);
    const at::Tensor step = at::bitwise_and(cb, 0x7F) - at::bitwise_and(ca, 0x7F);
    EXPECT_TRUE(at::bitwise_and(ca, 0x80).equal(at::bitwise_and(cb, 0x80))) << format << ": signs kept";
    at::Tensor moved = step.abs() == 1;
    moved[0][0] = true;  // checked apart below
    EXPECT_TRUE(moved.all().item<bool>()) << format << ": a step other than one code";
    EXPECT_EQ(b[0][0].item<double>(), 0.0) << format;
    EXPECT_EQ(step[0][1].item<int>(), 1) << format << ": away from zero";
    EXPECT_EQ(step[0][2].item<int>(), -1) << format << ": in from -max";
    // Both directions happen.
    EXPECT_GT((step == 1).sum().item<int64_t>(), 100) << format;
    EXPECT_GT((step == -1).sum().item<int64_t>(), 100) << format;
  }
}

TEST(Fp8Jitter, ProbabilityZeroChangesNothingAndTheDrawIsSeeded) {
  at::Generator gen = make_generator(311);
  const at::Tensor x = at::randn({50, 40}, gen, at::TensorOptions().dtype(at::kDouble));
  const QuantRecipe r = recipe("Float8CurrentScaling", "E4M3");
  ReferenceQuantization plain(r);
  ReferenceQuantization zero(r);
  zero.set_jitter(0.0, make_generator(1));
  const at::Tensor a = plain.quantize(QuantRole::kInput, 0, x).rowwise;
  EXPECT_TRUE(zero.quantize(QuantRole::kInput, 0, x).rowwise.equal(a));
  ReferenceQuantization half1(r);
  ReferenceQuantization half2(r);
  half1.set_jitter(0.5, make_generator(2));
  half2.set_jitter(0.5, make_generator(2));
  const at::Tensor b1 = half1.quantize(QuantRole::kInput, 0, x).rowwise;
  EXPECT_TRUE(b1.equal(half2.quantize(QuantRole::kInput, 0, x).rowwise));  // same seed, same moves
  // 2000 Bernoulli(0.5) draws: the fraction moved lies within 0.5 +- 0.1 (9 standard deviations).
  const double fraction = (b1 != a).to(at::kDouble).mean().item<double>();
  EXPECT_NEAR(fraction, 0.5, 0.1);
  half1.clear_jitter();
  EXPECT_TRUE(half1.quantize(QuantRole::kInput, 0, x).rowwise.equal(a));
}

TEST(Fp8RoundingMargin, IsTheDistanceToTheBoundaryOnTheValuesSide) {
  const auto margins = [](std::vector<double> v, Fp8Format f) {
    const at::Tensor m = fp8_rounding_margin(at::tensor(v, at::TensorOptions().dtype(at::kDouble)), f);
    return std::vector<double>(m.data_ptr<double>(), m.data_ptr<double>() + m.numel());
  };
  // E4M3 around 1 and 2: spacing 1/8 in [1, 2), 1/4 in [2, 4).
  const auto e4 = margins({1.0625, 1.0, 1.9, 2.05, -1.1, 0.0, 500.0}, Fp8Format::kE4M3);
  EXPECT_DOUBLE_EQ(e4[0], 0.0);               // a tie: on the boundary
  EXPECT_DOUBLE_EQ(e4[1], 0.0625);            // an FP8 value: half a spacing from either side
  EXPECT_NEAR(e4[2], 0.0625 - 0.025, 1e-15);  // 1.9 -> 1.875, the boundary above at 1.9375
  EXPECT_NEAR(e4[3], 0.125 - 0.05, 1e-15);    // 2.05 -> 2, the boundary above at 2.125
  EXPECT_NEAR(e4[4], 0.0625 - 0.025, 1e-15);  // -1.1 -> -1.125, the sign does not matter
  EXPECT_TRUE(std::isinf(e4[5]));             // zero stays zero everywhere
  EXPECT_TRUE(std::isinf(e4[6]));             // beyond max the cast saturates
  // E5M2: spacing 1/4 in [1, 2); subnormals at 2^-16 below 2^-14.
  const auto e5 = margins({1.1, std::ldexp(3.0, -17)}, Fp8Format::kE5M2);
  EXPECT_NEAR(e5[0], 0.125 - 0.1, 1e-15);
  EXPECT_NEAR(e5[1], std::ldexp(1.0, -17) - std::ldexp(1.0, -17), 1e-30);  // a subnormal tie
}

/// The reference's plain (unjittered) quantization of `x` as an input: its dequantized values
/// and the scaled values it records (one tensor), what the jitter tests start from.
std::pair<at::Tensor, std::vector<at::Tensor>> plain_input_quantization(const QuantRecipe& r, const at::Tensor& x) {
  std::vector<at::Tensor> recorded;
  ReferenceQuantization plain(r);
  plain.record_scaled(&recorded);
  const at::Tensor a = plain.quantize(QuantRole::kInput, 0, x).rowwise;
  return {a, std::move(recorded)};
}

TEST(Fp8Jitter, WindowsMoveOnlyElementsNearABoundaryFromTheReferencesCodes) {
  at::Generator gen = make_generator(312);
  const at::Tensor x = at::randn({60, 50}, gen, at::TensorOptions().dtype(at::kDouble));
  const QuantRecipe r = recipe("Float8CurrentScaling", "E4M3");
  // The reference's scaled values, recorded by a plain evaluation.
  const auto [a, recorded] = plain_input_quantization(r, x);
  ASSERT_EQ(recorded.size(), 1U);
  const at::Tensor margin = fp8_rounding_margin(recorded[0], Fp8Format::kE4M3);
  // Zero windows: nothing moves, whatever the probability.
  ReferenceQuantization none(r);
  none.set_jitter(1.0, make_generator(3), recorded, {at::zeros_like(recorded[0])});
  EXPECT_TRUE(none.quantize(QuantRole::kInput, 0, x).rowwise.equal(a));
  // A window of 0.02: exactly the elements closer than that to a boundary move, each by one
  // code; with a slightly different input (x (1 + 2^-20)) the result is still built on the
  // reference's codes.
  const at::Tensor window = at::full_like(recorded[0], 0.02);
  ReferenceQuantization some(r);
  some.set_jitter(1.0, make_generator(4), recorded, {window});
  const at::Tensor b = some.quantize(QuantRole::kInput, 0, x * (1 + std::ldexp(1.0, -20))).rowwise;
  const at::Tensor near = margin < 0.02;
  ASSERT_GT(near.sum().item<int64_t>(), 50);
  ASSERT_LT(near.sum().item<int64_t>(), x.numel() / 2);
  // b's own scale is a's times (1 - 2^-20) or so: an unmoved element is a's code at that
  // scale (relatively 2^-20 off a), a moved one is a whole FP8 code away (over 2^-5).
  const at::Tensor moved = (b - a).abs() > 1e-4 * a.abs();
  EXPECT_TRUE(moved.equal(near)) << (moved != near).sum().item<int64_t>() << " elements differ";
  // A quantization past the windows' end rounds its own values and may move every element.
  const at::Tensor c = some.quantize(QuantRole::kInput, 0, x).rowwise;
  EXPECT_GT((c != a).sum().item<int64_t>(), x.numel() / 2);
}

// A window is measured per element from one rounding of the upstream values (the
// baseline's), so it is zero wherever the baseline happened to round to the reference's
// value, while another correct implementation rounds otherwise there (the torch emulation of
// tests/backends/data/torch-fp8-zero-window-tie.json: its scaled value 2 fp32 ulps off the
// reference's, on an FP8 midpoint, where the baseline's was the reference's). Each element's
// window is therefore at least twice the median window of its row: with windows of
// 2^-6 |reference| on four fifths of the elements and 0 on the rest (a fifth of a float32
// GroupedLinear output's windows were 0), elements of both kinds move, exactly those closer
// to a boundary than that (a window of one size everywhere stays as it is: the test above).
TEST(Fp8Jitter, AZeroWindowIsRaisedToTwiceItsRowsMedianWindow) {
  at::Generator gen = make_generator(313);
  const at::Tensor x = at::randn({60, 50}, gen, at::TensorOptions().dtype(at::kDouble));
  const QuantRecipe r = recipe("Float8CurrentScaling", "E4M3");
  const auto [a, recorded] = plain_input_quantization(r, x);
  ASSERT_EQ(recorded.size(), 1U);
  const at::Tensor reference = recorded[0];
  const at::Tensor zero =
      (at::arange(reference.numel(), at::TensorOptions().dtype(at::kLong)) % 5 == 0).reshape(reference.sizes());
  const at::Tensor window = at::where(zero, at::zeros_like(reference), std::ldexp(1.0, -6) * reference.abs());
  ReferenceQuantization jittered(r);
  jittered.set_jitter(1.0, make_generator(5), recorded, {window});
  const at::Tensor moved = jittered.quantize(QuantRole::kInput, 0, x).rowwise != a;
  const at::Tensor margin = fp8_rounding_margin(reference, Fp8Format::kE4M3);
  const at::Tensor row_median = std::get<0>(window.median(1, /*keepdim=*/true)).expand_as(window);
  const at::Tensor near = margin < at::maximum(window, 2 * row_median);
  EXPECT_TRUE(moved.equal(near)) << moved.sum().item<int64_t>() << " moved, " << near.sum().item<int64_t>()
                                 << " near a boundary";
  // Elements whose own window is 0 move too, where they lie that close to a boundary.
  EXPECT_GT(at::logical_and(moved, zero).sum().item<int64_t>(), 10);
}

// An element that comes out of a cancellation has an upstream error on the scale of its
// row's terms, not of its own value (tests/backends/data/torch-fp8-row-cancellation.json: a
// Linear's incoming gradient 0.037 = -0.665 + 0.702, the torch emulation's value 8.9e-6
// relative off the reference's, the baseline's 2.5e-6, one E4M3 step 8.5x a norm bound).
// With windows on one row only (0, 4, 1, 1 on its columns in turn: median 1, largest 4) and
// 0 on every other row, exactly the elements of that row closer to a boundary than their own
// window or twice the row's median window (2) move, among them elements whose own window
// (0 or 1) is smaller, and no element of another row moves. (The floor stops at the row's
// largest window: a window of one size everywhere stays as it is, the test above.)
TEST(Fp8Jitter, AWindowIsAtLeastTwiceItsRowsMedianWindow) {
  at::Generator gen = make_generator(317);
  const at::Tensor x = 30 * at::randn({16, 64}, gen, at::TensorOptions().dtype(at::kDouble));
  const QuantRecipe r = recipe("Float8CurrentScaling", "E4M3");
  const auto [a, recorded] = plain_input_quantization(r, x);
  ASSERT_EQ(recorded.size(), 1U);
  const at::Tensor reference = recorded[0];
  const auto options = at::TensorOptions().dtype(at::kLong);
  const at::Tensor row = at::arange(16, options).reshape({16, 1}).expand({16, 64});
  const at::Tensor column = at::arange(64, options).reshape({1, 64}).expand({16, 64});
  const at::Tensor in_row =
      at::where(column % 4 == 0, at::zeros_like(reference),
                at::where(column % 4 == 1, at::full_like(reference, 4.0), at::ones_like(reference)));
  const at::Tensor window = at::where(row == 3, in_row, at::zeros_like(reference));
  ReferenceQuantization jittered(r);
  jittered.set_jitter(1.0, make_generator(6), recorded, {window});
  const at::Tensor moved = jittered.quantize(QuantRole::kInput, 0, x).rowwise != a;
  const at::Tensor margin = fp8_rounding_margin(reference, Fp8Format::kE4M3);
  const at::Tensor near = at::logical_and(row == 3, margin < at::maximum(window, at::full_like(window, 2.0)));
  EXPECT_TRUE(moved.equal(near)) << moved.sum().item<int64_t>() << " moved, " << near.sum().item<int64_t>()
                                 << " near a boundary";
  EXPECT_EQ(at::logical_and(moved, row != 3).sum().item<int64_t>(), 0);
  // Moved where only the row's median reaches (own window 0 or 1, margin at least that).
  const at::Tensor beyond_own = at::logical_and(moved, margin >= window);
  EXPECT_GE(beyond_own.sum().item<int64_t>(), 3) << beyond_own.sum().item<int64_t>();
}

// ---------------------------------------------------------------------------------------
// Errors

TEST(QuantRecipe, ParsesDefaultsAndEveryOption) {
  const QuantRecipe delayed = recipe("DelayedScaling", "");
  EXPECT_EQ(delayed.kind, RecipeKind::kDelayedScaling);
  EXPECT_EQ(delayed.format, RecipeFormat::kHybrid);
  EXPECT_EQ(delayed.amax_history_len, 1024);
  EXPECT_EQ(delayed.margin, 0);
  const QuantRecipe block =
      recipe("Float8BlockScaling", "", {{"block_scaling_dims", "2,1,1"}, {"backward_override", "dequantized"}});
  EXPECT_EQ(block.format, RecipeFormat::kE4M3);
  EXPECT_EQ(block.x_block, BlockDims::k2D);
  EXPECT_EQ(block.w_block, BlockDims::k1D);
  EXPECT_EQ(block.scales, ScalePrecision::kPowerOf2);
  EXPECT_EQ(block.backward_override, BackwardOverride::kDequantized);
  EXPECT_EQ(block.format_for(QuantRole::kGradOutput), Fp8Format::kE4M3);
  EXPECT_EQ(recipe("Float8CurrentScaling", "HYBRID").format_for(QuantRole::kGradOutput), Fp8Format::kE5M2);
  EXPECT_EQ(recipe("Float8CurrentScaling", "HYBRID").format_for(QuantRole::kWeight), Fp8Format::kE4M3);
}

TEST(QuantRecipe, ErrorsNameTheRecipeTheOptionAndTheAllowedValues) {
  EXPECT_THAT(error_message([] {
                recipe("Float8CurrentScaling", "E4M3", {{"use_power_2_scales", "2"}});
              }),
              HasSubstr("Float8CurrentScaling: option 'use_power_2_scales' must be one of \"0\", \"1\", got \"2\""));
  EXPECT_THAT(error_message([] {
                recipe("DelayedScaling", "E4M3", {{"backward_override", "none"}});
              }),
              HasSubstr("DelayedScaling: unknown option 'backward_override'; known options: amax_compute_algo, "
                        "amax_history_len, margin"));
  EXPECT_THAT(error_message([] {
                recipe("DelayedScaling", "E4M3", {{"margin", "-1"}});
              }),
              HasSubstr("DelayedScaling: option 'margin' must be an integer in [0, 127], got \"-1\""));
  EXPECT_THAT(error_message([] {
                recipe("DelayedScaling", "E4M3", {{"amax_history_len", "0"}});
              }),
              HasSubstr("option 'amax_history_len' must be an integer in [1, 1048576], got \"0\""));
  EXPECT_THAT(error_message([] {
                recipe("Float8BlockScaling", "E4M3", {{"block_scaling_dims", "2,2,1"}});
              }),
              HasSubstr("Float8BlockScaling: option 'block_scaling_dims' must be one of \"1,2,1\", \"1,1,1\", "
                        "\"2,1,1\", \"1,1,2\", got \"2,2,1\""));
  EXPECT_THAT(error_message([] { recipe("Float8CurrentScaling", "E5M2"); }),
              HasSubstr("Float8CurrentScaling: fp8_format must be one of \"E4M3\", \"HYBRID\", got \"E5M2\""));
  EXPECT_THAT(error_message([] { recipe("MXFP8BlockScaling", "E4M3"); }),
              HasSubstr("unsupported-recipe: MXFP8BlockScaling: the reference does not emulate this recipe"));
  EXPECT_THAT(error_message([] { recipe("NVFP4BlockScaling", "E4M3"); }), HasSubstr("unsupported-recipe"));
  EXPECT_THAT(error_message([] { recipe("Float16Scaling", "E4M3"); }),
              HasSubstr("unknown-name: unknown recipe 'Float16Scaling'; known recipes: DelayedScaling"));
  EXPECT_THAT(error_message([] { ReferenceQuantization().set_jitter(1.5, make_generator(1)); }),
              HasSubstr("probability must be in [0, 1], got 1.5"));
  EXPECT_THAT(error_message([] { ReferenceQuantization().quantize(QuantRole::kInput, 0, at::ones({2})); }),
              HasSubstr("quantize needs a recipe; this one has none"));
  EXPECT_THAT(
      error_message([] { ReferenceQuantization(recipe("DelayedScaling", "")).delayed_scale(3, QuantRole::kWeight); }),
      HasSubstr("no delayed-scaling quantizer for op 3, group 0, role weight"));
}

// ---------------------------------------------------------------------------------------
// FP8 GEMM accumulation (Hopper's FP8 MMA: 13 fraction bits, 32 products per step)

Fp8GemmAccumulation hopper(std::vector<Fp8Gemm> fast = {}) {
  Fp8GemmAccumulation model;
  model.fast = std::move(fast);
  return model;
}

/// a [1, K] · b [K, 1] as a 1x1 tensor through emulate_fp8_gemm.
double emulated_dot(const std::vector<double>& a, const std::vector<double>& b, const Fp8GemmAccumulation& model,
                    Fp8Gemm gemm = Fp8Gemm::kFprop) {
  return emulate_fp8_gemm(row(a), row(b).t(), model, gemm).item<double>();
}

TEST(Fp8Accumulation, EachStepTruncatesTowardsZeroBelowItsLargestExponent) {
  const Fp8GemmAccumulation model = hopper();
  const double t = std::ldexp(1.0, -13);  // the unit of 13 fraction bits at exponent 0
  // A product below the step's unit is lost; one of 1.5 units keeps one; signs truncate
  // towards zero.
  EXPECT_EQ(emulated_dot({1.0, t / 2}, {1.0, 1.0}, model), 1.0);
  EXPECT_EQ(emulated_dot({1.0, 1.5 * t}, {1.0, 1.0}, model), 1.0 + t);
  EXPECT_EQ(emulated_dot({-1.0, -1.5 * t}, {1.0, 1.0}, model), -1.0 - t);
  // The sum's own leading bit: 1 + t plus 1 carries into exponent 1, whose unit is 2t.
  EXPECT_EQ(emulated_dot({1.0 + t, 1.0}, {1.0, 1.0}, model), 2.0);
  // The exact products are not rounded first: 3 · 0.375 = 1.125 is kept whole.
  EXPECT_EQ(emulated_dot({3.0}, {0.375}, model), 1.125);
  // Two steps of one product: the accumulator 2^10 makes the next step's unit 2^-3, so a
  // product of 0.1 is lost under fast accumulation and kept (to fp32) when each step is
  // promoted into the fp32 sum.
  Fp8GemmAccumulation fast = hopper({Fp8Gemm::kFprop});
  fast.products_per_step = 1;
  fast.promotion_products = 1;
  Fp8GemmAccumulation split = fast;
  split.fast.clear();
  EXPECT_EQ(emulated_dot({1024.0, 0.1}, {1.0, 1.0}, fast), 1024.0);
  EXPECT_EQ(emulated_dot({1024.0, 0.1}, {1.0, 1.0}, split),
            static_cast<double>(1024.0F + static_cast<float>(emulated_dot({0.1}, {1.0}, split))));
}

TEST(Fp8Accumulation, ReproducesThreeH200ValuesBitForBit) {
  // Operands (dequantized, power-of-2 block scales) of three elements TE 2.20.2 computed on
  // the H200 for one case (docs/gpu/2026-12-02 call-A te32, `mismatch|Linear|output`: a
  // Linear [16, 48] -> 16 under Float8BlockScaling 1,1,1; values from the case's seed).
  // TE's results, read from the report, are reproduced exactly; the exact sums are the
  // reference's.
  const Fp8GemmAccumulation model = hopper();  // block scaling: split accumulation
  const std::vector<double> fprop_x{
      0.46875, 2.25,    0.5625, -1.125, -1.0,     2.5,     -0.9375, 0.5,      0.8125, -1.75,  -0.5,   0.5,
      -1.0,    0.5625,  0.8125, -2.0,   -0.5625,  0.15625, -0.3125, -0.21875, -1.5,   1.25,   -0.625, -1.625,
      1.75,    0.21875, -0.5,   0.75,   -0.15625, 1.0,     0.5625,  -1.375,   -1.125, 0.5625, 0.375,  1.0,
      -2.0,    -0.8125, 1.375,  0.5625, 1.125,    -1.375,  0.5625,  -0.5625,  -0.5,   0.875,  1.625,  0.625};
  const std::vector<double> fprop_w{
      -0.171875,   -0.3125,     -0.21875,   0.0859375,  0.01171875,      -0.0390625,  0.0703125,   0.25,
      -0.0859375,  -0.04296875, 0.0859375,  0.02734375, -0.01171875,     0.05078125,  0.15625,     0.0859375,
      0.15625,     -0.1875,     0.28125,    0.1875,     -0.01171875,     -0.03515625, 0.017578125, -0.002685546875,
      -0.171875,   -0.125,      -0.0546875, -0.25,      -0.09375,        -0.171875,   0.017578125, 0.15625,
      0.025390625, 0.15625,     0.15625,    -0.09375,   0.0859375,       0.21875,     -0.21875,    -0.0018310546875,
      0.0625,      0.0546875,   0.1875,     -0.234375,  0.0013427734375, 0.125,       0.078125,    0.1875};
  EXPECT_EQ(emulated_dot(fprop_x, fprop_w, model, Fp8Gemm::kFprop), -2.25341796875);
  EXPECT_EQ(row(fprop_x).mm(row(fprop_w).t()).item<double>(), -2.2538070678710938);
  const std::vector<double> dgrad_dy{-1.625, -1.0,    0.46875, -1.5, -0.140625, -1.5,     1.75,     1.5,
                                     1.625,  0.28125, -2.5,    -0.5, 1.5,       -0.34375, -0.40625, -0.234375};
  const std::vector<double> dgrad_w{0.5,        -0.109375,  -0.0859375, 0.34375, -0.140625, -0.046875,
                                    0.0703125,  -0.0546875, -0.15625,   0.125,   0.3125,    -0.0013427734375,
                                    0.03515625, -0.28125,   0.01953125, 0.0625};
  EXPECT_EQ(emulated_dot(dgrad_dy, dgrad_w, model, Fp8Gemm::kDgrad), -2.000244140625);
  EXPECT_EQ(row(dgrad_dy).mm(row(dgrad_w).t()).item<double>(), -2.00042724609375);
  const std::vector<double> wgrad_dy{1.75,   1.25,  -1.5, 0.28125,     0.75, -0.625, -1.75,    0.375,
                                     0.9375, -2.25, -1.0, 0.017578125, 1.75, 1.75,   0.171875, -0.46875};
  const std::vector<double> wgrad_x{0.15625, -1.25, 0.875,   1.125,  -0.28125, 2.75,   -0.40625, 0.5625,
                                    -0.625,  2.25,  -0.1875, -0.375, 0.875,    -0.875, -0.625,   -0.875};
  EXPECT_EQ(emulated_dot(wgrad_dy, wgrad_x, model, Fp8Gemm::kWgrad), -8.45703125);
  EXPECT_EQ(row(wgrad_dy).mm(row(wgrad_x).t()).item<double>(), -8.457763671875);
  // Each is within its accumulation term, and the term is far below a 2^-7 scaling.
  for (const auto& [a, b] : {std::pair{fprop_x, fprop_w}, {dgrad_dy, dgrad_w}, {wgrad_dy, wgrad_x}}) {
    const double exact = row(a).mm(row(b).t()).item<double>();
    const double term = fp8_accumulation_term(row(a), row(b).t(), model, Fp8Gemm::kFprop).item<float>();
    EXPECT_LE(std::fabs(emulated_dot(a, b, model) - exact), term);
    EXPECT_LT(8 * term, std::fabs(exact) * (1 - std::ldexp(1.0, -7)) / 16);
  }
}

/// `n` FP8 E4M3 values (current scaling over the tensor) of a seeded [rows, cols] draw;
/// `positive`: their magnitudes (every product of one sign: the accumulator's worst case).
at::Tensor fp8_operand(int64_t rows, int64_t cols, uint64_t seed, bool positive) {
  at::Generator gen = make_generator(seed);
  at::Tensor x = seeded_randn({rows, cols}, gen).to(at::kCPU, at::kDouble);
  if (positive) x = x.abs();
  return hand_qdq(x, Fp8Format::kE4M3, Groups::kTensor, false);
}

TEST(Fp8Accumulation, TheTermCoversTheEmulatedErrorOfRandomGemms) {
  // The term is evidence for the oracle, which multiplies it by 4 (norm) and 8 (element);
  // against the emulated accumulator it holds on its own, element by element, for reductions
  // from one step to 32 (fast: the error grows with the accumulator), random signs and one
  // sign throughout.
  uint64_t seed = 700;
  for (const int64_t k : {16, 48, 64, 200, 1024}) {
    for (const bool positive : {false, true}) {
      for (const bool fast : {false, true}) {
        const Fp8GemmAccumulation model = fast ? hopper({Fp8Gemm::kFprop}) : hopper();
        const at::Tensor a = fp8_operand(6, k, ++seed, positive);
        const at::Tensor b = fp8_operand(k, 5, ++seed, positive);
        const at::Tensor exact = a.mm(b);
        const at::Tensor error = (emulate_fp8_gemm(a, b, model, Fp8Gemm::kFprop) - exact).abs();
        const at::Tensor term = fp8_accumulation_term(a, b, model, Fp8Gemm::kFprop).to(at::kDouble);
        const std::string what =
            "K " + std::to_string(k) + (positive ? " one sign" : " random signs") + (fast ? " fast" : " split");
        EXPECT_TRUE((error <= term).all().item<bool>()) << what << ": error\n" << error << "\nterm\n" << term;
        // Not a vacuous bound: the emulated error is there, and the term is a small part of
        // the result (a 2^-7 scaling is ~100%, a few percent error is far beyond it).
        EXPECT_GT(error.max().item<double>(), 0.0) << what;
        EXPECT_LT((term.norm() / exact.norm()).item<double>(), positive && fast ? 0.1 : 0.02) << what;
      }
    }
  }
}

/// One Linear [in -> out] with `rows` rows under `r`, its quantization set up by `setup`
/// before the forward; the seeded operands and results, float64 CPU.
LinearRun run_linear_with(const QuantRecipe& r, uint64_t seed, const std::function<void(ReferenceQuantization&)>& setup,
                          int64_t rows = 5, int64_t in = 40, int64_t out = 3) {
  at::Generator gen = make_generator(seed);
  auto linear = std::make_shared<Linear>(LinearOptions(in, out), test_options());
  Sequential seq({linear}, FusionRegistry{});
  LinearRun run;
  run.x = seeded_randn({rows, in}, gen, at::kDouble, true);
  run.g = cpu(seeded_randn({rows, out}, gen));
  run.w = cpu(linear->weight());
  ReferenceQuantization quantization(r);
  setup(quantization);
  ReferenceEvaluator ref(seq);
  ref.set_quantization(&quantization);
  run.y = cpu(ref.forward(run.x, {})[0]);
  const ReferenceGradients grads = ref.backward({run.g});
  run.dx = cpu(grads.grad_input);
  run.dw = cpu(grads.grad_params[0][0]);
  run.x = cpu(run.x);
  return run;
}

TEST(Fp8Accumulation, EachQuantizedGemmOfALinearTakesTheMode) {
  // Per-tensor current scaling (one copy of each operand) and 1D blocks (dgrad and wgrad on
  // the column-wise copies): the fprop, dgrad and wgrad results move by exactly their own
  // GEMM's term, up or down, or become the emulated accumulator's.
  struct Setting {
    const char* name;
    QuantRecipe recipe;
    Groups x_col, w_col, g_row, g_col;
    bool pow2;
  };
  const std::vector<Setting> settings{
      {"Float8CurrentScaling", recipe("Float8CurrentScaling", "E4M3"), Groups::kTensor, Groups::kTensor,
       Groups::kTensor, Groups::kTensor, false},
      {"Float8BlockScaling 1,1,1", recipe("Float8BlockScaling", "E4M3", {{"block_scaling_dims", "1,1,1"}}),
       Groups::kColumns, Groups::kColumns, Groups::kRows, Groups::kColumns, true},
  };
  const Fp8GemmAccumulation model = hopper({Fp8Gemm::kFprop});
  for (const Setting& s : settings) {
    const bool block = s.recipe.kind == RecipeKind::kFloat8BlockScaling;
    const LinearRun exact = run_linear_with(s.recipe, 311, [](ReferenceQuantization&) {});
    const at::Tensor xr = hand_qdq(exact.x, Fp8Format::kE4M3, block ? Groups::kRows : Groups::kTensor, s.pow2);
    const at::Tensor wr = hand_qdq(exact.w, Fp8Format::kE4M3, block ? Groups::kRows : Groups::kTensor, s.pow2);
    const at::Tensor xc = hand_qdq(exact.x, Fp8Format::kE4M3, s.x_col, s.pow2);
    const at::Tensor wc = hand_qdq(exact.w, Fp8Format::kE4M3, s.w_col, s.pow2);
    const at::Tensor gr = hand_qdq(exact.g, Fp8Format::kE4M3, s.g_row, s.pow2);
    const at::Tensor gc = hand_qdq(exact.g, Fp8Format::kE4M3, s.g_col, s.pow2);
    const at::Tensor t_fprop = fp8_accumulation_term(xr, wr.t(), model, Fp8Gemm::kFprop).to(at::kDouble);
    const at::Tensor t_dgrad = fp8_accumulation_term(gr, wc, model, Fp8Gemm::kDgrad).to(at::kDouble);
    const at::Tensor t_wgrad = fp8_accumulation_term(gc.t(), xc, model, Fp8Gemm::kWgrad).to(at::kDouble);
    for (const auto mode : {AccumulationMode::kPlus, AccumulationMode::kMinus}) {
      const double sign = mode == AccumulationMode::kPlus ? 1.0 : -1.0;
      const LinearRun moved =
          run_linear_with(s.recipe, 311, [&](ReferenceQuantization& q) { q.set_accumulation(model, mode); });
      EXPECT_TRUE((moved.y - exact.y).allclose(sign * t_fprop, 1e-9, 1e-12)) << s.name;
      EXPECT_TRUE((moved.dx - exact.dx).allclose(sign * t_dgrad, 1e-9, 1e-12)) << s.name;
      EXPECT_TRUE((moved.dw - exact.dw).allclose(sign * t_wgrad, 1e-9, 1e-12)) << s.name;
      EXPECT_GT(t_fprop.min().item<double>(), 0.0) << s.name;
    }
    const LinearRun random = run_linear_with(s.recipe, 311, [&](ReferenceQuantization& q) {
      q.set_accumulation(model, AccumulationMode::kRandomSign, make_generator(5));
    });
    const at::Tensor moved = random.dw - exact.dw;
    EXPECT_TRUE(moved.abs().allclose(t_wgrad, 1e-9, 1e-12)) << s.name;
    EXPECT_TRUE((moved > 0).any().item<bool>() && (moved < 0).any().item<bool>()) << s.name;
    const LinearRun emulated = run_linear_with(
        s.recipe, 311, [&](ReferenceQuantization& q) { q.set_accumulation(model, AccumulationMode::kEmulate); });
    EXPECT_TRUE(emulated.y.equal(emulate_fp8_gemm(xr, wr.t(), model, Fp8Gemm::kFprop))) << s.name;
    EXPECT_TRUE(emulated.dx.equal(emulate_fp8_gemm(gr, wc, model, Fp8Gemm::kDgrad))) << s.name;
    EXPECT_TRUE(emulated.dw.equal(emulate_fp8_gemm(gc.t(), xc, model, Fp8Gemm::kWgrad))) << s.name;
    EXPECT_FALSE(emulated.y.equal(exact.y)) << s.name;
  }
}

TEST(Fp8Accumulation, BackwardOverridesKeepTheirBackwardGemmsExact) {
  // high_precision and dequantized run dgrad and wgrad in the compute dtype: only the forward
  // product is an FP8 GEMM.
  const Fp8GemmAccumulation model = hopper({Fp8Gemm::kFprop});
  for (const char* override_value : {"high_precision", "dequantized"}) {
    const QuantRecipe r = recipe("Float8CurrentScaling", "E4M3", {{"backward_override", override_value}});
    const LinearRun exact = run_linear_with(r, 312, [](ReferenceQuantization&) {});
    const LinearRun moved =
        run_linear_with(r, 312, [&](ReferenceQuantization& q) { q.set_accumulation(model, AccumulationMode::kPlus); });
    EXPECT_FALSE(moved.y.equal(exact.y)) << override_value;
    EXPECT_TRUE(moved.dx.equal(exact.dx)) << override_value;
    EXPECT_TRUE(moved.dw.equal(exact.dw)) << override_value;
  }
}

TEST(Fp8Accumulation, ModelsAreCheckedAndRandomSignsNeedAGenerator) {
  Fp8GemmAccumulation bad = hopper();
  bad.promotion_products = 48;
  EXPECT_THAT(error_message([&] { bad.validate(); }),
              HasSubstr("promotion_products must be a positive multiple of products_per_step (32), got 48"));
  bad = hopper();
  bad.fraction_bits = 0;
  EXPECT_THAT(error_message([&] { bad.validate(); }), HasSubstr("fraction_bits must be in [1, 52], got 0"));
  EXPECT_THAT(error_message([] {
                ReferenceQuantization(recipe("DelayedScaling", "E4M3"))
                    .set_accumulation(hopper(), AccumulationMode::kRandomSign);
              }),
              HasSubstr("random signs need a CPU generator"));
  EXPECT_THAT(
      error_message([] {
        fp8_accumulation_term(at::ones({2, 3}, at::kDouble), at::ones({2, 3}, at::kDouble), hopper(), Fp8Gemm::kFprop);
      }),
      HasSubstr("fp8_accumulation_term: expected a [M, K] and b [K, N], got [2, 3] and [2, 3]"));
  EXPECT_STREQ(fp8_gemm_name(Fp8Gemm::kWgrad), "wgrad");
}

}  // namespace
}  // namespace gradfuzz::ops
