#include "campaign/campaign.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <set>
#include <sstream>
#include <string>

#include "campaign/environment.h"
#include "campaign/exit_codes.h"
#include "campaign/files.h"
#include "corpus/case_file.h"

namespace gradfuzz::campaign {

namespace {

/// A fresh directory under the system temp dir, removed at the end of the test.
class TempDir {
 public:
  explicit TempDir(const std::string& name) : path_(make_temp_dir("gradfuzz-" + name + "-")) {}
  ~TempDir() { remove_tree(path_); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

/// Records what the campaign reported.
class RecordingReporter final : public reports::Reporter {
 public:
  void report_context(const reports::ReportContext&) override {}
  void report_case(const reports::CaseRecord& record) override { records.push_back(record); }
  void finalize(const reports::RunSummary&) override {}
  std::vector<reports::CaseRecord> records;
};

TEST(Campaign, CaseSeedsDependOnCampaignSeedAndIndex) {
  EXPECT_EQ(case_seed(1, 5), case_seed(1, 5));
  EXPECT_NE(case_seed(1, 5), case_seed(2, 5));
  std::set<uint64_t> seeds;
  for (int64_t i = 0; i < 100; ++i) seeds.insert(case_seed(42, i));
  EXPECT_EQ(seeds.size(), 100u);
}

TEST(Campaign, CaseSizeGrowsWithIndexUpTo100) {
  EXPECT_LT(case_size(0), case_size(50));
  EXPECT_EQ(case_size(1000), 100);
  for (int64_t i = 1; i < 200; ++i) EXPECT_LE(case_size(i - 1), case_size(i));
}

TEST(Campaign, SameSeedRegeneratesTheSameCases) {
  CampaignOptions a;
  a.seed = 9;
  CampaignOptions b = a;
  for (int64_t i = 0; i < 5; ++i) EXPECT_EQ(campaign_case(a, i), campaign_case(b, i)) << "case " << i;
  b.seed = 10;
  bool any_differs = false;
  for (int64_t i = 0; i < 5; ++i) any_differs = any_differs || campaign_case(a, i) != campaign_case(b, i);
  EXPECT_TRUE(any_differs);
}

TEST(Campaign, ShardsPartitionTheUnshardedCampaignsCases) {
  auto seeds_of = [](int64_t cases, int64_t index, int64_t count) {
    TempDir dir("shard");
    CampaignOptions options;
    options.cases = cases;
    options.seed = 21;
    options.max_ops = 2;
    options.corpus_dir = dir.path();
    options.shard_index = index;
    options.shard_count = count;
    RecordingReporter reporter;
    run_campaign(options, reporter, nullptr);
    std::multiset<uint64_t> seeds;
    for (const auto& r : reporter.records) seeds.insert(r.result.seed);
    return seeds;
  };
  const auto whole = seeds_of(9, 0, 1);
  std::multiset<uint64_t> joined;
  for (int64_t i = 0; i < 3; ++i) {
    const auto part = seeds_of(3, i, 3);
    EXPECT_EQ(part.size(), 3u) << "shard " << i;
    for (uint64_t s : part) {
      EXPECT_EQ(joined.count(s), 0u) << "shards repeat a case";
      joined.insert(s);
    }
  }
  EXPECT_EQ(joined, whole);
}

/// Answers every case with a mismatch whose tensor role depends on the case's size: a
/// channel gradient while the case keeps at least `min_ops` ops, the output below that.
class RoleBySizeRunner final : public CaseRunner {
 public:
  explicit RoleBySizeRunner(size_t min_ops) : min_ops_(min_ops) {}
  const harness::BackendCapabilities& capabilities() override { return caps_; }
  int slots() const override { return 1; }
  int idle() const override { return 1; }
  int in_flight() const override { return 0; }
  int submit(Job) override { return 0; }
  std::optional<JobResult> wait(std::optional<std::chrono::steady_clock::time_point>) override { return std::nullopt; }
  harness::CaseResult run_now(const harness::CaseSpec& spec, const std::string&) override {
    harness::CaseResult r;
    harness::Finding d;
    d.role = spec.ops.size() >= min_ops_ ? "grad_channel" : "output";
    d.signature = "mismatch|Op|" + d.role;
    r.findings.push_back(d);
    r.summarize();
    return r;
  }
  void cancel_in_flight() override {}

 private:
  size_t min_ops_;
  harness::BackendCapabilities caps_;
};

TEST(Campaign, ShrinkingKeepsTheFindingsSignatureNotOnlyItsKind) {
  CampaignOptions options;
  options.seed = 3;
  harness::CaseSpec big;
  for (int64_t i = 50; big.ops.size() < 6; ++i) big = campaign_case(options, i);
  RoleBySizeRunner runner(3);
  const harness::CaseSpec minimal = shrink_failure(runner, big, "mismatch|Op|grad_channel", "", false, 2000);
  // A shrink that only kept the kind would go on to one op (an output mismatch there).
  EXPECT_EQ(minimal.ops.size(), 3u);
  EXPECT_EQ(runner.run_now(minimal, "").findings.front().role, "grad_channel");
}

TEST(Campaign, RunsTheRequestedCasesAndLeavesNoInflightFiles) {
  TempDir dir("campaign");
  CampaignOptions options;
  options.cases = 4;
  options.seed = 3;
  options.max_ops = 3;
  options.corpus_dir = dir.path();
  RecordingReporter reporter;
  std::ostringstream progress;
  const CampaignOutcome outcome = run_campaign(options, reporter, &progress);
  EXPECT_EQ(outcome.cases_run, 4);
  EXPECT_EQ(outcome.passed + outcome.failed, 4);
  EXPECT_EQ(reporter.records.size(), 4u);
  EXPECT_EQ(count_regular_files(dir.path() / kInflightDir), 0u);
  EXPECT_EQ(count_regular_files(dir.path() / kFindingsDir), outcome.findings.size());
  EXPECT_THAT(progress.str(), ::testing::HasSubstr("cases 4"));
  for (const auto& record : reporter.records) EXPECT_FALSE(record.result.op_types.empty());
  // Every finding is saved, loadable, and reproduced by its line.
  for (const auto& found : outcome.findings) {
    const reports::Finding& finding = found.finding;
    EXPECT_TRUE(found.fault_attributable);  // no fault: always
    const corpus::CaseFile file = corpus::load_case_file(finding.case_file);
    EXPECT_EQ(file.verdict.kind, finding.result.verdict);
    EXPECT_EQ(finding.reproduce, "gradfuzz replay " + finding.case_file);
  }
}

TEST(Campaign, InternalErrorLeavesTheInflightReproOnDisk) {
  if (cuda_available()) GTEST_SKIP() << "needs a process without CUDA (a CUDA case then trips run_case's assertion)";
  TempDir dir("campaign-internal");
  CampaignOptions options;
  options.cases = 1;
  options.device = "cuda";  // run_case raises std::invalid_argument: an internal error here
  options.corpus_dir = dir.path();
  RecordingReporter reporter;
  try {
    run_campaign(options, reporter, nullptr);
    FAIL() << "expected InternalError";
  } catch (const InternalError& e) {
    EXPECT_THAT(e.repro(), ::testing::HasSubstr(kInflightDir));
    const corpus::CaseFile file = corpus::load_case_file(e.repro());
    // On cuda the shapes are a mix, scheduled by time: case 0 is drawn in the first regime.
    EXPECT_EQ(file.spec, campaign_case(options, 0, nullptr, next_regime(options.regime_time_shares, {})));
  }
  EXPECT_EQ(count_regular_files(dir.path() / kInflightDir), 1u);
}

// A mix scheduled by time with many workers: a simulated clock, 12 workers, tiny cases of
// 50 ms, edge of 2.5 s, large of 9 s (the H200's te costs, docs/BENCHMARKS.md). Charging
// the running cases their expected cost (and letting a regime's first case finish before
// another is handed out) keeps each regime near its share of the worker time even in a
// short campaign; charging only finished cases hands a large case to every worker that asks
// while the first one runs (tiny then gets under half of a 22 s campaign).
TEST(Campaign, MixSharesHoldWithManyWorkersWhenRunningCasesAreCharged) {
  using generators::ShapeRegime;
  const std::map<ShapeRegime, double> shares{
      {ShapeRegime::kTiny, 0.80}, {ShapeRegime::kEdge, 0.12}, {ShapeRegime::kLarge, 0.08}};
  const std::map<ShapeRegime, double> cost{
      {ShapeRegime::kTiny, 0.05}, {ShapeRegime::kEdge, 2.5}, {ShapeRegime::kLarge, 9.0}};
  auto simulate = [&](bool charge_running, double horizon) {
    struct Worker {
      ShapeRegime regime = ShapeRegime::kTiny;
      double started = 0, ends = 0;
      bool busy = false;
    };
    std::vector<Worker> workers(12);
    std::map<ShapeRegime, double> spent;
    std::map<ShapeRegime, int64_t> finished;
    double now = 0;
    while (now < horizon) {
      for (Worker& w : workers) {
        if (w.busy) continue;
        std::vector<RegimeInFlight> running;
        for (const Worker& o : workers) {
          if (o.busy) running.push_back({o.regime, now - o.started});
        }
        w.regime = charge_running ? next_mix_regime(shares, spent, finished, running) : next_regime(shares, spent);
        w.started = now;
        w.ends = now + cost.at(w.regime);
        w.busy = true;
      }
      Worker* next = &workers[0];
      for (Worker& w : workers) {
        if (w.ends < next->ends) next = &w;
      }
      now = next->ends;
      spent[next->regime] += cost.at(next->regime);
      ++finished[next->regime];
      next->busy = false;
    }
    double total = 0;
    for (const auto& [r, s] : spent) total += s;
    std::map<ShapeRegime, double> share;
    for (const auto& [r, s] : spent) share[r] = s / total;
    return std::make_pair(share, finished);
  };
  for (double horizon : {22.0, 120.0, 600.0}) {
    const auto [share, finished] = simulate(true, horizon);
    SCOPED_TRACE(horizon);
    EXPECT_NEAR(share.at(ShapeRegime::kTiny), 0.80, 0.04);
    EXPECT_NEAR(share.at(ShapeRegime::kEdge), 0.12, 0.03);
    EXPECT_NEAR(share.at(ShapeRegime::kLarge), 0.08, 0.03);
    if (horizon >= 120) {
      // Large cases keep coming: at least one a minute of the campaign.
      EXPECT_GE(finished.at(ShapeRegime::kLarge), static_cast<int64_t>(horizon / 60));
    }
  }
  // The old accounting (finished cases only) on the same 22 s: tiny gets less than asked.
  const auto [old_share, old_finished] = simulate(false, 22.0);
  EXPECT_LT(old_share.at(ShapeRegime::kTiny), 0.6);
}

TEST(Campaign, ChargedRegimeSecondsCountRunningCasesAtTheirExpectedCost) {
  using generators::ShapeRegime;
  const std::map<ShapeRegime, double> spent{{ShapeRegime::kTiny, 10.0}, {ShapeRegime::kEdge, 6.0}};
  const std::map<ShapeRegime, int64_t> finished{{ShapeRegime::kTiny, 200}, {ShapeRegime::kEdge, 2}};
  // An edge case running for 1 s is charged its regime's mean (3 s); one past it, its own time;
  // a large case, with none finished yet, its seconds so far.
  const auto charged = charged_regime_seconds(
      spent, finished, {{ShapeRegime::kEdge, 1.0}, {ShapeRegime::kEdge, 5.0}, {ShapeRegime::kLarge, 0.5}});
  EXPECT_DOUBLE_EQ(charged.at(ShapeRegime::kTiny), 10.0);
  EXPECT_DOUBLE_EQ(charged.at(ShapeRegime::kEdge), 6.0 + 3.0 + 5.0);
  EXPECT_DOUBLE_EQ(charged.at(ShapeRegime::kLarge), 0.5);
}

TEST(Campaign, StopsAtTheTimeBudget) {
  TempDir dir("campaign-time");
  CampaignOptions options;
  options.time_s = 1e-9;
  options.corpus_dir = dir.path();
  RecordingReporter reporter;
  const CampaignOutcome outcome = run_campaign(options, reporter, nullptr);
  EXPECT_LE(outcome.cases_run, 1);
}

TEST(Campaign, FaultFindingIsShrunkSavedWithItsFaultAndDeduplicated) {
  TempDir dir("campaign-fault");
  CampaignOptions options;
  options.cases = 300;
  options.seed = 1;
  options.fault = "scale-bias-grad";
  options.stop_at_first_finding = true;
  options.require_fault_attributable = true;
  options.corpus_dir = dir.path();
  RecordingReporter reporter;
  const CampaignOutcome outcome = run_campaign(options, reporter, nullptr);
  const CampaignFinding* found = outcome.first_attributable();
  // The default campaign must find this fault within the budget: not finding it is a failure.
  ASSERT_NE(found, nullptr) << "scale-bias-grad not found in 300 cases with seed 1";
  // The campaign stopped at the fault's finding; earlier findings fail without the fault too.
  EXPECT_EQ(found, &outcome.findings.back());
  EXPECT_EQ(found->case_number, outcome.cases_run);
  for (const auto& f : outcome.findings) {
    if (&f != found) {
      EXPECT_FALSE(f.fault_attributable);
    }
  }
  const reports::Finding& finding = found->finding;
  const corpus::CaseFile file = corpus::load_case_file(finding.case_file);
  EXPECT_EQ(file.verdict.fault, std::optional<std::string>("scale-bias-grad"));
  // The scales' gradient lands in the wrong slot: the scales get none.
  EXPECT_EQ(file.verdict.kind, harness::VerdictKind::kMissingGradient);
  EXPECT_THAT(finding.reproduce, ::testing::EndsWith(" --fault scale-bias-grad"));
  EXPECT_LE(found->shrunk_ops, campaign_case(options, outcome.cases_run - 1).num_ops());
  // The saved case fails with the fault and passes without it.
  ops::FaultScope off(ops::Fault::kScaleBiasGrad, false);
  EXPECT_TRUE(runner::run_case(file.spec, options.run_options).passed());
}

}  // namespace
}  // namespace gradfuzz::campaign
