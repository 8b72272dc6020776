#include "campaign/finding_recorder.h"

#include <algorithm>
#include <chrono>
#include <set>

#include "campaign/confirmation.h"
#include "corpus/case_file.h"
#include "reports/build_info.h"

namespace gradfuzz::campaign {

namespace {

using Clock = std::chrono::steady_clock;
using harness::CaseResult;
using harness::CaseSpec;
using harness::Finding;
using harness::VerdictKind;

bool kills_process(VerdictKind kind) { return kind == VerdictKind::kCrash || kind == VerdictKind::kTimeout; }

}  // namespace

bool wants_trace(const CaseResult& result) {
  return std::any_of(result.findings.begin(), result.findings.end(), [](const Finding& f) {
    return !f.is_known() && (f.kind == VerdictKind::kMismatch || f.kind == VerdictKind::kMissingGradient) &&
           f.role != "plan";
  });
}

FindingRecorder::FindingRecorder(const CampaignOptions& options, CaseRunner& runner, std::string backend_version,
                                 std::function<bool()> keep_going)
    : options_(options),
      runner_(runner),
      version_(std::move(backend_version)),
      keep_going_(std::move(keep_going)),
      tool_version_(reports::build_tool_info().version),
      findings_dir_(options.corpus_dir / kFindingsDir),
      crashing_dir_(options.corpus_dir / corpus::kCrashingDir),
      known_dir_(options.corpus_dir / kFindingsDir / kKnownDir),
      attribute_(options.fault && options.require_fault_attributable) {}

void FindingRecorder::mark(CaseResult& result, const CaseSpec& spec) const {
  if (options_.known) options_.known->mark(result, spec, version_);
  if (explained_.empty() || !has_documented_cause(spec)) return;
  for (Finding& f : result.findings) {
    if (f.is_known()) continue;
    const auto it = explained_.find(f.signature);
    if (it != explained_.end()) f.known = it->second;
  }
}

std::string FindingRecorder::case_level_known(const Finding& finding) const {
  if (!finding.is_known()) return "";
  const KnownIssue* e = options_.known ? options_.known->entry(finding.known) : nullptr;
  if (e && e->case_level()) return e->id;
  // A documented cause found by a confirmation holds in the cases that have that cause.
  const auto it = explained_.find(finding.signature);
  return it != explained_.end() && it->second == finding.known ? finding.known : std::string();
}

std::string FindingRecorder::save(const CaseSpec& spec, VerdictKind kind, const std::optional<std::string>& fault,
                                  const std::filesystem::path& dir, std::optional<corpus::SavedFinding> finding) const {
  corpus::CaseFile file =
      corpus::make_case_file(spec, corpus::ExpectedVerdict{kind, fault}, options_.seed, tool_version_, fault);
  file.backend = options_.backend;
  file.finding = std::move(finding);
  return corpus::write_case_file(dir, file).string();
}

CampaignFinding FindingRecorder::open_cluster(const CaseSpec& spec, const CaseResult& result,
                                              const std::string& signature, const std::string& fault, bool attributable,
                                              bool traced, std::string& key) {
  const Finding& first = *result.finding(signature);
  const std::optional<std::string> fault_opt = fault.empty() ? std::nullopt : std::optional<std::string>(fault);
  CaseSpec minimal = spec;
  CaseResult minimal_result = result;
  // A known finding is not shrunk again: its case is kept as generated.
  if (!first.is_known() && options_.shrink) {
    const int64_t calls = first.kind == VerdictKind::kCrash     ? options_.max_crash_shrink_calls
                          : first.kind == VerdictKind::kTimeout ? options_.max_timeout_shrink_calls
                                                                : options_.max_shrink_calls;
    const auto shrink_end = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                               std::chrono::duration<double>(options_.max_shrink_seconds));
    minimal = shrink_failure(
        runner_, spec, signature, fault, attribute_ && attributable, calls,
        [&] { return (!keep_going_ || keep_going_()) && Clock::now() < shrink_end; }, traced);
    if (!(minimal == spec)) {
      minimal_result = traced ? runner_.run_traced(minimal, fault) : runner_.run_now(minimal, fault);
      mark(minimal_result, minimal);
      // Shrinking is only trusted when the minimal case reproduces, and as the new finding it
      // shrank for: a smaller case that a case-level known issue covers (the recipe shrunk
      // away, an entry on "none") is that issue's. Else keep the original.
      const Finding* again = minimal_result.finding(signature);
      if (!again || again->is_known()) {
        minimal = spec;
        minimal_result = result;
      }
    }
  }
  CampaignFinding found;
  std::optional<reports::Confirmation> confirmation;
  std::string known_id = first.known;
  if (!first.is_known()) {
    // Before it is called new: its alternative runs, on the traced result of the minimal case
    // (an error's signature does not depend on the trace).
    const bool value = first.kind == VerdictKind::kMismatch || first.kind == VerdictKind::kMissingGradient;
    if (!traced && value) {
      CaseResult again = runner_.run_traced(minimal, fault);
      mark(again, minimal);
      if (again.finding(signature)) minimal_result = std::move(again);
    }
    ConfirmationContext context;
    context.fault = fault;
    context.known = options_.known.get();
    context.backend = options_.backend;
    context.version = version_;
    confirmation = confirm_cluster(runner_, minimal, minimal_result, signature, context);
    if (!confirmation->explained_by.empty()) {
      known_id = confirmation->explained_by;
      explained_[signature] = known_id;
      key = ClusterTable::key(signature, attributable, known_id);
      for (Finding& f : minimal_result.findings) {
        if (f.signature == signature) f.known = known_id;
      }
    }
  }
  const Finding& saved_first = minimal_result.finding(signature) ? *minimal_result.finding(signature) : first;
  corpus::SavedFinding saved{saved_first, std::nullopt, ""};
  if (confirmation) {
    saved.first_divergence = confirmation->first_divergence;
    saved.diagnosis = confirmation->diagnosis;
  } else if (const harness::Divergence* d = minimal_result.divergence_of(saved_first.path_pair)) {
    saved.first_divergence = *d;
  }
  const bool is_known = !known_id.empty();
  found.finding.result = minimal_result;
  found.finding.signature = signature;
  found.finding.case_file = save(minimal, first.kind, fault_opt,
                                 is_known                    ? known_dir_
                                 : kills_process(first.kind) ? crashing_dir_
                                                             : findings_dir_,
                                 saved);
  found.finding.reproduce = reports::reproduce_line(found.finding.case_file, fault_opt);
  if (options_.backend != "model") found.finding.reproduce += " --backend " + options_.backend;
  if (options_.known && !options_.known->path.empty() && is_known) {
    found.finding.reproduce += " --known " + options_.known->path.string();
  }
  found.finding.fault = fault_opt;
  found.finding.cluster = key;
  found.finding.dtype = minimal.dtype;
  found.finding.recipe = minimal.recipe;
  found.finding.confirmation = std::move(confirmation);
  if (is_known && options_.known) {
    if (const KnownIssue* e = options_.known->entry(known_id)) {
      found.finding.known = reports::KnownRef{e->id, e->status, e->link, e->note};
    }
  }
  found.shrunk_ops = minimal.num_ops();
  found.fault_attributable = attributable;
  return found;
}

bool FindingRecorder::record(const CaseSpec& spec, const std::string& fault, int64_t number, double seconds,
                             reports::CaseRecord& record, CampaignOutcome& outcome) {
  const std::optional<std::string> fault_opt = fault.empty() ? std::nullopt : std::optional<std::string>(fault);
  // A new value finding is signed again by where the values first diverge: a traced run.
  bool traced = false;
  if (wants_trace(record.result)) {
    CaseResult again = runner_.run_traced(spec, fault);
    mark(again, spec);
    if (again.failed()) {
      record.result = std::move(again);
      traced = true;
    }
  }
  // Which of the case's findings persist with the fault off (selftest): those are not the
  // fault's, and cluster apart.
  std::set<std::string> persists;
  if (attribute_) {
    const CaseResult without = traced ? runner_.run_traced(spec, "") : runner_.run_now(spec, "");
    for (const auto& sig : without.signatures()) persists.insert(sig);
  }
  bool stop = false;
  for (const std::string& signature : record.result.signatures()) {
    const Finding& first = *record.result.finding(signature);
    const bool attributable = !attribute_ || !persists.count(signature);
    std::string key = ClusterTable::key(signature, attributable, case_level_known(first));
    ClusterTable::Cluster* cluster = clusters_.find(key);
    if (!cluster) {
      CampaignFinding found = open_cluster(spec, record.result, signature, fault, attributable, traced, key);
      cluster = clusters_.find(key);
      const bool known = found.finding.known.has_value();
      if (!cluster) {
        cluster = &clusters_.add({key, signature, first.kind, attributable, known ? found.finding.known->id : ""});
      }
      if (known && !first.is_known()) {
        // Confirmed as a documented cause's consequence: this case's findings of it too.
        for (Finding& f : record.result.findings) {
          if (f.signature == signature) f.known = found.finding.known->id;
        }
      }
      found.case_number = number;
      found.seconds = seconds;
      if (options_.stop_at_first_finding && attributable && !known) stop = true;
      record.new_findings.push_back(found.finding);
      outcome.findings.push_back(std::move(found));
    } else if (cluster->examples < kExamplesPerCluster) {
      // A few unshrunk members of each cluster, as they were generated.
      record.example_files.emplace_back(key, save(spec, first.kind, fault_opt, findings_dir_ / kExamplesDir));
      ++cluster->examples;
    }
    record.clusters.push_back(key);
    ++cluster->cases;
  }
  return stop;
}

}  // namespace gradfuzz::campaign
