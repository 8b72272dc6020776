#include "generators/parallel_gen.h"

#include <algorithm>
#include <limits>
#include <stdexcept>

#include "generators/draw.h"
#include "generators/validate.h"
#include "harness/sharding.h"
#include "ops/errors.h"
#include "ops/fusion_registry.h"
#include "ops/op_registry.h"

namespace gradfuzz::generators {
namespace {

using harness::CaseSpec;
using harness::Layout;
using harness::OpSpec;
using ops::OpAttrs;

using detail::chance;
using detail::pick;
using detail::pick_of;

/// Per-rank dimensions of the edge regime: around the kernels' block, warp and vector widths.
const std::vector<int64_t> kEdgeLocal{1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256, 257};
const std::vector<double> kScales{-2.0, -0.5, 0.5, 1.5, 3.0};

/// A distributed case under construction: the chain so far, its shape (unsharded) and the
/// layout of its end.
struct Draft {
  int64_t world = 1;
  std::vector<OpSpec> ops;
  std::vector<int64_t> shape;
  Layout layout = Layout::kReplicated;
  /// After an AllGather the whole tensor's gradient is a summand per rank (its backward sums
  /// them): only ops that pass a gradient on as it comes may follow (harness/sharding.h).
  bool summed_gradient = false;
  int64_t catalog_ops = 0;
  int64_t next_channel = 0;
  ShapeRegime regime = ShapeRegime::kTiny;
  int64_t max_tensor_elements = int64_t{1} << 24;
  const harness::BackendCapabilities* caps = nullptr;

  int64_t rows() const { return shape[0]; }
  int64_t features() const { return shape[1]; }
  bool has(const std::string& name) const { return !caps || caps->op(name) != nullptr; }
};

/// A per-rank dimension of the draft's regime.
int64_t draw_local(const Draft& d) {
  switch (d.regime) {
    case ShapeRegime::kEdge:
      return pick_of(kEdgeLocal);
    case ShapeRegime::kLarge:
      return pick(16, 64) * 64 / std::max<int64_t>(1, d.world);
    default:
      return pick(1, 4);
  }
}

/// A feature count split over the ranks (a multiple of N), within the tensor budget.
int64_t draw_split_features(const Draft& d) {
  int64_t local = std::max<int64_t>(1, draw_local(d));
  const int64_t wider = std::max(d.rows(), d.features());
  while (local > 1 && d.world * local * wider > d.max_tensor_elements) local /= 2;
  return d.world * local;
}

/// Any feature count (a plain or row Linear's out), within the tensor budget.
int64_t draw_any_features(const Draft& d) {
  int64_t out = d.regime == ShapeRegime::kTiny ? pick(2, 8) : draw_local(d) * pick(1, 2);
  const int64_t wider = std::max(d.rows(), d.features());
  while (out > 1 && out * wider > d.max_tensor_elements) out /= 2;
  return std::max<int64_t>(1, out);
}

/// The backend's documented option values for op `name`, drawn for the attrs `attrs` leaves
/// unset; cache_quantized_input and interleave stay at their defaults (a rank's FP8 cache
/// scales by its slice; SwiGLU's blocks are the catalog's).
OpAttrs with_options(const Draft& d, const std::string& name, OpAttrs attrs) {
  if (!d.caps) return attrs;
  const auto* op = d.caps->op(name);
  if (!op) return attrs;
  for (const auto& [attr, values] : op->options) {
    if (values.empty() || attrs.count(attr) || attr == "cache_quantized_input" || attr == "interleave") continue;
    attrs[attr] = pick_of(values);
  }
  return attrs;
}

/// Appends catalog op `name` and moves the draft's shape and layout on; false (nothing
/// appended) when the backend lacks it or its attrs do not fit the shape.
bool append(Draft& d, const std::string& name, OpAttrs attrs, Layout out) {
  if (!d.has(name)) return false;
  attrs = with_options(d, name, std::move(attrs));
  ops::OpSignature sig;
  try {
    sig = ops::OpRegistry::catalog().signature(name, attrs, d.shape);
  } catch (const std::exception&) {
    return false;
  }
  OpSpec op;
  op.name = name;
  op.attrs = std::move(attrs);
  d.ops.push_back(std::move(op));
  d.shape = sig.output_shape;
  d.layout = out;
  ++d.catalog_ops;
  return true;
}

OpAttrs linear_attrs(int64_t out, int64_t mode, bool sequence_parallel) {
  OpAttrs a{{"out", static_cast<double>(out)}};
  if (mode != 0) a["tensor_parallel_mode"] = static_cast<double>(mode);
  if (sequence_parallel) a["sequence_parallel"] = 1;
  return a;
}

std::string pick_act(const Draft& d) {
  std::vector<std::string> acts;
  for (const char* a : {"ReLU", "GELU", "SReLU"}) {
    if (d.has(a)) acts.emplace_back(a);
  }
  return acts.empty() ? std::string("Identity") : pick_of(acts);
}

/// Column Linear [tensor-parallel Bias] [activation] row Linear [Bias]: from the whole input
/// (or, with sequence parallelism, its row slices) back to the same layout. `out`: the row
/// Linear's out (0: drawn).
void mlp_block(Draft& d, bool sequence_parallel, int64_t out = 0) {
  const Layout back = d.layout;
  append(d, "Linear", linear_attrs(draw_split_features(d), 1, sequence_parallel), Layout::kFeatures);
  if (chance(1, 2)) append(d, "Bias", {{"tensor_parallel", 1}}, Layout::kFeatures);
  if (chance(2, 3)) append(d, pick_act(d), {}, Layout::kFeatures);
  append(d, "Linear", linear_attrs(out > 0 ? out : draw_any_features(d), 2, sequence_parallel), back);
  if (out == 0 && chance(1, 3)) append(d, "Bias", {}, back);
}

/// A MakeExtraOutput whose extra output a later AddExtraInput of the same fuser consumes,
/// around `inner` (which must come back to the same layout and features).
template <class Inner>
void residual_block(Draft& d, Inner inner) {
  const std::string channel = "c" + std::to_string(d.next_channel++);
  const int64_t features = d.features();
  const Layout layout = d.layout;
  if (!append(d, "MakeExtraOutput", {{"in_place", chance(1, 2) ? 1.0 : 0.0}}, layout)) return;
  d.ops.back().output_bindings = {{channel, chance(1, 2)}};
  inner(features);
  if (d.features() != features || d.layout != layout) return;  // the inner block could not close
  if (append(d, "AddExtraInput", {{"in_place", chance(1, 2) ? 1.0 : 0.0}}, layout)) {
    d.ops.back().input_channels = {channel};
  }
}

/// One op the current layout takes (harness/sharding.h plan_sharding's rules).
void single_op(Draft& d) {
  std::vector<std::string> names{"ConstantScale", "Identity", "MakeExtraOutput"};
  const Layout l = d.layout;
  if (l != Layout::kPartial) {
    for (const char* n : {"ReLU", "GELU", "SReLU", "AddExtraInput"}) names.emplace_back(n);
  }
  if (l == Layout::kReplicated || l == Layout::kRows || d.world == 1) {
    names.emplace_back("Bias");
    if (d.features() >= 4) {
      names.emplace_back("RMSNorm");
      names.emplace_back("LayerNorm");
    }
    if (d.features() % 2 == 0) names.emplace_back("SwiGLU");
  }
  if (l == Layout::kFeatures) names.emplace_back("Bias");
  if (l == Layout::kPartial || l == Layout::kReplicated || l == Layout::kRows) names.emplace_back("Linear");
  const std::string name = pick_of(names);
  OpAttrs attrs;
  Layout out = l;
  if (name == "ConstantScale") attrs = {{"scale", pick_of(kScales)}};
  if (name == "MakeExtraOutput" || name == "AddExtraInput") attrs = {{"in_place", chance(1, 2) ? 1.0 : 0.0}};
  if (name == "RMSNorm" || name == "LayerNorm") {
    attrs = {{"eps", pick_of<double>({1e-5, 1e-3})}, {"zero_centered_gamma", chance(1, 2) ? 1.0 : 0.0}};
  }
  if (name == "Bias" && l == Layout::kFeatures && d.world > 1) attrs = {{"tensor_parallel", 1}};
  if (name == "Linear") attrs = linear_attrs(draw_any_features(d), 0, false);
  if (!append(d, name, attrs, out)) return;
  if (name == "MakeExtraOutput") {
    // Unconsumed: returned unbound (1/2), bound and hidden (1/4) or bound and public (1/4).
    const int64_t r = pick(0, 3);
    if (r >= 2) d.ops.back().output_bindings = {{"c" + std::to_string(d.next_channel++), r == 3}};
  }
}

/// A block from the draft's current layout (see parallel_gen.h for the table).
void block(Draft& d) {
  switch (d.layout) {
    case Layout::kReplicated:
    case Layout::kRows: {
      if (d.summed_gradient) {
        single_op(d);
        break;
      }
      const bool sp = d.layout == Layout::kRows && d.world > 1;
      const int64_t r = pick(0, 13);
      if (r < 4) {
        mlp_block(d, sp);
      } else if (r < 6) {
        if (sp) {
          d.summed_gradient = append(d, "AllGather", {}, Layout::kReplicated);
        } else {
          append(d, "Linear", linear_attrs(draw_split_features(d), 1, false), Layout::kFeatures);
        }
      } else if (r < 8) {
        if (sp) {
          append(d, "Linear", linear_attrs(draw_split_features(d), 1, true), Layout::kFeatures);
        } else {
          append(d, "Linear", linear_attrs(draw_any_features(d), 0, false), d.layout);
          if (chance(1, 2)) append(d, "ConstantScale", {{"scale", pick_of(kScales)}}, d.layout);
        }
      } else if (r < 10) {
        single_op(d);
      } else {
        residual_block(d, [&](int64_t features) { mlp_block(d, sp, features); });
      }
      break;
    }
    case Layout::kFeatures: {
      const int64_t r = pick(0, 8);
      if (r < 3) {
        const bool sp = chance(1, 2);
        append(d, "Linear", linear_attrs(draw_any_features(d), 2, sp), sp ? Layout::kRows : Layout::kReplicated);
        if (chance(1, 3)) append(d, "ConstantScale", {{"scale", pick_of(kScales)}}, d.layout);
      } else if (r < 6) {
        append(d, "Linear", linear_attrs(draw_any_features(d), 0, false), Layout::kPartial);
        if (chance(1, 3)) append(d, "ConstantScale", {{"scale", pick_of(kScales)}}, d.layout);
        const int64_t close = pick(0, 3);
        if (close == 1) append(d, "AllReduce", {}, Layout::kReplicated);
        if (close >= 2) append(d, "ReduceScatter", {}, Layout::kRows);
      } else if (r < 8) {
        single_op(d);
      } else {
        residual_block(d, [&](int64_t) { append(d, pick_act(d), {}, Layout::kFeatures); });
      }
      break;
    }
    case Layout::kPartial: {
      if (pick(0, 4) < 4) {
        if (chance(1, 2)) {
          append(d, "AllReduce", {}, Layout::kReplicated);
        } else {
          append(d, "ReduceScatter", {}, Layout::kRows);
        }
      } else {
        single_op(d);
      }
      break;
    }
  }
}

void append_boundary(Draft& d) {
  OpSpec op;
  op.name = harness::kBoundaryOp;
  d.ops.push_back(std::move(op));
}

/// The first dimensions: rows a multiple of N (each rank's slice of the regime), features a
/// multiple of N too, within the tensor budget.
void draw_input(Draft& d) {
  int64_t rows = d.world * std::max<int64_t>(1, draw_local(d));
  int64_t features = d.world * std::max<int64_t>(1, d.regime == ShapeRegime::kTiny ? pick(1, 4) : draw_local(d));
  while (rows > d.world && rows * features > d.max_tensor_elements)
    rows = d.world * std::max<int64_t>(1, rows / d.world / 2);
  while (features > d.world && rows * features > d.max_tensor_elements) {
    features = d.world * std::max<int64_t>(1, features / d.world / 2);
  }
  d.shape = {rows, features};
}

Draft start_draft(const GenOptions& options) {
  if (!options.world_size || *options.world_size < 1 || *options.world_size > harness::kMaxWorldSize) {
    throw std::invalid_argument("gen_parallel_case: expected world_size in [1, " +
                                std::to_string(harness::kMaxWorldSize) + "]");
  }
  Draft d;
  d.world = *options.world_size;
  d.caps = options.capabilities.get();
  d.max_tensor_elements = std::max<int64_t>(options.max_tensor_elements, 64);
  d.regime = options.shapes;
  if (d.regime == ShapeRegime::kMix) {
    const int64_t r = pick(0, 9);
    d.regime = r < 6 ? ShapeRegime::kTiny : r < 9 ? ShapeRegime::kEdge : ShapeRegime::kLarge;
  }
  draw_input(d);
  return d;
}

/// Flags, fusions, dtype, device, seed and repeat calls, as gen_case draws them.
void finish(CaseSpec& spec, Draft& d, const GenOptions& options) {
  for (auto& op : d.ops) {
    if (op.name == harness::kBoundaryOp) continue;
    const int64_t n_params = param_count(op);
    if (n_params > 0 && chance(1, 4)) {
      for (int64_t p = 0; p < n_params; ++p) op.param_requires_grad.push_back(!chance(1, 2));
    }
    if (op.name == "AddExtraInput" && op.input_channels.empty() && chance(1, 4)) {
      op.extra_input_requires_grad = {!chance(1, 2)};
    }
  }
  spec.ops = std::move(d.ops);
  spec.world_size = d.world;
  detail::draw_case_settings(spec, options);
  canonicalize(spec);
}

CaseSpec draw_parallel_case(const GenOptions& options) {
  const int size = *rc::gen::withSize([](int s) { return rc::gen::just(s); });
  const int64_t scaled =
      (static_cast<int64_t>(options.max_ops) * std::min(size, rc::kNominalSize) + rc::kNominalSize - 1) /
      rc::kNominalSize;
  const int64_t budget = std::max<int64_t>(1, scaled);
  Draft d = start_draft(options);
  CaseSpec spec;
  spec.input_shape = d.shape;
  if (d.world > 1) {
    const int64_t r = pick(0, 2);
    d.layout = r == 0 ? Layout::kReplicated : r == 1 ? Layout::kRows : Layout::kFeatures;
    spec.input_layout = harness::layout_name(d.layout);
  }
  const int64_t target = std::max({pick(1, budget), pick(1, budget), pick(1, budget)});
  for (int attempts = 0; d.catalog_ops < target && attempts < 4 * target + 8; ++attempts) {
    if (d.catalog_ops > 0 && chance(1, 5)) append_boundary(d);
    block(d);
  }
  finish(spec, d, options);
  return spec;
}

/// One invalid split (see gen_parallel_invalid_case); the rest of the chain as valid cases
/// draw it.
InvalidCase draw_parallel_invalid_case(const GenOptions& options) {
  Draft d = start_draft(options);
  const int64_t n = d.world;
  const int64_t which = pick(0, 4);
  // Rows that do not divide, for the two forward checks.
  if (which >= 3) d.shape[0] = n * std::max<int64_t>(1, d.rows() / n) + pick(1, n - 1);
  CaseSpec spec;
  spec.input_shape = d.shape;
  std::string description;
  // Features that do not divide, on the whole input (the refused op never runs, so its
  // input's layout is not checked).
  auto indivisible_features = [&]() {
    if (d.features() % n != 0) return;
    append(d, "Linear", linear_attrs(n * std::max<int64_t>(1, draw_any_features(d) / n) + pick(1, n - 1), 0, false),
           d.layout);
  };
  if (chance(1, 2) && which < 3) single_op(d);
  switch (which) {
    case 0:
      append(d, "Linear", linear_attrs(n * draw_local(d) + pick(1, n - 1), 1, false), Layout::kFeatures);
      description = "a column-parallel Linear whose out does not divide over " + std::to_string(n) + " ranks";
      break;
    case 1:
      indivisible_features();
      append(d, "Linear", linear_attrs(draw_any_features(d), 2, chance(1, 2)), Layout::kReplicated);
      description = "a row-parallel Linear whose in does not divide over " + std::to_string(n) + " ranks";
      break;
    case 2:
      indivisible_features();
      append(d, "Bias", {{"tensor_parallel", 1}}, Layout::kFeatures);
      description = "a tensor-parallel Bias whose size does not divide over " + std::to_string(n) + " ranks";
      break;
    case 3:
      append(d, "Linear", linear_attrs(draw_split_features(d), 1, false), Layout::kFeatures);
      append(d, "Linear", linear_attrs(draw_any_features(d), 0, false), Layout::kPartial);
      append(d, "ReduceScatter", {}, Layout::kRows);
      description = "a ReduceScatter of rows that do not divide over " + std::to_string(n) + " ranks";
      break;
    default:
      append(d, "Linear", linear_attrs(draw_split_features(d), 1, false), Layout::kFeatures);
      append(d, "Linear", linear_attrs(draw_any_features(d), 2, true), Layout::kRows);
      description =
          "a sequence-parallel row Linear whose output rows do not divide over " + std::to_string(n) + " ranks";
      break;
  }
  if (chance(1, 2)) append(d, pick_act(d), {}, d.layout);
  finish(spec, d, options);
  return {std::move(spec), ops::InvalidArgumentError::kKind, description};
}

}  // namespace

rc::Gen<CaseSpec> gen_parallel_case(const GenOptions& options) {
  if (options.dtypes.empty()) throw std::invalid_argument("gen_parallel_case: expected at least one dtype, got none");
  if (!options.world_size || *options.world_size < 1 || *options.world_size > harness::kMaxWorldSize) {
    throw std::invalid_argument("gen_parallel_case: expected world_size in [1, " +
                                std::to_string(harness::kMaxWorldSize) + "]");
  }
  return rc::gen::exec([options] { return draw_parallel_case(options); });
}

rc::Gen<InvalidCase> gen_parallel_invalid_case(const GenOptions& options) {
  if (!options.world_size || *options.world_size < 2 || *options.world_size > harness::kMaxWorldSize) {
    throw std::invalid_argument("gen_parallel_invalid_case: expected world_size in [2, " +
                                std::to_string(harness::kMaxWorldSize) + "]");
  }
  return rc::gen::exec([options] { return draw_parallel_invalid_case(options); });
}

}  // namespace gradfuzz::generators
