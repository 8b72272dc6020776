#pragma once

#include <c10/core/TensorOptions.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "ops/basic_op.h"
#include "ops/fusion_registry.h"

namespace gradfuzz::ops {

/// Numeric construction options of a catalog op ("out", "groups", "bias", "scale_bias",
/// "eps", "interleave", "in_place", "scale", "s0", "s1", "features"). Booleans are 0/1.
using OpAttrs = std::map<std::string, double>;

/// What a tensor in an extra slot is; a channel may connect an output to an input only when
/// both slots have the same kind and shape.
enum class TensorKind { kFloat, kSplitSizes, kRoutingMap };
const char* tensor_kind_name(TensorKind kind);

/// Shape and kind of one extra slot for a given main-input shape.
struct SlotSpec {
  TensorKind kind = TensorKind::kFloat;
  std::vector<int64_t> shape;
  bool operator==(const SlotSpec& o) const { return kind == o.kind && shape == o.shape; }
};

/// Static description of a catalog op for the given main input shape [rows, features].
struct OpSignature {
  std::vector<int64_t> output_shape;
  std::vector<SlotSpec> extra_inputs;
  std::vector<SlotSpec> extra_outputs;
  /// Shapes of the op's parameters (what create() will allocate), so a case's size can be
  /// checked before anything is allocated.
  std::vector<std::vector<int64_t>> parameter_shapes = {};
};

/// Creates the op for a main input of `input_shape`; parameters get `options` (dtype and
/// device) and deterministic non-zero initial values. Throws InvalidArgumentError when the
/// attrs do not fit the shape (SwiGLU on an odd feature count...).
using OpFactory = std::function<BasicOpPtr(const OpAttrs&, const std::vector<int64_t>& input_shape,
                                           const at::TensorOptions& options)>;
/// Signature for a main input of `input_shape` (same errors as the factory).
using OpSignatureFn = std::function<OpSignature(const OpAttrs&, const std::vector<int64_t>& input_shape)>;

struct OpInfo {
  std::string name;
  std::string summary;
  /// Attr names with their defaults.
  OpAttrs defaults;
  OpFactory make;
  OpSignatureFn signature;
};

/// Catalog ops by name (ops.md). An unknown name throws UnknownNameError listing the known
/// names; an unknown attr name throws UnknownNameError listing the op's attrs.
class OpRegistry {
 public:
  void add(OpInfo info);
  /// Every basic op of ops.md.
  static const OpRegistry& catalog();

  const OpInfo& info(const std::string& name) const;
  std::vector<std::string> names() const;
  BasicOpPtr create(const std::string& name, const OpAttrs& attrs, const std::vector<int64_t>& input_shape,
                    const at::TensorOptions& options) const;
  OpSignature signature(const std::string& name, const OpAttrs& attrs, const std::vector<int64_t>& input_shape) const;

 private:
  OpAttrs resolve(const OpInfo& info, const OpAttrs& attrs) const;
  std::map<std::string, OpInfo> ops_;
};

/// Registration hook implemented by the catalog sources (ops/basic/*.cc).
void register_catalog_ops(OpRegistry& registry);
/// Registration hook implemented by ops/fused/*.cc.
void register_catalog_fusions(FusionRegistry& registry);

}  // namespace gradfuzz::ops
