#include "tools/campaign.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <set>
#include <sstream>
#include <string>
#include <unistd.h>

#include "corpus/case_file.h"

namespace gradfuzz::tools {
namespace {

/// A fresh directory under the system temp dir, removed at the end of the test.
class TempDir {
 public:
  explicit TempDir(const std::string& name)
      : path_(std::filesystem::temp_directory_path() /
              ("gradfuzz-" + name + "-" + std::to_string(static_cast<long long>(::getpid())))) {
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
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

size_t count_files(const std::filesystem::path& dir) {
  if (!std::filesystem::exists(dir)) return 0;
  size_t n = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) n += entry.is_regular_file() ? 1 : 0;
  return n;
}

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
  EXPECT_EQ(count_files(dir.path() / kInflightDir), 0u);
  EXPECT_EQ(count_files(dir.path() / kFindingsDir), outcome.findings.size());
  EXPECT_THAT(progress.str(), ::testing::HasSubstr("cases 4"));
  for (const auto& record : reporter.records) EXPECT_FALSE(record.result.op_types.empty());
  // Every finding is saved, loadable, and reproduced by its line.
  for (const auto& finding : outcome.findings) {
    const corpus::CaseFile file = corpus::load_case_file(finding.case_file);
    EXPECT_EQ(file.verdict.kind, finding.result.verdict);
    EXPECT_EQ(finding.reproduce, "gradfuzz replay " + finding.case_file);
  }
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
  options.fault = ops::Fault::kScaleBiasGrad;
  options.stop_at_first_finding = true;
  options.corpus_dir = dir.path();
  RecordingReporter reporter;
  const CampaignOutcome outcome = run_campaign(options, reporter, nullptr);
  if (outcome.findings.empty()) GTEST_SKIP() << "scale-bias-grad not hit in 300 cases with seed 1";
  ASSERT_EQ(outcome.findings.size(), 1u);
  const auto& finding = outcome.findings.front();
  const corpus::CaseFile file = corpus::load_case_file(finding.case_file);
  EXPECT_EQ(file.verdict.fault, std::optional<std::string>("scale-bias-grad"));
  EXPECT_NE(file.verdict.kind, harness::VerdictKind::kPass);
  EXPECT_THAT(finding.reproduce, ::testing::EndsWith(" --fault scale-bias-grad"));
  EXPECT_EQ(outcome.first_failure_case, outcome.cases_run);
  EXPECT_LE(outcome.finding_ops.front(), campaign_case(options, outcome.cases_run - 1).num_ops());
}

}  // namespace
}  // namespace gradfuzz::tools
