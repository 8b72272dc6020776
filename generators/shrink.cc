#include "generators/shrink.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>

#include "generators/validate.h"
#include "harness/builder.h"

namespace gradfuzz::generators {
namespace {

using harness::CaseSpec;
using harness::OpSpec;

/// Fuser index of every module, from Boundary positions alone (works on invalid specs too).
std::vector<int64_t> fuser_ids(const CaseSpec& spec) {
  std::vector<int64_t> ids;
  int64_t fuser = -1;
  bool open = false;
  for (const auto& op : spec.ops) {
    if (op.name == harness::kBoundaryOp) {
      open = false;
      ids.push_back(-1);
      continue;
    }
    if (!open) {
      open = true;
      ++fuser;
    }
    ids.push_back(fuser);
  }
  return ids;
}

/// Unbinds every input slot in fuser `fuser` bound to `channel`.
void unbind_consumers(CaseSpec& spec, const std::vector<int64_t>& fusers, int64_t fuser, const std::string& channel) {
  for (size_t i = 0; i < spec.ops.size(); ++i) {
    if (fusers[i] != fuser) continue;
    for (auto& ch : spec.ops[i].input_channels) {
      if (ch && *ch == channel) ch.reset();
    }
  }
}

CaseSpec remove_module(const CaseSpec& spec, int64_t index) {
  CaseSpec out = spec;
  const auto fusers = fuser_ids(spec);
  for (const auto& b : spec.ops[index].output_bindings) {
    if (b.channel) unbind_consumers(out, fusers, fusers[index], *b.channel);
  }
  out.ops.erase(out.ops.begin() + index);
  std::vector<harness::CallThenBindStep> steps;
  for (auto step : out.call_then_bind) {
    if (step.op == index) continue;
    if (step.op > index) --step.op;
    steps.push_back(step);
  }
  out.call_then_bind = std::move(steps);
  std::vector<harness::LateBindStep> late;
  for (auto step : out.late_binds) {
    if (step.op == index) continue;
    if (step.op > index) --step.op;
    late.push_back(step);
  }
  out.late_binds = std::move(late);
  return out;
}

/// Unbinds every bound input whose channel has no earlier producer in its fuser with a
/// matching slot; nullopt when the shapes themselves no longer propagate.
std::optional<CaseSpec> unbind_broken(const CaseSpec& spec) {
  auto layout = compute_layout(spec);
  if (!layout) return std::nullopt;
  CaseSpec out = spec;
  std::map<std::pair<int64_t, std::string>, SlotAt> producers;
  for (size_t i = 0; i < spec.ops.size(); ++i) {
    const auto& outs = spec.ops[i].output_bindings;
    for (size_t s = 0; s < outs.size() && s < layout->modules[i].signature.extra_outputs.size(); ++s) {
      if (outs[s].channel) {
        producers.emplace(std::make_pair(layout->modules[i].fuser, *outs[s].channel),
                          SlotAt{static_cast<int64_t>(i), static_cast<int64_t>(s)});
      }
    }
  }
  for (size_t i = 0; i < spec.ops.size(); ++i) {
    const auto& mod = layout->modules[i];
    auto& ins = out.ops[i].input_channels;
    for (size_t s = 0; s < ins.size(); ++s) {
      if (!ins[s]) continue;
      auto it = producers.find({mod.fuser, *ins[s]});
      bool ok =
          it != producers.end() && it->second.op < static_cast<int64_t>(i) && s < mod.signature.extra_inputs.size();
      if (ok) {
        const auto& prod = layout->modules[it->second.op];
        const auto& o = prod.signature.extra_outputs[it->second.slot];
        ok = o == mod.signature.extra_inputs[s] &&
             (o.kind != ops::TensorKind::kSplitSizes || prod.input_shape[0] == mod.input_shape[0]);
      }
      if (!ok) ins[s].reset();
    }
  }
  return out;
}

void halve_attr(std::vector<CaseSpec>& out, const CaseSpec& spec, size_t op, const char* key) {
  auto it = spec.ops[op].attrs.find(key);
  if (it == spec.ops[op].attrs.end() || it->second < 2) return;
  CaseSpec c = spec;
  c.ops[op].attrs[key] = static_cast<double>(static_cast<int64_t>(it->second) / 2);
  out.push_back(std::move(c));
}

}  // namespace

namespace {

/// Validity for shrinking: fusion names are the backend's business (a te case names TE's
/// fusions, which the model's catalog does not know) and shrinking only ever drops them.
/// Under an FP8 recipe: every GEMM (Linear, GroupedLinear) sees rows and features that are
/// multiples of 16 and makes such outputs, as the generator draws them (TE's FP8 GEMMs refuse
/// others: a shrunk case below that would fail for that reason instead of its own).
bool fp8_gemms_aligned(const CaseSpec& spec) {
  if (!spec.recipe) return true;
  try {
    const harness::CasePlan plan = harness::plan_case(spec);
    for (size_t i = 0; i < spec.ops.size() && i < plan.ops.size(); ++i) {
      const auto& name = spec.ops[i].name;
      if (name != "Linear" && name != "GroupedLinear") continue;
      const auto& in = plan.ops[i].input_shape;
      const auto& out = plan.ops[i].signature.output_shape;
      if (in.empty() || out.empty() || in.front() % 16 != 0 || in.back() % 16 != 0 || out.back() % 16 != 0) {
        return false;
      }
    }
  } catch (const std::exception&) {
    return false;
  }
  return true;
}

bool valid_for_shrinking(const CaseSpec& spec) {
  if (!fp8_gemms_aligned(spec)) return false;
  if (spec.fusions.empty()) return is_valid_case(spec);
  CaseSpec copy = spec;
  copy.fusions.clear();
  return is_valid_case(copy);
}

}  // namespace

std::optional<CaseSpec> without_op(const CaseSpec& spec, int64_t index) {
  if (index < 0 || index >= static_cast<int64_t>(spec.ops.size())) return std::nullopt;
  std::optional<CaseSpec> out = remove_module(spec, index);
  if (!valid_for_shrinking(*out)) out = unbind_broken(*out);
  if (!out || out->ops.empty() || !valid_for_shrinking(*out)) return std::nullopt;
  canonicalize(*out);
  return out;
}

std::vector<CaseSpec> shrink_candidates(const CaseSpec& spec) {
  std::vector<CaseSpec> raw;
  const bool spec_valid = valid_for_shrinking(spec);
  // Shape-changing edits also get a variant with the bindings they broke unbound.
  auto add_with_repair = [&](CaseSpec c) {
    if (spec_valid && !valid_for_shrinking(c)) {
      auto repaired = unbind_broken(c);
      raw.push_back(std::move(c));
      if (repaired) raw.push_back(std::move(*repaired));
      return;
    }
    raw.push_back(std::move(c));
  };

  if (!spec.usage_elements().empty()) {
    // First, the whole usage script at once: a finding that stays without it is not the
    // script's, and its case exports (exported tests do not write the steps).
    CaseSpec c = spec;
    c.clear_usage();
    raw.push_back(std::move(c));
  }
  if (spec.world_size > 1) {
    // A finding that stays on one rank is not the ranks' (the same chain, every split off).
    CaseSpec c = spec;
    c.world_size = 1;
    c.input_layout = "replicated";
    raw.push_back(std::move(c));
  }
  for (size_t i = 0; i < spec.ops.size(); ++i) add_with_repair(remove_module(spec, static_cast<int64_t>(i)));
  if (spec.world_size > 1) {
    // Layouts come in pairs (a column Linear and its row Linear, a Linear making summands
    // and the collective summing them): removing one alone leaves layouts that do not
    // compose, so distributed cases also try removing two modules at once.
    for (size_t i = 0; i < spec.ops.size(); ++i) {
      for (size_t j = i + 1; j < spec.ops.size(); ++j) {
        add_with_repair(remove_module(remove_module(spec, static_cast<int64_t>(j)), static_cast<int64_t>(i)));
      }
    }
  }
  for (size_t k = 0; k < spec.fusions.size(); ++k) {
    CaseSpec c = spec;
    c.fusions.erase(c.fusions.begin() + static_cast<long>(k));
    raw.push_back(std::move(c));
  }
  for (size_t k = 0; k < spec.call_then_bind.size(); ++k) {
    CaseSpec c = spec;
    c.call_then_bind.erase(c.call_then_bind.begin() + static_cast<long>(k));
    raw.push_back(std::move(c));
  }
  for (size_t k = 0; k < spec.repeat_calls.size(); ++k) {
    CaseSpec c = spec;
    c.repeat_calls.erase(c.repeat_calls.begin() + static_cast<long>(k));
    raw.push_back(std::move(c));
  }
  // Each step of the usage script shrinks away where the finding stays without it.
  for (size_t k = 0; k < spec.repeat_calls.size(); ++k) {
    for (bool harness::RepeatCall::*flag :
         {&harness::RepeatCall::update, &harness::RepeatCall::inference_mode, &harness::RepeatCall::checkpoint,
          &harness::RepeatCall::recompute, &harness::RepeatCall::second_sequential, &harness::RepeatCall::recipe_off}) {
      if (!(spec.repeat_calls[k].*flag)) continue;
      CaseSpec c = spec;
      c.repeat_calls[k].*flag = false;
      raw.push_back(std::move(c));
    }
    if (spec.repeat_calls[k].amax_history_len > 0) {
      CaseSpec c = spec;
      c.repeat_calls[k].amax_history_len = 0;
      raw.push_back(std::move(c));
    }
  }
  // held_quantized_tensor before quantized_params (which it needs).
  for (bool CaseSpec::*flag : {&CaseSpec::read_after_backward, &CaseSpec::deferred_init, &CaseSpec::several_sequentials,
                               &CaseSpec::held_quantized_tensor}) {
    if (!(spec.*flag)) continue;
    CaseSpec c = spec;
    c.*flag = false;
    raw.push_back(std::move(c));
  }
  if (spec.quantized_params) {
    CaseSpec c = spec;
    c.quantized_params = c.held_quantized_tensor = false;
    raw.push_back(std::move(c));
  }
  if (spec.recipe) {
    // A finding that stays without the recipe is not the recipe's.
    CaseSpec c = spec;
    c.recipe.reset();
    raw.push_back(std::move(c));
  }
  for (size_t i = 0; i < spec.ops.size(); ++i) {
    for (size_t s = 0; s < spec.ops[i].input_channels.size(); ++s) {
      if (!spec.ops[i].input_channels[s]) continue;
      CaseSpec c = spec;
      c.ops[i].input_channels[s].reset();
      raw.push_back(std::move(c));
    }
  }
  const auto fusers = fuser_ids(spec);
  for (size_t i = 0; i < spec.ops.size(); ++i) {
    for (size_t s = 0; s < spec.ops[i].output_bindings.size(); ++s) {
      const auto& b = spec.ops[i].output_bindings[s];
      if (!b.channel) continue;
      CaseSpec c = spec;
      unbind_consumers(c, fusers, fusers[i], *b.channel);
      c.ops[i].output_bindings[s] = harness::OutputBindingSpec{};
      raw.push_back(std::move(c));
    }
  }
  if (spec.input_shape.size() == 2) {
    for (size_t d = 0; d < 2; ++d) {
      if (spec.input_shape[d] < 2) continue;
      CaseSpec c = spec;
      c.input_shape[d] /= 2;
      add_with_repair(std::move(c));
    }
  }
  bool any_groups = false;
  CaseSpec all_groups = spec;
  for (size_t i = 0; i < spec.ops.size(); ++i) {
    auto it = all_groups.ops[i].attrs.find("groups");
    if (it != all_groups.ops[i].attrs.end() && it->second >= 2) {
      it->second = static_cast<double>(static_cast<int64_t>(it->second) / 2);
      any_groups = true;
    }
  }
  if (any_groups) raw.push_back(std::move(all_groups));
  for (size_t i = 0; i < spec.ops.size(); ++i) {
    const auto& name = spec.ops[i].name;
    if (name == "Linear" || name == "GroupedLinear") {
      std::vector<CaseSpec> halved;
      halve_attr(halved, spec, i, "out");
      for (auto& c : halved) add_with_repair(std::move(c));
    }
    if (name == "GroupedLinear" || name == "Dispatch") halve_attr(raw, spec, i, "groups");
  }
  for (size_t i = 0; i < spec.ops.size(); ++i) {
    if (spec.ops[i].output_style == ops::OutputStyle::kVector) continue;
    CaseSpec c = spec;
    c.ops[i].output_style = ops::OutputStyle::kVector;
    raw.push_back(std::move(c));
  }
  if (!spec.input_requires_grad) {
    CaseSpec c = spec;
    c.input_requires_grad = true;
    raw.push_back(std::move(c));
  }
  for (size_t i = 0; i < spec.ops.size(); ++i) {
    if (!spec.ops[i].param_requires_grad.empty()) {
      CaseSpec c = spec;
      c.ops[i].param_requires_grad.clear();
      raw.push_back(std::move(c));
    }
    if (!spec.ops[i].extra_input_requires_grad.empty()) {
      CaseSpec c = spec;
      c.ops[i].extra_input_requires_grad.clear();
      raw.push_back(std::move(c));
    }
  }

  CaseSpec canonical = spec;
  canonicalize(canonical);
  std::vector<CaseSpec> out;
  for (auto& c : raw) {
    canonicalize(c);
    if (c == canonical) continue;
    if (std::find(out.begin(), out.end(), c) != out.end()) continue;
    out.push_back(std::move(c));
  }
  return out;
}

ShrinkResult shrink(const CaseSpec& failing, const std::function<bool(const CaseSpec&)>& still_fails,
                    const ShrinkOptions& options) {
  ShrinkResult result;
  result.minimal = failing;
  const bool require_valid = options.require_valid && valid_for_shrinking(failing);
  size_t resume = 0;
  while (true) {
    const auto candidates = shrink_candidates(result.minimal);
    const size_t n = candidates.size();
    bool accepted = false;
    for (size_t k = 0; k < n; ++k) {
      const size_t idx = (resume + k) % n;
      const CaseSpec& candidate = candidates[idx];
      if (require_valid && !valid_for_shrinking(candidate)) continue;
      if (result.predicate_calls >= options.max_predicate_calls) return result;
      ++result.predicate_calls;
      if (still_fails(candidate)) {
        result.minimal = candidate;
        ++result.steps;
        resume = idx;
        accepted = true;
        break;
      }
    }
    if (!accepted) {
      result.locally_minimal = true;
      return result;
    }
  }
}

}  // namespace gradfuzz::generators
