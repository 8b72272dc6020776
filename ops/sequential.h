#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "ops/fuser.h"

namespace gradfuzz::ops {

/// A plain (non-fusible) module: sees only the main tensor and runs with ordinary autograd.
/// It splits a Sequential into several fusers.
class FunctionModule {
 public:
  FunctionModule(std::string name, std::function<at::Tensor(const at::Tensor&)> fn)
      : name_(std::move(name)), fn_(std::move(fn)) {}
  const std::string& name() const { return name_; }
  at::Tensor operator()(const at::Tensor& x) const { return fn_(x); }

 private:
  std::string name_;
  std::function<at::Tensor(const at::Tensor&)> fn_;
};

/// The catalog's boundary module: y = x, as a new tensor through plain autograd.
std::shared_ptr<FunctionModule> make_boundary();

/// One module of a Sequential.
using Module = std::variant<BasicOpPtr, std::shared_ptr<FunctionModule>>;

/// Runs modules in order; maximal runs of consecutive basic ops become one persistent
/// fuser each (runtime.md section 9).
class Sequential {
 public:
  /// Validates every fuser (channels never cross a boundary: MissingProducerError) and locks
  /// the ops only when all of them are valid.
  Sequential(std::vector<Module> modules, const FusionRegistry& fusions);

  /// Main output then public extra outputs of all fusers, in fuser order. Each fuser takes
  /// exactly its number of public extra inputs, front to back; a surplus or shortfall throws
  /// ExtraInputCountError.
  std::vector<at::Tensor> forward(const at::Tensor& input, const std::vector<at::Tensor>& extra_inputs);

  const std::vector<Module>& modules() const { return modules_; }
  /// The fusers in order, and for each module the index of its fuser (-1 for a plain module).
  const std::vector<std::shared_ptr<OperationFuser>>& fusers() const { return fusers_; }
  int64_t num_public_extra_inputs() const;

 private:
  std::vector<Module> modules_;
  std::vector<std::shared_ptr<OperationFuser>> fusers_;
  /// Per module: index into fusers_ when it starts a fuser, else -1 (plain or continuing).
  std::vector<int64_t> steps_;
};

}  // namespace gradfuzz::ops
