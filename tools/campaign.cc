#include "tools/campaign.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <ostream>
#include <set>
#include <stdexcept>

#include <unistd.h>

#include "corpus/case_file.h"
#include "generators/invalid_gen.h"
#include "generators/shrink.h"
#include "reports/build_info.h"
#include "tools/exit_codes.h"
#include "tools/files.h"

namespace gradfuzz::tools {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

std::optional<std::string> fault_text(const std::optional<ops::Fault>& fault) {
  if (!fault) return std::nullopt;
  return ops::fault_name(*fault);
}

/// Runs one case; internal assertions (the only exceptions run_case lets through) become
/// InternalError naming the repro file.
harness::CaseResult run_guarded(const harness::CaseSpec& spec, const harness::RunOptions& run_options,
                                const std::filesystem::path& repro) {
  try {
    return harness::run_case(spec, run_options);
  } catch (const std::exception& e) {
    throw InternalError(std::string("run_case raised: ") + e.what(), repro.string());
  }
}

class ProgressLine {
 public:
  explicit ProgressLine(std::ostream* out) : out_(out), start_(Clock::now()), last_(start_) {}

  void update(int64_t cases, int64_t findings, bool force = false) {
    if (!out_) return;
    const auto now = Clock::now();
    // A few updates a second keep a terminal readable without slowing fast campaigns.
    if (!force && now - last_ < std::chrono::milliseconds(250)) return;
    last_ = now;
    const double elapsed = std::chrono::duration<double>(now - start_).count();
    *out_ << "\r[gradfuzz] cases " << cases << "  findings " << findings << "  "
          << (elapsed > 0 ? static_cast<double>(cases) / elapsed : 0.0) << " cases/s   " << std::flush;
  }

  void finish() {
    if (out_) *out_ << '\n' << std::flush;
  }

 private:
  std::ostream* out_;
  Clock::time_point start_;
  Clock::time_point last_;
};

}  // namespace

std::string inflight_case_text(const harness::CaseSpec& spec, uint64_t campaign_seed,
                               const std::optional<std::string>& fault) {
  const corpus::CaseFile file =
      corpus::make_case_file(spec, corpus::ExpectedVerdict{}, campaign_seed, reports::build_tool_info().version, fault);
  return corpus::case_file_to_json(file).dump(2) + "\n";
}

std::vector<std::filesystem::path> recover_crashed_cases(const std::filesystem::path& corpus_dir,
                                                         std::vector<std::string>& problems) {
  std::vector<std::filesystem::path> recovered;
  const std::filesystem::path inflight_dir = corpus_dir / kInflightDir;
  if (count_regular_files(inflight_dir) == 0) return recovered;
  for (const auto& path : corpus::list_case_files(inflight_dir)) {
    try {
      corpus::CaseFile file = corpus::load_case_file(path);
      file.verdict.kind = harness::VerdictKind::kCrash;
      file.verdict.fault = file.provenance.fault;
      recovered.push_back(corpus::write_case_file(corpus_dir / corpus::kCrashingDir, file));
      remove_file(path);
    } catch (const std::exception& e) {
      problems.push_back(path.string() + ": left in place, unreadable: " + e.what());
    }
  }
  return recovered;
}

uint64_t case_seed(uint64_t campaign_seed, int64_t index) {
  return splitmix64(splitmix64(campaign_seed) ^ static_cast<uint64_t>(index));
}

int case_size(int64_t index) { return static_cast<int>(std::min<int64_t>(100, 10 + std::max<int64_t>(0, index))); }

generators::GenOptions campaign_gen_options(const CampaignOptions& options) {
  generators::GenOptions gen;
  gen.set_max_ops(options.max_ops).set_dtypes(options.dtypes).set_device(options.device);
  return gen;
}

harness::CaseSpec campaign_case(const CampaignOptions& options, int64_t index) {
  const uint64_t seed = case_seed(options.seed, index);
  if (index % kInvalidCaseEvery == kInvalidCaseEvery - 1) {
    // Invalid configurations: every path must raise the same error and lock nothing.
    return generators::generate_invalid_case(seed, case_size(index), campaign_gen_options(options)).spec;
  }
  return generators::generate_case(seed, case_size(index), campaign_gen_options(options));
}

const CampaignFinding* CampaignOutcome::first_attributable() const {
  for (const auto& f : findings) {
    if (f.fault_attributable) return &f;
  }
  return nullptr;
}

bool passes_without_fault(const harness::CaseSpec& spec, ops::Fault fault, const harness::RunOptions& run_options) {
  ops::FaultScope off(fault, /*enabled=*/false);
  try {
    return harness::run_case(spec, run_options).passed();
  } catch (const std::exception&) {
    return false;
  }
}

harness::CaseSpec shrink_failure(const harness::CaseSpec& spec, harness::VerdictKind kind,
                                 const std::optional<ops::Fault>& passes_without,
                                 const harness::RunOptions& run_options, int64_t max_calls) {
  auto still_fails = [&](const harness::CaseSpec& candidate) {
    try {
      if (harness::run_case(candidate, run_options).verdict != kind) return false;
    } catch (const std::exception&) {
      // A candidate that trips an internal assertion is a different problem, not this one.
      return false;
    }
    return !passes_without || passes_without_fault(candidate, *passes_without, run_options);
  };
  generators::ShrinkOptions shrink_options;
  shrink_options.set_max_predicate_calls(max_calls);
  return generators::shrink(spec, still_fails, shrink_options).minimal;
}

CampaignOutcome run_campaign(const CampaignOptions& options, reports::Reporter& reporter, std::ostream* progress) {
  std::unique_ptr<ops::FaultScope> fault_scope;
  if (options.fault) fault_scope = std::make_unique<ops::FaultScope>(*options.fault);
  const std::optional<std::string> fault = fault_text(options.fault);
  const std::string tool_version = reports::build_tool_info().version;
  const std::filesystem::path inflight_dir = options.corpus_dir / kInflightDir;
  const std::filesystem::path findings_dir = options.corpus_dir / kFindingsDir;
  // A time-only budget leaves the count unbounded.
  const int64_t max_cases =
      options.cases.value_or(options.time_s ? std::numeric_limits<int64_t>::max() : kDefaultCampaignCases);

  CampaignOutcome outcome;
  // Fault-attributable findings and failures that persist without the fault are
  // deduplicated separately, so a real bug cannot hide the fault's finding of the same shape.
  std::set<std::string> seen_signatures;
  std::set<std::string> seen_unattributed;
  const bool attribute = options.fault && options.require_fault_attributable;
  std::unique_ptr<InflightFile> inflight_file;
  try {
    inflight_file = std::make_unique<InflightFile>(inflight_dir / (std::to_string(::getpid()) + ".json"));
  } catch (const std::runtime_error& e) {
    throw InputError(std::string("--corpus: ") + e.what());
  }
  InflightFile& inflight = *inflight_file;
  ProgressLine line(progress);
  const auto start = Clock::now();
  for (int64_t i = 0;; ++i) {
    if (i >= max_cases) break;
    if (options.time_s && seconds_since(start) >= *options.time_s) break;

    harness::CaseSpec spec = campaign_case(options, i);
    // Written before the run: if the case kills the process, the repro is on disk.
    try {
      inflight.write(inflight_case_text(spec, options.seed, fault));
    } catch (const std::runtime_error& e) {
      throw InputError(std::string("--corpus: ") + e.what());
    }
    reports::CaseRecord record;
    record.result = run_guarded(spec, options.run_options, inflight.path());

    ++outcome.cases_run;
    bool stop = false;
    if (record.result.passed()) {
      ++outcome.passed;
    } else {
      ++outcome.failed;
      const double seconds = seconds_since(start);
      const bool attributable = !attribute || passes_without_fault(spec, *options.fault, options.run_options);
      std::set<std::string>& seen = attributable ? seen_signatures : seen_unattributed;
      if (seen.insert(record.result.signature()).second) {
        const std::optional<ops::Fault> passes_without =
            attribute && attributable ? options.fault : std::optional<ops::Fault>();
        harness::CaseSpec minimal = options.shrink ? shrink_failure(spec, record.result.verdict, passes_without,
                                                                    options.run_options, options.max_shrink_calls)
                                                   : spec;
        CampaignFinding found;
        found.finding.result = run_guarded(minimal, options.run_options, /*repro=*/{});
        if (found.finding.result.verdict != record.result.verdict) {
          // Shrinking is only trusted when the minimal case reproduces: keep the original.
          minimal = spec;
          found.finding.result = record.result;
        }
        seen.insert(found.finding.result.signature());
        const corpus::ExpectedVerdict verdict{found.finding.result.verdict, fault};
        const std::filesystem::path saved = corpus::write_case_file(
            findings_dir, corpus::make_case_file(minimal, verdict, options.seed, tool_version, fault));
        found.finding.case_file = saved.string();
        found.finding.reproduce = reports::reproduce_line(found.finding.case_file, fault);
        found.shrunk_ops = minimal.num_ops();
        found.case_number = i + 1;
        found.seconds = seconds;
        found.fault_attributable = attributable;
        record.finding = found.finding;
        outcome.findings.push_back(std::move(found));
        stop = options.stop_at_first_finding && attributable;
      }
    }
    reporter.report_case(record);
    line.update(outcome.cases_run, static_cast<int64_t>(outcome.findings.size()));
    if (stop) break;
  }
  inflight.remove();
  outcome.wall_s = seconds_since(start);
  line.update(outcome.cases_run, static_cast<int64_t>(outcome.findings.size()), /*force=*/true);
  line.finish();
  return outcome;
}

}  // namespace gradfuzz::tools
