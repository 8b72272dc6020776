#include "campaign/selftest.h"

#include <algorithm>

#include "campaign/exit_codes.h"
#include "campaign/replay.h"

namespace gradfuzz::campaign {

int replay_exit_status(const std::filesystem::path& case_file, const std::optional<std::string>& fault,
                       CaseRunner& runner, const KnownIssues* known) {
  try {
    const auto cases = load_case_paths({case_file.string()});
    const ReplayOutcome outcome = replay_cases(cases, fault, runner, nullptr, nullptr, known);
    // As `gradfuzz replay --known`: only new findings fail (a case of an in-place fused op
    // keeps its known in-place findings with the fault off).
    return static_cast<int>(outcome.new_failed() > 0 ? ExitCode::kFindings : ExitCode::kOk);
  } catch (const InputError&) {
    return static_cast<int>(ExitCode::kUsage);
  } catch (const std::exception&) {
    return static_cast<int>(ExitCode::kInternal);
  }
}

CampaignOptions selftest_campaign(const CampaignOptions& base, const std::string& fault) {
  CampaignOptions campaign = base;
  campaign.fault = fault;
  ops::Fault model_fault{};
  bool is_model = false;
  for (ops::Fault f : ops::all_faults()) {
    if (ops::fault_name(f) == fault) {
      model_fault = f;
      is_model = true;
    }
  }
  if (!is_model) return campaign;
  if (ops::fault_is_half_precision(model_fault)) {
    std::vector<std::string> half;
    for (const auto& d : base.dtypes) {
      if (d == "bfloat16" || d == "float16") half.push_back(d);
    }
    campaign.dtypes = half.empty() ? std::vector<std::string>{"bfloat16", "float16"} : half;
  }
  if (ops::fault_shapes(model_fault) == "edge") {
    // Long enough reductions, small enough tensors for a CPU: edge dimensions within 2^14.
    campaign.shapes = generators::ShapeRegime::kEdge;
    campaign.max_tensor_elements = std::min<int64_t>(campaign.max_tensor_elements, int64_t{1} << 14);
  }
  return campaign;
}

std::vector<reports::SelftestEntry> run_selftest(const SelftestOptions& options, reports::Reporter& reporter,
                                                 std::ostream* progress) {
  InProcessRunner runner(backends::make_backend({}), options.campaign.run_options);
  return run_selftest(options, runner, reporter, progress);
}

std::vector<reports::SelftestEntry> run_selftest(const SelftestOptions& options, CaseRunner& runner,
                                                 reports::Reporter& reporter, std::ostream* progress) {
  std::vector<reports::SelftestEntry> entries;
  for (const std::string& fault : options.faults) {
    reports::SelftestEntry entry;
    entry.name = fault;
    if (progress) *progress << "[gradfuzz] selftest " << entry.name << '\n';

    CampaignOptions campaign = selftest_campaign(options.campaign, fault);
    // A fault of the ranks' communication fires only in distributed cases of its world.
    if (const auto* planted = runner.capabilities().fault(fault); planted && planted->world_size > 0) {
      campaign.world_size = planted->world_size;
    }
    campaign.stop_at_first_finding = true;
    campaign.require_fault_attributable = true;
    campaign.corpus_dir = options.corpus_dir / entry.name;
    const CampaignOutcome outcome = run_campaign(campaign, runner, reporter, progress);

    // Findings whose case also fails with the fault off (with several workers, other
    // findings of the fault itself may arrive after the first: those are attributable).
    entry.unattributed_findings = std::count_if(outcome.findings.begin(), outcome.findings.end(),
                                                [](const CampaignFinding& f) { return !f.fault_attributable; });
    entry.known_findings = std::count_if(outcome.findings.begin(), outcome.findings.end(),
                                         [](const CampaignFinding& f) { return f.known(); });
    if (const CampaignFinding* found = outcome.first_attributable()) {
      const reports::Finding& finding = found->finding;
      entry.detected = true;
      entry.cases_to_detect = found->case_number;
      entry.seconds_to_detect = found->seconds;
      entry.shrunk_ops = found->shrunk_ops;
      entry.case_file = finding.case_file;
      const KnownIssues* known = campaign.known.get();
      entry.replay_with_fault_exit = replay_exit_status(finding.case_file, fault, runner, known);
      entry.replay_without_fault_exit = replay_exit_status(finding.case_file, std::nullopt, runner, known);
    }
    entries.push_back(entry);
  }
  return entries;
}

}  // namespace gradfuzz::campaign
