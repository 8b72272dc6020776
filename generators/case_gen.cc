#include "generators/case_gen.h"

#include <algorithm>
#include <limits>
#include <map>
#include <stdexcept>

#include "generators/draw.h"
#include "generators/parallel_gen.h"
#include "generators/validate.h"
#include "ops/fusion_registry.h"
#include "ops/op_registry.h"

// Distribution of gen_case (every choice is uniform over the listed options; "chance p"
// draws yes with probability p and shrinks towards no):
// - rows uniform in 1..8; features (also Linear/GroupedLinear `out`): with chance 3/4 an
//   even value of {2,4,6,8}, else an odd one of {3,5,7};
// - catalog-op count n the largest of three uniform draws in [1, budget] (see case_gen.h);
//   blocks are appended until n ops exist: each block is, with chance 1/5, one catalog op
//   drawn uniformly from the registry (ops whose attrs cannot fit the current shape are
//   skipped), else one motif
//   drawn from those that fit the remaining budget and shape, weighted so that every fusion
//   registration fires in at least 5% of a default 2000-case campaign (measured per seed:
//   docs/BENCHMARKS.md): residual 16 (three registrations, the joint one hiding the two
//   others), moe 17 (five ops of the budget), linear_bias_add, linear_bias_act, extra_linear
//   and extra_rmsnorm 4, linear_scale_add 5, the others 1:
//     linear_bias_act   Linear, Bias[, ReLU|GELU]                      (1/3 each tail)
//     linear_bias_add   Linear[, Bias], AddExtraInput
//     linear_scale_add  Linear, ConstantScale, AddExtraInput
//     linear_scale      Linear, ConstantScale
//     extra_linear      MakeExtraOutput, Linear
//     bias_act          Bias, ReLU|GELU
//     extra_rmsnorm     MakeExtraOutput, RMSNorm
//     moe               Dispatch, GroupedLinear, ScaledSwiGLU|ScaledSReLU, GroupedLinear,
//                       Combine (split sizes, probs and routing map suggested as channels;
//                       the second GroupedLinear of the first one's bias kind with chance 3/4)
//     residual          MakeExtraOutput, <one shape-preserving op>, AddExtraInput (same C;
//                       the middle op without extra tensors with chance 3/4)
//     fresh_scale       RowStat|Dispatch, ScaledSReLU|ScaledSwiGLU|GroupedLinear(scale_bias)
//                       (the fresh tensor suggested for the scales slot)
//   Before every block after the first, a Boundary module with chance 1/5.
// - RMSNorm and LayerNorm only where the features are >= 4 (see kMinNormFeatures);
// - attrs: ConstantScale `scale` and DualExtraOutput `s0`,`s1` from {-2,-0.5,0.5,1.5,3};
//   `in_place` 0/1; groups 1..4; `bias` 0/1 (1 when `scale_bias`); `scale_bias` 0/1;
//   SwiGLU and ScaledSwiGLU `interleave` 0 or any k with features % 2k == 0; RMSNorm and
//   LayerNorm eps {1e-5,1e-3} and `zero_centered_gamma` 1 with chance 1/2; Reshape
//   `features` a divisor (<= 8) of rows*features. The options a backend documents with a
//   domain of values (capabilities: cache_quantized_input, accumulate_into_main_grad, ...)
//   are drawn uniformly over it (with_backend_options); without one they keep defaults.
// - bindings: each extra input slot with a motif suggestion is bound to it with chance 3/4;
//   any other slot with at least one compatible earlier producer in its fuser is bound with
//   chance 1/2 to one drawn uniformly (fan-out arises when several pick the same producer);
//   otherwise public. A consumed output is public-and-bound or hidden (1/2 each); an
//   unconsumed one is unbound (1/2), bound hidden (1/4) or bound public (1/4).
// - per op: generator output style with chance 1/2; a call-then-bind step with chance 1/6
//   (grad mode on/off 1/2 each); with chance 1/4 random per-parameter requires-grad flags
//   (each off with chance 1/2), and likewise for public floating extra inputs.
// - main input requires grad with chance 3/4; fusions: all allowed ones (1/5); each
//   independently with chance 1/2 (1/5); only the fusions of one pass (joint 1/5, forward
//   2/5, backward 2/5) (3/5). dtype uniform over options; seed uniform u64.
// - a recipe (backends with available ones, drawn before the shapes) with chance 1/2: uniform
//   over the available recipes, their formats and option values; GEMM dimensions then
//   multiples of 16 (tiny: rows 16 or 32, features 16..64), and kept so at every GEMM: a
//   GEMM only on aligned features, SwiGLU only where its half is, no Reshape (fits());
// - steering (GenOptions::feature_weights, drawn first when given): a case may draw
//   generator styles, call-then-bind steps or in_place=1 only with its feature's weight;
// - with chance 1/4, one or two repeat calls (where the backend runs them): no_grad with
//   chance 1/3, the input requiring grad with chance 1/2;
// - last, the usage script (the elements the backend's capabilities.usage lists): with chance
//   1/8 one to six more calls (a training loop of up to eight); per call an optimizer step
//   before it (1/2), a no_grad call under inference_mode (1/2), a checkpoint round trip
//   (1/4), recompute where it runs backward and the recipe is not DelayedScaling (1/4), the
//   ops in a second Sequential (1/6); per case the held outputs read after each backward (1/4).

namespace gradfuzz::generators {
namespace {

using harness::CaseSpec;
using harness::OpSpec;
using ops::OpAttrs;

using detail::chance;
using detail::pick;
using detail::pick_of;

const std::vector<double> kScales{-2.0, -0.5, 0.5, 1.5, 3.0};

/// Dimensions at and around the block, warp and vector widths of the kernels under test.
const std::vector<int64_t> kEdgeDims{1,    7,    8,    9,    15,   16,   17,   31,   32,   33,   63,
                                     64,   65,   127,  128,  129,  255,  256,  257,  511,  512,  513,
                                     1023, 1024, 1025, 2047, 2048, 2049, 4095, 4096, 4097, 8191, 8192};

/// A case under construction, with what the generator knows about each module.
struct Draft {
  std::vector<OpSpec> ops;
  std::vector<std::vector<int64_t>> in_shape;
  std::vector<ops::OpSignature> sig;
  std::vector<int64_t> fuser;  // -1 for Boundary
  int64_t current_fuser = 0;
  bool fuser_open = false;
  std::vector<int64_t> shape;
  /// consumer slot -> suggested producer slot (motif wiring).
  std::map<SlotAt, SlotAt> suggested;
  int64_t num_catalog_ops = 0;
  /// The case's shape regime (never kMix) and the element budget of one tensor.
  ShapeRegime regime = ShapeRegime::kTiny;
  int64_t max_tensor_elements = int64_t{1} << 24;
  /// The backend under test; null for the model's catalog.
  const harness::BackendCapabilities* caps = nullptr;
  /// Steering: whether this case may draw each steerable feature (GenOptions::feature_weights).
  bool allow_generator = true;
  bool allow_call_then_bind = true;
  bool allow_in_place = true;
  /// The case runs under an FP8 recipe: its GEMM dimensions are drawn as multiples of 16
  /// (te.autocast's documented requirement for a Linear's input).
  bool quantized = false;

  int64_t features() const { return shape[1]; }
  int64_t rows() const { return shape[0]; }
  /// Whether the backend can build op `name`.
  bool has(const std::string& name) const { return !caps || caps->op(name) != nullptr; }
  bool has_all(std::initializer_list<const char*> names) const {
    return std::all_of(names.begin(), names.end(), [&](const char* n) { return has(n); });
  }
  /// Whether op `name` can hand back its extra outputs as a generator in this backend.
  bool allows_generator(const std::string& name) const {
    if (!caps) return true;
    const auto* op = caps->op(name);
    return op && std::find(op->output_styles.begin(), op->output_styles.end(), ops::OutputStyle::kGenerator) !=
                     op->output_styles.end();
  }
};

/// A feature count for the draft's regime (tiny: as the distribution notes say).
int64_t draw_dim(const Draft& d, bool rows) {
  switch (d.regime) {
    case ShapeRegime::kEdge: {
      if (!d.quantized) return pick_of(kEdgeDims);
      std::vector<int64_t> aligned;
      for (int64_t v : kEdgeDims) {
        if (v % 16 == 0) aligned.push_back(v);
      }
      return pick_of(aligned);
    }
    case ShapeRegime::kLarge: {
      // Mostly multiples of 64 (what models use), sometimes one off (the kernels' tails).
      const int64_t v = rows ? pick(16, 512) * 64 : pick(16, 256) * 64;
      return v + (d.quantized ? 0 : pick_of<int64_t>({0, 0, 0, 0, 1, -1}));
    }
    default:
      if (d.quantized) return 16 * (rows ? pick(1, 2) : pick(1, 4));
      return rows ? pick(1, 8) : (chance(3, 4) ? pick_of<int64_t>({2, 4, 6, 8}) : pick_of<int64_t>({3, 5, 7}));
  }
}

/// A new feature count (an op's `out`) that keeps [rows, out] and the weight [out, features]
/// within the tensor budget: halved (to at least 1) until it fits.
int64_t draw_features(const Draft& d) {
  int64_t out = draw_dim(d, /*rows=*/false);
  const int64_t wider = std::max(d.rows(), d.features());
  while (out > 1 && out * wider > d.max_tensor_elements) out /= 2;
  return out;
}

/// The values the backend documents for option `attr` of op `name` (nullptr: any).
const std::vector<double>* backend_domain(const Draft& d, const std::string& name, const std::string& attr) {
  if (!d.caps) return nullptr;
  const auto* op = d.caps->op(name);
  if (!op) return nullptr;
  auto it = op->options.find(attr);
  return it == op->options.end() || it->second.empty() ? nullptr : &it->second;
}

/// `attrs` plus, for a backend with option domains for op `name`, one value of each option
/// the caller left unset (drawn uniformly).
OpAttrs with_backend_options(const Draft& d, const std::string& name, OpAttrs attrs) {
  if (!d.caps) return attrs;
  const auto* op = d.caps->op(name);
  if (!op) return attrs;
  for (const auto& [attr, values] : op->options) {
    if (!values.empty() && !attrs.count(attr)) attrs[attr] = pick_of(values);
  }
  return attrs;
}

/// Appends a catalog op; returns its module index, or -1 when the attrs do not fit or the
/// backend lacks the op.
int64_t append(Draft& d, const std::string& name, OpAttrs attrs) {
  if (!d.has(name)) return -1;
  ops::OpSignature sig;
  try {
    OpAttrs full = with_backend_options(d, name, attrs);
    try {
      sig = ops::OpRegistry::catalog().signature(name, full, d.shape);
      attrs = std::move(full);
    } catch (const std::exception&) {
      // A backend option value that does not fit this shape: the catalog's choice instead.
      sig = ops::OpRegistry::catalog().signature(name, attrs, d.shape);
    }
  } catch (const std::exception&) {
    return -1;
  }
  if (!d.fuser_open) {
    d.fuser_open = true;
    if (d.num_catalog_ops > 0) ++d.current_fuser;
  }
  OpSpec op;
  op.name = name;
  op.attrs = std::move(attrs);
  d.ops.push_back(std::move(op));
  d.in_shape.push_back(d.shape);
  d.fuser.push_back(d.current_fuser);
  d.shape = sig.output_shape;
  d.sig.push_back(std::move(sig));
  ++d.num_catalog_ops;
  return static_cast<int64_t>(d.ops.size()) - 1;
}

void append_boundary(Draft& d) {
  OpSpec op;
  op.name = harness::kBoundaryOp;
  d.ops.push_back(std::move(op));
  d.in_shape.push_back(d.shape);
  d.fuser.push_back(-1);
  d.sig.emplace_back();
  d.fuser_open = false;
}

void suggest(Draft& d, int64_t producer, int64_t out_slot, int64_t consumer, int64_t in_slot) {
  if (producer < 0 || consumer < 0) return;
  d.suggested[{consumer, in_slot}] = {producer, out_slot};
}

/// Attrs for op `name` on the current shape, drawn per the table at the top of this file.
OpAttrs choose_attrs(const std::string& name, const Draft& d) {
  const int64_t f = d.features();
  if (name == "Linear") return {{"out", static_cast<double>(draw_features(d))}};
  if (name == "ConstantScale") return {{"scale", pick_of(kScales)}};
  if (name == "MakeExtraOutput" || name == "AddExtraInput") {
    const bool in_place = chance(1, 2);
    return {{"in_place", in_place && d.allow_in_place ? 1.0 : 0.0}};
  }
  if (name == "DualExtraOutput") return {{"s0", pick_of(kScales)}, {"s1", pick_of(kScales)}};
  if (name == "RMSNorm" || name == "LayerNorm") {
    const double eps = pick_of<double>({1e-5, 1e-3});
    return {{"eps", eps}, {"zero_centered_gamma", chance(1, 2) ? 1.0 : 0.0}};
  }
  if (name == "Dispatch") return {{"groups", static_cast<double>(pick(1, 4))}};
  if (name == "GroupedLinear") {
    const bool scale_bias = chance(1, 2);
    const bool bias = scale_bias || chance(1, 2);
    return {{"groups", static_cast<double>(pick(1, 4))},
            {"out", static_cast<double>(draw_features(d))},
            {"bias", bias ? 1.0 : 0.0},
            {"scale_bias", scale_bias ? 1.0 : 0.0}};
  }
  if (name == "SwiGLU" || name == "ScaledSwiGLU") {
    // Every block width that divides the features; a backend that documents its own values
    // (TE's kernels take 0 or multiples of 32) narrows them to those.
    const std::vector<double>* domain = backend_domain(d, name, "interleave");
    std::vector<int64_t> choices{0};
    for (int64_t k = 1; 2 * k <= f; ++k) {
      const bool offered =
          !domain || std::find(domain->begin(), domain->end(), static_cast<double>(k)) != domain->end();
      if (f % (2 * k) == 0 && offered) choices.push_back(k);
    }
    return {{"interleave", static_cast<double>(pick_of(choices))}};
  }
  if (name == "Reshape") {
    std::vector<int64_t> divisors;
    for (int64_t k = 1; k <= 8; ++k) {
      if ((d.rows() * f) % k == 0) divisors.push_back(k);
    }
    return {{"features", static_cast<double>(pick_of(divisors))}};
  }
  return {};
}

bool needs_even_features(const std::string& name) { return name == "SwiGLU" || name == "ScaledSwiGLU"; }

/// Normalisations over fewer features are degenerate: RMSNorm over one feature and LayerNorm
/// over two give an output that does not depend on the input (up to eps), so the true
/// gradient is a cancellation of O(1) terms to ~0, and any two correct implementations
/// disagree by their rounding noise amplified by 1/std. That judges arithmetic order, not
/// gradient routing, so the generator keeps norms at 4 features or more.
constexpr int64_t kMinNormFeatures = 4;
bool is_norm(const std::string& name) { return name == "RMSNorm" || name == "LayerNorm"; }

bool is_gemm(const std::string& name) { return name == "Linear" || name == "GroupedLinear"; }

/// FP8 GEMMs take dimensions that are multiples of this (te.autocast: TE's
/// assert_dim_for_fp8_exec, cuBLASLt's FP8 alignment).
constexpr int64_t kFp8Multiple = 16;

/// Whether op `name` may follow the draft's current shape. Under a recipe every GEMM's input
/// features stay multiples of 16: a GEMM only on aligned features, SwiGLU only where its half
/// is aligned, no Reshape (its features are at most 8).
bool fits(const std::string& name, const Draft& d) {
  if (d.quantized) {
    if (is_gemm(name) && d.features() % kFp8Multiple != 0) return false;
    if (needs_even_features(name) && d.features() % (2 * kFp8Multiple) != 0) return false;
    if (name == "Reshape") return false;
  }
  if (needs_even_features(name) && d.features() % 2 != 0) return false;
  return !is_norm(name) || d.features() >= kMinNormFeatures;
}

void single_op_block(Draft& d) {
  const auto names = ops::OpRegistry::catalog().names();
  std::vector<std::string> eligible;
  for (const auto& n : names) {
    // The collectives are drawn in distributed cases only (parallel_gen.h): one-process
    // cases draw from the catalog as they did before those existed.
    const bool collective = n == "AllGather" || n == "ReduceScatter" || n == "AllReduce";
    if (fits(n, d) && d.has(n) && !collective) eligible.push_back(n);
  }
  const auto name = pick_of(eligible);
  append(d, name, choose_attrs(name, d));
}

int64_t append_linear(Draft& d) { return append(d, "Linear", choose_attrs("Linear", d)); }

std::string pick_act(const Draft& d) {
  const std::string act = pick_of<std::string>({"ReLU", "GELU"});
  return d.has(act) ? act : (act == "ReLU" ? "GELU" : "ReLU");
}

/// Names of the motifs, their largest op count, and their weight: the number of fusion
/// registrations whose pattern the motif forms, so each registration gets about the same
/// share of cases (the residual pattern is registered in all three passes).
struct Motif {
  const char* name;
  int64_t max_ops;
  int64_t weight;
};
const std::vector<Motif> kMotifs{
    {"linear_bias_act", 3, 4}, {"linear_bias_add", 3, 4}, {"linear_scale_add", 3, 5}, {"linear_scale", 2, 1},
    {"extra_linear", 2, 4},    {"bias_act", 2, 1},        {"extra_rmsnorm", 2, 4},    {"moe", 5, 17},
    {"residual", 3, 16},       {"fresh_scale", 2, 1}};

void moe_block(Draft& d) {
  const int64_t groups = pick(1, 4);
  const bool swiglu = chance(1, 2);
  const int64_t dispatch = append(d, "Dispatch", {{"groups", static_cast<double>(groups)}});
  // The second GroupedLinear mostly takes the first one's bias kind (GroupedMLP fuses only
  // linears of one kind); one in four draws its own.
  std::optional<std::pair<bool, bool>> kind;
  auto grouped = [&](int64_t out) {
    const bool own = !kind || chance(1, 4);
    const bool scale_bias = own ? chance(1, 2) : kind->first;
    const bool bias = own ? scale_bias || chance(1, 2) : kind->second;
    if (!kind) kind = std::make_pair(scale_bias, bias);
    const int64_t idx = append(d, "GroupedLinear",
                               {{"groups", static_cast<double>(groups)},
                                {"out", static_cast<double>(out)},
                                {"bias", bias ? 1.0 : 0.0},
                                {"scale_bias", scale_bias ? 1.0 : 0.0}});
    suggest(d, dispatch, 0, idx, 0);                  // split sizes
    if (scale_bias) suggest(d, dispatch, 1, idx, 1);  // probs as bias scales
    return idx;
  };
  if (swiglu) {
    const int64_t half = d.quantized ? kFp8Multiple * std::max<int64_t>(1, draw_features(d) / (2 * kFp8Multiple))
                         : d.regime == ShapeRegime::kTiny ? pick(1, 4)
                                                          : std::max<int64_t>(1, draw_features(d) / 2);
    grouped(2 * half);
  } else {
    grouped(draw_features(d));
  }
  const std::string act = swiglu ? "ScaledSwiGLU" : "ScaledSReLU";
  const int64_t act_idx = append(d, act, choose_attrs(act, d));
  suggest(d, dispatch, 1, act_idx, 0);  // probs as activation scales
  grouped(draw_features(d));
  const int64_t combine = append(d, "Combine", {});
  suggest(d, dispatch, 2, combine, 0);  // routing map
}

void residual_block(Draft& d) {
  const int64_t f = d.features();
  const int64_t producer = append(d, "MakeExtraOutput", choose_attrs("MakeExtraOutput", d));
  // Mostly a middle op without extra tensors (the FusedResidual pattern); one in four with
  // extras of its own, where the pattern must not fuse.
  std::vector<std::string> middles;
  const std::vector<const char*> plain{"Linear", "Bias",    "ConstantScale", "ReLU",    "GELU",
                                       "SReLU",  "RMSNorm", "LayerNorm",     "Identity"};
  const std::vector<const char*> with_extras{"ScaledSReLU",     "MakeExtraOutput", "AddExtraInput", "RowStat",
                                             "DualExtraOutput", "Dispatch",        "Combine",       "GroupedLinear"};
  // A GEMM in the middle keeps the features (out = f): its weight [f, f] must fit the budget.
  auto middle_fits = [&](const char* name) {
    return fits(name, d) && d.has(name) && (!is_gemm(name) || f * f <= d.max_tensor_elements);
  };
  for (const char* name : chance(1, 4) ? with_extras : plain) {
    if (middle_fits(name)) middles.emplace_back(name);
  }
  if (middles.empty()) {
    for (const char* name : plain) {
      if (middle_fits(name)) middles.emplace_back(name);
    }
  }
  const std::string middle = pick_of(middles);
  OpAttrs attrs = choose_attrs(middle, d);
  if (middle == "Linear" || middle == "GroupedLinear") attrs["out"] = static_cast<double>(f);
  append(d, middle, attrs);
  const int64_t consumer = append(d, "AddExtraInput", choose_attrs("AddExtraInput", d));
  suggest(d, producer, 0, consumer, 0);
}

void fresh_scale_block(Draft& d) {
  const bool dispatch = chance(1, 2);
  const int64_t producer = dispatch ? append(d, "Dispatch", choose_attrs("Dispatch", d)) : append(d, "RowStat", {});
  const int64_t fresh_slot = dispatch ? 1 : 0;
  std::vector<std::string> consumers{"ScaledSReLU"};
  for (const char* name : {"GroupedLinear", "ScaledSwiGLU"}) {
    if (fits(name, d)) consumers.emplace_back(name);
  }
  const auto name = pick_of(consumers);
  OpAttrs attrs = choose_attrs(name, d);
  if (name == "GroupedLinear") {
    attrs["scale_bias"] = 1;
    attrs["bias"] = 1;
    if (dispatch && producer >= 0) attrs["groups"] = d.ops[producer].attrs.at("groups");
  }
  const int64_t consumer = append(d, name, attrs);
  if (name == "GroupedLinear") {
    suggest(d, producer, fresh_slot, consumer, 1);
    if (dispatch) suggest(d, producer, 0, consumer, 0);
  } else {
    suggest(d, producer, fresh_slot, consumer, 0);
  }
}

/// Whether the backend has every op motif `name` needs (alternatives: at least one).
bool motif_available(const std::string& name, const Draft& d) {
  const bool act = d.has("ReLU") || d.has("GELU");
  if (name == "linear_bias_act") return d.has_all({"Linear", "Bias"});
  if (name == "linear_bias_add") return d.has_all({"Linear", "AddExtraInput"});
  if (name == "linear_scale_add") return d.has_all({"Linear", "ConstantScale", "AddExtraInput"});
  if (name == "linear_scale") return d.has_all({"Linear", "ConstantScale"});
  if (name == "extra_linear") return d.has_all({"MakeExtraOutput", "Linear"});
  if (name == "bias_act") return d.has("Bias") && act;
  if (name == "extra_rmsnorm") return d.has_all({"MakeExtraOutput", "RMSNorm"});
  if (name == "moe") {
    return d.has_all({"Dispatch", "GroupedLinear", "Combine", "ScaledSwiGLU", "ScaledSReLU"});
  }
  if (name == "residual") return d.has_all({"MakeExtraOutput", "AddExtraInput"});
  if (name == "fresh_scale") return d.has_all({"RowStat", "Dispatch", "ScaledSReLU", "GroupedLinear"});
  return true;
}

void motif_block(Draft& d, int64_t remaining) {
  std::vector<std::string> eligible;
  for (const auto& m : kMotifs) {
    if (m.max_ops > remaining) continue;
    if (std::string(m.name) == "extra_rmsnorm" && !fits("RMSNorm", d)) continue;
    // The motifs that start with a GEMM (moe: GroupedLinear after Dispatch).
    const std::string n = m.name;
    if ((n.rfind("linear", 0) == 0 || n == "extra_linear" || n == "moe") && !fits("Linear", d)) continue;
    if (!motif_available(m.name, d)) continue;
    for (int64_t w = 0; w < m.weight; ++w) eligible.emplace_back(m.name);
  }
  if (eligible.empty()) {
    single_op_block(d);
    return;
  }
  const auto motif = pick_of(eligible);
  if (motif == "linear_bias_act") {
    append_linear(d);
    append(d, "Bias", {});
    const int64_t tail = pick(0, 2);
    if (tail > 0) append(d, tail == 1 ? "ReLU" : "GELU", {});
  } else if (motif == "linear_bias_add") {
    append_linear(d);
    if (chance(1, 2)) append(d, "Bias", {});
    append(d, "AddExtraInput", choose_attrs("AddExtraInput", d));
  } else if (motif == "linear_scale_add") {
    append_linear(d);
    append(d, "ConstantScale", choose_attrs("ConstantScale", d));
    append(d, "AddExtraInput", choose_attrs("AddExtraInput", d));
  } else if (motif == "linear_scale") {
    append_linear(d);
    append(d, "ConstantScale", choose_attrs("ConstantScale", d));
  } else if (motif == "extra_linear") {
    append(d, "MakeExtraOutput", choose_attrs("MakeExtraOutput", d));
    append_linear(d);
  } else if (motif == "bias_act") {
    append(d, "Bias", {});
    append(d, pick_act(d), {});
  } else if (motif == "extra_rmsnorm") {
    append(d, "MakeExtraOutput", choose_attrs("MakeExtraOutput", d));
    append(d, "RMSNorm", choose_attrs("RMSNorm", d));
  } else if (motif == "moe") {
    moe_block(d);
  } else if (motif == "residual") {
    residual_block(d);
  } else {
    fresh_scale_block(d);
  }
}

bool compatible(const Draft& d, SlotAt producer, SlotAt consumer) {
  if (producer.op >= consumer.op || d.fuser[producer.op] < 0 || d.fuser[producer.op] != d.fuser[consumer.op]) {
    return false;
  }
  const auto& out = d.sig[producer.op].extra_outputs;
  const auto& in = d.sig[consumer.op].extra_inputs;
  if (producer.slot >= static_cast<int64_t>(out.size()) || consumer.slot >= static_cast<int64_t>(in.size())) {
    return false;
  }
  const auto& o = out[producer.slot];
  if (!(o == in[consumer.slot])) return false;
  // Split sizes sum to the producer's rows: the consumer must see the same row count.
  return o.kind != ops::TensorKind::kSplitSizes || d.in_shape[producer.op][0] == d.in_shape[consumer.op][0];
}

/// Draws every binding (see the distribution notes) and writes them into d.ops.
void bind_channels(Draft& d) {
  std::map<SlotAt, SlotAt> source;  // consumer -> producer
  std::map<SlotAt, int64_t> consumer_count;
  for (int64_t j = 0; j < static_cast<int64_t>(d.ops.size()); ++j) {
    for (int64_t s = 0; s < static_cast<int64_t>(d.sig[j].extra_inputs.size()); ++s) {
      const SlotAt here{j, s};
      auto sug = d.suggested.find(here);
      if (sug != d.suggested.end() && compatible(d, sug->second, here)) {
        if (chance(3, 4)) source[here] = sug->second;
        continue;
      }
      std::vector<SlotAt> candidates;
      for (int64_t i = 0; i < j; ++i) {
        for (int64_t t = 0; t < static_cast<int64_t>(d.sig[i].extra_outputs.size()); ++t) {
          if (compatible(d, {i, t}, here)) candidates.push_back({i, t});
        }
      }
      if (!candidates.empty() && chance(1, 2)) source[here] = pick_of(candidates);
    }
  }
  for (const auto& [consumer, producer] : source) ++consumer_count[producer];

  int64_t next_channel = 0;
  std::map<SlotAt, std::string> names;
  for (int64_t i = 0; i < static_cast<int64_t>(d.ops.size()); ++i) {
    auto& op = d.ops[i];
    const int64_t n_out = static_cast<int64_t>(d.sig[i].extra_outputs.size());
    op.output_bindings.assign(static_cast<size_t>(n_out), harness::OutputBindingSpec{});
    for (int64_t t = 0; t < n_out; ++t) {
      auto& b = op.output_bindings[t];
      if (consumer_count.count({i, t})) {
        b.channel = "c" + std::to_string(next_channel++);
        b.output_to_caller = !chance(1, 2);
      } else {
        const int64_t r = pick(0, 3);
        if (r >= 2) {
          b.channel = "c" + std::to_string(next_channel++);
          b.output_to_caller = r == 3;
        }
      }
      if (b.channel) names[{i, t}] = *b.channel;
    }
  }
  for (const auto& [consumer, producer] : source) {
    auto& chans = d.ops[consumer.op].input_channels;
    if (chans.size() <= static_cast<size_t>(consumer.slot)) chans.resize(static_cast<size_t>(consumer.slot) + 1);
    chans[consumer.slot] = names.at(producer);
  }
}

CaseSpec draw_case(const GenOptions& options) {
  const int size = *rc::gen::withSize([](int s) { return rc::gen::just(s); });
  const int64_t scaled =
      (static_cast<int64_t>(options.max_ops) * std::min(size, rc::kNominalSize) + rc::kNominalSize - 1) /
      rc::kNominalSize;
  const int64_t budget = std::max<int64_t>(1, scaled);

  Draft d;
  d.caps = options.capabilities.get();
  // Steering first, and only when asked for: unsteered campaigns draw exactly as before.
  for (const auto& [feature, weight] : options.feature_weights) {
    const bool allowed = pick(0, 999) < static_cast<int64_t>(weight * 1000);
    if (feature == "generator_outputs") d.allow_generator = allowed;
    if (feature == "call_then_bind") d.allow_call_then_bind = allowed;
    if (feature == "in_place") d.allow_in_place = allowed;
  }
  d.max_tensor_elements = std::max<int64_t>(options.max_tensor_elements, 64);
  // A recipe first, where the backend offers any (other backends draw exactly as before):
  // every path then runs under it (harness::RecipeSpec), drawn uniformly with its format and
  // each documented option uniformly over the backend's values.
  std::optional<harness::RecipeSpec> recipe;
  if (d.caps && options.recipe != "none") {
    std::vector<const harness::RecipeCapability*> recipes;
    for (const auto* r : d.caps->available_recipes()) {
      if (options.recipe == "any" || r->name == options.recipe) recipes.push_back(r);
    }
    if (!recipes.empty() && (options.recipe != "any" || chance(1, 2))) {
      const harness::RecipeCapability& r = *pick_of(recipes);
      harness::RecipeSpec spec_recipe;
      spec_recipe.name = r.name;
      if (!r.fp8_formats.empty()) spec_recipe.fp8_format = pick_of(r.fp8_formats);
      for (const auto& [option, values] : r.options) {
        if (!values.empty()) spec_recipe.options[option] = pick_of(values);
      }
      recipe = std::move(spec_recipe);
      d.quantized = true;
    }
  }
  d.regime = options.shapes;
  if (d.regime == ShapeRegime::kMix) {
    const int64_t r = pick(0, 9);
    d.regime = r < 6 ? ShapeRegime::kTiny : r < 9 ? ShapeRegime::kEdge : ShapeRegime::kLarge;
  }
  {
    int64_t rows = draw_dim(d, /*rows=*/true);
    const int64_t features = draw_dim(d, /*rows=*/false);
    while (rows > 1 && rows * features > d.max_tensor_elements) rows /= 2;
    d.shape = {rows, features};
  }
  CaseSpec spec;
  spec.input_shape = d.shape;
  spec.recipe = std::move(recipe);

  // The largest of three uniform draws: most cases have room for two motifs (a fusion needs
  // its whole pattern), and small cases stay common enough.
  const int64_t target = std::max({pick(1, budget), pick(1, budget), pick(1, budget)});
  for (int attempts = 0; d.num_catalog_ops < target && attempts < 4 * target + 8; ++attempts) {
    if (d.num_catalog_ops > 0 && chance(1, 5)) append_boundary(d);
    if (chance(1, 5)) {
      single_op_block(d);
    } else {
      motif_block(d, target - d.num_catalog_ops);
    }
  }
  bind_channels(d);

  for (int64_t i = 0; i < static_cast<int64_t>(d.ops.size()); ++i) {
    auto& op = d.ops[i];
    if (op.name == harness::kBoundaryOp) continue;
    if (chance(1, 2) && d.allows_generator(op.name) && d.allow_generator) {
      op.output_style = ops::OutputStyle::kGenerator;
    }
    if (chance(1, 6)) {
      const bool grad_mode = !chance(1, 2);
      if (d.allow_call_then_bind) spec.call_then_bind.push_back({i, grad_mode});
    }
    const int64_t n_params = param_count(op);
    if (n_params > 0 && chance(1, 4)) {
      for (int64_t p = 0; p < n_params; ++p) op.param_requires_grad.push_back(!chance(1, 2));
    }
    const auto& ins = d.sig[i].extra_inputs;
    bool has_public_float = false;
    for (size_t s = 0; s < ins.size(); ++s) {
      const bool bound = s < op.input_channels.size() && op.input_channels[s];
      has_public_float = has_public_float || (!bound && ins[s].kind == ops::TensorKind::kFloat);
    }
    if (has_public_float && chance(1, 4)) {
      for (size_t s = 0; s < ins.size(); ++s) {
        const bool bound = s < op.input_channels.size() && op.input_channels[s];
        op.extra_input_requires_grad.push_back(bound || ins[s].kind != ops::TensorKind::kFloat || !chance(1, 2));
      }
    }
  }
  spec.ops = std::move(d.ops);
  detail::draw_case_settings(spec, options);
  canonicalize(spec);
  return spec;
}

}  // namespace

const char* shape_regime_name(ShapeRegime regime) {
  switch (regime) {
    case ShapeRegime::kTiny:
      return "tiny";
    case ShapeRegime::kEdge:
      return "edge";
    case ShapeRegime::kLarge:
      return "large";
    case ShapeRegime::kMix:
      return "mix";
  }
  return "tiny";
}

ShapeRegime shape_regime_from_name(const std::string& name) {
  for (ShapeRegime r : {ShapeRegime::kTiny, ShapeRegime::kEdge, ShapeRegime::kLarge, ShapeRegime::kMix}) {
    if (name == shape_regime_name(r)) return r;
  }
  throw std::invalid_argument("unknown shape regime '" + name + "'; known: tiny, edge, large, mix");
}

rc::Gen<CaseSpec> gen_case(const GenOptions& options) {
  if (options.dtypes.empty()) throw std::invalid_argument("gen_case: expected at least one dtype, got none");
  if (options.max_ops < 1) {
    throw std::invalid_argument("gen_case: expected max_ops >= 1, got " + std::to_string(options.max_ops));
  }
  if (options.world_size) return gen_parallel_case(options);
  return rc::gen::exec([options] { return draw_case(options); });
}

CaseSpec generate_case(uint64_t seed, int size, const GenOptions& options) {
  return gen_case(options)(rc::Random(seed), size).value();
}

namespace detail {

void draw_case_settings(harness::CaseSpec& spec, const GenOptions& options) {
  spec.input_requires_grad = !chance(1, 4);

  // Fusion registrations with their passes: the backend's, or the model's catalog.
  std::vector<std::pair<std::string, ops::FusionPass>> registrations;
  if (options.capabilities) {
    for (const auto& f : options.capabilities->fusions) registrations.emplace_back(f.name, f.pass);
  } else {
    for (const auto& entry : ops::FusionRegistry::catalog().entries())
      registrations.emplace_back(entry.name, entry.pass);
  }
  std::vector<std::string> allowed;
  if (options.fusions) {
    allowed = *options.fusions;
  } else {
    for (const auto& [name, pass] : registrations) allowed.push_back(name);
  }
  // A joint registration hides the forward- and backward-only registrations of the same
  // pattern, so three cases in five enable a single pass: each pass then runs on its own.
  const int64_t fusion_mode = pick(0, 4);
  if (fusion_mode == 0) {
    spec.fusions = allowed;
  } else if (fusion_mode == 1) {
    for (const auto& f : allowed) {
      if (!chance(1, 2)) spec.fusions.push_back(f);
    }
  } else {
    // Forward or backward more often than joint: the "all" mode already plans joint
    // registrations first, and a joint one hides the single-pass ones of its pattern.
    const auto pass =
        pick_of<ops::FusionPass>({ops::FusionPass::kJoint, ops::FusionPass::kForward, ops::FusionPass::kForward,
                                  ops::FusionPass::kBackward, ops::FusionPass::kBackward});
    for (const auto& [name, entry_pass] : registrations) {
      if (entry_pass == pass && std::find(allowed.begin(), allowed.end(), name) != allowed.end()) {
        spec.fusions.push_back(name);
      }
    }
  }
  spec.dtype = pick_of(options.dtypes);
  spec.device = options.device;
  spec.seed = *rc::gen::noShrink(
      rc::gen::resize(rc::kNominalSize, rc::gen::inRange<uint64_t>(0, std::numeric_limits<uint64_t>::max())));
  // Further calls of the built Sequential (one case in four, where the backend runs them):
  // the main input with another requires-grad flag, or a no_grad forward. The fusers' plans
  // must follow each call's first_op_requiring_backward, and every call give the same values.
  const bool repeats = options.capabilities ? options.capabilities->repeat_calls : true;
  if (repeats && chance(1, 4)) {
    const int64_t n = pick(1, 2);
    for (int64_t k = 0; k < n; ++k) {
      harness::RepeatCall call;
      call.no_grad = chance(1, 3);
      call.input_requires_grad = !chance(1, 2);
      spec.repeat_calls.push_back(call);
    }
  }
  draw_usage_script(spec, options);
}

void draw_usage_script(harness::CaseSpec& spec, const GenOptions& options) {
  // Drawn after everything else, so a backend without usage elements (and every case drawn
  // before them) draws the same cases as before.
  const auto runs = [&](const char* element) {
    return options.capabilities != nullptr && options.capabilities->runs_usage(element);
  };
  if (spec.world_size != 1 || !options.usage) return;
  if (!spec.repeat_calls.empty()) {
    // Delayed scaling's recomputed forward records its amaxes a second time (TE asks for its
    // own checkpoint there): recompute under the other recipes only.
    const bool delayed = spec.recipe && spec.recipe->name == "DelayedScaling";
    if (runs("update") && chance(1, 8)) {
      // A longer training loop: up to eight calls.
      const int64_t more = pick(1, 6);
      for (int64_t k = 0; k < more; ++k) spec.repeat_calls.emplace_back();
    }
    for (auto& call : spec.repeat_calls) {
      if (runs("update")) call.update = chance(1, 2);
      if (call.no_grad && runs("inference_mode")) call.inference_mode = chance(1, 2);
      if (runs("checkpoint")) call.checkpoint = chance(1, 4);
      if (!call.no_grad && !delayed && runs("recompute")) call.recompute = chance(1, 4);
      if (runs("second_sequential")) call.second_sequential = chance(1, 6);
    }
  }
  if (runs("read_after_backward")) spec.read_after_backward = chance(1, 4);
  if (runs("deferred_init")) spec.deferred_init = chance(1, 8);
  // Drawn after the elements above, so that their cases stay as they were.
  const std::string recipe = spec.recipe ? spec.recipe->name : "";
  if (!recipe.empty() && runs("recipe_change")) {
    // A call with the recipe off (an evaluation in high precision, say), or DelayedScaling's
    // history made longer or shorter from a call on.
    for (auto& call : spec.repeat_calls) {
      if (chance(1, 6)) {
        call.recipe_off = true;
      } else if (recipe == "DelayedScaling" && chance(1, 6)) {
        const auto it = spec.recipe->options.find("amax_history_len");
        const int64_t current = it == spec.recipe->options.end() ? 1024 : std::stoll(it->second);
        std::vector<int64_t> lengths;
        for (int64_t n : {1, 2, 3, 16}) {
          if (n != current) lengths.push_back(n);
        }
        call.amax_history_len = pick_of(lengths);
      }
    }
  }
  const auto has = [&](const char* name) {
    return std::any_of(spec.ops.begin(), spec.ops.end(), [&](const harness::OpSpec& op) { return op.name == name; });
  };
  // Several Sequentials for a case that builds: an invalid one fails at a Sequential after
  // others were built and locked, which one Sequential never does (its construction checks
  // every fuser first).
  if (runs("several_sequentials") && has(harness::kBoundaryOp) && is_valid_case(spec)) {
    spec.several_sequentials = chance(1, 3);
  }
  // Quantized weights: their high-precision values are gone, so not under a backward_override
  // of high_precision (whose backward would read them), nor with deferred initialisation.
  const auto override_it = spec.recipe ? spec.recipe->options.find("backward_override")
                                       : std::map<std::string, std::string>::const_iterator{};
  const bool high_precision_backward =
      spec.recipe && override_it != spec.recipe->options.end() && override_it->second == "high_precision";
  if (runs("quantized_params") && !recipe.empty() && recipe != "DelayedScaling" && has("Linear") &&
      !high_precision_backward && !spec.deferred_init) {
    spec.quantized_params = chance(1, 4);
    if (spec.quantized_params && runs("held_quantized_tensor")) spec.held_quantized_tensor = chance(1, 2);
    spec.drop_unmet_usage();  // a call with the recipe off has no high-precision weights to use
  }
}

}  // namespace detail

}  // namespace gradfuzz::generators
