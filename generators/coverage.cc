#include "generators/coverage.h"

#include <algorithm>
#include <set>

#include "generators/validate.h"

namespace gradfuzz::generators {
namespace {

using harness::CaseSpec;
using harness::OpSpec;

bool is_act(const std::string& n) { return n == "ReLU" || n == "GELU"; }
bool is_scaled_act(const std::string& n) { return n == "ScaledSwiGLU" || n == "ScaledSReLU"; }

std::optional<std::string> out_channel(const OpSpec& op, size_t slot) {
  if (slot < op.output_bindings.size()) return op.output_bindings[slot].channel;
  return std::nullopt;
}
std::optional<std::string> in_channel(const OpSpec& op, size_t slot) {
  if (slot < op.input_channels.size()) return op.input_channels[slot];
  return std::nullopt;
}

/// Length of the pattern of `fusion` starting at module i (all modules inside one fuser:
/// `names` holds "" for Boundary so a window never spans one), or 0 when it does not occur.
int64_t match_length(const std::string& fusion, const CaseSpec& spec, size_t i) {
  const auto& ops = spec.ops;
  auto name = [&](size_t k) -> std::string {
    if (k >= ops.size() || ops[k].name == harness::kBoundaryOp) return "";
    return ops[k].name;
  };
  if (fusion == "ForwardLinearBiasActivation") {
    if (name(i) != "Linear" || name(i + 1) != "Bias") return 0;
    return is_act(name(i + 2)) ? 3 : 2;
  }
  if (fusion == "ForwardLinearBiasAdd") {
    if (name(i) != "Linear") return 0;
    if (name(i + 1) == "AddExtraInput") return 2;
    return name(i + 1) == "Bias" && name(i + 2) == "AddExtraInput" ? 3 : 0;
  }
  if (fusion == "ForwardLinearScaleAdd") {
    return name(i) == "Linear" && name(i + 1) == "ConstantScale" && name(i + 2) == "AddExtraInput" ? 3 : 0;
  }
  if (fusion == "BackwardLinearAdd") return name(i) == "MakeExtraOutput" && name(i + 1) == "Linear" ? 2 : 0;
  if (fusion == "BackwardLinearScale") return name(i) == "Linear" && name(i + 1) == "ConstantScale" ? 2 : 0;
  if (fusion == "BackwardActivationBias") return name(i) == "Bias" && is_act(name(i + 1)) ? 2 : 0;
  if (fusion == "BackwardAddRMSNorm") return name(i) == "MakeExtraOutput" && name(i + 1) == "RMSNorm" ? 2 : 0;
  if (fusion == "GroupedMLP") {
    return name(i) == "GroupedLinear" && is_scaled_act(name(i + 1)) && name(i + 2) == "GroupedLinear" ? 3 : 0;
  }
  if (fusion.rfind("FusedResidual", 0) == 0) {
    if (name(i) != "MakeExtraOutput" || name(i + 1).empty() || name(i + 2) != "AddExtraInput") return 0;
    auto c = out_channel(ops[i], 0);
    return c && in_channel(ops[i + 2], 0) == c ? 3 : 0;
  }
  return 0;
}

const std::vector<std::string>& pattern_fusions() {
  static const std::vector<std::string> kNames{
      "ForwardLinearBiasActivation", "ForwardLinearBiasAdd",   "ForwardLinearScaleAdd", "BackwardLinearAdd",
      "BackwardLinearScale",         "BackwardActivationBias", "BackwardAddRMSNorm",    "GroupedMLP",
      "FusedResidual.forward",       "FusedResidual.backward", "FusedResidual.joint"};
  return kNames;
}

}  // namespace

const std::vector<std::string>& coverage_feature_names() {
  static const std::vector<std::string> kNames{
      "bound_input",    "public_input",      "mixed_slot_order", "hidden_output",  "public_bound_output", "fanout",
      "fresh_producer", "generator_outputs", "call_then_bind",   "fuser_boundary", "same_fusion_channel", "scale_bias",
      "no_grad_input",  "repeat_calls",      "no_grad_call"};
  return kNames;
}

std::vector<PatternMatch> fusion_pattern_matches(const CaseSpec& spec, bool enabled_only) {
  std::vector<PatternMatch> matches;
  for (const auto& fusion : pattern_fusions()) {
    if (enabled_only && std::find(spec.fusions.begin(), spec.fusions.end(), fusion) == spec.fusions.end()) continue;
    for (size_t i = 0; i < spec.ops.size(); ++i) {
      const int64_t len = match_length(fusion, spec, i);
      if (len > 0) matches.push_back({fusion, static_cast<int64_t>(i), static_cast<int64_t>(i) + len});
    }
  }
  return matches;
}

void StaticCoverage::merge(const StaticCoverage& other) {
  for (const auto& [k, v] : other.ops) ops[k] += v;
  for (const auto& [k, v] : other.fusions) fusions[k] += v;
  for (const auto& [k, v] : other.features) features[k] += v;
}

StaticCoverage static_coverage(const CaseSpec& spec) {
  StaticCoverage cov;
  for (const auto& op : spec.ops) {
    if (op.name != harness::kBoundaryOp) ++cov.ops[op.name];
  }
  const auto matches = fusion_pattern_matches(spec, /*enabled_only=*/true);
  for (const auto& m : matches) ++cov.fusions[m.fusion];

  std::set<std::string> features;
  auto layout = compute_layout(spec);
  if (layout) {
    for (size_t i = 0; i < spec.ops.size(); ++i) {
      const auto& op = spec.ops[i];
      const auto& mod = layout->modules[i];
      if (mod.boundary) {
        // fuser_boundary: a Boundary module with catalog ops on both sides (two fusers).
        const bool before = std::any_of(spec.ops.begin(), spec.ops.begin() + static_cast<long>(i),
                                        [](const OpSpec& o) { return o.name != harness::kBoundaryOp; });
        const bool after = std::any_of(spec.ops.begin() + static_cast<long>(i) + 1, spec.ops.end(),
                                       [](const OpSpec& o) { return o.name != harness::kBoundaryOp; });
        if (before && after) features.insert("fuser_boundary");
        continue;
      }
      const auto& sig = mod.signature;
      bool bound = false;
      bool pub = false;
      for (size_t s = 0; s < sig.extra_inputs.size(); ++s) {
        if (in_channel(op, s)) {
          bound = true;
        } else {
          pub = true;
          // no_grad_input also counts a public floating extra input that does not require grad.
          if (sig.extra_inputs[s].kind == ops::TensorKind::kFloat && s < op.extra_input_requires_grad.size() &&
              !op.extra_input_requires_grad[s]) {
            features.insert("no_grad_input");
          }
        }
      }
      if (bound) features.insert("bound_input");
      if (pub) features.insert("public_input");
      // mixed_slot_order: one op mixes bound and public input slots.
      if (bound && pub) features.insert("mixed_slot_order");
      for (size_t s = 0; s < sig.extra_outputs.size(); ++s) {
        if (s >= op.output_bindings.size() || !op.output_bindings[s].channel) continue;
        features.insert(op.output_bindings[s].output_to_caller ? "public_bound_output" : "hidden_output");
      }
      // generator_outputs: generator style on an op that hands back a non-empty container.
      if (op.output_style == ops::OutputStyle::kGenerator &&
          (!sig.extra_outputs.empty() || !sig.extra_inputs.empty())) {
        features.insert("generator_outputs");
      }
      if (op.name == "GroupedLinear" && attr_or_default(op, "scale_bias") != 0) features.insert("scale_bias");
    }
    // mixed_slot_order also: across ops of one fuser, a bound slot between two public ones.
    for (int64_t f = 0; f < layout->num_fusers; ++f) {
      std::string seq;
      for (size_t i = 0; i < spec.ops.size(); ++i) {
        if (layout->modules[i].fuser != f) continue;
        for (size_t s = 0; s < layout->modules[i].signature.extra_inputs.size(); ++s) {
          seq += in_channel(spec.ops[i], s) ? 'b' : 'p';
        }
      }
      const auto first_p = seq.find('p');
      if (first_p != std::string::npos && seq.find('b', first_p) != std::string::npos &&
          seq.find('p', seq.find('b', first_p)) != std::string::npos) {
        features.insert("mixed_slot_order");
      }
    }
    for (const auto& ch : case_channels(spec, *layout)) {
      if (ch.consumers.size() >= 2) features.insert("fanout");
      const auto& producer = spec.ops[ch.producer.op].name;
      // fresh_producer: a consumed channel whose tensor the producer creates (Dispatch probs,
      // RowStat), unlike MakeExtraOutput which hands back its input.
      if (!ch.consumers.empty() && ((producer == "Dispatch" && ch.producer.slot == 1) || producer == "RowStat")) {
        features.insert("fresh_producer");
      }
      // same_fusion_channel: producer and a consumer inside one enabled pattern match.
      for (const auto& c : ch.consumers) {
        for (const auto& m : matches) {
          if (ch.producer.op >= m.begin && c.op < m.end && c.op >= m.begin) features.insert("same_fusion_channel");
        }
      }
    }
  }
  if (!spec.call_then_bind.empty()) features.insert("call_then_bind");
  if (!spec.input_requires_grad) features.insert("no_grad_input");
  if (!spec.repeat_calls.empty()) features.insert("repeat_calls");
  for (const auto& call : spec.repeat_calls) {
    if (call.no_grad) features.insert("no_grad_call");
  }
  for (const auto& f : features) cov.features[f] = 1;
  return cov;
}

}  // namespace gradfuzz::generators
