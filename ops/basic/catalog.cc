// Registration of every basic op of ops.md in the catalog registry.

#include <ATen/ATen.h>

#include <cmath>
#include <iomanip>
#include <sstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ops/basic/activations.h"
#include "ops/basic/channel_ops.h"
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
    if (std::stod(shorter.str()) == v) return shorter.str();
  }
  return longest;
}

double attr(const OpAttrs& attrs, const std::string& name, double fallback) {
  auto it = attrs.find(name);
  return it == attrs.end() ? fallback : it->second;
}

/// An integer attr >= `min`, or InvalidArgumentError naming the op and attr.
int64_t int_attr(const std::string& op, const OpAttrs& attrs, const std::string& name, double fallback,
                 int64_t min) {
  const double v = attr(attrs, name, fallback);
  if (!std::isfinite(v) || v != std::floor(v) || v < static_cast<double>(min)) {
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
  add_op(
      registry, "Linear", "y = x W^T; weight [out, in]", {{"out", kDefaultLinearOut}},
      [](const OpAttrs& a, const std::vector<int64_t>& shape) {
        auto [rows, features] = rows_features("Linear", shape);
        const int64_t out = int_attr("Linear", a, "out", kDefaultLinearOut, 1);
        (void)features;
        return OpSignature{{rows, out}, {}, {}};
      },
      [](const OpAttrs& a, int64_t, int64_t features, const at::TensorOptions& o) -> BasicOpPtr {
        return std::make_shared<Linear>(LinearOptions(features, int_attr("Linear", a, "out", kDefaultLinearOut, 1)),
                                        o);
      });
  add_op(
      registry, "Bias", "y = x + b; bias [n], non-zero", {},
      [](const OpAttrs&, const std::vector<int64_t>& shape) {
        auto [rows, features] = rows_features("Bias", shape);
        return same_shape(rows, features);
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
  add_op(
      registry, "Reshape", "y = x.reshape(-1, features); features=0 keeps the input's feature count",
      {{"features", 0}},
      [](const OpAttrs& a, const std::vector<int64_t>& shape) {
        auto [rows, features] = rows_features("Reshape", shape);
        int64_t target = int_attr("Reshape", a, "features", 0, 0);
        if (target == 0) target = features;
        if ((rows * features) % target != 0) {
          throw InvalidArgumentError("Reshape: features=" + std::to_string(target) + " must divide numel=" +
                                     std::to_string(rows * features) + " of the input");
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
  for (size_t i = 0; i < 3; ++i) {
    const std::string name = elementwise[i].first;
    const ActivationKind kind = elementwise[i].second;
    add_op(
        registry, name, elementwise_summary[i], {},
        [name](const OpAttrs&, const std::vector<int64_t>& shape) {
          auto [rows, features] = rows_features(name, shape);
          return same_shape(rows, features);
        },
        [kind](const OpAttrs&, int64_t, int64_t, const at::TensorOptions&) -> BasicOpPtr {
          switch (kind) {
            case ActivationKind::kReLU:
              return std::make_shared<ReLU>();
            case ActivationKind::kGELU:
              return std::make_shared<GELU>();
            case ActivationKind::kSReLU:
              return std::make_shared<SReLU>();
          }
          GRADFUZZ_INTERNAL_ASSERT(false, "unknown activation kind");
        });
  }
  add_op(
      registry, "SwiGLU", "halves a, b of the features: y = silu(a) * b", {},
      [](const OpAttrs&, const std::vector<int64_t>& shape) {
        auto [rows, features] = rows_features("SwiGLU", shape);
        activation_math::check_glu_features("SwiGLU", features, 0);
        return OpSignature{{rows, features / 2}, {}, {}};
      },
      [](const OpAttrs&, int64_t, int64_t, const at::TensorOptions&) -> BasicOpPtr {
        return std::make_shared<SwiGLU>();
      });
  add_op(
      registry, "ScaledSwiGLU",
      "y = silu(a) * b * s[r]; extra input scales [rows]; interleave k>0 alternates k-wide a, b blocks",
      {{"interleave", 0}},
      [](const OpAttrs& a, const std::vector<int64_t>& shape) {
        auto [rows, features] = rows_features("ScaledSwiGLU", shape);
        const int64_t k = int_attr("ScaledSwiGLU", a, "interleave", 0, 0);
        activation_math::check_glu_features("ScaledSwiGLU", features, k);
        return OpSignature{{rows, features / 2}, {float_slot({rows})}, {}};
      },
      [](const OpAttrs& a, int64_t, int64_t, const at::TensorOptions&) -> BasicOpPtr {
        return std::make_shared<ScaledSwiGLU>(int_attr("ScaledSwiGLU", a, "interleave", 0, 0));
      });
  add_op(
      registry, "ScaledSReLU", "y = relu(x)^2 * s[r]; extra input scales [rows]", {},
      [](const OpAttrs&, const std::vector<int64_t>& shape) {
        auto [rows, features] = rows_features("ScaledSReLU", shape);
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
  const OpAttrs grouped_defaults{{"groups", kDefaultGroups}, {"out", kDefaultLinearOut}, {"bias", 1}, {"scale_bias", 0}};
  auto grouped_options = [](const OpAttrs& a, int64_t features) {
    const std::string op = "GroupedLinear";
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
      "rows split into G groups (slot 0 split sizes): y_r = x_r W_g^T + b_g (scale_bias: + b_g * s[r], slot 1)",
      grouped_defaults,
      [grouped_options](const OpAttrs& a, const std::vector<int64_t>& shape) {
        auto [rows, features] = rows_features("GroupedLinear", shape);
        const GroupedLinearOptions options = grouped_options(a, features);
        OpSignature sig{{rows, options.out()}, {SlotSpec{TensorKind::kSplitSizes, {options.groups()}}}, {}};
        if (options.scale_bias()) sig.extra_inputs.push_back(float_slot({rows}));
        return sig;
      },
      [grouped_options](const OpAttrs& a, int64_t, int64_t features, const at::TensorOptions& o) -> BasicOpPtr {
        return std::make_shared<GroupedLinear>(grouped_options(a, features), o);
      });

  // ----- norms.h
  add_op(
      registry, "RMSNorm", "y = x / rms(x) * gamma", {{"eps", 1e-5}},
      [](const OpAttrs& a, const std::vector<int64_t>& shape) {
        auto [rows, features] = rows_features("RMSNorm", shape);
        if (!(real_attr("RMSNorm", a, "eps", 1e-5) > 0)) {
          throw InvalidArgumentError("RMSNorm: attr 'eps' must be > 0");
        }
        return same_shape(rows, features);
      },
      [](const OpAttrs& a, int64_t, int64_t features, const at::TensorOptions& o) -> BasicOpPtr {
        return std::make_shared<RMSNorm>(features, real_attr("RMSNorm", a, "eps", 1e-5), o);
      });
  add_op(
      registry, "LayerNorm", "y = (x - mean) / std * gamma + beta", {{"eps", 1e-5}},
      [](const OpAttrs& a, const std::vector<int64_t>& shape) {
        auto [rows, features] = rows_features("LayerNorm", shape);
        if (!(real_attr("LayerNorm", a, "eps", 1e-5) > 0)) {
          throw InvalidArgumentError("LayerNorm: attr 'eps' must be > 0");
        }
        return same_shape(rows, features);
      },
      [](const OpAttrs& a, int64_t, int64_t features, const at::TensorOptions& o) -> BasicOpPtr {
        return std::make_shared<LayerNorm>(features, real_attr("LayerNorm", a, "eps", 1e-5), o);
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
