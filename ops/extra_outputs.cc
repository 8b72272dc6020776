#include "ops/extra_outputs.h"

#include <memory>

#include "ops/errors.h"

namespace gradfuzz::ops {

const char* output_style_name(OutputStyle style) { return style == OutputStyle::kVector ? "vector" : "generator"; }

OutputStyle output_style_from_name(const std::string& name) {
  if (name == "vector") return OutputStyle::kVector;
  if (name == "generator") return OutputStyle::kGenerator;
  throw UnknownNameError("unknown output style '" + name + "'; known styles: vector, generator");
}

ExtraOutputs ExtraOutputs::vector(std::vector<at::Tensor> tensors) {
  ExtraOutputs out;
  out.tensors_ = std::move(tensors);
  return out;
}

ExtraOutputs ExtraOutputs::generator(Next next) {
  ExtraOutputs out;
  out.style_ = OutputStyle::kGenerator;
  out.next_ = std::move(next);
  return out;
}

ExtraOutputs ExtraOutputs::make(OutputStyle style, std::vector<at::Tensor> tensors) {
  if (style == OutputStyle::kVector) return vector(std::move(tensors));
  // The generator owns the tensors and yields them lazily, one per call.
  auto pending = std::make_shared<std::vector<at::Tensor>>(std::move(tensors));
  auto position = std::make_shared<size_t>(0);
  return generator([pending, position]() -> std::optional<at::Tensor> {
    if (*position >= pending->size()) return std::nullopt;
    return (*pending)[(*position)++];
  });
}

std::vector<at::Tensor> ExtraOutputs::materialize() {
  if (style_ == OutputStyle::kVector) return tensors_;
  if (consumed_) {
    throw GeneratorMisuseError("a single-pass extra-output generator was read a second time");
  }
  consumed_ = true;
  std::vector<at::Tensor> out;
  while (std::optional<at::Tensor> t = next_()) out.push_back(std::move(*t));
  return out;
}

size_t ExtraOutputs::size() const {
  if (style_ == OutputStyle::kGenerator) {
    throw GeneratorMisuseError("object of type 'generator' has no size");
  }
  return tensors_.size();
}

const at::Tensor& ExtraOutputs::at(size_t index) const {
  if (style_ == OutputStyle::kGenerator) {
    throw GeneratorMisuseError("object of type 'generator' cannot be indexed");
  }
  return tensors_.at(index);
}

}  // namespace gradfuzz::ops
