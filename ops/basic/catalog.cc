// Registration of every basic op of ops.md in the catalog registry.

#include <ATen/ATen.h>

#include <cmath>
#include <cstdlib>
#include <iomanip>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "ops/basic/activations.h"
#include "ops/basic/channel_ops.h"
#include "ops/basic/collectives.h"
#include "ops/basic/grouped_linear.h"
#include "ops/basic/linear.h"
#include "ops/basic/moe.h"
#include "ops/basic/norms.h"
#include "ops/errors.h"
#include "ops/op_registry.h"

namespace gradfuzz::ops {

namespace {

/// Main input shape [rows, features] with both >= 1, or InvalidArgumentError naming the op.
std::pair<int64_t, int64_t> rows_features(const std::string& op, const std::vector<int64_t>& shape) {
  if (shape.size() != 2 || shape[0] < 1 || shape[1] < 1) {
    std::string got = "[";
    for (size_t i = 0; i < shape.size(); ++i) got += (i ? ", " : "") + std::to_string(shape[i]);
    throw InvalidArgumentError(op + ": main input shape must be [rows, features] with both >= 1, got " + got + "]");
  }
  return {shape[0], shape[1]};
}

/// Shortest round-tripping text of an attr value ("2.5", "0", "1e-05").
std::string number_text(double v) {
  std::ostringstream os;
  os << std::setprecision(17) << v;
  std::string longest = os.str();
  for (int precision = 1; precision < 17; ++precision) {
    std::ostringstream shorter;
    shorter << std::setprecision(precision) << v;
    // strtod, not stod: stod throws out_of_range for a subnormal such as 1e-310.
    if (std::strtod(shorter.str().c_str(), nullptr) == v) return shorter.str();
  }
  return longest;
}

double attr(const OpAttrs& attrs, const std::string& name, double fallback) {
  auto it = attrs.find(name);
  return it == attrs.end() ? fallback : it->second;
}

/// An integer attr >= `min`, or InvalidArgumentError naming the op and attr.
int64_t int_attr(const std::string& op, const OpAttrs& attrs, const std::string& name, double fallback, int64_t min) {
  const double v = attr(attrs, name, fallback);
  // Beyond 2^53 a double no longer holds every integer (and beyond 2^63 the conversion
  // below would be undefined): no dimension is that large.
  constexpr double kLargest = 9007199254740992.0;
  if (!std::isfinite(v) || v != std::floor(v) || v < static_cast<double>(min) || v > kLargest) {
    throw InvalidArgumentError(op + ": attr '" + name + "' must be an integer >= " + std::to_string(min) + ", got " +
                               number_text(v));
  }
  return static_cast<int64_t>(v);
}

/// A 0/1 attr, or InvalidArgumentError.
bool bool_attr(const std::string& op, const OpAttrs& attrs, const std::string& name, double fallback) {
  const double v = attr(attrs, name, fallback);
  if (v != 0.0 && v != 1.0) {
    throw InvalidArgumentError(op + ": attr '" + name + "' must be 0 or 1, got " + number_text(v));
  }
  return v == 1.0;
}

/// A finite real attr, or InvalidArgumentError.
double real_attr(const std::string& op, const OpAttrs& attrs, const std::string& name, double fallback) {
  const double v = attr(attrs, name, fallback);
  if (!std::isfinite(v)) {
    throw InvalidArgumentError(op + ": attr '" + name + "' must be finite, got " + number_text(v));
  }
  return v;
}

SlotSpec float_slot(std::vector<int64_t> shape) { return {TensorKind::kFloat, std::move(shape)}; }

/// TE constructor options that do not change the math (memory, scheduling, how TE hands out
/// weight gradients): the catalog accepts them so case files can carry them to the te
/// backend, and the model ignores them.
struct NeutralOptions {
  /// 0/1 attrs.
  std::vector<std::string> flags;
  /// Integer attrs >= 0.
  std::vector<std::string> counts;
};

/// The defaults (all 0) of `neutral`, added to `defaults`.
OpAttrs with_neutral(OpAttrs defaults, const NeutralOptions& neutral) {
  for (const auto& name : neutral.flags) defaults.emplace(name, 0);
  for (const auto& name : neutral.counts) defaults.emplace(name, 0);
  return defaults;
}

/// Validates the neutral attrs of `op` (InvalidArgumentError naming op and attr).
void check_neutral(const std::string& op, const OpAttrs& attrs, const NeutralOptions& neutral) {
  for (const auto& name : neutral.flags) bool_attr(op, attrs, name, 0);
  for (const auto& name : neutral.counts) int_attr(op, attrs, name, 0, 0);
}

/// `summary` plus the note listing the neutral attrs.
std::string with_neutral_note(const std::string& summary, const NeutralOptions& neutral) {
  std::string names;
  for (const auto& name : neutral.flags) names += (names.empty() ? "" : ", ") + name;
  for (const auto& name : neutral.counts) names += (names.empty() ? "" : ", ") + name;
  return summary + "; TE options " + names + ": accepted, no effect on the model";
}

/// Shape-preserving op without extra slots.
OpSignature same_shape(int64_t rows, int64_t features) { return {{rows, features}, {}, {}}; }

/// Registers an op whose signature function also validates the factory's arguments.
void add_op(OpRegistry& registry, const std::string& name, const std::string& summary, OpAttrs defaults,
            OpSignatureFn signature,
            std::function<BasicOpPtr(const OpAttrs&, int64_t, int64_t, const at::TensorOptions&)> build) {
  OpFactory make = [signature, build, name](const OpAttrs& attrs, const std::vector<int64_t>& shape,
                                            const at::TensorOptions& options) -> BasicOpPtr {
    signature(attrs, shape);  // same validation and errors as the signature
    auto [rows, features] = rows_features(name, shape);
    return build(attrs, rows, features, options);
  };
  registry.add(OpInfo{name, summary, std::move(defaults), std::move(make), std::move(signature)});
}

constexpr double kDefaultLinearOut = 16;
constexpr double kDefaultGroups = 2;

}  // namespace

void register_catalog_ops(OpRegistry& registry) {
  // ----- linear.h
  // Tensor parallelism (te.ops BasicLinear's tensor_parallel_mode and sequence_parallel,
  // Bias's tensor_parallel) says how a distributed case's ranks split the op
  // (harness/sharding.h); on the unsharded tensors the model holds, the math is the same.
  const NeutralOptions linear_neutral{{"accumulate_into_main_grad", "sequence_parallel"}, {}};
  auto check_tp_mode = [](const OpAttrs& a) {
    const int64_t mode = int_attr("Linear", a, "tensor_parallel_mode", 0, 0);
    if (mode > 2) {
      throw InvalidArgumentError("Linear: attr 'tensor_parallel_mode' must be 0 (none), 1 (column) or 2 (row), got " +
                                 std::to_string(mode));
    }
  };
  add_op(
      registry, "Linear",
      with_neutral_note("y = x W^T; weight [out, in]; tensor_parallel_mode 0 none, 1 column, 2 row (the ranks' split)",
                        linear_neutral),
      with_neutral({{"out", kDefaultLinearOut}, {"tensor_parallel_mode", 0}}, linear_neutral),
      [linear_neutral, check_tp_mode](const OpAttrs& a, const std::vector<int64_t>& shape) {
        auto [rows, features] = rows_features("Linear", shape);
        const int64_t out = int_attr("Linear", a, "out", kDefaultLinearOut, 1);
        check_neutral("Linear", a, linear_neutral);
        check_tp_mode(a);
        return OpSignature{{rows, out}, {}, {}, {{out, features}}};
      },
      [](const OpAttrs& a, int64_t, int64_t features, const at::TensorOptions& o) -> BasicOpPtr {
        return std::make_shared<Linear>(LinearOptions(features, int_attr("Linear", a, "out", kDefaultLinearOut, 1)), o);
      });
  const NeutralOptions bias_neutral{{"tensor_parallel"}, {}};
  add_op(
      registry, "Bias", with_neutral_note("y = x + b; bias [n], non-zero", bias_neutral),
      with_neutral({}, bias_neutral),
      [bias_neutral](const OpAttrs& a, const std::vector<int64_t>& shape) {
        auto [rows, features] = rows_features("Bias", shape);
        check_neutral("Bias", a, bias_neutral);
        OpSignature sig = same_shape(rows, features);
        sig.parameter_shapes = {{features}};
        return sig;
      },
      [](const OpAttrs&, int64_t, int64_t features, const at::TensorOptions& o) -> BasicOpPtr {
        return std::make_shared<Bias>(features, o);
      });
  add_op(
      registry, "ConstantScale", "y = scale * x", {{"scale", 0.5}},
      [](const OpAttrs& a, const std::vector<int64_t>& shape) {
        auto [rows, features] = rows_features("ConstantScale", shape);
        real_attr("ConstantScale", a, "scale", 0.5);
        return same_shape(rows, features);
      },
      [](const OpAttrs& a, int64_t, int64_t, const at::TensorOptions&) -> BasicOpPtr {
        return std::make_shared<ConstantScale>(real_attr("ConstantScale", a, "scale", 0.5));
      });
  add_op(
      registry, "Identity", "y = x", {},
      [](const OpAttrs&, const std::vector<int64_t>& shape) {
        auto [rows, features] = rows_features("Identity", shape);
        return same_shape(rows, features);
      },
      [](const OpAttrs&, int64_t, int64_t, const at::TensorOptions&) -> BasicOpPtr {
        return std::make_shared<Identity>();
      });
  // ----- collectives.h: identities on the unsharded tensors the model holds.
  for (CollectiveKind kind : {CollectiveKind::kAllGather, CollectiveKind::kReduceScatter, CollectiveKind::kAllReduce}) {
    const std::string name = collective_name(kind);
    const char* summary = kind == CollectiveKind::kAllGather ? "ranks' row slices -> the whole tensor on every rank"
                          : kind == CollectiveKind::kReduceScatter
                              ? "ranks' summands -> each rank its row slice of the sum"
                              : "ranks' summands -> the sum on every rank";
    add_op(
        registry, name, std::string(summary) + "; the identity on the unsharded tensors", {},
        [name](const OpAttrs&, const std::vector<int64_t>& shape) {
          auto [rows, features] = rows_features(name, shape);
          return same_shape(rows, features);
        },
        [kind](const OpAttrs&, int64_t, int64_t, const at::TensorOptions&) -> BasicOpPtr {
          return std::make_shared<Collective>(kind);
        });
  }
  add_op(
      registry, "Reshape", "y = x.reshape(-1, features); features=0 keeps the input's feature count", {{"features", 0}},
      [](const OpAttrs& a, const std::vector<int64_t>& shape) {
        auto [rows, features] = rows_features("Reshape", shape);
        int64_t target = int_attr("Reshape", a, "features", 0, 0);
        if (target == 0) target = features;
        if ((rows * features) % target != 0) {
          throw InvalidArgumentError("Reshape: features=" + std::to_string(target) +
                                     " must divide numel=" + std::to_string(rows * features) + " of the input");
        }
        return OpSignature{{rows * features / target, target}, {}, {}};
      },
      [](const OpAttrs& a, int64_t, int64_t features, const at::TensorOptions&) -> BasicOpPtr {
        const int64_t target = int_attr("Reshape", a, "features", 0, 0);
        return std::make_shared<Reshape>(target == 0 ? features : target);
      });

  // ----- activations.h
  const std::pair<const char*, ActivationKind> elementwise[] = {
      {"ReLU", ActivationKind::kReLU}, {"GELU", ActivationKind::kGELU}, {"SReLU", ActivationKind::kSReLU}};
  const char* elementwise_summary[] = {"y = relu(x)", "y = gelu(x), tanh form", "y = relu(x)^2"};
  // TE's cache_quantized_input (activation.py, swiglu.py): the input kept for backward as FP8.
  const std::string cache_note =
      "; cache_quantized_input=1: backward at the input's FP8 E4M3 quantize-dequantize (current scaling)";
  auto input_cache = [](const std::string& op, const OpAttrs& a) {
    return bool_attr(op, a, "cache_quantized_input", 0) ? InputCache::kQuantized : InputCache::kHighPrecision;
  };
  for (size_t i = 0; i < 3; ++i) {
    const std::string name = elementwise[i].first;
    const ActivationKind kind = elementwise[i].second;
    add_op(
        registry, name, elementwise_summary[i] + cache_note, {{"cache_quantized_input", 0}},
        [name, input_cache](const OpAttrs& a, const std::vector<int64_t>& shape) {
          auto [rows, features] = rows_features(name, shape);
          input_cache(name, a);
          return same_shape(rows, features);
        },
        [name, kind, input_cache](const OpAttrs& a, int64_t, int64_t, const at::TensorOptions&) -> BasicOpPtr {
          const InputCache cache = input_cache(name, a);
          switch (kind) {
            case ActivationKind::kReLU:
              return std::make_shared<ReLU>(cache);
            case ActivationKind::kGELU:
              return std::make_shared<GELU>(cache);
            case ActivationKind::kSReLU:
              return std::make_shared<SReLU>(cache);
          }
          GRADFUZZ_INTERNAL_ASSERT(false, "unknown activation kind");
        });
  }
  add_op(
      registry, "SwiGLU",
      "halves a, b of the features: y = silu(a) * b; interleave k>0 alternates k-wide a, b blocks" + cache_note,
      {{"interleave", 0}, {"cache_quantized_input", 0}},
      [input_cache](const OpAttrs& a, const std::vector<int64_t>& shape) {
        auto [rows, features] = rows_features("SwiGLU", shape);
        const int64_t k = int_attr("SwiGLU", a, "interleave", 0, 0);
        activation_math::check_glu_features("SwiGLU", features, k);
        input_cache("SwiGLU", a);
        return OpSignature{{rows, features / 2}, {}, {}};
      },
      [input_cache](const OpAttrs& a, int64_t, int64_t, const at::TensorOptions&) -> BasicOpPtr {
        return std::make_shared<SwiGLU>(int_attr("SwiGLU", a, "interleave", 0, 0), input_cache("SwiGLU", a));
      });
  const NeutralOptions scaled_neutral{{"activation_recompute_in_mlp"}, {}};
  add_op(
      registry, "ScaledSwiGLU",
      with_neutral_note(
          "y = silu(a) * b * s[r]; extra input scales [rows]; interleave k>0 alternates k-wide a, b blocks",
          scaled_neutral),
      with_neutral({{"interleave", 0}}, scaled_neutral),
      [scaled_neutral](const OpAttrs& a, const std::vector<int64_t>& shape) {
        auto [rows, features] = rows_features("ScaledSwiGLU", shape);
        const int64_t k = int_attr("ScaledSwiGLU", a, "interleave", 0, 0);
        activation_math::check_glu_features("ScaledSwiGLU", features, k);
        check_neutral("ScaledSwiGLU", a, scaled_neutral);
        return OpSignature{{rows, features / 2}, {float_slot({rows})}, {}};
      },
      [](const OpAttrs& a, int64_t, int64_t, const at::TensorOptions&) -> BasicOpPtr {
        return std::make_shared<ScaledSwiGLU>(int_attr("ScaledSwiGLU", a, "interleave", 0, 0));
      });
  add_op(
      registry, "ScaledSReLU", with_neutral_note("y = relu(x)^2 * s[r]; extra input scales [rows]", scaled_neutral),
      with_neutral({}, scaled_neutral),
      [scaled_neutral](const OpAttrs& a, const std::vector<int64_t>& shape) {
        auto [rows, features] = rows_features("ScaledSReLU", shape);
        check_neutral("ScaledSReLU", a, scaled_neutral);
        return OpSignature{{rows, features}, {float_slot({rows})}, {}};
      },
      [](const OpAttrs&, int64_t, int64_t, const at::TensorOptions&) -> BasicOpPtr {
        return std::make_shared<ScaledSReLU>();
      });

  // ----- channel_ops.h
  add_op(
      registry, "MakeExtraOutput", "y = x; extra output x itself; in_place accumulates the extra gradient",
      {{"in_place", 0}},
      [](const OpAttrs& a, const std::vector<int64_t>& shape) {
        auto [rows, features] = rows_features("MakeExtraOutput", shape);
        bool_attr("MakeExtraOutput", a, "in_place", 0);
        return OpSignature{{rows, features}, {}, {float_slot({rows, features})}};
      },
      [](const OpAttrs& a, int64_t, int64_t, const at::TensorOptions&) -> BasicOpPtr {
        return std::make_shared<MakeExtraOutput>(bool_attr("MakeExtraOutput", a, "in_place", 0) ? InPlace::kYes
                                                                                                : InPlace::kNo);
      });
  add_op(
      registry, "AddExtraInput", "y = x + e; extra input e like x; in_place writes into e", {{"in_place", 0}},
      [](const OpAttrs& a, const std::vector<int64_t>& shape) {
        auto [rows, features] = rows_features("AddExtraInput", shape);
        bool_attr("AddExtraInput", a, "in_place", 0);
        return OpSignature{{rows, features}, {float_slot({rows, features})}, {}};
      },
      [](const OpAttrs& a, int64_t, int64_t, const at::TensorOptions&) -> BasicOpPtr {
        return std::make_shared<AddExtraInput>(bool_attr("AddExtraInput", a, "in_place", 0) ? InPlace::kYes
                                                                                            : InPlace::kNo);
      });
  add_op(
      registry, "RowStat", "y = x; extra output mean of squares per row [rows] (fresh tensor)", {},
      [](const OpAttrs&, const std::vector<int64_t>& shape) {
        auto [rows, features] = rows_features("RowStat", shape);
        return OpSignature{{rows, features}, {}, {float_slot({rows})}};
      },
      [](const OpAttrs&, int64_t, int64_t, const at::TensorOptions&) -> BasicOpPtr {
        return std::make_shared<RowStat>();
      });
  add_op(
      registry, "DualExtraOutput", "y = x; extra outputs s0 * x and s1 * x", {{"s0", 0.5}, {"s1", -1.5}},
      [](const OpAttrs& a, const std::vector<int64_t>& shape) {
        auto [rows, features] = rows_features("DualExtraOutput", shape);
        real_attr("DualExtraOutput", a, "s0", 0.5);
        real_attr("DualExtraOutput", a, "s1", -1.5);
        return OpSignature{{rows, features}, {}, {float_slot({rows, features}), float_slot({rows, features})}};
      },
      [](const OpAttrs& a, int64_t, int64_t, const at::TensorOptions&) -> BasicOpPtr {
        return std::make_shared<DualExtraOutput>(real_attr("DualExtraOutput", a, "s0", 0.5),
                                                 real_attr("DualExtraOutput", a, "s1", -1.5));
      });

  // ----- grouped_linear.h
  const NeutralOptions grouped_neutral{
      {"accumulate_into_main_grad", "single_grouped_weight", "single_grouped_bias", "delay_wgrad_compute"}, {}};
  const OpAttrs grouped_defaults = with_neutral(
      {{"groups", kDefaultGroups}, {"out", kDefaultLinearOut}, {"bias", 1}, {"scale_bias", 0}}, grouped_neutral);
  auto grouped_options = [grouped_neutral](const OpAttrs& a, int64_t features) {
    const std::string op = "GroupedLinear";
    check_neutral(op, a, grouped_neutral);
    GroupedLinearOptions options(int_attr(op, a, "groups", kDefaultGroups, 1), features,
                                 int_attr(op, a, "out", kDefaultLinearOut, 1));
    options.bias(bool_attr(op, a, "bias", 1)).scale_bias(bool_attr(op, a, "scale_bias", 0));
    if (options.scale_bias() && !options.bias()) {
      throw InvalidArgumentError("GroupedLinear: scale_bias=1 requires bias=1, got bias=0");
    }
    return options;
  };
  add_op(
      registry, "GroupedLinear",
      with_neutral_note(
          "rows split into G groups (slot 0 split sizes): y_r = x_r W_g^T + b_g (scale_bias: + b_g * s[r], slot 1)",
          grouped_neutral),
      grouped_defaults,
      [grouped_options](const OpAttrs& a, const std::vector<int64_t>& shape) {
        auto [rows, features] = rows_features("GroupedLinear", shape);
        const GroupedLinearOptions options = grouped_options(a, features);
        OpSignature sig{{rows, options.out()}, {SlotSpec{TensorKind::kSplitSizes, {options.groups()}}}, {}};
        if (options.scale_bias()) sig.extra_inputs.push_back(float_slot({rows}));
        sig.parameter_shapes = {{options.groups(), options.out(), features}};
        if (options.bias()) sig.parameter_shapes.push_back({options.groups(), options.out()});
        return sig;
      },
      [grouped_options](const OpAttrs& a, int64_t, int64_t features, const at::TensorOptions& o) -> BasicOpPtr {
        return std::make_shared<GroupedLinear>(grouped_options(a, features), o);
      });

  // ----- norms.h
  const NeutralOptions norm_neutral{{}, {"sm_margin"}};
  const OpAttrs norm_defaults = with_neutral({{"eps", 1e-5}, {"zero_centered_gamma", 0}}, norm_neutral);
  // Validates the attrs of RMSNorm or LayerNorm `op` and returns its options.
  auto norm_options = [norm_neutral](const std::string& op, const OpAttrs& a, int64_t features) {
    const double eps = real_attr(op, a, "eps", 1e-5);
    if (!(eps > 0)) {
      throw InvalidArgumentError(op + ": attr 'eps' must be > 0");
    }
    const bool zero_centered = bool_attr(op, a, "zero_centered_gamma", 0);
    check_neutral(op, a, norm_neutral);
    return NormOptions(features).eps(eps).zero_centered_gamma(zero_centered);
  };
  const std::string zero_centered_note = "; zero_centered_gamma=1: gamma stored zero-centred, scale (1 + gamma)";
  add_op(
      registry, "RMSNorm", with_neutral_note("y = x / rms(x) * gamma" + zero_centered_note, norm_neutral),
      norm_defaults,
      [norm_options](const OpAttrs& a, const std::vector<int64_t>& shape) {
        auto [rows, features] = rows_features("RMSNorm", shape);
        norm_options("RMSNorm", a, features);
        OpSignature sig = same_shape(rows, features);
        sig.parameter_shapes = {{features}};
        return sig;
      },
      [norm_options](const OpAttrs& a, int64_t, int64_t features, const at::TensorOptions& o) -> BasicOpPtr {
        return std::make_shared<RMSNorm>(norm_options("RMSNorm", a, features), o);
      });
  add_op(
      registry, "LayerNorm",
      with_neutral_note("y = (x - mean) / std * gamma + beta" + zero_centered_note, norm_neutral), norm_defaults,
      [norm_options](const OpAttrs& a, const std::vector<int64_t>& shape) {
        auto [rows, features] = rows_features("LayerNorm", shape);
        norm_options("LayerNorm", a, features);
        OpSignature sig = same_shape(rows, features);
        sig.parameter_shapes = {{features}, {features}};
        return sig;
      },
      [norm_options](const OpAttrs& a, int64_t, int64_t features, const at::TensorOptions& o) -> BasicOpPtr {
        return std::make_shared<LayerNorm>(norm_options("LayerNorm", a, features), o);
      });

  // ----- moe.h
  add_op(
      registry, "Dispatch",
      "rows reordered by argmax of router logits [rows, G]; extra outputs split sizes, token probs, routing map",
      {{"groups", kDefaultGroups}},
      [](const OpAttrs& a, const std::vector<int64_t>& shape) {
        auto [rows, features] = rows_features("Dispatch", shape);
        const int64_t groups = int_attr("Dispatch", a, "groups", kDefaultGroups, 1);
        return OpSignature{{rows, features},
                           {float_slot({rows, groups})},
                           {SlotSpec{TensorKind::kSplitSizes, {groups}}, float_slot({rows}),
                            SlotSpec{TensorKind::kRoutingMap, {rows}}}};
      },
      [](const OpAttrs& a, int64_t, int64_t, const at::TensorOptions&) -> BasicOpPtr {
        return std::make_shared<Dispatch>(int_attr("Dispatch", a, "groups", kDefaultGroups, 1));
      });
  add_op(
      registry, "Combine", "undoes Dispatch's reordering; extra input routing map [rows]", {},
      [](const OpAttrs&, const std::vector<int64_t>& shape) {
        auto [rows, features] = rows_features("Combine", shape);
        return OpSignature{{rows, features}, {SlotSpec{TensorKind::kRoutingMap, {rows}}}, {}};
      },
      [](const OpAttrs&, int64_t, int64_t, const at::TensorOptions&) -> BasicOpPtr {
        return std::make_shared<Combine>();
      });
}

}  // namespace gradfuzz::ops
