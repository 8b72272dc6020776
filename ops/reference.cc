#include "ops/reference.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include "ops/errors.h"

namespace gradfuzz::ops {
namespace {

/// A leaf copy on `device` in `dtype` with the same requires_grad; integer tensors stay integer.
at::Tensor reference_leaf(const at::Tensor& t, at::ScalarType dtype, at::Device device) {
  if (!t.defined()) return t;
  at::Tensor copy = t.detach().to(device);
  if (at::isFloatingType(copy.scalar_type())) {
    copy = copy.to(dtype).requires_grad_(t.requires_grad());
  } else {
    copy = copy.clone();
  }
  return copy;
}

thread_local KinkProbe* current_probe = nullptr;

/// Makes `probe` this thread's kink probe for its lifetime (restoring the previous one).
class ProbeScope {
 public:
  explicit ProbeScope(KinkProbe* probe) : previous_(current_probe) { current_probe = probe; }
  ~ProbeScope() { current_probe = previous_; }
  ProbeScope(const ProbeScope&) = delete;
  ProbeScope& operator=(const ProbeScope&) = delete;

 private:
  KinkProbe* previous_;
};

}  // namespace

at::Tensor KinkProbe::record(const at::Tensor& distance) {
  sites_.push_back({current_op_, distance.detach().clone()});
  auto it = flips_.find(current_op_);
  if (it == flips_.end() || it->second.sizes() != distance.sizes()) return at::Tensor();
  return it->second.to(distance.device());
}

KinkProbe* kink_probe() { return current_probe; }

at::Tensor ReferenceEvaluator::with_noise(const at::Tensor& t) const {
  if (noise_relative_ <= 0 || !noise_generator_ || !t.defined() || !at::isFloatingType(t.scalar_type()) ||
      t.numel() == 0) {
    return t;
  }
  // Drawn on the CPU in float64 (the generator is a CPU one), both now, so the noise depends
  // on the draw order of the forward only, not on the order autograd runs the hooks in.
  const auto cpu = at::TensorOptions().dtype(at::kDouble);
  auto scale = [&] {
    return (1 + noise_relative_ * (at::rand(t.sizes(), *noise_generator_, cpu) * 2 - 1)).to(t.options());
  };
  const at::Tensor forward_scale = scale();
  const at::Tensor backward_scale = scale();
  at::Tensor noisy = t * forward_scale;
  if (noisy.requires_grad()) {
    noisy.register_hook([backward_scale](const at::Tensor& grad) { return grad * backward_scale; });
  }
  return noisy;
}

ReferenceEvaluator::ReferenceEvaluator(const Sequential& sequential, at::ScalarType compute_dtype, at::Device device)
    : sequential_(sequential), compute_dtype_(compute_dtype), device_(device) {
  for (const Module& module : sequential_.modules()) {
    const auto* op = std::get_if<BasicOpPtr>(&module);
    if (!op) continue;
    std::vector<at::Tensor> copies;
    for (const at::Tensor& p : (*op)->parameters()) copies.push_back(reference_leaf(p, compute_dtype_, device_));
    params_.push_back(std::move(copies));
  }
}

std::vector<at::Tensor> ReferenceEvaluator::forward(const at::Tensor& input,
                                                    const std::vector<at::Tensor>& extra_inputs) {
  input_ = reference_leaf(input, compute_dtype_, device_);
  extra_inputs_.clear();
  for (const at::Tensor& e : extra_inputs) extra_inputs_.push_back(reference_leaf(e, compute_dtype_, device_));
  if (static_cast<int64_t>(extra_inputs_.size()) != sequential_.num_public_extra_inputs()) {
    throw ExtraInputCountError("reference: expected " + std::to_string(sequential_.num_public_extra_inputs()) +
                               " public extra inputs, got " + std::to_string(extra_inputs_.size()));
  }
  channel_values_.clear();
  op_inputs_.clear();
  op_outputs_.clear();
  op_extra_inputs_.clear();
  op_extra_outputs_.clear();
  ProbeScope probe_scope(probe_);
  ReferenceQuantizationScope quantization_scope(quantization_);
  std::vector<at::Tensor> public_outputs;
  at::Tensor x = input_;
  size_t next_extra = 0;
  size_t op_index = 0;
  // Channels are scoped to one run of consecutive basic ops (one fuser); plain modules end it.
  std::map<std::string, at::Tensor>* channels = nullptr;
  bool in_run = false;
  int64_t module_index = -1;
  for (const Module& module : sequential_.modules()) {
    ++module_index;
    if (probe_) probe_->set_current_op(module_index);
    if (quantization_) quantization_->set_current_op(module_index);
    if (const auto* plain = std::get_if<std::shared_ptr<FunctionModule>>(&module)) {
      x = with_noise((**plain)(x));
      in_run = false;
      continue;
    }
    if (!in_run) {
      channel_values_.emplace_back();
      channels = &channel_values_.back();
      in_run = true;
    }
    const BasicOp& op = *std::get<BasicOpPtr>(module);
    // Wire by name: bound slots read the channel, public slots take the caller's tensors in
    // (op, slot) order.
    std::vector<at::Tensor> extras(op.num_extra_inputs());
    for (int64_t s = 0; s < op.num_extra_inputs(); ++s) {
      if (auto channel = op.extra_input_channel(s)) {
        auto it = channels->find(*channel);
        if (it == channels->end()) {
          throw MissingProducerError("reference: " + op.describe_slot("input", s) + " reads channel '" + *channel +
                                     "' before any op of its fuser produced it");
        }
        extras[s] = it->second;
      } else {
        extras[s] = extra_inputs_.at(next_extra++);
      }
    }
    if (quantization_) {
      // The next module casts this op's gradient when it is a basic op of the same fuser (a
      // plain module ends the fuser, and TE's fuser has no previous op at its start).
      const auto& modules = sequential_.modules();
      const size_t next = static_cast<size_t>(module_index) + 1;
      const auto* next_op = next < modules.size() ? std::get_if<BasicOpPtr>(&modules[next]) : nullptr;
      const QuantRecipe* recipe = quantization_->recipe();
      quantization_->set_next_op_casts_gradient(recipe != nullptr && next_op != nullptr &&
                                                (*next_op)->casts_grad_input_for_previous_op(*recipe));
    }
    if (trace_) {
      op_inputs_[module_index] = x;
      for (int64_t s = 0; s < op.num_extra_inputs(); ++s) {
        at::Tensor& e = extras[static_cast<size_t>(s)];
        if (!e.defined() || !e.requires_grad() || !at::isFloatingType(e.scalar_type())) continue;
        // A node of this consumer's own: the gradient asked of it is this op's share of the
        // channel's (or caller tensor's), the same values.
        e = e.view_as(e);
        op_extra_inputs_[{module_index, s}] = e;
      }
    }
    ReferenceResult result = op.reference(x, extras, params_.at(op_index++));
    for (int64_t s = 0; s < op.num_extra_outputs(); ++s) {
      const OutputBinding binding = op.extra_output_binding(s);
      at::Tensor value = with_noise(result.extra_outputs[s]);
      if (trace_ && value.defined()) op_extra_outputs_[{module_index, s}] = value.detach();
      if (binding.channel) {
        if (value.requires_grad()) value.retain_grad();
        if (!channels->emplace(*binding.channel, value).second) {
          throw DuplicateProducerError("reference: channel '" + *binding.channel + "' is produced twice");
        }
      }
      if (binding.output_to_caller) public_outputs.push_back(value);
    }
    x = with_noise(result.output);
    if (trace_) op_outputs_[module_index] = x.detach();
  }
  outputs_ = {x};
  outputs_.insert(outputs_.end(), public_outputs.begin(), public_outputs.end());
  // DelayedScaling's forward update: at the exit of TE's autocast, only under grad mode.
  if (quantization_) {
    quantization_->after_forward(at::GradMode::is_enabled() ? ForwardGrad::kEnabled : ForwardGrad::kDisabled);
  }
  return outputs_;
}

ReferenceGradients ReferenceEvaluator::backward(const std::vector<at::Tensor>& cotangents) {
  GRADFUZZ_INTERNAL_ASSERT(cotangents.size() == outputs_.size(), "one cotangent per reference output");
  // Collect every tensor whose gradient is asked for; autograd::grad returns them in order.
  std::vector<at::Tensor> wrt;
  auto want = [&](const at::Tensor& t) -> int64_t {
    if (!t.defined() || !t.requires_grad()) return -1;
    wrt.push_back(t);
    return static_cast<int64_t>(wrt.size()) - 1;
  };
  const int64_t input_pos = want(input_);
  std::vector<std::vector<int64_t>> param_pos;
  for (const auto& op_params : params_) {
    param_pos.emplace_back();
    for (const at::Tensor& p : op_params) param_pos.back().push_back(want(p));
  }
  std::vector<int64_t> extra_pos;
  for (const at::Tensor& e : extra_inputs_) extra_pos.push_back(want(e));
  // A traced evaluation also asks for the gradient of every op's main input; the same tensor
  // (an op handing its input on) is asked for once.
  std::map<int64_t, int64_t> op_input_pos;
  for (const auto& [module, x] : op_inputs_) {
    if (!x.defined() || !x.requires_grad() || !at::isFloatingType(x.scalar_type())) continue;
    int64_t pos = -1;
    for (size_t k = 0; k < wrt.size() && pos < 0; ++k) {
      if (wrt[k].unsafeGetTensorImpl() == x.unsafeGetTensorImpl()) pos = static_cast<int64_t>(k);
    }
    op_input_pos[module] = pos >= 0 ? pos : want(x);
  }
  std::map<std::pair<int64_t, int64_t>, int64_t> op_extra_pos;
  for (const auto& [slot, e] : op_extra_inputs_) op_extra_pos[slot] = want(e);
  std::vector<std::map<std::string, int64_t>> channel_pos;
  for (const auto& channels : channel_values_) {
    channel_pos.emplace_back();
    for (const auto& [name, value] : channels) {
      if (at::isFloatingType(value.scalar_type())) channel_pos.back()[name] = want(value);
    }
  }

  std::vector<at::Tensor> outputs;
  std::vector<at::Tensor> grad_outputs;
  for (size_t k = 0; k < outputs_.size(); ++k) {
    if (!outputs_[k].requires_grad()) continue;  // integer outputs, or nothing upstream needs grad
    outputs.push_back(outputs_[k]);
    grad_outputs.push_back(cotangents[k].detach().to(device_, outputs_[k].scalar_type()));
  }
  std::vector<at::Tensor> grads(wrt.size());
  if (!outputs.empty() && !wrt.empty()) {
    ReferenceQuantizationScope quantization_scope(quantization_);
    grads = torch::autograd::grad(outputs, wrt, grad_outputs, /*retain_graph=*/true, /*create_graph=*/false,
                                  /*allow_unused=*/true);
  }
  // DelayedScaling's backward update, after the whole backward (fuser.py: is_first_module).
  if (quantization_) quantization_->after_backward();
  auto pick = [&](int64_t pos) -> at::Tensor {
    if (pos < 0) return at::Tensor();
    const at::Tensor& g = grads[pos];
    // Unused but differentiable: the true gradient is zero, not "none".
    return g.defined() ? g : at::zeros_like(wrt[pos]);
  };
  ReferenceGradients out;
  out.grad_input = pick(input_pos);
  for (const auto& positions : param_pos) {
    out.grad_params.emplace_back();
    for (int64_t pos : positions) out.grad_params.back().push_back(pick(pos));
  }
  for (int64_t pos : extra_pos) out.grad_extra_inputs.push_back(pick(pos));
  for (const auto& [module, pos] : op_input_pos) out.grad_op_inputs[module] = pick(pos);
  for (const auto& [slot, pos] : op_extra_pos) out.grad_op_extra_inputs[slot] = pick(pos);
  for (const auto& channels : channel_pos) {
    out.channel_grads.emplace_back();
    for (const auto& [name, pos] : channels) {
      if (pos >= 0) out.channel_grads.back()[name] = pick(pos);
    }
  }
  return out;
}

}  // namespace gradfuzz::ops
