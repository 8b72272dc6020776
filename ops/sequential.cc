#include "ops/sequential.h"

#include <ATen/ATen.h>

#include "ops/errors.h"

namespace gradfuzz::ops {

std::shared_ptr<FunctionModule> make_boundary() {
  return std::make_shared<FunctionModule>("Boundary", [](const at::Tensor& x) { return x.clone(); });
}

Sequential::Sequential(std::vector<Module> modules, const FusionRegistry& fusions) : modules_(std::move(modules)) {
  // Group maximal runs of basic ops into fusers; a construction that fails leaves every op
  // unlocked.
  std::vector<std::vector<BasicOpPtr>> runs;
  bool in_run = false;
  for (const Module& module : modules_) {
    if (const auto* op = std::get_if<BasicOpPtr>(&module)) {
      if (!*op) throw InvalidArgumentError("Sequential: module " + std::to_string(steps_.size()) + " is null");
      if (!in_run) runs.emplace_back();
      steps_.push_back(in_run ? -1 : static_cast<int64_t>(runs.size() - 1));
      runs.back().push_back(*op);
      in_run = true;
    } else {
      if (!std::get<std::shared_ptr<FunctionModule>>(module)) {
        throw InvalidArgumentError("Sequential: module " + std::to_string(steps_.size()) + " is null");
      }
      steps_.push_back(-1);
      in_run = false;
    }
  }
  // Fusers built without locking validate their runs; only when every run is valid does the
  // Sequential lock what they cover.
  for (auto& run : runs)
    fusers_.push_back(std::make_shared<OperationFuser>(std::move(run), fusions, Locking::kTransient));
  for (const auto& fuser : fusers_) {
    for (const BasicOpPtr& op : fuser->ops()) op->lock();
  }
}

int64_t Sequential::num_public_extra_inputs() const {
  int64_t total = 0;
  for (const auto& fuser : fusers_) total += fuser->num_public_extra_inputs();
  return total;
}

std::vector<at::Tensor> Sequential::forward(const at::Tensor& input, const std::vector<at::Tensor>& extra_inputs) {
  const int64_t expected = num_public_extra_inputs();
  if (static_cast<int64_t>(extra_inputs.size()) != expected) {
    std::string per_fuser;
    for (size_t f = 0; f < fusers_.size(); ++f) {
      per_fuser += (per_fuser.empty() ? "" : ", ") + std::string("fuser ") + std::to_string(f) + " takes " +
                   std::to_string(fusers_[f]->num_public_extra_inputs());
    }
    throw ExtraInputCountError("Sequential expected " + std::to_string(expected) + " public extra inputs (" +
                               (per_fuser.empty() ? std::string("no fusers") : per_fuser) + "), got " +
                               std::to_string(extra_inputs.size()) +
                               (static_cast<int64_t>(extra_inputs.size()) > expected ? " (surplus)" : " (shortfall)"));
  }
  at::Tensor x = input;
  std::vector<at::Tensor> public_outputs;
  size_t next_extra = 0;
  for (size_t m = 0; m < modules_.size(); ++m) {
    if (const auto* plain = std::get_if<std::shared_ptr<FunctionModule>>(&modules_[m])) {
      x = (**plain)(x);
      continue;
    }
    if (steps_[m] < 0) continue;  // covered by the fuser that started earlier
    OperationFuser& fuser = *fusers_[steps_[m]];
    const auto count = static_cast<size_t>(fuser.num_public_extra_inputs());
    std::vector<at::Tensor> extras(extra_inputs.begin() + static_cast<std::ptrdiff_t>(next_extra),
                                   extra_inputs.begin() + static_cast<std::ptrdiff_t>(next_extra + count));
    next_extra += count;
    std::vector<at::Tensor> outs = fuser.forward(x, extras);
    x = outs[0];
    public_outputs.insert(public_outputs.end(), outs.begin() + 1, outs.end());
  }
  std::vector<at::Tensor> result{x};
  result.insert(result.end(), public_outputs.begin(), public_outputs.end());
  return result;
}

}  // namespace gradfuzz::ops
