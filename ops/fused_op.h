#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

#include "ops/basic_op.h"

namespace gradfuzz::ops {

/// Forward result of a plan group: main output and, per covered basic op, its extra outputs.
struct GroupForwardResult {
  at::Tensor output;
  std::vector<ExtraOutputs> extra_outputs;
};

/// Backward result of a plan group, per covered basic op.
struct GroupBackwardResult {
  at::Tensor grad_input;
  std::vector<std::vector<at::Tensor>> grad_params;
  std::vector<ExtraOutputs> grad_extra_inputs;
};

/// One entry of a forward or backward plan: a fused op standing in for a contiguous run
/// of basic ops, or (is_basic()) a single basic op. Vectors are indexed by position
/// inside the group. A bound extra input whose producer is inside the group arrives
/// undefined in forward: the group routes that tensor itself, and in backward applies
/// the consumer's gradient to the producer itself (the same-fusion rule); it still
/// returns that consumer slot's gradient so the fuser can trace the channel.
class FusedOp {
 public:
  FusedOp(std::string name, std::vector<BasicOpPtr> ops) : name_(std::move(name)), ops_(std::move(ops)) {}
  virtual ~FusedOp() = default;
  FusedOp(const FusedOp&) = delete;
  FusedOp& operator=(const FusedOp&) = delete;

  /// Registration name ("BackwardActivationBias", "FusedResidual.joint"); for a single basic
  /// op, its type.
  const std::string& name() const { return name_; }
  const std::vector<BasicOpPtr>& basic_ops() const { return ops_; }
  virtual bool is_basic() const { return false; }

  virtual GroupForwardResult forward(std::vector<OpContext*>& ctxs, const at::Tensor& input,
                                     const std::vector<std::vector<at::Tensor>>& extra_inputs) const;
  virtual GroupBackwardResult backward(std::vector<OpContext*>& ctxs, const at::Tensor& grad_output,
                                       const std::vector<std::vector<at::Tensor>>& grad_extra_outputs) const;

 private:
  std::string name_;
  std::vector<BasicOpPtr> ops_;
};

using FusedOpPtr = std::shared_ptr<FusedOp>;

/// The plan group for one basic op, running its own forward and backward.
class SingleOpGroup final : public FusedOp {
 public:
  explicit SingleOpGroup(BasicOpPtr op) : FusedOp(op->type(), {op}) {}
  bool is_basic() const override { return true; }
  GroupForwardResult forward(std::vector<OpContext*>& ctxs, const at::Tensor& input,
                             const std::vector<std::vector<at::Tensor>>& extra_inputs) const override;
  GroupBackwardResult backward(std::vector<OpContext*>& ctxs, const at::Tensor& grad_output,
                               const std::vector<std::vector<at::Tensor>>& grad_extra_outputs) const override;
};

}  // namespace gradfuzz::ops
