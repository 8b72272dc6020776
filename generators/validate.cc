#include "generators/validate.h"

#include <algorithm>
#include <map>
#include <set>
#include <sstream>

#include "harness/builder.h"
#include "harness/sharding.h"
#include "ops/errors.h"

namespace gradfuzz::generators {
namespace {

using harness::CaseSpec;
using harness::OpSpec;

std::string shape_str(const std::vector<int64_t>& shape) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? "," : "") << shape[i];
  os << "]";
  return os.str();
}

std::string slot_str(const ops::SlotSpec& s) { return std::string(ops::tensor_kind_name(s.kind)) + shape_str(s.shape); }

std::string op_path(int64_t i) { return "/ops/" + std::to_string(i); }

bool is_boundary(const OpSpec& op) { return op.name == harness::kBoundaryOp; }

}  // namespace

int64_t param_count(const OpSpec& op) {
  if (op.name == "Linear" || op.name == "Bias" || op.name == "RMSNorm") return 1;
  if (op.name == "LayerNorm") return 2;
  if (op.name == "GroupedLinear") return attr_or_default(op, "bias") != 0 ? 2 : 1;
  return 0;
}

double attr_or_default(const OpSpec& op, const std::string& key) {
  auto it = op.attrs.find(key);
  if (it != op.attrs.end()) return it->second;
  const auto& defaults = ops::OpRegistry::catalog().info(op.name).defaults;
  auto d = defaults.find(key);
  if (d == defaults.end()) {
    throw ops::UnknownNameError(op.name + ": no attr '" + key + "'");
  }
  return d->second;
}

std::optional<CaseLayout> compute_layout(const CaseSpec& spec, std::vector<ValidationProblem>* problems) {
  auto report = [&](std::string kind, std::string path, std::string message) {
    if (problems) problems->push_back({std::move(kind), std::move(path), std::move(message)});
  };
  if (spec.input_shape.size() != 2 || spec.input_shape[0] < 1 || spec.input_shape[1] < 1) {
    report(kSpecProblem, "/input_shape",
           "expected [rows, features] with both >= 1, got " + shape_str(spec.input_shape));
    return std::nullopt;
  }
  CaseLayout layout;
  std::vector<int64_t> shape = spec.input_shape;
  bool in_fuser = false;
  for (size_t i = 0; i < spec.ops.size(); ++i) {
    const OpSpec& op = spec.ops[i];
    ModuleLayout m;
    m.input_shape = shape;
    if (is_boundary(op)) {
      m.boundary = true;
      in_fuser = false;
      if (!op.attrs.empty() || !op.input_channels.empty() || !op.output_bindings.empty()) {
        report(kSpecProblem, op_path(static_cast<int64_t>(i)), "Boundary takes no attrs or bindings");
        return std::nullopt;
      }
      layout.modules.push_back(std::move(m));
      continue;
    }
    if (!in_fuser) {
      in_fuser = true;
      ++layout.num_fusers;
    }
    m.fuser = layout.num_fusers - 1;
    try {
      m.signature = ops::OpRegistry::catalog().signature(op.name, op.attrs, shape);
    } catch (const Error& e) {
      report(e.kind(), op_path(static_cast<int64_t>(i)), op.name + " on input " + shape_str(shape) + ": " + e.what());
      return std::nullopt;
    } catch (const std::exception& e) {
      report(kSpecProblem, op_path(static_cast<int64_t>(i)),
             op.name + " on input " + shape_str(shape) + ": " + e.what());
      return std::nullopt;
    }
    shape = m.signature.output_shape;
    layout.modules.push_back(std::move(m));
  }
  return layout;
}

std::vector<ChannelInfo> case_channels(const CaseSpec& spec, const CaseLayout& layout) {
  std::vector<ChannelInfo> channels;
  std::map<std::pair<int64_t, std::string>, size_t> by_name;
  for (size_t i = 0; i < spec.ops.size() && i < layout.modules.size(); ++i) {
    const auto& op = spec.ops[i];
    for (size_t s = 0; s < op.output_bindings.size(); ++s) {
      const auto& b = op.output_bindings[s];
      if (!b.channel) continue;
      auto key = std::make_pair(layout.modules[i].fuser, *b.channel);
      if (by_name.count(key)) continue;  // duplicate producer: the first one wins here
      by_name[key] = channels.size();
      channels.push_back({*b.channel, layout.modules[i].fuser, {static_cast<int64_t>(i), static_cast<int64_t>(s)}, {}});
    }
  }
  for (size_t i = 0; i < spec.ops.size() && i < layout.modules.size(); ++i) {
    const auto& op = spec.ops[i];
    for (size_t s = 0; s < op.input_channels.size(); ++s) {
      if (!op.input_channels[s]) continue;
      auto it = by_name.find({layout.modules[i].fuser, *op.input_channels[s]});
      if (it == by_name.end()) continue;
      channels[it->second].consumers.push_back({static_cast<int64_t>(i), static_cast<int64_t>(s)});
    }
  }
  return channels;
}

int64_t count_public_inputs(const CaseSpec& spec, const CaseLayout& layout) {
  int64_t count = 0;
  for (size_t i = 0; i < spec.ops.size() && i < layout.modules.size(); ++i) {
    const auto& sig = layout.modules[i].signature;
    for (size_t s = 0; s < sig.extra_inputs.size(); ++s) {
      const auto& ch = spec.ops[i].input_channels;
      if (s >= ch.size() || !ch[s]) ++count;
    }
  }
  return count;
}

std::vector<ValidationProblem> validate_case(const CaseSpec& spec, const std::vector<std::string>* known_fusions) {
  std::vector<ValidationProblem> problems;
  auto report = [&](std::string kind, std::string path, std::string message) {
    problems.push_back({std::move(kind), std::move(path), std::move(message)});
  };
  static const std::set<std::string> kDtypes{"float64", "float32", "bfloat16", "float16"};
  if (!kDtypes.count(spec.dtype)) report(kSpecProblem, "/dtype", "unknown dtype '" + spec.dtype + "'");
  if (spec.device != "cpu" && spec.device != "cuda") {
    report(kSpecProblem, "/device", "expected cpu or cuda, got '" + spec.device + "'");
  }
  auto layout_opt = compute_layout(spec, &problems);
  if (!layout_opt) return problems;
  const CaseLayout& layout = *layout_opt;

  // Per-op slot lists and flags.
  for (size_t i = 0; i < spec.ops.size(); ++i) {
    const OpSpec& op = spec.ops[i];
    if (layout.modules[i].boundary) continue;
    const auto& sig = layout.modules[i].signature;
    const std::string path = op_path(static_cast<int64_t>(i));
    if (op.input_channels.size() > sig.extra_inputs.size()) {
      report(ops::SlotOutOfRangeError::kKind, path + "/input_channels",
             op.name + ": expected at most " + std::to_string(sig.extra_inputs.size()) + " extra input bindings, got " +
                 std::to_string(op.input_channels.size()));
    }
    if (op.output_bindings.size() > sig.extra_outputs.size()) {
      report(ops::SlotOutOfRangeError::kKind, path + "/output_bindings",
             op.name + ": expected at most " + std::to_string(sig.extra_outputs.size()) +
                 " extra output bindings, got " + std::to_string(op.output_bindings.size()));
    }
    for (size_t s = 0; s < op.input_channels.size(); ++s) {
      if (op.input_channels[s] && op.input_channels[s]->empty()) {
        report(ops::InvalidChannelNameError::kKind, path + "/input_channels/" + std::to_string(s),
               op.name + " input slot " + std::to_string(s) + ": empty channel name");
      }
    }
    for (size_t s = 0; s < op.output_bindings.size(); ++s) {
      const auto& b = op.output_bindings[s];
      if (b.channel && b.channel->empty()) {
        report(ops::InvalidChannelNameError::kKind, path + "/output_bindings/" + std::to_string(s),
               op.name + " output slot " + std::to_string(s) + ": empty channel name");
      }
      if (!b.channel && !b.output_to_caller) {
        report(kSpecProblem, path + "/output_bindings/" + std::to_string(s),
               op.name + " output slot " + std::to_string(s) + ": an unbound output is always returned to the caller");
      }
    }
    if (static_cast<int64_t>(op.param_requires_grad.size()) > param_count(op)) {
      report(kSpecProblem, path + "/param_requires_grad",
             op.name + ": expected at most " + std::to_string(param_count(op)) + " flags, got " +
                 std::to_string(op.param_requires_grad.size()));
    }
    if (op.extra_input_requires_grad.size() > sig.extra_inputs.size()) {
      report(kSpecProblem, path + "/extra_input_requires_grad",
             op.name + ": expected at most " + std::to_string(sig.extra_inputs.size()) + " flags, got " +
                 std::to_string(op.extra_input_requires_grad.size()));
    }
  }
  if (!problems.empty()) return problems;

  // Routing, fuser by fuser, in the runtime's order: producers, then bound inputs.
  for (int64_t f = 0; f < layout.num_fusers; ++f) {
    std::map<std::string, SlotAt> producers;
    for (size_t i = 0; i < spec.ops.size(); ++i) {
      if (layout.modules[i].fuser != f) continue;
      const auto& outs = spec.ops[i].output_bindings;
      for (size_t s = 0; s < outs.size(); ++s) {
        if (!outs[s].channel) continue;
        SlotAt here{static_cast<int64_t>(i), static_cast<int64_t>(s)};
        auto [it, inserted] = producers.emplace(*outs[s].channel, here);
        if (!inserted) {
          report(ops::DuplicateProducerError::kKind, op_path(here.op) + "/output_bindings/" + std::to_string(s),
                 "channel '" + *outs[s].channel + "' produced by " + spec.ops[it->second.op].name + " (op " +
                     std::to_string(it->second.op) + " slot " + std::to_string(it->second.slot) + ") and " +
                     spec.ops[i].name + " (op " + std::to_string(i) + " slot " + std::to_string(s) + ")");
        }
      }
    }
    if (!problems.empty()) return problems;
    for (size_t i = 0; i < spec.ops.size(); ++i) {
      if (layout.modules[i].fuser != f) continue;
      const auto& ins = spec.ops[i].input_channels;
      for (size_t s = 0; s < ins.size(); ++s) {
        if (!ins[s]) continue;
        const std::string path = op_path(static_cast<int64_t>(i)) + "/input_channels/" + std::to_string(s);
        auto it = producers.find(*ins[s]);
        if (it == producers.end()) {
          report(ops::MissingProducerError::kKind, path,
                 spec.ops[i].name + " input slot " + std::to_string(s) + ": channel '" + *ins[s] +
                     "' has no producer in fuser " + std::to_string(f));
          continue;
        }
        if (it->second.op >= static_cast<int64_t>(i)) {
          report(ops::ProducerNotEarlierError::kKind, path,
                 spec.ops[i].name + " input slot " + std::to_string(s) + ": channel '" + *ins[s] +
                     "' is produced by op " + std::to_string(it->second.op) + ", expected an op before " +
                     std::to_string(i));
        }
      }
    }
    if (!problems.empty()) return problems;
  }

  // Slot compatibility: same kind and shape; split sizes also need the same row count.
  for (const auto& ch : case_channels(spec, layout)) {
    const auto& prod = layout.modules[ch.producer.op];
    const auto& out_spec = prod.signature.extra_outputs[ch.producer.slot];
    for (const auto& c : ch.consumers) {
      const auto& cons = layout.modules[c.op];
      const auto& in_spec = cons.signature.extra_inputs[c.slot];
      const std::string path = op_path(c.op) + "/input_channels/" + std::to_string(c.slot);
      if (!(in_spec == out_spec)) {
        report(ops::InvalidArgumentError::kKind, path,
               spec.ops[c.op].name + " input slot " + std::to_string(c.slot) + " expects " + slot_str(in_spec) +
                   ", channel '" + ch.name + "' carries " + slot_str(out_spec));
      } else if (in_spec.kind == ops::TensorKind::kSplitSizes && prod.input_shape[0] != cons.input_shape[0]) {
        report(ops::InvalidArgumentError::kKind, path,
               spec.ops[c.op].name + " input slot " + std::to_string(c.slot) + ": split sizes of channel '" + ch.name +
                   "' sum to " + std::to_string(prod.input_shape[0]) + " rows, expected " +
                   std::to_string(cons.input_shape[0]));
      }
    }
  }

  // Call-then-bind steps and fusions.
  for (size_t k = 0; k < spec.call_then_bind.size(); ++k) {
    const int64_t op = spec.call_then_bind[k].op;
    if (op < 0 || op >= static_cast<int64_t>(spec.ops.size()) || layout.modules[op].boundary) {
      report(kSpecProblem, "/call_then_bind/" + std::to_string(k),
             "expected the index of a catalog op, got " + std::to_string(op));
    }
  }
  const auto known = known_fusions ? *known_fusions : ops::FusionRegistry::catalog().names();
  std::set<std::string> seen;
  for (size_t k = 0; k < spec.fusions.size(); ++k) {
    const auto& name = spec.fusions[k];
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      report(ops::UnknownNameError::kKind, "/fusions/" + std::to_string(k), "unknown fusion '" + name + "'");
    } else if (!seen.insert(name).second) {
      report(kSpecProblem, "/fusions/" + std::to_string(k), "fusion '" + name + "' listed twice");
    }
  }
  if (!problems.empty()) return problems;

  // Distributed cases: layouts that compose (harness/sharding.h), then the splits te.ops
  // refuses (at construction, or in the forward before any communication).
  if (harness::is_distributed(spec)) {
    try {
      const harness::CasePlan plan = harness::plan_case(spec);
      harness::plan_sharding(spec, plan);
      if (const auto refused = harness::parallel_config_error(spec, plan)) {
        report(ops::InvalidArgumentError::kKind, op_path(refused->op), refused->message);
        return problems;
      }
    } catch (const harness::SpecError& e) {
      report(kSpecProblem, e.json_path(), e.what());
      return problems;
    } catch (const std::exception& e) {
      report(kSpecProblem, "/ops", e.what());
      return problems;
    }
  }

  // Invalid-configuration knobs, in the order the harness applies them: late binds after
  // construction, then the forward call (extra-input count, split sizes).
  for (size_t k = 0; k < spec.late_binds.size(); ++k) {
    const auto& lb = spec.late_binds[k];
    const std::string path = "/late_binds/" + std::to_string(k);
    if (lb.op < 0 || lb.op >= static_cast<int64_t>(spec.ops.size()) || layout.modules[lb.op].boundary) {
      report(kSpecProblem, path, "expected the index of a catalog op, got " + std::to_string(lb.op));
    } else if (lb.slot < 0 || lb.slot >= static_cast<int64_t>(layout.modules[lb.op].signature.extra_inputs.size())) {
      report(ops::SlotOutOfRangeError::kKind, path,
             spec.ops[lb.op].name + ": input slot " + std::to_string(lb.slot) + " outside [0, " +
                 std::to_string(layout.modules[lb.op].signature.extra_inputs.size()) + ")");
    } else if (lb.channel.empty()) {
      report(ops::InvalidChannelNameError::kKind, path, spec.ops[lb.op].name + ": empty channel name");
    } else {
      report(ops::LockedError::kKind, path,
             spec.ops[lb.op].name + " input slot " + std::to_string(lb.slot) + ": bound after construction");
    }
    return problems;
  }
  if (spec.extra_input_count_delta != 0) {
    const int64_t expected = count_public_inputs(spec, layout);
    if (expected + spec.extra_input_count_delta < 0) {
      report(kSpecProblem, "/extra_input_count_delta",
             "cannot pass " + std::to_string(expected + spec.extra_input_count_delta) + " extra inputs");
    } else {
      report(ops::ExtraInputCountError::kKind, "/extra_input_count_delta",
             "expected " + std::to_string(expected) + " public extra inputs, passing " +
                 std::to_string(expected + spec.extra_input_count_delta));
    }
    return problems;
  }
  if (spec.corrupt_split_sizes) {
    bool has_public_split = false;
    for (size_t i = 0; i < spec.ops.size(); ++i) {
      const auto& sig = layout.modules[i].signature;
      for (size_t s = 0; s < sig.extra_inputs.size(); ++s) {
        const auto& ch = spec.ops[i].input_channels;
        if (sig.extra_inputs[s].kind == ops::TensorKind::kSplitSizes && (s >= ch.size() || !ch[s])) {
          has_public_split = true;
        }
      }
    }
    if (has_public_split) {
      report(ops::InvalidArgumentError::kKind, "/corrupt_split_sizes", "public split sizes do not sum to the rows");
    } else {
      report(kSpecProblem, "/corrupt_split_sizes", "no public split-sizes slot to corrupt");
    }
  }
  return problems;
}

bool is_valid_case(const CaseSpec& spec, const std::vector<std::string>* known_fusions) {
  return validate_case(spec, known_fusions).empty();
}

void canonicalize(CaseSpec& spec) {
  for (auto& op : spec.ops) {
    while (!op.input_channels.empty() && !op.input_channels.back()) op.input_channels.pop_back();
    while (!op.output_bindings.empty() && !op.output_bindings.back().channel &&
           op.output_bindings.back().output_to_caller) {
      op.output_bindings.pop_back();
    }
    while (!op.param_requires_grad.empty() && op.param_requires_grad.back()) op.param_requires_grad.pop_back();
    while (!op.extra_input_requires_grad.empty() && op.extra_input_requires_grad.back()) {
      op.extra_input_requires_grad.pop_back();
    }
  }
  // A usage element whose need an edit removed (the Boundary, the recipe, the Linear) goes
  // with it.
  spec.drop_unmet_usage();
}

}  // namespace gradfuzz::generators
