#include "ops/basic_op.h"

#include <ATen/ATen.h>

#include "ops/errors.h"
#include "ops/faults.h"
#include "ops/fuser.h"

namespace gradfuzz::ops {

std::string BasicOp::describe_slot(const char* direction, int64_t slot) const {
  return type_ + " extra " + direction + " slot " + std::to_string(slot);
}

ForwardResult BasicOp::forward(OpContext& ctx, const at::Tensor& input,
                               const std::vector<at::Tensor>& extra_inputs) const {
  if (static_cast<int64_t>(extra_inputs.size()) != num_extra_inputs()) {
    throw ExtraCountError(type_ + " forward: expected " + std::to_string(num_extra_inputs()) + " extra inputs, got " +
                          std::to_string(extra_inputs.size()));
  }
  if (!input.defined()) throw InvalidArgumentError(type_ + " forward: the main input is undefined");
  return forward_impl(ctx, input, extra_inputs);
}

BackwardResult BasicOp::backward(OpContext& ctx, const at::Tensor& grad_output,
                                 const std::vector<at::Tensor>& grad_extra_outputs) const {
  if (static_cast<int64_t>(grad_extra_outputs.size()) != num_extra_outputs()) {
    throw ExtraCountError(type_ + " backward: expected " + std::to_string(num_extra_outputs()) +
                          " extra-output gradients, got " + std::to_string(grad_extra_outputs.size()));
  }
  return backward_impl(ctx, grad_output, grad_extra_outputs);
}

ReferenceResult BasicOp::reference(const at::Tensor& input, const std::vector<at::Tensor>& extra_inputs,
                                   const std::vector<at::Tensor>& params) const {
  if (static_cast<int64_t>(extra_inputs.size()) != num_extra_inputs()) {
    throw ExtraCountError(type_ + " reference: expected " + std::to_string(num_extra_inputs()) + " extra inputs, got " +
                          std::to_string(extra_inputs.size()));
  }
  if (params.size() != parameters().size()) {
    throw InvalidArgumentError(type_ + " reference: expected " + std::to_string(parameters().size()) +
                               " parameters, got " + std::to_string(params.size()));
  }
  ReferenceResult result = reference_impl(input, extra_inputs, params);
  if (static_cast<int64_t>(result.extra_outputs.size()) != num_extra_outputs()) {
    throw ExtraCountError(type_ + " reference: expected " + std::to_string(num_extra_outputs()) +
                          " extra outputs, got " + std::to_string(result.extra_outputs.size()));
  }
  return result;
}

void BasicOp::check_binding_change(const char* direction, int64_t slot, int64_t count,
                                   const std::optional<std::string>& name) const {
  const std::string channel = name ? "'" + *name + "'" : std::string("<unbound>");
  if (slot < 0 || slot >= count) {
    throw SlotOutOfRangeError(type_ + ": extra " + direction + " slot " + std::to_string(slot) +
                              " is out of range (the op has " + std::to_string(count) + " extra " + direction +
                              " slots) while binding channel " + channel);
  }
  if (name && name->empty()) {
    throw InvalidChannelNameError(describe_slot(direction, slot) + ": channel name must be a non-empty string, got ''");
  }
  if (locked_) {
    throw LockedError(describe_slot(direction, slot) + ": cannot bind channel " + channel +
                      ": the op is locked by a persistent fuser or Sequential; bindings must be set "
                      "before it is placed in one");
  }
}

BasicOp& BasicOp::set_extra_input_channel(int64_t slot, std::optional<std::string> name) {
  check_binding_change("input", slot, num_extra_inputs(), name);
  if (name) {
    input_channels_[slot] = std::move(*name);
  } else {
    input_channels_.erase(slot);
  }
  return *this;
}

BasicOp& BasicOp::set_extra_output_channel(int64_t slot, std::optional<std::string> name, bool output_to_caller) {
  check_binding_change("output", slot, num_extra_outputs(), name);
  if (name) {
    output_bindings_[slot] = OutputBinding{std::move(name), output_to_caller};
  } else {
    output_bindings_.erase(slot);  // unbound slots are public: output_to_caller forced true
  }
  return *this;
}

std::optional<std::string> BasicOp::extra_input_channel(int64_t slot) const {
  auto it = input_channels_.find(slot);
  if (it == input_channels_.end()) return std::nullopt;
  return it->second;
}

OutputBinding BasicOp::extra_output_binding(int64_t slot) const {
  auto it = output_bindings_.find(slot);
  if (it == output_bindings_.end()) return OutputBinding{};
  return it->second;
}

std::vector<at::Tensor> BasicOp::operator()(const at::Tensor& input, const std::vector<at::Tensor>& extra_inputs) {
  // The transient fuser validates this op's bindings like any fuser would but, repairing
  // review finding 3, never locks: the op may still be bound and placed in a Sequential.
  const Locking locking = fault_enabled(Fault::kTransientLock) ? Locking::kPersistent : Locking::kTransient;
  OperationFuser fuser({shared_from_this()}, FusionRegistry{}, locking);
  return fuser.forward(input, extra_inputs);
}

}  // namespace gradfuzz::ops
