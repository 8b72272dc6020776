#include "ops/fuser.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <thread>

#include "ops/errors.h"
#include "ops/faults.h"

namespace gradfuzz::ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

std::string slot_name(const std::vector<BasicOpPtr>& ops, const SlotRef& ref, const char* direction) {
  return ops[ref.op]->type() + " (op " + std::to_string(ref.op) + ") extra " + direction + " slot " +
         std::to_string(ref.slot);
}

bool is_floating(const at::Tensor& t) { return t.defined() && at::isFloatingType(t.scalar_type()); }

/// out-of-place a + b where either may be undefined; the result never aliases an argument,
/// so the caller may hand it to an op that accumulates in place (runtime.md section 8.6).
at::Tensor fresh_sum(const at::Tensor& a, const at::Tensor& b) {
  if (a.defined() && b.defined()) return a + b.to(a.scalar_type());
  // With the aliased-channel-grad fault the lone term is handed on as it is: an op that
  // accumulates into its extra-output gradient in place then writes into the caller's
  // cotangent or a consumer's gradient.
  const bool alias = fault_enabled(Fault::kAliasedChannelGrad);
  if (a.defined()) return alias ? a : a.clone();
  if (b.defined()) return alias ? b : b.clone();
  return at::Tensor();
}

/// Reads one op's container exactly once into a vector and checks its length.
std::vector<at::Tensor> materialize(ExtraOutputs& container, size_t expected, const BasicOp& op, const char* what) {
  std::vector<at::Tensor> tensors;
  if (fault_enabled(Fault::kGeneratorOutputs)) {
    // Review finding 2: size and index the container as if it were a sequence.
    const size_t n = container.size();
    for (size_t i = 0; i < n; ++i) tensors.push_back(container.at(i));
  } else {
    tensors = container.materialize();
  }
  if (tensors.size() != expected) {
    throw ExtraCountError(op.type() + " returned " + std::to_string(tensors.size()) + " " + what + ", expected " +
                          std::to_string(expected));
  }
  return tensors;
}

/// Everything one call needs in backward. Holds its own references so a transient fuser may
/// be destroyed before backward runs.
struct CallState : torch::CustomClassHolder {
  std::vector<BasicOpPtr> ops;
  std::shared_ptr<const RoutingTables> routing;
  std::vector<FusedOpPtr> backward_plan;
  std::vector<PlanEntry> backward_entries;
  std::vector<OpContext> ctxs;
  /// Produced values per (op, slot): needed for dtypes of channel gradients.
  std::map<SlotRef, at::Tensor> values;
  /// Whether each public input slot's tensor is floating (gets a gradient).
  std::vector<bool> public_input_floating;
  std::vector<size_t> param_offsets;  // per op, into the flat parameter list
  size_t num_params = 0;
  std::shared_ptr<FuserTrace> trace;
  /// GroupTraceScope was on at the forward call (backward may run on another thread).
  bool trace_groups = false;
};

/// Where each public extra input of the caller goes: (op, slot) per caller index.
std::vector<SlotRef> caller_input_targets(const RoutingTables& routing, const std::vector<BasicOpPtr>& ops) {
  if (!fault_enabled(Fault::kSlotOrder)) return routing.public_inputs;
  // Fault (review finding 4): per op, the public tensors are written to the slot positions
  // that follow the bound slots, as if every op listed its bound slots first.
  std::vector<SlotRef> targets;
  for (int64_t i = 0; i < static_cast<int64_t>(ops.size()); ++i) {
    int64_t bound = 0;
    for (int64_t s = 0; s < ops[i]->num_extra_inputs(); ++s) bound += ops[i]->extra_input_channel(s) ? 1 : 0;
    int64_t k = 0;
    for (const SlotRef& ref : routing.public_inputs) {
      if (ref.op == i) targets.push_back(SlotRef{i, bound + k++});
    }
  }
  return targets;
}

thread_local bool group_trace_on = false;

/// A detached copy of a group's tensor for the trace (undefined stays undefined).
at::Tensor trace_copy(const at::Tensor& t) { return t.defined() ? t.detach().clone() : t; }

/// Position of the main input among FuserFunction::apply's arguments.
constexpr size_t kInputArg = 4;

class FuserFunction : public torch::autograd::Function<FuserFunction> {
 public:
  static variable_list forward(AutogradContext* autograd_ctx, c10::intrusive_ptr<CallState> state,
                               const std::vector<FusedOpPtr>* forward_plan,
                               const std::vector<PlanEntry>* forward_entries, int64_t first_op_requiring_backward,
                               const at::Tensor& input, at::TensorList params, at::TensorList extra_inputs) {
    const std::vector<BasicOpPtr>& ops = state->ops;
    const RoutingTables& routing = *state->routing;
    const auto n = static_cast<int64_t>(ops.size());
    FuserTrace& trace = *state->trace;
    trace.forward_plan = *forward_entries;

    // Extra inputs per op: public ones from the caller, bound ones filled in as we go.
    std::vector<std::vector<at::Tensor>> caller_extras(n);
    for (int64_t i = 0; i < n; ++i) caller_extras[i].resize(ops[i]->num_extra_inputs());
    const std::vector<SlotRef> targets = caller_input_targets(routing, ops);
    for (size_t k = 0; k < targets.size(); ++k) {
      const SlotRef& ref = targets[k];
      if (ref.slot >= static_cast<int64_t>(caller_extras[ref.op].size())) {
        throw InvalidArgumentError(slot_name(ops, ref, "input") + " does not exist (public extra input " +
                                   std::to_string(k) + " was routed past the op's slots)");
      }
      caller_extras[ref.op][ref.slot] = extra_inputs[k];
    }
    std::map<SlotRef, bool> caller_slot;
    for (const SlotRef& ref : targets) caller_slot[ref] = true;

    at::Tensor x = input;
    for (size_t g = 0; g < forward_plan->size(); ++g) {
      const FusedOp& group = *(*forward_plan)[g];
      const PlanEntry& entry = trace.forward_plan[g];
      auto inside = [&](int64_t op) { return op >= entry.begin && op < entry.end; };
      std::vector<OpContext*> ctx_ptrs;
      std::vector<std::vector<at::Tensor>> extras;
      for (int64_t i = entry.begin; i < entry.end; ++i) {
        OpContext& ctx = state->ctxs[i];
        const BasicOp& op = *ops[i];
        ctx.requires_backward = i >= first_op_requiring_backward;
        ctx.grad_wanted.assign(op.num_extra_inputs(), false);
        ctx.output_needed.assign(op.num_extra_outputs(), false);
        std::vector<at::Tensor> op_extras(op.num_extra_inputs());
        for (int64_t s = 0; s < op.num_extra_inputs(); ++s) {
          const SlotRef ref{i, s};
          auto source = routing.input_sources.find(ref);
          if (source != routing.input_sources.end() && !caller_slot.count(ref)) {
            const SlotRef& producer = source->second;
            // Same group: the fused op routes the tensor itself.
            if (inside(producer.op)) {
              ctx.grad_wanted[s] = producer.op >= first_op_requiring_backward;
              continue;
            }
            const at::Tensor& value = state->values.at(producer);
            op_extras[s] = value;
            if (fault_enabled(Fault::kInternalRequiresGrad)) {
              // Review finding 1: a fresh tensor made inside this forward never requires grad.
              ctx.grad_wanted[s] = value.requires_grad();
            } else {
              ctx.grad_wanted[s] = producer.op >= first_op_requiring_backward && is_floating(value);
            }
          } else {
            op_extras[s] = caller_extras[i][s];
            ctx.grad_wanted[s] = op_extras[s].defined() && op_extras[s].requires_grad();
          }
          if (op.writes_extra_input_in_place(s) && op_extras[s].defined() &&
              !fault_enabled(Fault::kInPlaceExtraInput)) {
            // The op writes into this tensor: give it a private copy so no other consumer of
            // the channel and no caller sees the write (runtime.md section 11).
            op_extras[s] = op_extras[s].clone();
          }
        }
        for (int64_t s = 0; s < op.num_extra_outputs(); ++s) {
          const SlotRef ref{i, s};
          bool needed = op.extra_output_binding(s).output_to_caller;
          auto consumers = routing.consumers.find(ref);
          if (consumers != routing.consumers.end()) {
            for (const SlotRef& c : consumers->second) needed = needed || !inside(c.op);
          }
          ctx.output_needed[s] = needed;
        }
        ctx_ptrs.push_back(&ctx);
        extras.push_back(std::move(op_extras));
      }

      if (fault_enabled(Fault::kCrashSegfault) && entry.end - entry.begin >= 3) std::raise(SIGSEGV);
      if (fault_enabled(Fault::kHang)) {
        for (int64_t i = entry.begin; i < entry.end; ++i) {
          if (ops[i]->output_style() == OutputStyle::kGenerator && ops[i]->num_extra_outputs() >= 2) {
            while (true) std::this_thread::sleep_for(std::chrono::seconds(1));
          }
        }
      }
      GroupForwardResult result = group.forward(ctx_ptrs, x, extras);
      if (result.extra_outputs.size() != static_cast<size_t>(entry.end - entry.begin)) {
        throw ExtraCountError(group.name() + " returned extra outputs for " +
                              std::to_string(result.extra_outputs.size()) + " ops, expected " +
                              std::to_string(entry.end - entry.begin));
      }
      if (!result.output.defined()) {
        throw InvalidArgumentError(group.name() + " returned an undefined main output");
      }
      for (int64_t i = entry.begin; i < entry.end; ++i) {
        const BasicOp& op = *ops[i];
        std::vector<at::Tensor> outs =
            materialize(result.extra_outputs[i - entry.begin], op.num_extra_outputs(), op, "extra outputs");
        for (int64_t s = 0; s < op.num_extra_outputs(); ++s) {
          const SlotRef ref{i, s};
          if (!outs[s].defined()) {
            if (op.extra_output_binding(s).output_to_caller) {
              throw PublicOutputNoneError(slot_name(ops, ref, "output") + ": public output returned none");
            }
            if (state->ctxs[i].output_needed[s]) {
              throw NeededOutsideFusionError(slot_name(ops, ref, "output") + " (channel '" +
                                             *op.extra_output_binding(s).channel +
                                             "') returned none but is needed outside its fusion " + group.name());
            }
            continue;
          }
          state->values[ref] = outs[s];
          if (auto channel = op.extra_output_binding(s).channel) trace.channel_values[*channel] = outs[s];
          if (state->trace_groups) trace.forward_extra_outputs[{i, s}] = trace_copy(outs[s]);
        }
      }
      x = result.output;
      if (state->trace_groups) trace.forward_outputs.emplace_back(g, trace_copy(x));
    }

    // Outputs: main, then public extra outputs. A tensor returned twice (MakeExtraOutput
    // hands back x itself) is cloned so each autograd output has its own history.
    variable_list outputs{x};
    for (const SlotRef& ref : routing.public_outputs) outputs.push_back(state->values.at(ref));
    for (size_t k = 1; k < outputs.size(); ++k) {
      for (size_t j = 0; j < k; ++j) {
        if (outputs[k].unsafeGetTensorImpl() == outputs[j].unsafeGetTensorImpl()) {
          outputs[k] = outputs[k].clone();
          break;
        }
      }
    }
    // One call with every integer output: each call replaces the previous set.
    variable_list non_differentiable;
    for (const at::Tensor& out : outputs) {
      if (!is_floating(out)) non_differentiable.push_back(out);
    }
    if (!non_differentiable.empty()) autograd_ctx->mark_non_differentiable(non_differentiable);
    (void)params;
    autograd_ctx->saved_data["state"] = c10::IValue::make_capsule(state);
    return outputs;
  }

  static variable_list backward(AutogradContext* autograd_ctx, variable_list grad_outputs) {
    auto state = c10::static_intrusive_pointer_cast<CallState>(autograd_ctx->saved_data["state"].toCapsule());
    const std::vector<BasicOpPtr>& ops = state->ops;
    const RoutingTables& routing = *state->routing;
    FuserTrace& trace = *state->trace;
    trace.backward_plan = state->backward_entries;
    trace.backward_ran = true;

    std::map<SlotRef, at::Tensor> public_grads;
    for (size_t k = 0; k < routing.public_outputs.size(); ++k) {
      public_grads[routing.public_outputs[k]] = grad_outputs[k + 1];
    }
    std::map<SlotRef, at::Tensor> channel_grads;  // accumulated consumer gradients per producer slot
    std::map<SlotRef, size_t> public_index;
    for (size_t k = 0; k < routing.public_inputs.size(); ++k) public_index[routing.public_inputs[k]] = k;

    // Gradient slots follow apply()'s arguments: state, plan, first index (non-tensors),
    // then input, every parameter, every public extra input.
    variable_list grads(kInputArg + 1 + state->num_params + routing.public_inputs.size());
    at::Tensor grad_y = grad_outputs[0];
    for (size_t g = state->backward_plan.size(); g-- > 0;) {
      const FusedOp& group = *state->backward_plan[g];
      const PlanEntry& entry = state->backward_entries[g];
      bool any_needs_backward = false;
      for (int64_t i = entry.begin; i < entry.end; ++i) any_needs_backward |= state->ctxs[i].requires_backward;
      // requires_backward is monotone in the op index: nothing earlier needs backward either.
      if (!any_needs_backward) break;
      auto inside = [&](int64_t op) { return op >= entry.begin && op < entry.end; };

      std::vector<OpContext*> ctx_ptrs;
      std::vector<std::vector<at::Tensor>> grad_extra_outputs;
      std::map<SlotRef, at::Tensor> channel_totals;  // for the trace
      for (int64_t i = entry.begin; i < entry.end; ++i) {
        const BasicOp& op = *ops[i];
        std::vector<at::Tensor> op_grads(op.num_extra_outputs());
        for (int64_t s = 0; s < op.num_extra_outputs(); ++s) {
          const SlotRef ref{i, s};
          // A hidden output a forward-only fused op left unmaterialised still gets the
          // gradient its consumers sent through the channel.
          auto value = state->values.find(ref);
          if (value != state->values.end() && !is_floating(value->second)) continue;
          auto pub = public_grads.find(ref);
          auto ch = channel_grads.find(ref);
          op_grads[s] = fresh_sum(pub != public_grads.end() ? pub->second : at::Tensor(),
                                  ch != channel_grads.end() ? ch->second : at::Tensor());
          // The op may accumulate into op_grads[s] in place (MakeExtraOutput(in_place)): the
          // trace keeps its own copy.
          if (op.extra_output_binding(s).channel && op_grads[s].defined()) channel_totals[ref] = op_grads[s].clone();
        }
        ctx_ptrs.push_back(&state->ctxs[i]);
        grad_extra_outputs.push_back(std::move(op_grads));
      }

      GroupBackwardResult result = group.backward(ctx_ptrs, grad_y, grad_extra_outputs);
      if (result.grad_extra_inputs.size() != static_cast<size_t>(entry.end - entry.begin) ||
          result.grad_params.size() != static_cast<size_t>(entry.end - entry.begin)) {
        throw ExtraCountError(group.name() + " backward returned gradients for the wrong number of ops");
      }
      for (int64_t i = entry.begin; i < entry.end; ++i) {
        const BasicOp& op = *ops[i];
        std::vector<at::Tensor> input_grads =
            materialize(result.grad_extra_inputs[i - entry.begin], op.num_extra_inputs(), op, "extra-input gradients");
        for (int64_t s = 0; s < op.num_extra_inputs(); ++s) {
          const SlotRef ref{i, s};
          const at::Tensor& grad = input_grads[s];
          if (state->trace_groups) trace.backward_extra_grads[{i, s}] = trace_copy(grad);
          if (!grad.defined()) continue;
          auto source = routing.input_sources.find(ref);
          if (source == routing.input_sources.end()) {
            grads[kInputArg + 1 + state->num_params + public_index.at(ref)] = grad;
            continue;
          }
          const SlotRef& producer = source->second;
          // A hidden output owned by a fused group may never have been materialised; its
          // gradient then keeps its own dtype.
          auto value = state->values.find(producer);
          const at::Tensor& reference = value != state->values.end() ? value->second : grad;
          if (!is_floating(reference)) continue;  // split sizes, routing maps: never a gradient
          const at::Tensor cast = grad.to(reference.scalar_type());
          if (inside(producer.op)) {
            // Same-fusion rule: the group applied this gradient itself; only trace it.
            channel_totals[producer] = channel_totals[producer].defined() ? channel_totals[producer] + cast : cast;
            continue;
          }
          auto& acc = channel_grads[producer];
          if (acc.defined() && fault_enabled(Fault::kCrashAbort)) std::abort();
          // Stored gradients are never aliased: clone on first store, sum out of place after.
          acc = acc.defined() ? acc + cast : (fault_enabled(Fault::kAliasedChannelGrad) ? cast : cast.clone());
        }
        const std::vector<at::Tensor>& pgrads = result.grad_params[i - entry.begin];
        const size_t num_params =
            (i + 1 < static_cast<int64_t>(ops.size()) ? state->param_offsets[i + 1] : state->num_params) -
            state->param_offsets[i];
        // As TE's fuser does: a backward owes one entry (possibly undefined) per parameter;
        // a short list would otherwise leave the missing gradients silently undefined.
        if (pgrads.size() != num_params) {
          throw ParamGradCountError(group.name() + " backward returned " + std::to_string(pgrads.size()) +
                                    " parameter gradient(s) for " + op.type() + " (op " + std::to_string(i) +
                                    "), which has " + std::to_string(num_params) + " parameter(s)");
        }
        for (size_t p = 0; p < num_params; ++p) {
          grads[kInputArg + 1 + state->param_offsets[i] + p] = pgrads[p];
        }
      }
      for (const auto& [ref, total] : channel_totals) {
        if (total.defined()) trace.channel_grads[*ops[ref.op]->extra_output_binding(ref.slot).channel] = total;
      }
      grad_y = result.grad_input;
      if (state->trace_groups) trace.backward_grad_inputs.emplace_back(g, trace_copy(grad_y));
      if (entry.begin == 0) grads[kInputArg] = grad_y;
    }
    return grads;
  }
};

}  // namespace

GroupTraceScope::GroupTraceScope(bool on) : previous_(group_trace_on) { group_trace_on = on; }
GroupTraceScope::~GroupTraceScope() { group_trace_on = previous_; }
bool GroupTraceScope::active() { return group_trace_on; }

RoutingTables build_routing_tables(const std::vector<BasicOpPtr>& ops) {
  RoutingTables tables;
  const auto n = static_cast<int64_t>(ops.size());
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t s = 0; s < ops[i]->num_extra_outputs(); ++s) {
      const OutputBinding binding = ops[i]->extra_output_binding(s);
      if (!binding.channel) continue;
      auto [it, inserted] = tables.producers.emplace(*binding.channel, SlotRef{i, s});
      if (!inserted) {
        throw DuplicateProducerError("channel '" + *binding.channel + "' is produced twice: by " +
                                     slot_name(ops, it->second, "output") + " and by " +
                                     slot_name(ops, SlotRef{i, s}, "output") + "; expected one producer per channel");
      }
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t s = 0; s < ops[i]->num_extra_inputs(); ++s) {
      const SlotRef ref{i, s};
      const std::optional<std::string> channel = ops[i]->extra_input_channel(s);
      if (!channel) {
        tables.public_inputs.push_back(ref);
        continue;
      }
      auto producer = tables.producers.find(*channel);
      if (producer == tables.producers.end()) {
        throw MissingProducerError(slot_name(ops, ref, "input") + " is bound to channel '" + *channel +
                                   "' but no op in the same fuser produces it (channels never cross a fuser "
                                   "boundary)");
      }
      if (producer->second.op >= i) {
        throw ProducerNotEarlierError(slot_name(ops, ref, "input") + " consumes channel '" + *channel +
                                      "' produced by " + slot_name(ops, producer->second, "output") +
                                      "; expected the producer at an op index below " + std::to_string(i));
      }
      tables.input_sources[ref] = producer->second;
      tables.consumers[producer->second].push_back(ref);
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t s = 0; s < ops[i]->num_extra_outputs(); ++s) {
      if (ops[i]->extra_output_binding(s).output_to_caller) tables.public_outputs.push_back(SlotRef{i, s});
    }
  }
  return tables;
}

std::vector<PlanEntry> map_plan(const std::vector<FusedOpPtr>& plan, const std::vector<BasicOpPtr>& ops) {
  std::vector<PlanEntry> entries;
  int64_t next = 0;
  for (const FusedOpPtr& group : plan) {
    PlanEntry entry{group->name(), next, next, !group->is_basic()};
    for (const BasicOpPtr& op : group->basic_ops()) {
      if (next >= static_cast<int64_t>(ops.size()) || ops[next] != op) {
        throw PlanMismatchError(group->name() + " covers " + op->type() + " where the plan expects " +
                                (next < static_cast<int64_t>(ops.size())
                                     ? ops[next]->type() + " (op " + std::to_string(next) + ")"
                                     : std::string("no more ops")));
      }
      ++next;
    }
    if (entry.begin == next) throw PlanMismatchError(group->name() + " covers no basic op");
    entry.end = next;
    entries.push_back(std::move(entry));
  }
  if (next != static_cast<int64_t>(ops.size())) {
    throw PlanMismatchError("the plan covers " + std::to_string(next) + " of " + std::to_string(ops.size()) +
                            " basic ops");
  }
  return entries;
}

OperationFuser::OperationFuser(std::vector<BasicOpPtr> ops, FusionRegistry fusions, Locking locking)
    : ops_(std::move(ops)),
      fusions_(std::move(fusions)),
      routing_(std::make_shared<const RoutingTables>(build_routing_tables(ops_))) {
  if (locking == Locking::kPersistent) {
    for (const BasicOpPtr& op : ops_) op->lock();
  }
}

int64_t OperationFuser::first_op_requiring_backward(const at::Tensor& input,
                                                    const std::vector<at::Tensor>& extra_inputs) const {
  const auto n = static_cast<int64_t>(ops_.size());
  if (!at::GradMode::is_enabled()) return n;
  if (input.requires_grad()) return 0;
  std::vector<bool> op_has_grad_input(n, false);
  for (size_t k = 0; k < routing_->public_inputs.size() && k < extra_inputs.size(); ++k) {
    if (extra_inputs[k].defined() && extra_inputs[k].requires_grad())
      op_has_grad_input[routing_->public_inputs[k].op] = true;
  }
  for (int64_t i = 0; i < n; ++i) {
    if (op_has_grad_input[i]) return i;
    for (const at::Tensor& p : ops_[i]->parameters()) {
      if (p.requires_grad()) return i;
    }
  }
  return n;
}

FusionPlans make_fusion_plans(const std::vector<BasicOpPtr>& ops, const FusionRegistry& fusions,
                              int64_t first_op_requiring_backward) {
  std::vector<FusedOpPtr> groups;
  for (const BasicOpPtr& op : ops) groups.push_back(std::make_shared<SingleOpGroup>(op));
  const FusionContext context{first_op_requiring_backward, &ops};
  std::vector<FusedOpPtr> joint = fusions.apply(FusionPass::kJoint, groups, context);
  FusionPlans plans;
  plans.forward = fusions.apply(FusionPass::kForward, joint, context);
  plans.backward = fusions.apply(FusionPass::kBackward, joint, context);
  plans.forward_entries = map_plan(plans.forward, ops);  // a mismatch is an error before anything runs
  plans.backward_entries = map_plan(plans.backward, ops);
  return plans;
}

void OperationFuser::build_plans(int64_t first_op_requiring_backward) {
  if (plans_built_for_ == first_op_requiring_backward) return;
  if (plans_built_for_ >= 0 && fault_enabled(Fault::kStalePlan)) return;
  FusionPlans plans = make_fusion_plans(ops_, fusions_, first_op_requiring_backward);
  forward_plan_ = std::move(plans.forward);
  backward_plan_ = std::move(plans.backward);
  forward_entries_ = std::move(plans.forward_entries);
  backward_entries_ = std::move(plans.backward_entries);
  plans_built_for_ = first_op_requiring_backward;
}

const std::vector<FusedOpPtr>& OperationFuser::forward_plan(int64_t first_op_requiring_backward) {
  build_plans(first_op_requiring_backward);
  return forward_plan_;
}

const std::vector<FusedOpPtr>& OperationFuser::backward_plan(int64_t first_op_requiring_backward) {
  build_plans(first_op_requiring_backward);
  return backward_plan_;
}

std::vector<at::Tensor> OperationFuser::forward(const at::Tensor& input, const std::vector<at::Tensor>& extra_inputs) {
  if (!input.defined()) throw InvalidArgumentError("OperationFuser: the main input is undefined");
  if (extra_inputs.size() != routing_->public_inputs.size()) {
    std::string slots;
    for (const SlotRef& ref : routing_->public_inputs)
      slots += (slots.empty() ? "" : ", ") + slot_name(ops_, ref, "input");
    throw ExtraInputCountError("OperationFuser expected " + std::to_string(routing_->public_inputs.size()) +
                               " public extra inputs (" + (slots.empty() ? std::string("none") : slots) + "), got " +
                               std::to_string(extra_inputs.size()));
  }
  for (size_t k = 0; k < extra_inputs.size(); ++k) {
    if (!extra_inputs[k].defined()) {
      throw InvalidArgumentError("OperationFuser: public extra input " + std::to_string(k) + " (" +
                                 slot_name(ops_, routing_->public_inputs[k], "input") + ") is undefined");
    }
  }
  const int64_t first = first_op_requiring_backward(input, extra_inputs);
  build_plans(first);

  auto state = c10::make_intrusive<CallState>();
  state->ops = ops_;
  state->routing = routing_;
  state->backward_plan = backward_plan_;
  state->backward_entries = backward_entries_;
  state->ctxs.resize(ops_.size());
  std::vector<at::Tensor> params;
  for (const BasicOpPtr& op : ops_) {
    state->param_offsets.push_back(params.size());
    for (const at::Tensor& p : op->parameters()) params.push_back(p);
  }
  state->num_params = params.size();
  state->trace = std::make_shared<FuserTrace>();
  state->trace->first_op_requiring_backward = first;
  state->trace_groups = group_trace_on;
  last_trace_ = state->trace;
  return FuserFunction::apply(state, &forward_plan_, &forward_entries_, first, input, at::TensorList(params),
                              at::TensorList(extra_inputs));
}

}  // namespace gradfuzz::ops
