#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ops/extra_outputs.h"
#include "ops/op_context.h"

namespace gradfuzz::ops {

struct QuantRecipe;  // ops/quantization.h

/// Result of a fused-path forward: main output and the extra outputs (either style).
struct ForwardResult {
  at::Tensor output;
  ExtraOutputs extra_outputs;
};

/// Result of a fused-path backward. `grad_params` follows parameters(); an undefined entry
/// means "no gradient". `grad_extra_inputs` has one entry per extra input slot.
struct BackwardResult {
  at::Tensor grad_input;
  std::vector<at::Tensor> grad_params;
  ExtraOutputs grad_extra_inputs;
};

/// Result of the reference (plain autograd) implementation.
struct ReferenceResult {
  at::Tensor output;
  std::vector<at::Tensor> extra_outputs;
};

/// Binding state of one extra output slot.
struct OutputBinding {
  std::optional<std::string> channel;
  bool output_to_caller = true;
};

/// A basic operation (runtime.md section 1). Public entry points are non-virtual: they
/// check arity, then call the virtual `*_impl`. Ops are held by shared_ptr because a
/// standalone call wraps `this` in a transient fuser.
class BasicOp : public std::enable_shared_from_this<BasicOp> {
 public:
  explicit BasicOp(std::string type) : type_(std::move(type)) {}
  virtual ~BasicOp() = default;
  BasicOp(const BasicOp&) = delete;
  BasicOp& operator=(const BasicOp&) = delete;

  /// Catalog name ("GroupedLinear").
  const std::string& type() const { return type_; }
  virtual int64_t num_extra_inputs() const { return 0; }
  virtual int64_t num_extra_outputs() const { return 0; }
  /// Parameters in gradient order (handles share storage with the op).
  virtual std::vector<at::Tensor> parameters() const { return {}; }
  /// Whether the fused-path forward writes into extra input `slot` in place; the fuser
  /// then hands it a private copy so no channel consumer or caller sees the write.
  virtual bool writes_extra_input_in_place(int64_t /*slot*/) const { return false; }
  /// Whether, under `recipe`, TE 2.20.2 casts this op's input gradient to FP8 with the
  /// previous op's grad_output quantizer when both are in one fuser (fuser.py:
  /// OperationFuser forward hands every op `prev_op.get_grad_output_quantizer()`; the ops
  /// that cast with it override this). The previous op then receives a quantized gradient
  /// (docs/BACKENDS.md "Where te.ops quantizes").
  virtual bool casts_grad_input_for_previous_op(const QuantRecipe& /*recipe*/) const { return false; }

  /// Fused-path forward. `extra_inputs` has num_extra_inputs() entries; an undefined entry
  /// is a bound slot whose producer sits in the same fused group (only fused ops see those).
  ForwardResult forward(OpContext& ctx, const at::Tensor& input, const std::vector<at::Tensor>& extra_inputs) const;
  /// Fused-path backward; `grad_extra_outputs` has num_extra_outputs() entries, undefined
  /// where no gradient arrived.
  BackwardResult backward(OpContext& ctx, const at::Tensor& grad_output,
                          const std::vector<at::Tensor>& grad_extra_outputs) const;
  /// Reference implementation with differentiable LibTorch calls and explicit parameters
  /// (float64 CPU copies in the reference path). Independent code from forward/backward.
  ReferenceResult reference(const at::Tensor& input, const std::vector<at::Tensor>& extra_inputs,
                            const std::vector<at::Tensor>& params) const;

  /// Bind (or, with std::nullopt, unbind) an extra input slot. Throws, in this order:
  /// SlotOutOfRangeError, InvalidChannelNameError (empty name), LockedError.
  BasicOp& set_extra_input_channel(int64_t slot, std::optional<std::string> name);
  /// Bind an extra output slot; unbinding forces output_to_caller = true. Same errors.
  BasicOp& set_extra_output_channel(int64_t slot, std::optional<std::string> name, bool output_to_caller = true);
  std::optional<std::string> extra_input_channel(int64_t slot) const;
  OutputBinding extra_output_binding(int64_t slot) const;

  /// Output style used by this op's containers (forward and backward).
  BasicOp& set_output_style(OutputStyle style) {
    style_ = style;
    return *this;
  }
  OutputStyle output_style() const { return style_; }

  /// Standalone call through a transient fuser: validates bindings, never locks (repair of
  /// finding 3). Returns the main output followed by public extra outputs.
  std::vector<at::Tensor> operator()(const at::Tensor& input, const std::vector<at::Tensor>& extra_inputs = {});

  bool locked() const { return locked_; }
  /// Called by persistent fusers only.
  void lock() { locked_ = true; }
  /// Used by the harness to undo a failed construction check; never by the runtime.
  void unlock_for_testing() { locked_ = false; }

  /// "GroupedLinear(slot 1)"-style label for messages.
  std::string describe_slot(const char* direction, int64_t slot) const;

 protected:
  virtual ForwardResult forward_impl(OpContext& ctx, const at::Tensor& input,
                                     const std::vector<at::Tensor>& extra_inputs) const = 0;
  virtual BackwardResult backward_impl(OpContext& ctx, const at::Tensor& grad_output,
                                       const std::vector<at::Tensor>& grad_extra_outputs) const = 0;
  virtual ReferenceResult reference_impl(const at::Tensor& input, const std::vector<at::Tensor>& extra_inputs,
                                         const std::vector<at::Tensor>& params) const = 0;
  /// Packs tensors in this op's output style.
  ExtraOutputs pack(std::vector<at::Tensor> tensors) const { return ExtraOutputs::make(style_, std::move(tensors)); }

 private:
  void check_binding_change(const char* direction, int64_t slot, int64_t count,
                            const std::optional<std::string>& name) const;

  std::string type_;
  std::map<int64_t, std::string> input_channels_;
  std::map<int64_t, OutputBinding> output_bindings_;
  OutputStyle style_ = OutputStyle::kVector;
  bool locked_ = false;
};

using BasicOpPtr = std::shared_ptr<BasicOp>;

/// Declares, in a basic op's class body, the three hooks every basic op overrides:
/// forward_impl, backward_impl and reference_impl, with BasicOp's exact signatures.
#define GRADFUZZ_BASIC_OP_IMPL()                                                                                   \
  ::gradfuzz::ops::ForwardResult forward_impl(::gradfuzz::ops::OpContext& ctx, const at::Tensor& input,            \
                                              const std::vector<at::Tensor>& extra_inputs) const override;         \
  ::gradfuzz::ops::BackwardResult backward_impl(::gradfuzz::ops::OpContext& ctx, const at::Tensor& grad_output,    \
                                                const std::vector<at::Tensor>& grad_extra_outputs) const override; \
  ::gradfuzz::ops::ReferenceResult reference_impl(                                                                 \
      const at::Tensor& input, const std::vector<at::Tensor>& extra_inputs, const std::vector<at::Tensor>& params) \
      const override

}  // namespace gradfuzz::ops
