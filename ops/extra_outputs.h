#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <optional>
#include <vector>

namespace gradfuzz::ops {

/// How an op hands back its extra outputs and its extra-input gradients.
enum class OutputStyle { kVector, kGenerator };

const char* output_style_name(OutputStyle style);
/// "vector" or "generator"; throws UnknownNameError otherwise.
OutputStyle output_style_from_name(const std::string& name);

/// A container of tensors in one of two styles (runtime.md section 7): a sized vector,
/// or a single-pass generator that yields tensors lazily, has no size, cannot be indexed
/// and cannot be rewound (the C++ analogue of a Python generator). Undefined tensors
/// stand for Python's None.
class ExtraOutputs {
 public:
  using Next = std::function<std::optional<at::Tensor>()>;

  /// An empty vector-style container.
  ExtraOutputs() = default;
  /// A sized container.
  static ExtraOutputs vector(std::vector<at::Tensor> tensors);
  /// A single-pass generator; `next` returns std::nullopt once exhausted.
  static ExtraOutputs generator(Next next);
  /// `tensors` in the given style: as a vector, or behind a generator that yields them
  /// one at a time.
  static ExtraOutputs make(OutputStyle style, std::vector<at::Tensor> tensors);

  OutputStyle style() const { return style_; }

  /// The right way to read any container: consumes it exactly once into a vector.
  /// Throws GeneratorMisuseError when a generator is read a second time.
  std::vector<at::Tensor> materialize();

  /// Sized access, valid for vectors only; a generator throws GeneratorMisuseError
  /// ("has no size" / "cannot be indexed"). The `generator-outputs` fault uses these.
  size_t size() const;
  const at::Tensor& at(size_t index) const;

 private:
  OutputStyle style_ = OutputStyle::kVector;
  std::vector<at::Tensor> tensors_;
  Next next_;
  bool consumed_ = false;
};

}  // namespace gradfuzz::ops
