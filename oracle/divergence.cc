#include "oracle/divergence.h"

#include <algorithm>

namespace gradfuzz::oracle {

namespace {

using harness::CasePlan;
using harness::CaseSpec;
using harness::Divergence;
using harness::Finding;
using harness::PathRun;
using harness::PlanGroup;
using harness::TraceEntry;
using harness::VerdictKind;

/// One place the path's values may first diverge.
struct Candidate {
  TensorPosition pos;
  /// At one op: its parameters' gradients (0), then its main tensor (1: the output, the input
  /// gradient), then its extras (2); a compared tensor before a traced one of the same rank.
  int rank = 0;
  std::string role;
  std::string tensor;
  const TraceEntry* entry = nullptr;
  const Finding* finding = nullptr;
};

/// Whether `a` comes before `b`: forward before backward, forward by increasing op, backward by
/// decreasing op, then by rank at one op.
bool earlier(const Candidate& a, const Candidate& b) {
  if (a.pos.forward != b.pos.forward) return a.pos.forward;
  if (a.pos.op != b.pos.op) return a.pos.forward ? a.pos.op < b.pos.op : a.pos.op > b.pos.op;
  return a.rank < b.rank;
}

/// The group of `run`'s plans covering op `op` in the given pass.
const PlanGroup* covering(const PathRun& run, bool forward, int64_t op) {
  for (const auto& fuser : run.plans) {
    for (const auto& g : forward ? fuser.forward : fuser.backward) {
      if (g.begin <= op && op < g.end) return &g;
    }
  }
  return nullptr;
}

/// The trace entry of `run` whose group covers op `op` in the given pass.
const TraceEntry* traced_group(const PathRun& run, bool forward, int64_t op) {
  for (const auto& e : run.trace) {
    if ((e.pass == "forward") == forward && e.group.begin <= op && op < e.group.end) return &e;
  }
  return nullptr;
}

}  // namespace

int64_t index_in(const std::string& s, const std::string& prefix) {
  if (s.rfind(prefix, 0) != 0) return -1;
  const size_t end = s.find(']', prefix.size());
  if (end == std::string::npos) return -1;
  try {
    return std::stoll(s.substr(prefix.size(), end - prefix.size()));
  } catch (const std::exception&) {
    return -1;
  }
}

int64_t last_op(const CaseSpec& spec) { return spec.ops.empty() ? 0 : static_cast<int64_t>(spec.ops.size()) - 1; }

std::optional<TensorPosition> tensor_position(const std::string& tensor, const CaseSpec& spec, const CasePlan& plan) {
  if (tensor == "output") return TensorPosition{true, last_op(spec)};
  if (int64_t k = index_in(tensor, "trace.forward["); k >= 0) return TensorPosition{true, k};
  if (int64_t k = index_in(tensor, "trace.backward["); k >= 0) return TensorPosition{false, k};
  if (int64_t k = index_in(tensor, "extra_output["); k >= 0) {
    if (k < static_cast<int64_t>(plan.public_outputs.size())) return TensorPosition{true, plan.public_outputs[k].op};
    return TensorPosition{true, last_op(spec)};
  }
  if (tensor == "grad_input") return TensorPosition{false, 0};
  if (int64_t i = index_in(tensor, "grad_param["); i >= 0) return TensorPosition{false, i};
  if (int64_t k = index_in(tensor, "grad_extra_input["); k >= 0) {
    if (k < static_cast<int64_t>(plan.public_inputs.size())) return TensorPosition{false, plan.public_inputs[k].op};
    return TensorPosition{false, 0};
  }
  if (tensor.rfind("grad_channel[", 0) == 0) {
    // grad_channel[name] or grad_channel[name@fuserF]
    std::string inner = tensor.substr(13, tensor.size() - 14);
    int64_t fuser = 0;
    if (auto at = inner.find("@fuser"); at != std::string::npos) {
      fuser = std::stoll(inner.substr(at + 6));
      inner = inner.substr(0, at);
    }
    for (size_t i = 0; i < spec.ops.size() && i < plan.ops.size(); ++i) {
      if (plan.ops[i].fuser != fuser) continue;
      for (const auto& b : spec.ops[i].output_bindings) {
        if (b.channel && *b.channel == inner) return TensorPosition{false, static_cast<int64_t>(i)};
      }
    }
    return TensorPosition{false, 0};
  }
  return std::nullopt;
}

std::optional<Divergence> first_divergence(const CaseSpec& spec, const CasePlan& plan, const PathRun& reference,
                                           const PathRun& run, const CaseBounds& bounds,
                                           const std::vector<Finding>& findings) {
  std::vector<Candidate> candidates;
  const std::string pair = run.name + "~reference";
  for (const Finding& f : findings) {
    if (f.path_pair != pair || (f.kind != VerdictKind::kMismatch && f.kind != VerdictKind::kMissingGradient) ||
        f.role == "plan") {
      continue;
    }
    if (const auto pos = tensor_position(f.tensor, spec, plan)) {
      // The case's input gradient and output are an op's main tensor as the trace's are, its
      // extra-input gradients and extra outputs the op's extras: ranked as those, so that a
      // defect at op 0 is signed as it is at op k (a weight gradient before the input's).
      const int rank = f.role == "grad_input" || f.role == "output"               ? 1
                       : f.role == "grad_extra_input" || f.role == "extra_output" ? 2
                                                                                  : 0;
      candidates.push_back({*pos, rank, f.role, f.tensor, nullptr, &f});
    }
  }
  // The trace tensors outside their bound, each compared as a tensor of its own.
  const auto expected = trace_tensors(reference);
  std::vector<Finding> traced;
  std::vector<std::string> notes;
  Comparer comparer(traced, notes);
  std::vector<std::pair<const TraceEntry*, int>> compared;
  auto check = [&](const TraceEntry& e, const std::string& name, const at::Tensor& got, const std::string& role,
                   int rank) {
    // A gradient the group returned none for where the reference has one is a missing one.
    const auto it = expected.find(name);
    if ((!got.defined() && e.pass == "forward") || it == expected.end() || !it->second.defined()) return;
    const size_t before = traced.size();
    comparer.compare(pair, name, role, it->second, got, e.pass == "backward", bounds.bound(name));
    for (size_t k = before; k < traced.size(); ++k) compared.emplace_back(&e, rank);
  };
  for (const auto& e : run.trace) {
    const bool forward = e.pass == "forward";
    if (!e.quantized) check(e, trace_name(e), e.tensor, forward ? "output" : "grad_input", 1);
    for (const auto& x : e.extras) {
      if (!x.quantized) check(e, trace_name(e, x), x.tensor, forward ? "extra_output" : "grad_extra_input", 2);
    }
  }
  for (size_t k = 0; k < traced.size(); ++k) {
    if (const auto pos = tensor_position(traced[k].tensor, spec, plan)) {
      candidates.push_back({*pos, compared[k].second, traced[k].role, traced[k].tensor, compared[k].first, &traced[k]});
    }
  }
  if (candidates.empty()) return std::nullopt;
  const Candidate* first = &candidates.front();
  for (const auto& c : candidates) {
    if (earlier(c, *first)) first = &c;
  }
  Divergence d;
  d.path = run.name;
  d.kind = harness::verdict_name(first->finding->kind);
  d.pass = first->pos.forward ? "forward" : "backward";
  d.op_index = first->pos.op;
  if (d.op_index >= 0 && d.op_index < static_cast<int64_t>(spec.ops.size())) d.op = spec.ops[d.op_index].name;
  d.role = first->role;
  d.tensor = first->tensor;
  const TraceEntry* entry = first->entry ? first->entry : traced_group(run, first->pos.forward, first->pos.op);
  const PlanGroup* group = entry ? &entry->group : covering(run, first->pos.forward, first->pos.op);
  if (group) {
    d.group = group->name;
    d.fused = group->fused;
  }
  if (entry) {
    d.impl_class = entry->impl_class;
    d.method = entry->method;
  }
  const Finding& f = *first->finding;
  d.max_abs_err = f.max_abs_err;
  d.max_rel_err = f.max_rel_err;
  d.norm_err = f.norm_err;
  d.norm_bound = f.norm_bound;
  return d;
}

}  // namespace gradfuzz::oracle
