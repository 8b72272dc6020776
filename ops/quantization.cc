#include "ops/quantization.h"

#include <ATen/ATen.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "ops/errors.h"

namespace gradfuzz::ops {

const char* fp8_format_name(Fp8Format format) { return format == Fp8Format::kE4M3 ? "E4M3" : "E5M2"; }

float fp8_max(Fp8Format format) { return format == Fp8Format::kE4M3 ? 448.0F : 57344.0F; }

at::ScalarType fp8_scalar_type(Fp8Format format) {
  return format == Fp8Format::kE4M3 ? at::kFloat8_e4m3fn : at::kFloat8_e5m2;
}

const char* quant_role_name(QuantRole role) {
  switch (role) {
    case QuantRole::kInput:
      return "input";
    case QuantRole::kWeight:
      return "weight";
    case QuantRole::kGradOutput:
      return "grad_output";
  }
  return "?";
}

// ---------------------------------------------------------------------------------------
// The recipe

namespace {

/// One option of a recipe: its name, its allowed string values (empty: an integer in
/// [min, max]) and TE's default.
struct OptionSpec {
  const char* name;
  std::vector<const char*> values;
  int64_t min = 0;
  int64_t max = 0;
  const char* fallback;
};

/// A recipe of BACKENDS.md's table: its formats' default and its options.
struct RecipeSpecTable {
  RecipeKind kind;
  const char* name;
  RecipeFormat default_format;
  std::vector<OptionSpec> options;
};

const std::vector<RecipeSpecTable>& recipe_table() {
  static const std::vector<const char*> kOverrides{"none", "high_precision", "dequantized"};
  static const std::vector<const char*> kFlag{"0", "1"};
  // margin < 128: 2^margin must be a finite fp32 divisor; an amax history beyond 2^20 slots
  // is no recipe anyone runs (TE's default is 1024).
  static const std::vector<RecipeSpecTable> table{
      {RecipeKind::kDelayedScaling,
       "DelayedScaling",
       RecipeFormat::kHybrid,
       {{"amax_compute_algo", {"max", "most_recent"}, 0, 0, "max"},
        {"amax_history_len", {}, 1, int64_t{1} << 20, "1024"},
        {"margin", {}, 0, 127, "0"}}},
      {RecipeKind::kFloat8CurrentScaling,
       "Float8CurrentScaling",
       RecipeFormat::kHybrid,
       {{"backward_override", kOverrides, 0, 0, "none"}, {"use_power_2_scales", kFlag, 0, 0, "0"}}},
      {RecipeKind::kFloat8BlockScaling,
       "Float8BlockScaling",
       RecipeFormat::kE4M3,
       {{"backward_override", kOverrides, 0, 0, "none"},
        // (x, w, grad); Float8BlockScaling.__post_init__ refuses two 2D operands in one GEMM
        {"block_scaling_dims", {"1,2,1", "1,1,1", "2,1,1", "1,1,2"}, 0, 0, "1,2,1"},
        {"use_f32_scales", kFlag, 0, 0, "0"}}},
  };
  return table;
}

std::string quoted_list(const std::vector<const char*>& values) {
  std::string out;
  for (const char* v : values) out += (out.empty() ? "\"" : ", \"") + std::string(v) + "\"";
  return out;
}

/// The value of `spec` in `options` (or its default), checked; InvalidArgumentError naming
/// the recipe, the option and the allowed values.
std::string option_value(const char* recipe, const OptionSpec& spec,
                         const std::map<std::string, std::string>& options) {
  auto it = options.find(spec.name);
  const std::string value = it == options.end() ? spec.fallback : it->second;
  const std::string where = std::string(recipe) + ": option '" + spec.name + "' must be ";
  if (!spec.values.empty()) {
    for (const char* allowed : spec.values) {
      if (value == allowed) return value;
    }
    throw InvalidArgumentError(where + "one of " + quoted_list(spec.values) + ", got \"" + value + "\"");
  }
  // An integer as Python's str(int(v)) writes it: digits, no sign, no leading zero.
  const bool digits = !value.empty() && value.size() <= 18 &&
                      std::all_of(value.begin(), value.end(), [](char c) { return c >= '0' && c <= '9'; }) &&
                      (value.size() == 1 || value[0] != '0');
  const int64_t number = digits ? std::stoll(value) : -1;
  if (!digits || number < spec.min || number > spec.max) {
    throw InvalidArgumentError(where + "an integer in [" + std::to_string(spec.min) + ", " + std::to_string(spec.max) +
                               "], got \"" + value + "\"");
  }
  return value;
}

BlockDims block_dims(char c) { return c == '2' ? BlockDims::k2D : BlockDims::k1D; }

}  // namespace

QuantRecipe QuantRecipe::parse(const std::string& name, const std::string& fp8_format,
                               const std::map<std::string, std::string>& options) {
  if (name == "MXFP8BlockScaling" || name == "NVFP4BlockScaling") {
    throw UnsupportedRecipeError(name +
                                 ": the reference does not emulate this recipe (unavailable on the H200, "
                                 "docs/BACKENDS.md \"Recipes\"); emulated: DelayedScaling, Float8CurrentScaling, "
                                 "Float8BlockScaling");
  }
  const RecipeSpecTable* spec = nullptr;
  for (const RecipeSpecTable& entry : recipe_table()) {
    if (name == entry.name) spec = &entry;
  }
  if (spec == nullptr) {
    throw UnknownNameError("unknown recipe '" + name +
                           "'; known recipes: DelayedScaling, Float8CurrentScaling, Float8BlockScaling, "
                           "MXFP8BlockScaling, NVFP4BlockScaling");
  }
  QuantRecipe recipe;
  recipe.kind = spec->kind;
  if (fp8_format.empty()) {
    recipe.format = spec->default_format;
  } else if (fp8_format == "E4M3") {
    recipe.format = RecipeFormat::kE4M3;
  } else if (fp8_format == "HYBRID") {
    recipe.format = RecipeFormat::kHybrid;
  } else {
    // Every TE recipe refuses Format.E5M2 (common/recipe/__init__.py).
    throw InvalidArgumentError(name + ": fp8_format must be one of \"E4M3\", \"HYBRID\", got \"" + fp8_format + "\"");
  }
  for (const auto& [key, value] : options) {
    const bool known = std::any_of(spec->options.begin(), spec->options.end(),
                                   [&key = key](const OptionSpec& o) { return key == o.name; });
    if (!known) {
      std::string names;
      for (const OptionSpec& o : spec->options) names += (names.empty() ? "" : ", ") + std::string(o.name);
      throw InvalidArgumentError(name + ": unknown option '" + key + "'; known options: " + names);
    }
  }
  for (const OptionSpec& o : spec->options) {
    const std::string value = option_value(spec->name, o, options);
    const std::string option = o.name;
    if (option == "amax_compute_algo") {
      recipe.amax_compute_algo = value == "max" ? AmaxComputeAlgo::kMax : AmaxComputeAlgo::kMostRecent;
    } else if (option == "amax_history_len") {
      recipe.amax_history_len = std::stoll(value);
    } else if (option == "margin") {
      recipe.margin = std::stoll(value);
    } else if (option == "backward_override") {
      recipe.backward_override = value == "none"             ? BackwardOverride::kNone
                                 : value == "high_precision" ? BackwardOverride::kHighPrecision
                                                             : BackwardOverride::kDequantized;
    } else if (option == "use_power_2_scales") {
      recipe.scales = value == "1" ? ScalePrecision::kPowerOf2 : ScalePrecision::kFp32;
    } else if (option == "use_f32_scales") {
      // Block scaling's scales are powers of two unless use_f32_scales (BACKENDS.md: the
      // documented meaning; te.ops 2.20.2 reads an import-time class attribute instead).
      recipe.scales = value == "1" ? ScalePrecision::kFp32 : ScalePrecision::kPowerOf2;
    } else if (option == "block_scaling_dims") {
      recipe.x_block = block_dims(value[0]);
      recipe.w_block = block_dims(value[2]);
      recipe.grad_block = block_dims(value[4]);
    } else {
      GRADFUZZ_INTERNAL_ASSERT(false, "recipe option without a parser: " + option);
    }
  }
  return recipe;
}

const char* QuantRecipe::name() const {
  switch (kind) {
    case RecipeKind::kDelayedScaling:
      return "DelayedScaling";
    case RecipeKind::kFloat8CurrentScaling:
      return "Float8CurrentScaling";
    case RecipeKind::kFloat8BlockScaling:
      return "Float8BlockScaling";
  }
  return "?";
}

Fp8Format QuantRecipe::format_for(QuantRole role) const {
  return role == QuantRole::kGradOutput && format == RecipeFormat::kHybrid ? Fp8Format::kE5M2 : Fp8Format::kE4M3;
}

BlockDims QuantRecipe::block_dims_for(QuantRole role) const {
  switch (role) {
    case QuantRole::kInput:
      return x_block;
    case QuantRole::kWeight:
      return w_block;
    case QuantRole::kGradOutput:
      return grad_block;
  }
  return BlockDims::k1D;
}

// ---------------------------------------------------------------------------------------
// The primitives

float value_for_inf(at::ScalarType dtype) {
  switch (dtype) {
    case at::kBFloat16:
      return static_cast<float>(std::numeric_limits<c10::BFloat16>::max());
    case at::kHalf:
      return static_cast<float>(std::numeric_limits<c10::Half>::max());
    default:
      return std::numeric_limits<float>::max();
  }
}

at::Tensor compute_scale_from_amax(const at::Tensor& amax, Fp8Format format, ScalePrecision precision, float inf_value,
                                   float epsilon) {
  at::Tensor a = amax.to(at::kFloat);
  // NaN < epsilon is false: a NaN amax stays NaN and gets scale 1 below.
  a = at::where(a < epsilon, at::full_like(a, epsilon), a);
  const at::Tensor bad = at::logical_or(at::logical_or(a == 0, at::isinf(a)), at::isnan(a));
  const at::Tensor one = at::ones_like(a);
  // fp8_max / amax: an fp32 division, rounded to nearest (recipe_common.cuh: __fdiv_rn)
  at::Tensor scale = at::full_like(a, fp8_max(format)) / at::where(bad, one, a);
  scale = at::where(at::isinf(scale), at::full_like(scale, inf_value), scale);
  if (precision == ScalePrecision::kPowerOf2) {
    // The sign and exponent bits of the fp32 scale (TE: scale_bits & 0xFF800000), i.e. the
    // power of two at or below it; 0xFF800000 read as int32 is -8388608.
    constexpr int64_t kSignAndExponent = -8388608;
    scale = at::bitwise_and(scale.contiguous().view(at::kInt), kSignAndExponent).view(at::kFloat);
  }
  return at::where(bad, one, scale);
}

at::Tensor fp8_amax(const at::Tensor& x) {
  const auto options = at::TensorOptions().dtype(at::kFloat).device(x.device());
  if (x.numel() == 0) return at::zeros({}, options);
  at::Tensor a = x.detach().to(at::kFloat).abs();
  // fmaxf(amax, |elt|) in the kernels returns the other operand for a NaN element.
  a = at::where(at::isnan(a), at::zeros_like(a), a);
  return a.max();
}

at::Tensor cast_to_fp8(const at::Tensor& x, const at::Tensor& scale, Fp8Format format) {
  const float max = fp8_max(format);
  // elt * scale: the fp32 product (quantize_fp8.cuh), then the saturating conversion.
  const at::Tensor scaled = x.detach().to(at::kFloat) * scale.to(x.device(), at::kFloat);
  return at::clamp(scaled, -max, max).to(fp8_scalar_type(format));
}

at::Tensor dequantize_fp8(const at::Tensor& q, const at::Tensor& scale, at::ScalarType dtype) {
  const at::Tensor s = scale.to(q.device(), at::kFloat);
  const at::Tensor scale_inv = at::ones_like(s) / s;  // fp32 reciprocal, correctly rounded
  return (q.to(at::kDouble) * scale_inv.to(at::kDouble)).to(dtype);
}

at::Tensor fp8_rounding_margin(const at::Tensor& scaled, Fp8Format format) {
  const at::Tensor s = scaled.detach().to(at::kDouble);
  const double max = fp8_max(format);
  const at::Tensor q = at::clamp(s, -max, max).to(fp8_scalar_type(format)).to(at::kDouble);
  // The spacing on s's side of q: that of the smaller magnitude of the two (just below a
  // power of two the spacing is half the one above it), subnormals at the smallest exponent.
  const int mantissa_bits = format == Fp8Format::kE4M3 ? 3 : 2;
  const int min_exponent = format == Fp8Format::kE4M3 ? -6 : -14;
  const at::Tensor smaller = at::clamp_min(at::minimum(s.abs(), q.abs()), std::ldexp(1.0, min_exponent));
  const at::Tensor spacing = at::exp2(at::floor(at::log2(smaller)) - mantissa_bits);
  at::Tensor margin = spacing / 2 - (s - q).abs();
  const at::Tensor none = at::logical_or(at::logical_or(s == 0, s.abs() > max), at::isnan(s));
  return at::where(none, at::full_like(margin, std::numeric_limits<double>::infinity()), margin);
}

at::Tensor jitter_fp8(const at::Tensor& q, const at::Tensor& eligible, double probability, at::Generator& generator) {
  GRADFUZZ_INTERNAL_ASSERT(q.scalar_type() == at::kFloat8_e4m3fn || q.scalar_type() == at::kFloat8_e5m2,
                           "jitter_fp8 takes an FP8 tensor");
  // Largest finite magnitude code: E4M3fn 0x7E (0x7F is NaN); E5M2 0x7B (0x7C inf, above NaN).
  const int64_t max_code = q.scalar_type() == at::kFloat8_e4m3fn ? 0x7E : 0x7B;
  const at::Tensor codes = q.contiguous().view(at::kByte).to(at::kShort);
  const at::Tensor sign = at::bitwise_and(codes, 0x80);
  const at::Tensor magnitude = at::bitwise_and(codes, 0x7F);
  const auto cpu = at::TensorOptions().dtype(at::kDouble);
  const at::Tensor pick = at::rand(q.sizes(), generator, cpu).to(q.device());
  const at::Tensor coin = at::rand(q.sizes(), generator, cpu).to(q.device());
  at::Tensor step = at::where(coin < 0.5, at::ones_like(magnitude), -at::ones_like(magnitude));
  step = at::where(magnitude == 0, at::ones_like(step), step);
  step = at::where(magnitude == max_code, -at::ones_like(step), step);
  const at::Tensor move =
      at::logical_and(at::logical_and(pick < probability, eligible.to(q.device())), magnitude <= max_code);
  const at::Tensor moved = at::where(move, magnitude + step, magnitude);
  return at::bitwise_or(sign, moved).to(at::kByte).view(q.scalar_type());
}

at::Tensor block_scales(const at::Tensor& x, BlockShape shape, Fp8Format format, ScalePrecision precision) {
  if (!x.defined() || x.dim() < 1) {
    throw InvalidArgumentError("block scaling: the tensor must be at least 1-D, got " +
                               (x.defined() ? std::string("a 0-D tensor") : std::string("an undefined tensor")));
  }
  const auto options = at::TensorOptions().dtype(at::kFloat).device(x.device());
  if (x.numel() == 0) return at::ones(x.sizes(), options);
  const at::Tensor x2 = x.detach().reshape({-1, x.size(-1)}).to(at::kFloat);
  const int64_t m = x2.size(0);
  const int64_t n = x2.size(1);
  const int64_t block_rows = shape == BlockShape::k1x128 ? 1 : kFp8BlockLen;
  const int64_t block_cols = shape == BlockShape::k128x1 ? 1 : kFp8BlockLen;
  const int64_t pad_m = (block_rows - m % block_rows) % block_rows;
  const int64_t pad_n = (block_cols - n % block_cols) % block_cols;
  at::Tensor magnitude = x2.abs();
  magnitude = at::where(at::isnan(magnitude), at::zeros_like(magnitude), magnitude);  // fmaxf, as fp8_amax
  // Zero padding leaves a partial block's amax that of the elements it has.
  const at::Tensor padded = at::constant_pad_nd(magnitude, {0, pad_n, 0, pad_m}, 0);
  const int64_t mb = (m + pad_m) / block_rows;
  const int64_t nb = (n + pad_n) / block_cols;
  // [mb·br, nb·bc] -> [mb, br, nb, bc] -> amax per block [mb, 1, nb, 1]
  const at::Tensor amax = padded.reshape({mb, block_rows, nb, block_cols}).amax({1, 3}, /*keepdim=*/true);
  const at::Tensor scale = compute_scale_from_amax(amax, format, precision, value_for_inf(x.scalar_type()));
  return scale.expand({mb, block_rows, nb, block_cols})
      .reshape({m + pad_m, n + pad_n})
      .narrow(0, 0, m)
      .narrow(1, 0, n)
      .reshape(x.sizes());
}

// ---------------------------------------------------------------------------------------
// FP8 GEMM accumulation

const char* fp8_gemm_name(Fp8Gemm gemm) {
  switch (gemm) {
    case Fp8Gemm::kFprop:
      return "fprop";
    case Fp8Gemm::kDgrad:
      return "dgrad";
    case Fp8Gemm::kWgrad:
      return "wgrad";
  }
  return "?";
}

bool Fp8GemmAccumulation::is_fast(Fp8Gemm gemm) const {
  return std::find(fast.begin(), fast.end(), gemm) != fast.end();
}

void Fp8GemmAccumulation::validate() const {
  if (fraction_bits < 1 || fraction_bits > 52) {
    throw InvalidArgumentError("FP8 GEMM accumulation: fraction_bits must be in [1, 52], got " +
                               std::to_string(fraction_bits));
  }
  if (products_per_step < 1) {
    throw InvalidArgumentError("FP8 GEMM accumulation: products_per_step must be at least 1, got " +
                               std::to_string(products_per_step));
  }
  if (promotion_products < products_per_step || promotion_products % products_per_step != 0) {
    throw InvalidArgumentError(
        "FP8 GEMM accumulation: promotion_products must be a positive multiple of "
        "products_per_step (" +
        std::to_string(products_per_step) + "), got " + std::to_string(promotion_products));
  }
}

namespace {

void check_gemm_operands(const at::Tensor& a, const at::Tensor& b, const char* what) {
  if (!a.defined() || !b.defined() || a.dim() != 2 || b.dim() != 2 || a.size(1) != b.size(0)) {
    const auto shape = [](const at::Tensor& t) { return t.defined() ? c10::str(t.sizes()) : std::string("undefined"); };
    throw InvalidArgumentError(std::string(what) + ": expected a [M, K] and b [K, N], got " + shape(a) + " and " +
                               shape(b));
  }
}

/// The products each accumulator covers before it is promoted (the whole reduction when fast).
int64_t accumulator_span(const Fp8GemmAccumulation& model, Fp8Gemm gemm, int64_t k) {
  return model.is_fast(gemm) ? std::max<int64_t>(k, 1) : model.promotion_products;
}

/// x truncated towards zero to a multiple of 2^exponent (exact in float64 for the
/// magnitudes an FP8 GEMM produces).
double truncate_to(double x, int exponent) { return std::ldexp(std::trunc(std::ldexp(x, -exponent)), exponent); }

/// The exponent e of x (2^e <= |x| < 2^(e+1)); x != 0.
int exponent_of(double x) { return std::ilogb(x); }

}  // namespace

at::Tensor fp8_accumulation_term(const at::Tensor& a, const at::Tensor& b, const Fp8GemmAccumulation& model,
                                 Fp8Gemm gemm) {
  check_gemm_operands(a, b, "fp8_accumulation_term");
  model.validate();
  // An estimate, computed in float32 on the operands' device: a few chunked GEMMs, about
  // three times the GEMM's own work.
  const at::Tensor af = a.detach().to(at::kFloat);
  const at::Tensor bf = b.detach().to(b.device() == a.device() ? b.device() : a.device(), at::kFloat);
  const int64_t k = af.size(1);
  const int64_t span = accumulator_span(model, gemm, k);
  const double unit = std::ldexp(1.0, -static_cast<int>(model.fraction_bits));
  at::Tensor term = at::zeros({af.size(0), bf.size(1)}, af.options());
  at::Tensor partial = at::zeros_like(term);
  for (int64_t k0 = 0; k0 < k; k0 += model.products_per_step) {
    if (k0 % span == 0) partial.zero_();
    const int64_t n = std::min(model.products_per_step, k - k0);
    const at::Tensor as = af.narrow(1, k0, n);
    const at::Tensor bs = bf.narrow(0, k0, n);
    // The step's largest product is at most the largest |a| of its row times the largest
    // |b| of its column.
    const at::Tensor largest = as.abs().amax({1}, /*keepdim=*/true) * bs.abs().amax({0}, /*keepdim=*/true);
    const at::Tensor step_unit = unit * at::maximum(partial.abs(), largest);
    const at::Tensor signs = at::matmul(at::sign(as), at::sign(bs)).abs();
    term.add_(step_unit * (signs * 0.5 + (std::sqrt(static_cast<double>(n) / 12.0) + 1.0)));
    partial.add_(at::matmul(as, bs));
  }
  return term;
}

at::Tensor emulate_fp8_gemm(const at::Tensor& a, const at::Tensor& b, const Fp8GemmAccumulation& model, Fp8Gemm gemm) {
  check_gemm_operands(a, b, "emulate_fp8_gemm");
  model.validate();
  const at::Tensor ad = a.detach().to(at::kCPU, at::kDouble).contiguous();
  const at::Tensor bd = b.detach().to(at::kCPU, at::kDouble).t().contiguous();  // [N, K]
  const int64_t m = ad.size(0);
  const int64_t n = bd.size(0);
  const int64_t k = ad.size(1);
  const int64_t span = accumulator_span(model, gemm, k);
  const int bits = static_cast<int>(model.fraction_bits);
  at::Tensor out = at::zeros({m, n}, ad.options());
  const auto pa = ad.accessor<double, 2>();
  const auto pb = bd.accessor<double, 2>();
  auto po = out.accessor<double, 2>();
  std::vector<double> terms;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      float promoted = 0.0F;  // the fp32 sum the accumulators are promoted into
      double accumulator = 0.0;
      for (int64_t k0 = 0; k0 < k; k0 += model.products_per_step) {
        if (k0 % span == 0 && k0 > 0) {
          promoted += static_cast<float>(accumulator);
          accumulator = 0.0;
        }
        terms.assign(1, accumulator);
        for (int64_t kk = k0; kk < std::min(k, k0 + model.products_per_step); ++kk) {
          terms.push_back(pa[i][kk] * pb[j][kk]);  // exact: FP8 values times fp32 scales
        }
        int largest = std::numeric_limits<int>::min();
        for (double t : terms) {
          if (t != 0.0 && std::isfinite(t)) largest = std::max(largest, exponent_of(t));
        }
        if (largest == std::numeric_limits<int>::min()) {
          // Only zeros (or non-finite products, which propagate as they are).
          double sum = 0.0;
          for (double t : terms) sum += t;
          accumulator = sum;
          continue;
        }
        double sum = 0.0;  // exact: at most products_per_step + 1 terms of fraction_bits + 1 bits
        for (double t : terms) sum += std::isfinite(t) ? truncate_to(t, largest - bits) : t;
        accumulator = sum != 0.0 && std::isfinite(sum) ? truncate_to(sum, exponent_of(sum) - bits) : sum;
      }
      po[i][j] = static_cast<double>(promoted + static_cast<float>(accumulator));
    }
  }
  return out.to(a.device());
}

// ---------------------------------------------------------------------------------------
// The state of one reference evaluation sequence

namespace detail {

/// A quantizer's identity: module index, group, role.
struct QuantKey {
  int64_t op = 0;
  int64_t group = 0;
  QuantRole role = QuantRole::kInput;
  bool operator<(const QuantKey& o) const { return std::tie(op, group, role) < std::tie(o.op, o.group, o.role); }
};

/// A delayed-scaling quantizer (Float8Quantizer over DelayedScalingRecipeState): scale 1.0
/// and a zeroed history of amax_history_len slots at creation.
struct DelayedQuantizer {
  Fp8Format format = Fp8Format::kE4M3;
  float scale = 1.0F;
  std::vector<float> history;
};

/// What a ReferenceQuantization and the backward hooks of its quantized GEMMs share.
struct QuantizationState {
  std::optional<QuantRecipe> recipe;
  int64_t current_op = -1;
  std::map<QuantKey, DelayedQuantizer> delayed;
  /// Whether a gradient was quantized since the last after_backward.
  bool gradient_quantized = false;
  std::optional<at::Generator> jitter_generator;
  double jitter_probability = 0.0;
  /// Per quantization of the evaluation (in order): how close to a rounding boundary an
  /// element must lie to be jittered; empty: every element.
  std::vector<at::Tensor> jitter_windows;
  std::vector<at::Tensor> jitter_reference;
  /// Quantizations so far (the index into jitter_windows).
  size_t quantizations = 0;
  std::vector<at::Tensor>* record = nullptr;
  /// What the quantized GEMMs give (set_accumulation): exact unless a model is set.
  std::optional<Fp8GemmAccumulation> accumulation;
  AccumulationMode accumulation_mode = AccumulationMode::kExact;
  std::optional<at::Generator> accumulation_generator;
  /// The path's quantization points (set_points).
  QuantizationPoints points;
  /// Whether the current op's next op casts its input gradient for it (set_next_op_casts_gradient).
  bool next_op_casts_gradient = false;
};

}  // namespace detail

namespace {

using detail::DelayedQuantizer;
using detail::QuantizationState;
using detail::QuantKey;

/// The two copies a GEMM may read.
enum class Copy { kRowwise, kColumnwise };

const QuantRecipe& recipe_of(const QuantizationState& state, const char* what) {
  if (!state.recipe) {
    throw InvalidArgumentError(std::string("ReferenceQuantization: ") + what + " needs a recipe; this one has none");
  }
  return *state.recipe;
}

DelayedQuantizer& delayed_quantizer(QuantizationState& state, const QuantKey& key) {
  auto it = state.delayed.find(key);
  if (it == state.delayed.end()) {
    DelayedQuantizer q;
    q.format = state.recipe->format_for(key.role);
    q.history.assign(static_cast<size_t>(state.recipe->amax_history_len), 0.0F);
    it = state.delayed.emplace(key, std::move(q)).first;
  }
  return it->second;
}

/// dq(Q(x)) with a scale per element (broadcasting), jittered when jitter is on; x's dtype.
at::Tensor quantize_dequantize(QuantizationState* state, const at::Tensor& x, const at::Tensor& scale,
                               Fp8Format format) {
  at::Tensor q = cast_to_fp8(x, scale, format);
  if (state == nullptr) return dequantize_fp8(q, scale, x.scalar_type());
  const size_t index = state->quantizations++;
  if (state->record) {
    // The fp32 product the cast rounds (cast_to_fp8), exactly in float64.
    state->record->push_back(
        (x.detach().to(at::kFloat) * scale.to(x.device(), at::kFloat)).to(at::kDouble).expand(x.sizes()).contiguous());
  }
  if (state->jitter_generator) {
    const bool matched = index < state->jitter_windows.size() && index < state->jitter_reference.size() &&
                         state->jitter_reference[index].defined() &&
                         state->jitter_reference[index].sizes() == x.sizes() &&
                         state->jitter_windows[index].sizes() == x.sizes();
    if (matched) {
      // The reference's codes; only elements near a rounding boundary may move.
      const at::Tensor reference = state->jitter_reference[index].to(x.device());
      const double max = fp8_max(format);
      const at::Tensor own = q;
      q = at::clamp(reference, -max, max).to(fp8_scalar_type(format));
      // Where this evaluation's scale differs from the reference's by more than a rounding
      // (a power-of-2 scale one step away), its own codes are the ones a correct
      // implementation with that scale gives; within one code, the reference's.
      const auto codes = [](const at::Tensor& t) {
        const at::Tensor c = t.contiguous().view(at::kByte).to(at::kShort);
        const at::Tensor magnitude = at::bitwise_and(c, 0x7F);
        return at::where(at::bitwise_and(c, 0x80) != 0, -magnitude, magnitude);
      };
      q = at::where((codes(q) - codes(own)).abs() <= 1, q, own);
      // An element's window is measured from one rounding of its upstream values (the
      // baseline's): one sample of an error whose size another correct implementation's
      // need not share. Where the baseline happened to round to the reference's value the
      // window is 0 (tests/backends/data/torch-fp8-zero-window-tie.json: the torch
      // emulation's scaled value 2 fp32 ulps off the reference's, on an FP8 midpoint), and
      // where the element comes out of a cancellation its error is on the scale of its row's
      // terms, not of its own value (tests/backends/data/torch-fp8-row-cancellation.json:
      // a Linear's incoming gradient 0.037 = -0.665 + 0.702, the emulation's 8.9e-6
      // relative off the reference's, the baseline's 2.5e-6, its scaled value 2.8e-6 above
      // an E4M3 midpoint, its window 2.1e-6). So each window is at least twice the median
      // window of its row (rows of the last dimension: a robust estimate of the row's
      // upstream error, pooled over elements whose errors come from the same reductions),
      // up to the row's largest window (a window of one size everywhere, an accumulation
      // term's, stays as it is).
      // A floor proportional to the element's magnitude (||windows|| / ||reference|| *
      // |reference|, aac9623) missed the cancellation and raised the largest elements'
      // windows where an accumulation term makes the windows of one size: with Hopper
      // accumulation a 2^-7 gradient failed by 2.9x its bound instead of 3.1x. The RMS of
      // the row's windows instead of its median is dominated by the row's largest elements
      // (the same 2^-7 test at 2.8-2.9x).
      const at::Tensor& windows = state->jitter_windows[index];
      at::Tensor window = windows.to(x.device());
      if (window.dim() >= 1 && window.numel() > 0) {
        const at::Tensor finite = at::nan_to_num(window, 0.0, 0.0, 0.0);
        const at::Tensor rows = finite.reshape({-1, finite.size(-1)});
        const at::Tensor row_median = std::get<0>(rows.median(1, /*keepdim=*/true));
        const at::Tensor row_max = std::get<0>(rows.max(1, /*keepdim=*/true));
        const at::Tensor floor = at::minimum(2 * row_median, row_max);
        window = at::maximum(window, floor.expand_as(rows).reshape(window.sizes()));
      }
      const at::Tensor eligible = fp8_rounding_margin(reference, format) < window;
      q = jitter_fp8(q, eligible, state->jitter_probability, *state->jitter_generator);
    } else {
      // An element whose input is exactly zero is zero in every implementation: it stays.
      const at::Tensor eligible = x.detach().to(at::kFloat) != 0;
      q = jitter_fp8(q, eligible, state->jitter_probability, *state->jitter_generator);
    }
  }
  return dequantize_fp8(q, scale, x.scalar_type());
}

/// Per-tensor current scaling of x (Float8CurrentScalingQuantizer::quantize_impl).
at::Tensor current_scaling(QuantizationState* state, const at::Tensor& x, Fp8Format format, ScalePrecision precision) {
  const at::Tensor scale =
      compute_scale_from_amax(fp8_amax(x), format, precision, value_for_inf(x.scalar_type()), /*epsilon=*/0.0F);
  return quantize_dequantize(state, x, scale, format);
}

/// One copy of x quantized by the quantizer `key` (for per-tensor recipes and 2D blocks both
/// copies are this one).
at::Tensor quantize_copy(QuantizationState& state, const QuantKey& key, const at::Tensor& x, Copy copy) {
  const QuantRecipe& recipe = recipe_of(state, "quantize");
  const Fp8Format format = recipe.format_for(key.role);
  const at::Tensor xd = x.detach();
  if (key.role == QuantRole::kGradOutput) state.gradient_quantized = true;
  switch (recipe.kind) {
    case RecipeKind::kDelayedScaling: {
      DelayedQuantizer& q = delayed_quantizer(state, key);
      // Quantize with the current scale; record the amax into slot 0 with a max (atomicMaxFloat).
      q.history[0] = std::max(q.history[0], fp8_amax(xd).item<float>());
      const at::Tensor scale = at::full({}, q.scale, at::TensorOptions().dtype(at::kFloat).device(xd.device()));
      return quantize_dequantize(&state, xd, scale, format);
    }
    case RecipeKind::kFloat8CurrentScaling:
      return current_scaling(&state, xd, format, recipe.scales);
    case RecipeKind::kFloat8BlockScaling: {
      const BlockShape shape = recipe.block_dims_for(key.role) == BlockDims::k2D ? BlockShape::k128x128
                               : copy == Copy::kRowwise                          ? BlockShape::k1x128
                                                                                 : BlockShape::k128x1;
      return quantize_dequantize(&state, xd, block_scales(xd, shape, format, recipe.scales), format);
    }
  }
  GRADFUZZ_INTERNAL_ASSERT(false, "unknown recipe kind");
}

/// Whether the quantizer of `role` gives the same values in both copies.
bool single_copy(const QuantRecipe& recipe, QuantRole role) {
  return recipe.kind != RecipeKind::kFloat8BlockScaling || recipe.block_dims_for(role) == BlockDims::k2D;
}

QuantizedOperand quantize_operand(QuantizationState& state, const QuantKey& key, const at::Tensor& x) {
  const QuantRecipe& recipe = recipe_of(state, "quantize");
  const at::Tensor rowwise = quantize_copy(state, key, x, Copy::kRowwise);
  if (single_copy(recipe, key.role)) return {rowwise, rowwise};
  return {rowwise, quantize_copy(state, key, x, Copy::kColumnwise)};
}

/// The DelayedScaling update of one quantizer (quantization.py: _default_get_amax_and_update_history,
/// _default_sf_compute, _update_amax_history).
void update_delayed(DelayedQuantizer& q, const QuantRecipe& recipe) {
  const float amax = recipe.amax_compute_algo == AmaxComputeAlgo::kMax
                         ? *std::max_element(q.history.begin(), q.history.end())
                         : q.history[0];
  // Keep the old scale for an amax of 0, inf or NaN; fp32 max where the quotient overflows.
  if (amax > 0.0F && std::isfinite(amax)) {
    float scale = (fp8_max(q.format) / amax) / std::ldexp(1.0F, static_cast<int>(recipe.margin));
    if (std::isinf(scale)) scale = std::numeric_limits<float>::max();
    q.scale = scale;
  }
  // torch.roll(history, -1) then slot 0 zeroed: the window keeps the last L amaxes.
  std::rotate(q.history.begin(), q.history.begin() + 1, q.history.end());
  q.history[0] = 0.0F;
}

thread_local ReferenceQuantization* current_quantization = nullptr;

}  // namespace

// ---------------------------------------------------------------------------------------
// QuantizationPoints

std::string QuantizationPoints::describe() const {
  if (empty()) return "the basic ops'";
  std::map<int64_t, std::string> parts;
  for (const auto& [op, alpha] : backward_gemm_alpha) {
    std::ostringstream os;
    os << "backward GEMMs alpha " << alpha;
    parts[op] = os.str();
  }
  for (const int64_t op : gradient_passthrough) {
    std::string& part = parts[op];
    part += std::string(part.empty() ? "" : ", ") + "gradient passed through";
  }
  std::string out;
  for (const auto& [op, part] : parts) out += (out.empty() ? "" : "; ") + ("op " + std::to_string(op) + ": " + part);
  return out;
}

// ---------------------------------------------------------------------------------------
// ReferenceQuantization

ReferenceQuantization::ReferenceQuantization() : state_(std::make_shared<QuantizationState>()) {}

ReferenceQuantization::ReferenceQuantization(QuantRecipe recipe) : ReferenceQuantization() {
  state_->recipe = std::move(recipe);
}

ReferenceQuantization::~ReferenceQuantization() = default;
ReferenceQuantization::ReferenceQuantization(ReferenceQuantization&&) noexcept = default;
ReferenceQuantization& ReferenceQuantization::operator=(ReferenceQuantization&&) noexcept = default;

const QuantRecipe* ReferenceQuantization::recipe() const { return state_->recipe ? &*state_->recipe : nullptr; }

void ReferenceQuantization::set_jitter(double probability, at::Generator generator, std::vector<at::Tensor> reference,
                                       std::vector<at::Tensor> windows) {
  if (!(probability >= 0.0 && probability <= 1.0)) {
    throw InvalidArgumentError("ReferenceQuantization jitter: probability must be in [0, 1], got " +
                               std::to_string(probability));
  }
  if (!generator.defined() || !generator.device().is_cpu()) {
    throw InvalidArgumentError("ReferenceQuantization jitter: the generator must be a CPU generator");
  }
  state_->jitter_probability = probability;
  state_->jitter_generator = std::move(generator);
  state_->jitter_reference = std::move(reference);
  state_->jitter_windows = std::move(windows);
}

void ReferenceQuantization::clear_jitter() {
  state_->jitter_generator.reset();
  state_->jitter_probability = 0.0;
  state_->jitter_windows.clear();
  state_->jitter_reference.clear();
}

void ReferenceQuantization::record_scaled(std::vector<at::Tensor>* into) { state_->record = into; }

void ReferenceQuantization::set_accumulation(Fp8GemmAccumulation model, AccumulationMode mode,
                                             std::optional<at::Generator> generator) {
  model.validate();
  if (mode == AccumulationMode::kRandomSign && (!generator || !generator->defined() || !generator->device().is_cpu())) {
    throw InvalidArgumentError("ReferenceQuantization accumulation: random signs need a CPU generator");
  }
  state_->accumulation = std::move(model);
  state_->accumulation_mode = mode;
  state_->accumulation_generator = std::move(generator);
}

void ReferenceQuantization::clear_accumulation() {
  state_->accumulation.reset();
  state_->accumulation_mode = AccumulationMode::kExact;
  state_->accumulation_generator.reset();
}

void ReferenceQuantization::set_points(QuantizationPoints points) {
  if (!points.empty() && !state_->recipe) {
    throw InvalidArgumentError("ReferenceQuantization: quantization points (" + points.describe() +
                               ") need a recipe; this one has none");
  }
  state_->points = std::move(points);
}

const QuantizationPoints& ReferenceQuantization::points() const { return state_->points; }

double ReferenceQuantization::backward_gemm_alpha(int64_t op) const {
  const auto it = state_->points.backward_gemm_alpha.find(op);
  return it == state_->points.backward_gemm_alpha.end() ? 1.0 : it->second;
}

bool ReferenceQuantization::gradient_passthrough(int64_t op) const {
  return state_->points.gradient_passthrough.count(op) > 0;
}

void ReferenceQuantization::set_current_op(int64_t op) { state_->current_op = op; }

int64_t ReferenceQuantization::current_op() const { return state_->current_op; }

void ReferenceQuantization::set_next_op_casts_gradient(bool casts) { state_->next_op_casts_gradient = casts; }

bool ReferenceQuantization::next_op_casts_gradient() const { return state_->next_op_casts_gradient; }

QuantizedOperand ReferenceQuantization::quantize(QuantRole role, int64_t group, const at::Tensor& x) {
  return quantize_operand(*state_, QuantKey{state_->current_op, group, role}, x);
}

at::Tensor ReferenceQuantization::quantize_cached_input(const at::Tensor& x) {
  // activation.py: Float8CurrentScalingQuantizer(kFloat8E4M3), whatever the recipe.
  return current_scaling(state_.get(), x.detach(), Fp8Format::kE4M3, ScalePrecision::kFp32);
}

void ReferenceQuantization::after_forward(ForwardGrad grad) {
  if (grad != ForwardGrad::kEnabled || !state_->recipe) return;
  for (auto& [key, q] : state_->delayed) {
    if (key.role != QuantRole::kGradOutput) update_delayed(q, *state_->recipe);
  }
}

void ReferenceQuantization::after_backward() {
  if (!state_->gradient_quantized || !state_->recipe) return;
  state_->gradient_quantized = false;
  for (auto& [key, q] : state_->delayed) {
    if (key.role == QuantRole::kGradOutput) update_delayed(q, *state_->recipe);
  }
}

namespace {
const DelayedQuantizer& find_delayed(const QuantizationState& state, int64_t op, QuantRole role, int64_t group) {
  auto it = state.delayed.find(QuantKey{op, group, role});
  if (it == state.delayed.end()) {
    throw InvalidArgumentError("ReferenceQuantization: no delayed-scaling quantizer for op " + std::to_string(op) +
                               ", group " + std::to_string(group) + ", role " + quant_role_name(role));
  }
  return it->second;
}
}  // namespace

void ReferenceQuantization::set_amax_history_len(int64_t length) {
  const QuantRecipe& recipe = recipe_of(*state_, "set_amax_history_len");
  if (recipe.kind != RecipeKind::kDelayedScaling || length < 1) {
    throw InvalidArgumentError(
        "ReferenceQuantization: set_amax_history_len needs DelayedScaling and a length >= 1, got " +
        std::to_string(length));
  }
  state_->recipe->amax_history_len = length;
  for (auto& [key, q] : state_->delayed) q.history.resize(static_cast<size_t>(length), 0.0F);
}

float ReferenceQuantization::delayed_scale(int64_t op, QuantRole role, int64_t group) const {
  return find_delayed(*state_, op, role, group).scale;
}

std::vector<float> ReferenceQuantization::amax_history(int64_t op, QuantRole role, int64_t group) const {
  return find_delayed(*state_, op, role, group).history;
}

ReferenceQuantization* reference_quantization() { return current_quantization; }

const QuantRecipe* reference_recipe() { return current_quantization ? current_quantization->recipe() : nullptr; }

ReferenceQuantizationScope::ReferenceQuantizationScope(ReferenceQuantization* quantization)
    : previous_(current_quantization) {
  current_quantization = quantization;
}

ReferenceQuantizationScope::~ReferenceQuantizationScope() { current_quantization = previous_; }

// ---------------------------------------------------------------------------------------
// The quantized reference math

at::Tensor value_with_gradient_of(const at::Tensor& value, const at::Tensor& carrier) {
  return value.detach() + (carrier - carrier.detach());
}

namespace {

/// `t` whose incoming gradient is quantize-dequantized by `key`'s quantizer (copy `copy`)
/// before it reaches t's producer: the identity forward, dq(Qg(dy)) backward. A gradient hook
/// on t (plain autograd; the hook shares the state, so it runs on autograd's device threads
/// too) and a view of t returned, so a consumer asking for its own gradient gets dy. With
/// `read`, the quantized gradient is also left there for the GEMMs that read it.
at::Tensor with_quantized_gradient(const at::Tensor& t, std::shared_ptr<QuantizationState> state, QuantKey key,
                                   Copy copy, std::shared_ptr<at::Tensor> read = nullptr) {
  if (!t.requires_grad()) return t;
  t.register_hook([state = std::move(state), key, copy, read = std::move(read)](const at::Tensor& grad) {
    at::Tensor quantized = quantize_copy(*state, key, grad, copy);
    if (read) *read = quantized;
    return quantized;
  });
  return t.view_as(t);
}

/// A view of t whose incoming gradient is multiplied by `alpha` before it reaches t (a GEMM's
/// alpha applied to its result, after the GEMM and its accumulation); t itself for alpha 1.
at::Tensor with_gradient_alpha(const at::Tensor& t, double alpha) {
  if (alpha == 1.0 || !t.requires_grad()) return t;
  const at::Tensor view = t.view_as(t);
  view.register_hook([alpha](const at::Tensor& grad) { return grad * alpha; });
  return view;
}

/// t - t.detach(): zero, with t's gradient.
at::Tensor zero_with_gradient_of(const at::Tensor& t) { return t - t.detach(); }

/// a·b as this evaluation's quantized GEMM `gemm` gives it (set_accumulation): exact, plus or
/// minus the accumulation term, or emulated; detached, in a's dtype.
at::Tensor accumulated(QuantizationState& state, const at::Tensor& a, const at::Tensor& b, Fp8Gemm gemm,
                       const at::Tensor* exact = nullptr) {
  const at::Tensor product = exact ? exact->detach() : at::matmul(a.detach(), b.detach());
  if (!state.accumulation || state.accumulation_mode == AccumulationMode::kExact) return product;
  const Fp8GemmAccumulation& model = *state.accumulation;
  switch (state.accumulation_mode) {
    case AccumulationMode::kEmulate:
      return emulate_fp8_gemm(a, b, model, gemm).to(product.scalar_type());
    case AccumulationMode::kPlus:
    case AccumulationMode::kMinus: {
      const at::Tensor term = fp8_accumulation_term(a, b, model, gemm).to(product.scalar_type());
      return state.accumulation_mode == AccumulationMode::kPlus ? product + term : product - term;
    }
    case AccumulationMode::kRandomSign: {
      const at::Tensor coin =
          at::rand(product.sizes(), *state.accumulation_generator, at::TensorOptions().dtype(at::kDouble));
      const at::Tensor sign = at::where(coin < 0.5, -at::ones_like(coin), at::ones_like(coin));
      return product + sign.to(product.device(), product.scalar_type()) *
                           fp8_accumulation_term(a, b, model, gemm).to(product.scalar_type());
    }
    case AccumulationMode::kExact:
      break;
  }
  return product;
}

/// `operand` (requiring grad) whose incoming gradient, the exact result of the GEMM `gemm`
/// of the quantized gradient left in `read` with `other`, is replaced by what this
/// evaluation's accumulation gives for it: dgrad = read · other, wgrad = readᵀ · other.
/// Returns operand itself where the GEMMs are exact.
at::Tensor with_accumulated_gradient(const at::Tensor& operand, const std::shared_ptr<QuantizationState>& state,
                                     std::shared_ptr<at::Tensor> read, at::Tensor other, Fp8Gemm gemm) {
  if (!operand.requires_grad() || !state->accumulation || state->accumulation_mode == AccumulationMode::kExact) {
    return operand;
  }
  const at::Tensor tapped = operand.view_as(operand);
  tapped.register_hook(
      [state, read = std::move(read), other = other.detach(), gemm](const at::Tensor& grad) -> at::Tensor {
        if (!read->defined()) return grad;
        const at::Tensor a = gemm == Fp8Gemm::kWgrad ? read->t() : *read;
        return accumulated(*state, a.to(grad.scalar_type()), other.to(grad.scalar_type()), gemm, &grad);
      });
  return tapped;
}

}  // namespace

at::Tensor ReferenceQuantization::with_gradient_cast_for_next_op(const at::Tensor& t, int64_t group) {
  const QuantRecipe& recipe = recipe_of(*state_, "a next op's gradient cast");
  const QuantKey key{state_->current_op, group, QuantRole::kGradOutput};
  if (recipe.kind == RecipeKind::kDelayedScaling) delayed_quantizer(*state_, key);
  return with_quantized_gradient(t, state_, key, Copy::kRowwise);
}

at::Tensor reference_quantized_linear(const at::Tensor& input, const at::Tensor& weight_in, int64_t group) {
  ReferenceQuantization* quantization = reference_quantization();
  if (quantization == nullptr || quantization->recipe() == nullptr) {
    throw InvalidArgumentError("reference_quantized_linear: no recipe in this reference evaluation");
  }
  const QuantRecipe& recipe = *quantization->recipe();
  const std::shared_ptr<QuantizationState>& state = quantization->state_;
  const int64_t in = weight_in.size(1);
  std::vector<int64_t> out_sizes = input.sizes().vec();
  out_sizes.back() = weight_in.size(0);
  // A fused op's alpha on the backward GEMMs (QuantizationPoints): every gradient this op's
  // GEMMs give x and W is multiplied by it after the GEMM, whatever the override.
  const double alpha = quantization->backward_gemm_alpha(quantization->current_op());
  const at::Tensor x = with_gradient_alpha(input.reshape({-1, in}), alpha);
  const at::Tensor weight = with_gradient_alpha(weight_in, alpha);
  const QuantizedOperand qx = quantization->quantize(QuantRole::kInput, group, x);
  const QuantizedOperand qw = quantization->quantize(QuantRole::kWeight, group, weight);
  // x [rows, in] · Wᵀ [in, out] -> y [rows, out] on the row-wise copies (fprop)
  const at::Tensor value = accumulated(*state, qx.rowwise, qw.rowwise.t(), Fp8Gemm::kFprop);
  at::Tensor y;
  switch (recipe.backward_override) {
    case BackwardOverride::kHighPrecision:
      // dy [rows, out] · W [out, in] -> dx; dyᵀ [out, rows] · x [rows, in] -> dW; no quantization
      y = value_with_gradient_of(value, at::matmul(x, weight.t()));
      break;
    case BackwardOverride::kDequantized:
      // dy · dq(Qw(W)) -> dx [rows, in]; dyᵀ · dq(Qi(x)) -> dW [out, in]; row-wise copies, dy unquantized
      // (the backward GEMMs run in the compute dtype: no FP8 accumulation there)
      y = value_with_gradient_of(
          value, at::matmul(value_with_gradient_of(qx.rowwise, x), value_with_gradient_of(qw.rowwise, weight).t()));
      break;
    case BackwardOverride::kNone: {
      const QuantKey grad_key{quantization->current_op(), group, QuantRole::kGradOutput};
      if (recipe.kind == RecipeKind::kDelayedScaling) {
        // The grad_output quantizer exists from the first forward on, as TE's fp8 metas do,
        // so every backward update rolls it.
        delayed_quantizer(*state, grad_key);
      }
      const bool one_copy = qx.columnwise.is_same(qx.rowwise) && qw.columnwise.is_same(qw.rowwise) &&
                            single_copy(recipe, QuantRole::kGradOutput);
      if (one_copy) {
        // dq(Qg(dy)) [rows, out] · dq(Qw(W)) [out, in] -> dx; dq(Qg(dy))ᵀ [out, rows] · dq(Qi(x)) [rows, in] -> dW
        const auto read = std::make_shared<at::Tensor>();
        const at::Tensor qx_carrier =
            with_accumulated_gradient(value_with_gradient_of(qx.rowwise, x), state, read, qw.rowwise, Fp8Gemm::kDgrad);
        const at::Tensor qw_carrier = with_accumulated_gradient(value_with_gradient_of(qw.rowwise, weight), state, read,
                                                                qx.rowwise, Fp8Gemm::kWgrad);
        const at::Tensor z = at::matmul(qx_carrier, qw_carrier.t());
        y = value_with_gradient_of(value, with_quantized_gradient(z, state, grad_key, Copy::kRowwise, read));
      } else {
        // 1D blocks: dgrad reads dy's row-wise and W's column-wise copy, wgrad dy's and x's
        // column-wise copies, each quantized separately from the forward's operands.
        // dq(Qg_row(dy)) [rows, out] · W_col [out, in] -> dx
        const auto read_rowwise = std::make_shared<at::Tensor>();
        const auto read_columnwise = std::make_shared<at::Tensor>();
        const at::Tensor x_carrier = with_accumulated_gradient(x, state, read_rowwise, qw.columnwise, Fp8Gemm::kDgrad);
        const at::Tensor dgrad = zero_with_gradient_of(at::matmul(x_carrier, qw.columnwise.t()));
        // dq(Qg_col(dy))ᵀ [out, rows] · x_col [rows, in] -> dW
        const at::Tensor w_carrier =
            with_accumulated_gradient(weight, state, read_columnwise, qx.columnwise, Fp8Gemm::kWgrad);
        const at::Tensor wgrad = zero_with_gradient_of(at::matmul(qx.columnwise, w_carrier.t()));
        y = value + with_quantized_gradient(dgrad, state, grad_key, Copy::kRowwise, read_rowwise) +
            with_quantized_gradient(wgrad, state, grad_key, Copy::kColumnwise, read_columnwise);
      }
      break;
    }
  }
  return y.reshape(out_sizes);
}

at::Tensor reference_cached_input(const at::Tensor& input) {
  ReferenceQuantization* quantization = reference_quantization();
  const at::Tensor cached = quantization != nullptr
                                ? quantization->quantize_cached_input(input)
                                : current_scaling(nullptr, input.detach(), Fp8Format::kE4M3, ScalePrecision::kFp32);
  return value_with_gradient_of(cached, input);
}

}  // namespace gradfuzz::ops
