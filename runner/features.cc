#include "runner/features.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>

namespace gradfuzz::runner {

using harness::CasePlan;
using harness::CaseResult;
using harness::CaseSpec;
using harness::OpPlan;
using harness::OpSpec;
using harness::PathRun;
using harness::RepeatCall;

std::vector<std::string> static_features(const CaseSpec& spec, const CasePlan& plan) {
  bool bound_input = false;
  bool public_input = false;
  bool mixed = false;
  bool hidden = false;
  bool public_bound = false;
  bool fresh = false;
  bool generator = false;
  bool boundary = false;
  bool scale_bias = false;
  bool no_grad_input = !spec.input_requires_grad;
  std::map<std::pair<int64_t, std::string>, int64_t> consumers;  // (fuser, channel) -> count
  std::map<std::pair<int64_t, std::string>, std::pair<std::string, int64_t>> producers;
  std::map<int64_t, bool> fuser_seen_bound;
  for (size_t i = 0; i < spec.ops.size(); ++i) {
    const OpSpec& op = spec.ops[i];
    const OpPlan& op_plan = plan.ops[i];
    if (op_plan.boundary) {
      boundary = true;
      continue;
    }
    const size_t n_in = op_plan.signature.extra_inputs.size();
    bool op_bound = false;
    bool op_public = false;
    for (size_t s = 0; s < n_in; ++s) {
      const bool bound = s < op.input_channels.size() && op.input_channels[s].has_value();
      if (bound) {
        op_bound = true;
        ++consumers[{op_plan.fuser, *op.input_channels[s]}];
        fuser_seen_bound[op_plan.fuser] = true;
      } else {
        op_public = true;
        // A public slot after a bound one in (op, slot) order: bound-first matching differs.
        if (fuser_seen_bound[op_plan.fuser]) mixed = true;
        const bool floating = op_plan.signature.extra_inputs[s].kind == ops::TensorKind::kFloat;
        if (floating && s < op.extra_input_requires_grad.size() && !op.extra_input_requires_grad[s]) {
          no_grad_input = true;
        }
      }
    }
    bound_input = bound_input || op_bound;
    public_input = public_input || op_public;
    if (op_bound && op_public) mixed = true;
    for (size_t s = 0; s < op.output_bindings.size() && s < op_plan.signature.extra_outputs.size(); ++s) {
      const auto& binding = op.output_bindings[s];
      if (!binding.channel) continue;
      (binding.output_to_caller ? public_bound : hidden) = true;
      producers[{op_plan.fuser, *binding.channel}] = {op.name, static_cast<int64_t>(s)};
    }
    if (op.output_style == ops::OutputStyle::kGenerator && (n_in > 0 || !op_plan.signature.extra_outputs.empty())) {
      generator = true;
    }
    if (op.name == "GroupedLinear") {
      auto it = op.attrs.find("scale_bias");
      if (it != op.attrs.end() && it->second != 0) scale_bias = true;
    }
  }
  bool fanout = false;
  for (const auto& [key, count] : consumers) {
    if (count >= 2) fanout = true;
    auto it = producers.find(key);
    if (it == producers.end()) continue;
    const auto& [type, slot] = it->second;
    // Fresh-tensor producers: Dispatch's token probs (slot 1) and RowStat's statistic.
    if ((type == "Dispatch" && slot == 1) || type == "RowStat") fresh = true;
  }
  std::vector<std::string> features;
  auto add = [&](bool on, const char* name) {
    if (on) features.emplace_back(name);
  };
  add(bound_input, "bound_input");
  add(public_input, "public_input");
  add(mixed, "mixed_slot_order");
  add(hidden, "hidden_output");
  add(public_bound, "public_bound_output");
  add(fanout, "fanout");
  add(fresh, "fresh_producer");
  add(generator, "generator_outputs");
  add(!spec.call_then_bind.empty(), "call_then_bind");
  add(boundary, "fuser_boundary");
  add(scale_bias, "scale_bias");
  add(no_grad_input, "no_grad_input");
  add(!spec.repeat_calls.empty(), "repeat_calls");
  add(std::any_of(spec.repeat_calls.begin(), spec.repeat_calls.end(), [](const RepeatCall& c) { return c.no_grad; }),
      "no_grad_call");
  return features;
}

void add_plan_coverage(const CaseSpec& spec, const PathRun& fused, CaseResult& result) {
  std::set<std::string> fired;
  std::set<std::string> forward;
  std::set<std::string> backward;
  // Channel -> producer spec index and consumer spec indices (channels are per fuser, and a
  // fused group never spans fusers, so a name seen inside one group is unambiguous there).
  std::multimap<std::string, int64_t> producers;
  std::multimap<std::string, int64_t> consumers;
  for (size_t i = 0; i < spec.ops.size(); ++i) {
    for (const auto& b : spec.ops[i].output_bindings) {
      if (b.channel) producers.emplace(*b.channel, static_cast<int64_t>(i));
    }
    for (const auto& c : spec.ops[i].input_channels) {
      if (c) consumers.emplace(*c, static_cast<int64_t>(i));
    }
  }
  bool same_fusion = false;
  for (const auto& fuser : fused.plans) {
    for (const auto* pass : {&fuser.forward, &fuser.backward}) {
      for (const auto& group : *pass) {
        if (!group.fused) continue;
        if (fired.insert(group.name).second) result.fusions_fired.push_back(group.name);
        auto& per_pass = pass == &fuser.forward ? forward : backward;
        if (per_pass.insert(group.name).second) {
          (pass == &fuser.forward ? result.fused_forward : result.fused_backward).push_back(group.name);
        }
        for (const auto& [channel, consumer] : consumers) {
          if (consumer < group.begin || consumer >= group.end) continue;
          auto [lo, hi] = producers.equal_range(channel);
          for (auto it = lo; it != hi; ++it) {
            if (it->second >= group.begin && it->second < consumer) same_fusion = true;
          }
        }
      }
    }
  }
  if (same_fusion) result.features.emplace_back("same_fusion_channel");
}

void add_compared_fusions(CaseResult& result) {
  std::set<std::string> seen;
  for (const auto* list : {&result.fused_forward, &result.fused_backward}) {
    for (const auto& name : *list) {
      if (seen.insert(name).second) result.fused_compared.push_back(name);
    }
  }
}

}  // namespace gradfuzz::runner
