#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ops/basic_op.h"
#include "ops/fusion_registry.h"

namespace gradfuzz::ops {

/// `(op, slot)` inside one fuser.
struct SlotRef {
  int64_t op = 0;
  int64_t slot = 0;
  bool operator==(const SlotRef& o) const { return op == o.op && slot == o.slot; }
  bool operator<(const SlotRef& o) const { return op != o.op ? op < o.op : slot < o.slot; }
};

/// Routing tables built at construction (runtime.md section 3).
struct RoutingTables {
  /// channel name -> producing output slot.
  std::map<std::string, SlotRef> producers;
  /// For each bound input slot: its producing output slot.
  std::map<SlotRef, SlotRef> input_sources;
  /// For each producing output slot: its consumers, one entry per consuming input slot.
  std::map<SlotRef, std::vector<SlotRef>> consumers;
  /// Unbound input slots in the order the caller's extra inputs are matched.
  std::vector<SlotRef> public_inputs;
  /// Output slots returned to the caller, in order.
  std::vector<SlotRef> public_outputs;
};

/// Whether constructing the fuser locks its ops (runtime.md section 2).
enum class Locking { kPersistent, kTransient };

/// One plan entry: which group ran over which basic-op index range [begin, end).
struct PlanEntry {
  std::string name;
  int64_t begin = 0;
  int64_t end = 0;
  bool fused = false;
};

/// What one forward call (and its backward, once run) did: plans and channel tensors.
struct FuserTrace {
  std::vector<PlanEntry> forward_plan;
  std::vector<PlanEntry> backward_plan;
  /// channel name -> value produced in forward.
  std::map<std::string, at::Tensor> channel_values;
  /// channel name -> total gradient of the produced tensor (public gradient plus every
  /// consumer's gradient, same-fusion consumers included). Absent when backward did not
  /// reach the producer or no gradient arrived.
  std::map<std::string, at::Tensor> channel_grads;
  /// Whether backward ran.
  bool backward_ran = false;
  /// The call's first_op_requiring_backward (runtime.md section 4), which its plans are for.
  int64_t first_op_requiring_backward = 0;
  /// With group tracing on (GroupTraceScope): per forward plan entry, the main output it
  /// handed on; per backward plan entry that ran, the gradient it returned for its main input
  /// (undefined: none). Detached copies taken when the group returned.
  std::vector<std::pair<size_t, at::Tensor>> forward_outputs;
  std::vector<std::pair<size_t, at::Tensor>> backward_grad_inputs;
  /// Likewise per (fuser op index, slot): each op's extra outputs, and the gradient each op's
  /// backward returned for each of its extra inputs.
  std::map<std::pair<int64_t, int64_t>, at::Tensor> forward_extra_outputs;
  std::map<std::pair<int64_t, int64_t>, at::Tensor> backward_extra_grads;
};

/// Turns on the recording of FuserTrace::forward_outputs and backward_grad_inputs for the
/// fusers that run on this thread while it lives (the model backend's traced paths).
class GroupTraceScope {
 public:
  explicit GroupTraceScope(bool on);
  ~GroupTraceScope();
  GroupTraceScope(const GroupTraceScope&) = delete;
  GroupTraceScope& operator=(const GroupTraceScope&) = delete;
  /// Whether recording is on on this thread.
  static bool active();

 private:
  bool previous_;
};

/// The plans of runtime.md section 5 for `ops` under `fusions` when backward starts at op
/// `first_op_requiring_backward`: the joint functions applied to the basic ops, then the
/// forward-only and, separately, the backward-only ones, each mapped back to basic-op
/// ranges (PlanMismatchError when a fused op does not cover the next ops in order).
/// Computed afresh on every call; OperationFuser keeps them per
/// first_op_requiring_backward.
struct FusionPlans {
  std::vector<FusedOpPtr> forward;
  std::vector<FusedOpPtr> backward;
  std::vector<PlanEntry> forward_entries;
  std::vector<PlanEntry> backward_entries;
};
FusionPlans make_fusion_plans(const std::vector<BasicOpPtr>& ops, const FusionRegistry& fusions,
                              int64_t first_op_requiring_backward);

/// Runs a contiguous list of basic ops as one custom autograd function with channel routing
/// and fusion plans (runtime.md sections 3-8).
class OperationFuser {
 public:
  /// Validates the bindings (errors of section 3) and, with Locking::kPersistent and only on
  /// success, locks every op.
  OperationFuser(std::vector<BasicOpPtr> ops, FusionRegistry fusions, Locking locking);

  /// Main output, then the public extra outputs. `extra_inputs` must match the public input
  /// slots exactly (ExtraInputCountError otherwise).
  std::vector<at::Tensor> forward(const at::Tensor& input, const std::vector<at::Tensor>& extra_inputs);

  const std::vector<BasicOpPtr>& ops() const { return ops_; }
  const FusionRegistry& fusions() const { return fusions_; }
  const RoutingTables& routing() const { return *routing_; }
  int64_t num_public_extra_inputs() const { return static_cast<int64_t>(routing_->public_inputs.size()); }
  int64_t num_public_extra_outputs() const { return static_cast<int64_t>(routing_->public_outputs.size()); }
  /// Section 4, for the given call arguments and the current grad mode.
  int64_t first_op_requiring_backward(const at::Tensor& input, const std::vector<at::Tensor>& extra_inputs) const;
  /// Plans for a given first_op_requiring_backward (cached; rebuilt when it changes).
  const std::vector<FusedOpPtr>& forward_plan(int64_t first_op_requiring_backward);
  const std::vector<FusedOpPtr>& backward_plan(int64_t first_op_requiring_backward);
  /// Trace of the most recent forward call (and of its backward once that ran).
  std::shared_ptr<const FuserTrace> last_trace() const { return last_trace_; }

 private:
  void build_plans(int64_t first_op_requiring_backward);

  std::vector<BasicOpPtr> ops_;
  FusionRegistry fusions_;
  std::shared_ptr<const RoutingTables> routing_;  // shared with in-flight backward calls
  int64_t plans_built_for_ = -1;
  std::vector<FusedOpPtr> forward_plan_;
  std::vector<FusedOpPtr> backward_plan_;
  std::vector<PlanEntry> forward_entries_;
  std::vector<PlanEntry> backward_entries_;
  std::shared_ptr<FuserTrace> last_trace_;
};

/// Validates and builds the routing tables of `ops` (section 3), throwing the section's
/// errors. Exposed so the reference path and tests share the exact rules.
RoutingTables build_routing_tables(const std::vector<BasicOpPtr>& ops);

/// Maps a plan to basic-op index ranges; throws PlanMismatchError when a group does not
/// cover exactly the next basic ops in order.
std::vector<PlanEntry> map_plan(const std::vector<FusedOpPtr>& plan, const std::vector<BasicOpPtr>& ops);

}  // namespace gradfuzz::ops
