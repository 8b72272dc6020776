#include "runner/judge.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <utility>

namespace gradfuzz::runner {

using harness::CaseSpec;
using harness::Finding;
using harness::PathRun;
using harness::VerdictKind;

namespace {

/// Whether two error outcomes agree: both ran, or both raised the same kind. A remote
/// backend's error it could not map to a runtime kind ("unrecognized") agrees with any.
bool errors_agree(const PathRun& run, const PathRun& reference) {
  if (run.ok() != reference.ok()) return false;
  if (run.ok()) return true;
  return run.error_kind == reference.error_kind || run.error_kind == "unrecognized";
}

Finding error_finding(const PathRun& run, const std::string& path_pair) {
  Finding f;
  f.kind = VerdictKind::kUnexpectedError;
  f.path_pair = path_pair;
  f.tensor = "error";
  f.role = "error";
  f.error_kind = run.error_kind;
  f.error_type = run.error_type;
  f.phase = run.error_stage;
  f.message = run.error_message;
  f.origin = run.error_origin;
  return f;
}

/// A run that raised where the reference ran, or ran where it raised, or raised otherwise.
Finding disagreement(const PathRun& run, const PathRun& reference) {
  if (!run.ok()) {
    Finding f = error_finding(run, run.name + "~reference");
    f.note = reference.ok() ? "the reference ran"
                            : "the reference raised " + reference.error_kind + " during " + reference.error_stage;
    return f;
  }
  Finding f;
  f.kind = VerdictKind::kUnexpectedError;
  f.path_pair = run.name + "~reference";
  f.tensor = "error";
  f.role = "no_error";
  f.error_kind = reference.error_kind;
  f.phase = reference.error_stage;
  f.message = reference.error_message;
  f.note =
      "the reference raised " + reference.error_kind + " during " + reference.error_stage + "; " + run.name + " ran";
  return f;
}

void add_lock_findings(const CaseSpec& spec, const PathRun& run, std::vector<Finding>& findings) {
  for (int64_t op : run.left_locked) {
    Finding f;
    f.kind = VerdictKind::kUnexpectedError;
    f.path_pair = run.name;
    f.tensor = "op[" + std::to_string(op) + "]";
    f.role = "left_locked";
    f.phase = run.error_stage;
    f.op = spec.ops.at(static_cast<size_t>(op)).name;
    f.note = "failed " + run.error_stage + " left op " + std::to_string(op) + " (" + f.op + ") locked";
    findings.push_back(std::move(f));
  }
}

/// The path a finding is of, without its repeat call ("fused" for "fused.call[1]~reference").
std::string base_path(const Finding& f) {
  const std::string path = f.path_pair.substr(0, f.path_pair.find('~'));
  return path.substr(0, path.find('.'));
}

bool is_value_kind(const Finding& f) {
  return f.kind == VerdictKind::kMismatch || f.kind == VerdictKind::kMissingGradient ||
         f.kind == VerdictKind::kModifiedInput;
}

}  // namespace

ErrorJudgement judge_errors(const CaseSpec& spec, const std::vector<const PathRun*>& paths, const PathRun& reference,
                            bool intends_error) {
  std::vector<const PathRun*> all = paths;
  for (const PathRun* run : paths) {
    for (const auto& repeat : run->repeats) all.push_back(&repeat);
  }
  ErrorJudgement out;
  std::string kinds;
  for (const PathRun* run : all) {
    kinds += (kinds.empty() ? "" : "; ") + (run->ok() ? run->name + " ran" : harness::describe_error(*run));
  }
  kinds += "; " + (reference.ok() ? std::string("reference ran") : harness::describe_error(reference));
  if (!reference.ok() && !intends_error) {
    // A case valid by construction that raises in the reference is a bug there or in the
    // shared building code, and would otherwise hide as an agreeing error.
    Finding f = error_finding(reference, "reference");
    f.note = "a valid case raised in the reference";
    out.findings.push_back(std::move(f));
  }
  bool any_error = !reference.ok();
  for (const PathRun* run : all) {
    any_error = any_error || !run->ok();
    if (!errors_agree(*run, reference)) out.findings.push_back(disagreement(*run, reference));
  }
  for (const PathRun* run : all) add_lock_findings(spec, *run, out.findings);
  add_lock_findings(spec, reference, out.findings);
  if (intends_error && !any_error) {
    // Validation is shared code: a regression there lets an invalid configuration through
    // every path alike, which no comparison between them can see.
    Finding f;
    f.kind = VerdictKind::kUnexpectedError;
    f.path_pair = "every path";
    f.tensor = "error";
    f.role = "no_error";
    f.note = "an invalid configuration raised in no path (reference included)";
    out.findings.push_back(std::move(f));
  }
  if (any_error) out.outcomes = kinds;
  return out;
}

std::vector<Finding> judge_replicas(const CaseSpec& spec, const std::vector<const PathRun*>& paths,
                                    const harness::ShardingPlan& sharding, const oracle::Tolerance& tolerance) {
  std::vector<Finding> findings;
  std::vector<std::string> notes;
  oracle::Comparer comparer(findings, notes);
  const oracle::CaseBounds bounds{tolerance, {}};
  auto compare_ranks = [&](const PathRun& run) {
    if (!run.ok() || run.ranks.size() < 2) return;
    const PathRun lead = harness::replica_view(run.ranks.front(), sharding);
    for (size_t k = 1; k < run.ranks.size(); ++k) {
      if (!run.ranks[k].ok()) continue;
      const PathRun copy = harness::replica_view(run.ranks[k], sharding);
      for (const auto& t : oracle::compared_tensors(spec, lead, copy)) {
        comparer.compare(run.name + ".rank[" + std::to_string(k) + "]~" + run.name + ".rank[0]", t.name, "replica",
                         t.expected, t.got, t.gradient, bounds.bound(t.name));
      }
    }
  };
  for (const PathRun* run : paths) {
    compare_ranks(*run);
    for (const auto& repeat : run->repeats) compare_ranks(repeat);
  }
  for (auto& f : findings) {
    if (f.note.empty()) f.note = "the ranks' copies of a replicated tensor differ";
  }
  return findings;
}

void compare_shifted(const CaseSpec& spec, const PathRun& fused_reference, const PathRun& unfused_reference,
                     const PathRun& fused, const PathRun& unfused, const oracle::TensorBound& bound, bool all_channels,
                     oracle::Comparer& comparer) {
  const auto fused_expected = oracle::tensors_by_name(spec, fused_reference);
  const auto unfused_expected = oracle::tensors_by_name(spec, unfused_reference);
  for (const auto& t : oracle::compared_tensors(spec, unfused, fused, all_channels)) {
    at::Tensor expected = t.expected;
    const auto f = fused_expected.find(t.name);
    const auto u = unfused_expected.find(t.name);
    if (expected.defined() && f != fused_expected.end() && u != unfused_expected.end() && f->second.defined() &&
        u->second.defined() && f->second.sizes() == expected.sizes() && u->second.sizes() == expected.sizes()) {
      expected = expected.to(at::kDouble) + (f->second - u->second).to(expected.device(), at::kDouble);
    }
    comparer.compare("fused~unfused", t.name, t.role, expected, t.got, t.gradient, bound);
  }
}

bool note_wide_dtype(std::vector<Finding>& findings, const std::vector<Finding>& wide_findings,
                     const std::set<std::string>& ran, const std::string& wide) {
  std::set<std::pair<std::string, std::string>> wrong;
  for (const auto& f : wide_findings) wrong.insert({f.path_pair, f.tensor});
  bool precision_only = true;
  for (auto& f : findings) {
    if (f.kind != VerdictKind::kMismatch && f.kind != VerdictKind::kMissingGradient) continue;
    const std::string path = f.path_pair.substr(0, f.path_pair.find('~'));
    if (!ran.count(path)) continue;
    const bool persists = wrong.count({path + "~reference", f.tensor}) > 0;
    precision_only = precision_only && !persists;
    const std::string evidence =
        persists ? "also wrong in " + wide + " on the same values" : "passes in " + wide + " on the same values";
    f.note = f.note.empty() ? evidence : f.note + "; " + evidence;
  }
  return precision_only;
}

namespace {

/// The call of a finding's path: 0 for the first, k for ".call[k]" (repeat call k - 1).
size_t call_of(const Finding& f) {
  const std::string path = f.path_pair.substr(0, f.path_pair.find('~'));
  const size_t at = path.find(".call[");
  if (at == std::string::npos) return 0;
  try {
    return static_cast<size_t>(std::stoul(path.substr(at + 6)));
  } catch (const std::exception&) {
    return 0;
  }
}

/// Whether the unfused path's call `k` (as call_of numbers them) ran.
bool unfused_call_ran(const PathRun* unfused, size_t k) {
  if (unfused == nullptr || !unfused->ok()) return false;
  return k == 0 || (k - 1 < unfused->repeats.size() && unfused->repeats[k - 1].ok());
}

}  // namespace

std::optional<InPlaceAblation> in_place_ablation(const CaseSpec& spec, const std::vector<Finding>& findings,
                                                 const PathRun* unfused) {
  InPlaceAblation out;
  out.ablated = spec;
  std::vector<std::string> writers;
  for (auto& op : out.ablated.ops) {
    auto it = op.attrs.find("in_place");
    if (it == op.attrs.end() || it->second != 1) continue;
    it->second = 0;
    if (std::find(writers.begin(), writers.end(), op.name) == writers.end()) writers.push_back(op.name);
  }
  if (writers.empty()) return std::nullopt;
  std::sort(writers.begin(), writers.end());  // one cluster whatever the ops' order
  for (const auto& w : writers) out.writers += (out.writers.empty() ? "" : ",") + w;
  // A tensor the unfused path gets wrong (or writes) too is not a fusion's doing.
  std::set<std::string> unfused_wrong;
  for (const auto& f : findings) {
    if (is_value_kind(f) && base_path(f) == "unfused") unfused_wrong.insert(f.tensor);
  }
  for (size_t k = 0; k < findings.size(); ++k) {
    const Finding& f = findings[k];
    if (!is_value_kind(f)) continue;
    const bool fusion_specific =
        base_path(f) != "unfused" && unfused_call_ran(unfused, call_of(f)) && !unfused_wrong.count(f.tensor);
    if (!fusion_specific) out.candidates.push_back(k);
  }
  if (out.candidates.empty()) return std::nullopt;
  return out;
}

std::vector<size_t> gone_without(const InPlaceAblation& ablation, const std::vector<Finding>& findings,
                                 const std::vector<Finding>& without) {
  std::set<std::pair<VerdictKind, std::string>> still;
  for (const auto& f : without) still.insert({f.kind, f.tensor});
  std::vector<size_t> gone;
  for (size_t k : ablation.candidates) {
    if (!still.count({findings[k].kind, findings[k].tensor})) gone.push_back(k);
  }
  return gone;
}

}  // namespace gradfuzz::runner
