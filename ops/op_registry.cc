#include "ops/op_registry.h"

#include "ops/errors.h"

namespace gradfuzz::ops {

const char* tensor_kind_name(TensorKind kind) {
  switch (kind) {
    case TensorKind::kFloat:
      return "float";
    case TensorKind::kSplitSizes:
      return "split_sizes";
    case TensorKind::kRoutingMap:
      return "routing_map";
  }
  GRADFUZZ_INTERNAL_ASSERT(false, "unhandled tensor kind");
}

void OpRegistry::add(OpInfo info) {
  GRADFUZZ_INTERNAL_ASSERT(ops_.count(info.name) == 0, "op '" + info.name + "' registered twice");
  std::string name = info.name;
  ops_.emplace(std::move(name), std::move(info));
}

const OpRegistry& OpRegistry::catalog() {
  static const OpRegistry registry = [] {
    OpRegistry r;
    register_catalog_ops(r);
    return r;
  }();
  return registry;
}

const OpInfo& OpRegistry::info(const std::string& name) const {
  auto it = ops_.find(name);
  if (it == ops_.end()) {
    std::string known;
    for (const auto& [known_name, unused] : ops_) known += (known.empty() ? "" : ", ") + known_name;
    throw UnknownNameError("unknown op '" + name + "'; known ops: " + known);
  }
  return it->second;
}

std::vector<std::string> OpRegistry::names() const {
  std::vector<std::string> out;
  for (const auto& [name, unused] : ops_) out.push_back(name);
  return out;
}

OpAttrs OpRegistry::resolve(const OpInfo& op, const OpAttrs& attrs) const {
  OpAttrs resolved = op.defaults;
  for (const auto& [key, value] : attrs) {
    if (op.defaults.count(key) == 0) {
      std::string known;
      for (const auto& [known_key, unused] : op.defaults) known += (known.empty() ? "" : ", ") + known_key;
      throw UnknownNameError(op.name + ": unknown attr '" + key +
                             "'; known attrs: " + (known.empty() ? std::string("(none)") : known));
    }
    resolved[key] = value;
  }
  return resolved;
}

BasicOpPtr OpRegistry::create(const std::string& name, const OpAttrs& attrs, const std::vector<int64_t>& input_shape,
                              const at::TensorOptions& options) const {
  const OpInfo& op = info(name);
  return op.make(resolve(op, attrs), input_shape, options);
}

OpSignature OpRegistry::signature(const std::string& name, const OpAttrs& attrs,
                                  const std::vector<int64_t>& input_shape) const {
  const OpInfo& op = info(name);
  return op.signature(resolve(op, attrs), input_shape);
}

}  // namespace gradfuzz::ops
