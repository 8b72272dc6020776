#pragma once

// FP8 quantization in the reference path (docs/BACKENDS.md "Recipes", the contract read from
// TE 2.20.2): a case's recipe parsed from its strings, TE's scale rules and saturating cast,
// the quantizer state of one reference evaluation sequence (delayed-scaling histories across
// the calls of one Sequential), a jitter mode for the oracle's sensitivity estimate, and the
// quantized reference math the reference ops call (a Linear's GEMM on quantized operands, an
// activation's cached FP8 input). Plain strings and maps only: ops/ never includes harness/.

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace gradfuzz::ops {

/// An FP8 element format (BACKENDS.md "FP8 formats and the cast").
enum class Fp8Format { kE4M3, kE5M2 };
/// "E4M3" or "E5M2".
const char* fp8_format_name(Fp8Format format);
/// Largest finite value (TE's Format.*.max_fwd): 448 for E4M3, 57344 for E5M2.
float fp8_max(Fp8Format format);
/// LibTorch's dtype of the format: at::kFloat8_e4m3fn or at::kFloat8_e5m2.
at::ScalarType fp8_scalar_type(Fp8Format format);

/// TE's recipe classes the reference emulates (MXFP8 and NVFP4 are refused, not emulated).
enum class RecipeKind { kDelayedScaling, kFloat8CurrentScaling, kFloat8BlockScaling };
/// A recipe's fp8_format: E4M3 for every tensor, or HYBRID (E4M3 forward, E5M2 gradients).
enum class RecipeFormat { kE4M3, kHybrid };
/// The tensor a quantizer quantizes (te.ops BasicLinear's quantizer roles).
enum class QuantRole { kInput, kWeight, kGradOutput };
/// "input", "weight" or "grad_output".
const char* quant_role_name(QuantRole role);
/// DelayedScaling's amax_compute_algo.
enum class AmaxComputeAlgo { kMax, kMostRecent };
/// The backward_override of Float8CurrentScaling and Float8BlockScaling.
enum class BackwardOverride { kNone, kHighPrecision, kDequantized };
/// A scale as compute_scale_from_amax's fp32 quotient, or with its mantissa cleared (the
/// power of two at or below it).
enum class ScalePrecision { kFp32, kPowerOf2 };
/// Float8BlockScaling's block dimension of one role: 1D (1x128 row-wise and 128x1 column-wise
/// copies, quantized separately) or 2D (one 128x128 tile, both copies the same values).
enum class BlockDims { k1D = 1, k2D = 2 };
/// The shape of the blocks that share one scale, over a tensor viewed as [rows, last dim].
enum class BlockShape { k1x128, k128x1, k128x128 };
/// Block length of Float8BlockScaling (Float8BlockQuantizer.block_len).
inline constexpr int64_t kFp8BlockLen = 128;

/// A case's recipe, parsed: every option of the recipe with TE's default where the case
/// leaves it out (BACKENDS.md "The recipe in a case"). Fields another recipe kind does not
/// have keep their defaults and are not read.
struct QuantRecipe {
  RecipeKind kind = RecipeKind::kFloat8CurrentScaling;
  RecipeFormat format = RecipeFormat::kHybrid;
  /// DelayedScaling: margin (scale divided by 2^margin), amax_history_len, amax_compute_algo.
  int64_t margin = 0;
  int64_t amax_history_len = 1024;
  AmaxComputeAlgo amax_compute_algo = AmaxComputeAlgo::kMax;
  /// Float8CurrentScaling: use_power_2_scales; Float8BlockScaling: not use_f32_scales.
  ScalePrecision scales = ScalePrecision::kFp32;
  /// Float8BlockScaling's block_scaling_dims "x,w,grad".
  BlockDims x_block = BlockDims::k1D;
  BlockDims w_block = BlockDims::k2D;
  BlockDims grad_block = BlockDims::k1D;
  /// Float8CurrentScaling and Float8BlockScaling (DelayedScaling has none).
  BackwardOverride backward_override = BackwardOverride::kNone;

  /// Parses TE's class name, fp8_format ("E4M3", "HYBRID"; empty: the recipe's TE default)
  /// and option strings as BACKENDS.md's table names them. Throws UnknownNameError for an
  /// unknown recipe name (listing the known ones), UnsupportedRecipeError for
  /// MXFP8BlockScaling and NVFP4BlockScaling, and InvalidArgumentError naming the recipe,
  /// the option (or fp8_format) and the allowed values for an unknown option or a bad value.
  static QuantRecipe parse(const std::string& name, const std::string& fp8_format,
                           const std::map<std::string, std::string>& options);
  /// TE's class name ("DelayedScaling").
  const char* name() const;
  /// The format of a tensor of `role`: E5M2 for gradients under HYBRID, else E4M3.
  Fp8Format format_for(QuantRole role) const;
  /// Float8BlockScaling's block dimension of `role`.
  BlockDims block_dims_for(QuantRole role) const;
};

// ---------------------------------------------------------------------------------------
// The primitives (fp32 scale arithmetic as TE's kernels do it)

/// The scale that replaces an overflowing one for a tensor of `dtype` (compute_scale_from_types:
/// the input type's largest finite value): bfloat16's or float16's max, else float32's (float64
/// has no TE kernel; the reference's float64 tensors take float32's).
float value_for_inf(at::ScalarType dtype);

/// TE's compute_scale_from_amax elementwise on float32 amaxes (any shape, any device): amax
/// floored at `epsilon`; 1 where it is 0, inf or NaN; else fp8_max / amax in fp32, `inf_value`
/// where that overflows, the mantissa cleared with kPowerOf2. Returns float32, amax's shape.
at::Tensor compute_scale_from_amax(const at::Tensor& amax, Fp8Format format, ScalePrecision precision, float inf_value,
                                   float epsilon = 0.0F);

/// max |float(x)| as a float32 scalar tensor on x's device, NaN elements ignored (the cast
/// kernels' fmaxf), 0 for an empty tensor.
at::Tensor fp8_amax(const at::Tensor& x);

/// fp8(float(x) · scale): the fp32 product saturated to +-fp8_max (LibTorch's cast does not
/// saturate) and rounded to nearest even; NaN stays NaN. `scale` (float32) broadcasts against
/// x. Returns a tensor of fp8_scalar_type(format), x's shape.
at::Tensor cast_to_fp8(const at::Tensor& x, const at::Tensor& scale, Fp8Format format);

/// float(q) · scale_inv with scale_inv = 1 / scale in fp32 (TE's reciprocal), computed in
/// float64 (exact: an FP8 value times an fp32 number) and returned in `dtype`.
at::Tensor dequantize_fp8(const at::Tensor& q, const at::Tensor& scale, at::ScalarType dtype);

/// Moves each element of the FP8 tensor `q` (either format) where `eligible` (bool, q's
/// shape) holds, with probability `probability`, to a neighbouring FP8 value: one code up or
/// down in magnitude with equal odds, sign kept; away from zero from a zero, towards zero from
/// +-max (the cast saturates, so nothing lies beyond). NaN and inf codes stay. Draws two
/// uniform numbers per element, in order, from the CPU `generator`.
at::Tensor jitter_fp8(const at::Tensor& q, const at::Tensor& eligible, double probability, at::Generator& generator);

/// The distance from each scaled value `scaled` (float(x) · scale, any floating dtype) to the
/// nearest boundary between two FP8 values of `format` that it could round to (half the
/// spacing on its side of its rounded value, minus its distance to that value), float64,
/// `scaled`'s shape; +inf where no other rounding exists (a zero, beyond +-fp8_max, NaN).
at::Tensor fp8_rounding_margin(const at::Tensor& scaled, Fp8Format format);

/// The float32 scale of every element of `x` viewed as [rows, last dim] under block scaling
/// (compute_scale_from_amax per block of `shape`, partial blocks at the edges covering what is
/// there), x's shape. Throws InvalidArgumentError for a 0-D x.
at::Tensor block_scales(const at::Tensor& x, BlockShape shape, Fp8Format format, ScalePrecision precision);

// ---------------------------------------------------------------------------------------
// FP8 GEMM accumulation (docs/BACKENDS.md "FP8 GEMM accumulation")

/// One of a Linear's three FP8 GEMMs (te.ops basic_linear.py): the forward product, the
/// input gradient, the weight gradient.
enum class Fp8Gemm { kFprop, kDgrad, kWgrad };
/// "fprop", "dgrad" or "wgrad".
const char* fp8_gemm_name(Fp8Gemm gemm);

/// How an implementation's FP8 GEMMs accumulate (a backend's capabilities.
/// fp8_gemm_accumulation). The products of two FP8 operands are exact; they are added
/// `products_per_step` at a time to an accumulator, each step's terms (the products and the
/// accumulator) aligned to the largest exponent among them and truncated towards zero to
/// `fraction_bits` bits below it, their sum truncated to `fraction_bits` bits below its own
/// leading bit. A GEMM with split accumulation adds the accumulator into an fp32 sum every
/// `promotion_products` products and starts a fresh one; a fast-accumulating GEMM (`fast`)
/// keeps one accumulator over the whole reduction. Hopper's FP8 MMA: 13 bits, 32 products.
struct Fp8GemmAccumulation {
  int64_t fraction_bits = 13;
  int64_t products_per_step = 32;
  int64_t promotion_products = 128;
  /// The GEMMs that run with fast accumulation under the case's recipe.
  std::vector<Fp8Gemm> fast;

  bool is_fast(Fp8Gemm gemm) const;
  /// Throws InvalidArgumentError unless fraction_bits is in [1, 52], products_per_step >= 1
  /// and promotion_products a positive multiple of products_per_step.
  void validate() const;
};

/// The accumulation term of a·b (a [M, K], b [K, N], dequantized operands, any floating
/// dtype and device): per output element, the size of the error the accumulator of `model`
/// makes on this GEMM, float32 [M, N] on a's device. Per step s of the reduction, with A_s
/// the exact partial sum the accumulator holds before it (zero after each promotion under
/// split accumulation), m_s an upper bound of the step's largest |product| (row maximum of
/// |a| times column maximum of |b| over the step), n_s its products and sigma_s the sum of
/// their signs:
///   u_s = 2^-fraction_bits * max(|A_s|, m_s)        (the step's truncation unit, at most)
///   T  += u_s * (|sigma_s| / 2 + sqrt(n_s / 12) + 1)
/// the mean of truncating n_s products of those signs towards zero, their spread, and the
/// truncations of the accumulator and of the sum. Not a worst-case bound: it is evidence
/// (the oracle multiplies its evidence by 4 and 8); against emulate_fp8_gemm the error stays
/// below T element by element for random operands (tests/ops/quantization_test.cc).
at::Tensor fp8_accumulation_term(const at::Tensor& a, const at::Tensor& b, const Fp8GemmAccumulation& model,
                                 Fp8Gemm gemm);

/// a·b computed as the accumulator of `model` does (see Fp8GemmAccumulation), element by
/// element in float64 on the dequantized values (alignment in value space: exact where the
/// scales are powers of two), promotions summed in fp32. a [M, K], b [K, N]; returns
/// float64 [M, N] on a's device. A model implementation for tests and probes: O(M N K)
/// scalar work on the CPU.
at::Tensor emulate_fp8_gemm(const at::Tensor& a, const at::Tensor& b, const Fp8GemmAccumulation& model, Fp8Gemm gemm);

/// What a quantized GEMM gives in an evaluation (ReferenceQuantization::set_accumulation).
enum class AccumulationMode {
  /// The exact sum of the products (the reference).
  kExact,
  /// Plus s * fp8_accumulation_term per element, s = +1 or -1 at random (rounding samples).
  kRandomSign,
  /// Plus, or minus, the term everywhere (how far an accumulation error can move a later
  /// quantizer's input: the FP8 windows).
  kPlus,
  kMinus,
  /// emulate_fp8_gemm: what an implementation with this accumulator computes.
  kEmulate,
};

/// A quantized operand as TE keeps it, dequantized, both copies in x's layout and dtype:
/// the row-wise copy (read by a GEMM reducing over the last dimension) and the column-wise
/// copy (read by one reducing over the rows). Per-tensor scaling and 2D blocks give the same
/// tensor twice (`columnwise.is_same(rowwise)`); 1D blocks two separately quantized copies.
struct QuantizedOperand {
  at::Tensor rowwise;
  at::Tensor columnwise;
};

// ---------------------------------------------------------------------------------------
// Per-path quantization points (docs/BACKENDS.md "Per-path quantization points")

/// Where a path's fused ops quantize other than its basic ops do, by module index: what a
/// reference evaluation must do differently to be the float64 reference of that path. Empty
/// for an unfused path (the basic ops' quantization points, the reference's default). A fused
/// op whose basic ops' math is the same but whose quantizer sees another tensor describes that
/// here; the runner derives it from the fused groups a path's plans report
/// (runner/quantization_points.h).
struct QuantizationPoints {
  /// A Linear (module index) whose backward GEMMs (dgrad and wgrad) quantize the gradient
  /// that reaches it and multiply their result by alpha (TE's BackwardLinearScale: the
  /// following ConstantScale's scale as the GEMMs' alpha, its grad_output quantizer seeing the
  /// unscaled gradient). Module index -> alpha.
  std::map<int64_t, double> backward_gemm_alpha;
  /// Ops (module indices) whose backward passes the gradient through unchanged because a fused
  /// op applies their factor elsewhere (the ConstantScale of a BackwardLinearScale); their
  /// forward value is unchanged.
  std::set<int64_t> gradient_passthrough;

  bool empty() const { return backward_gemm_alpha.empty() && gradient_passthrough.empty(); }
  bool operator==(const QuantizationPoints& other) const {
    return backward_gemm_alpha == other.backward_gemm_alpha && gradient_passthrough == other.gradient_passthrough;
  }
  bool operator!=(const QuantizationPoints& other) const { return !(*this == other); }
  /// "op 3: backward GEMMs alpha 1.5; op 4: gradient passed through" (empty: "the basic ops'").
  std::string describe() const;
};

// ---------------------------------------------------------------------------------------
// The quantizer state of one reference evaluation sequence

namespace detail {
struct QuantizationState;
}  // namespace detail

/// Whether a forward ran with grad mode on (DelayedScaling updates its forward scales only then).
enum class ForwardGrad { kDisabled, kEnabled };

/// The quantizers of one reference evaluation sequence: one per (module index, group, role),
/// GroupedLinear's group g or 0, created when first used and kept across the evaluator's calls
/// (one object for all repeat calls of a case, as one te Sequential keeps its histories).
/// Without a recipe only cache_quantized_input quantizes. With jitter on, every quantized
/// element is moved to a neighbouring FP8 value with the jitter's probability (the oracle's
/// estimate of what one FP8 ulp per quantized element costs a case). Movable, not copyable;
/// backward hooks share its state, so they stay valid after a move.
class ReferenceQuantization {
 public:
  /// No recipe: Linear and GroupedLinear stay in high precision.
  ReferenceQuantization();
  explicit ReferenceQuantization(QuantRecipe recipe);
  ~ReferenceQuantization();
  ReferenceQuantization(ReferenceQuantization&&) noexcept;
  ReferenceQuantization& operator=(ReferenceQuantization&&) noexcept;
  ReferenceQuantization(const ReferenceQuantization&) = delete;
  ReferenceQuantization& operator=(const ReferenceQuantization&) = delete;

  /// The recipe, or nullptr.
  const QuantRecipe* recipe() const;

  /// Turns jitter on for every later quantization: `probability` in [0, 1], draws from
  /// `generator` (a CPU generator, held, not copied). Throws InvalidArgumentError otherwise.
  /// With `reference` and `windows` (one each per quantization of the evaluation, in order:
  /// the float64 reference's scaled values, see record_scaled, and how close to a rounding
  /// boundary such a value must lie to round the other way in a correct implementation),
  /// quantization i starts from the reference's FP8 codes (what a correct implementation
  /// rounds to wherever nothing can carry a value across a boundary; the evaluation's own
  /// scale still dequantizes them) and moves only the elements whose reference value has an
  /// fp8_rounding_margin below windows[i]. A quantization past their end, or whose shape
  /// differs, rounds its own values and may move every element (the conservative estimate).
  void set_jitter(double probability, at::Generator generator, std::vector<at::Tensor> reference = {},
                  std::vector<at::Tensor> windows = {});
  /// Turns jitter off.
  void clear_jitter();
  /// Appends the scaled values float(x) · scale (float64, before the cast) of every later
  /// quantization to `into`, in order (nullptr stops); the oracle compares two evaluations'
  /// records to find the elements a rounding difference can move across a boundary.
  void record_scaled(std::vector<at::Tensor>* into);

  /// Every later quantized GEMM (fprop always; dgrad and wgrad where the backward is
  /// quantized, backward_override none) gives its result as `mode` says under `model`: the
  /// exact product plus or minus the accumulation term, or the emulated accumulator.
  /// kRandomSign draws one number per output element from `generator` (a CPU generator,
  /// held). Throws InvalidArgumentError for a model that does not validate or kRandomSign
  /// without a CPU generator.
  void set_accumulation(Fp8GemmAccumulation model, AccumulationMode mode,
                        std::optional<at::Generator> generator = std::nullopt);
  /// Back to exact GEMMs.
  void clear_accumulation();

  /// The quantization points of the path this evaluation is the reference of (empty: the
  /// basic ops', the default). Throws InvalidArgumentError for non-empty points without a
  /// recipe (only a recipe's Linear GEMMs can apply them).
  void set_points(QuantizationPoints points);
  const QuantizationPoints& points() const;
  /// The points' alpha of module `op`'s backward GEMMs, 1 where it has none.
  double backward_gemm_alpha(int64_t op) const;
  /// Whether module `op`'s backward passes its gradient through (QuantizationPoints).
  bool gradient_passthrough(int64_t op) const;

  /// Set by the evaluator before each module: the module index the next quantizations use.
  void set_current_op(int64_t op);
  int64_t current_op() const;
  /// Set by the evaluator before each module: whether the module after it, in the same fuser,
  /// casts its input gradient to FP8 with this module's grad_output quantizer
  /// (BasicOp::casts_grad_input_for_previous_op under the recipe). Every path of a case has
  /// it alike: TE's fuser hands the previous op's quantizer to basic and fused ops the same.
  void set_next_op_casts_gradient(bool casts);
  bool next_op_casts_gradient() const;
  /// `t` (the current op's output) whose incoming gradient dy reaches t's producer as
  /// dq(Qg(dy)): the current op's grad_output quantizer of `group` over the whole tensor, the
  /// row-wise copy (what te.ops' maybe_dequantize reads of it), recording dy's amax into that
  /// quantizer's DelayedScaling history. The cast a next op makes for a GroupedLinear
  /// (docs/BACKENDS.md "Where te.ops quantizes"). A view of t; t itself where it needs no
  /// gradient. Throws InvalidArgumentError without a recipe.
  at::Tensor with_gradient_cast_for_next_op(const at::Tensor& t, int64_t group);

  /// Quantizes `x` with the current op's quantizer of `role` and `group` under the recipe
  /// (delayed: its current scale, recording x's amax in history slot 0 with a max; current:
  /// x's own amax; block: per block of the role's dims). The result is detached. Throws
  /// InvalidArgumentError without a recipe.
  QuantizedOperand quantize(QuantRole role, int64_t group, const at::Tensor& x);
  /// cache_quantized_input's quantize-dequantize of an activation input (E4M3, current
  /// scaling over the whole tensor, fp32 scales, epsilon 0; whatever the recipe), detached,
  /// in x's dtype.
  at::Tensor quantize_cached_input(const at::Tensor& x);

  /// End of a forward: with kEnabled, every delayed-scaling forward (input, weight) quantizer
  /// takes its new scale from its history and rolls it (TE: autocast exit); with kDisabled
  /// nothing changes (the recorded amaxes wait for the next update).
  void after_forward(ForwardGrad grad);
  /// End of a backward: if some gradient was quantized since the last call, every
  /// delayed-scaling grad_output quantizer updates the same way.
  void after_backward();

  /// DelayedScaling's amax_history_len changed to `length` (>= 1) between calls: every
  /// history keeps its first `length` slots or is padded with zeros at its end, its scale
  /// kept, and quantizers made later get `length` slots (op.py: reset_recipe_state for a
  /// recipe of the same type). InvalidArgumentError without a DelayedScaling recipe.
  void set_amax_history_len(int64_t length);

  /// The current scale of a delayed-scaling quantizer; InvalidArgumentError when there is none.
  float delayed_scale(int64_t op, QuantRole role, int64_t group = 0) const;
  /// Its amax history, slot 0 first; InvalidArgumentError when there is none.
  std::vector<float> amax_history(int64_t op, QuantRole role, int64_t group = 0) const;

 private:
  // The quantized GEMM's backward hooks share the state (they may outlive a move).
  friend at::Tensor reference_quantized_linear(const at::Tensor& input, const at::Tensor& weight, int64_t group);
  std::shared_ptr<detail::QuantizationState> state_;
};

/// The quantization of the reference evaluation running on this thread, or nullptr.
ReferenceQuantization* reference_quantization();
/// The recipe of the reference evaluation running on this thread, or nullptr (none, or no
/// quantization set).
const QuantRecipe* reference_recipe();

/// Makes `quantization` this thread's for its lifetime (restoring the previous one); nullptr
/// is allowed (no quantization).
class ReferenceQuantizationScope {
 public:
  explicit ReferenceQuantizationScope(ReferenceQuantization* quantization);
  ~ReferenceQuantizationScope();
  ReferenceQuantizationScope(const ReferenceQuantizationScope&) = delete;
  ReferenceQuantizationScope& operator=(const ReferenceQuantizationScope&) = delete;

 private:
  ReferenceQuantization* previous_;
};

// ---------------------------------------------------------------------------------------
// The quantized reference math (plain autograd plus gradient hooks)

/// `value` with the gradient of `carrier` (same shape): value.detach() + (carrier -
/// carrier.detach()), exact where carrier is finite.
at::Tensor value_with_gradient_of(const at::Tensor& value, const at::Tensor& carrier);

/// y = x Wᵀ on the operands the recipe of this thread's reference_quantization() gives
/// (BACKENDS.md "Where te.ops quantizes"), x [.., in], weight [out, in] -> y [.., out], the
/// quantizers of the current op's `group`. Value: dq(Qi(x)) · dq(Qw(W))ᵀ on the row-wise
/// copies. Gradients (straight through the quantizers of x and W):
///   none:           dx = dq(Qg(dy)) · dq(Qw(W)),  dW = dq(Qg(dy))ᵀ · dq(Qi(x)), the
///                   column-wise copies of W, x and dy where 1D blocks make them differ;
///   high_precision: dx = dy · W,  dW = dyᵀ · x;
///   dequantized:    dx = dy · dq(Qw(W)),  dW = dyᵀ · dq(Qi(x)), row-wise copies.
/// The FP8 GEMMs (the value; dx and dW under `none`) give what set_accumulation says.
/// Where the quantization points give the current op a backward alpha, dx and dW are alpha
/// times the above, on the gradient as it reaches the op (quantized unscaled, the alpha after
/// the GEMMs and their accumulation, as TE's BackwardLinearScale computes them).
/// Throws InvalidArgumentError without a recipe.
at::Tensor reference_quantized_linear(const at::Tensor& input, const at::Tensor& weight, int64_t group);

/// cache_quantized_input's operand: a tensor whose value is dq(Q(x)) (E4M3 current scaling,
/// quantize_cached_input of this thread's quantization, or the same without jitter when none
/// is set) and whose gradient with respect to x is the identity. An activation returns
/// value_with_gradient_of(act(x), act(this)): value act(x), gradient act'(dq(Q(x))).
at::Tensor reference_cached_input(const at::Tensor& input);

}  // namespace gradfuzz::ops
