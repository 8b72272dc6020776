#include "runner/case_cost.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>

#include "runner/run_case.h"
#include "tests/harness/test_specs.h"

namespace gradfuzz::runner {
namespace {

using ::testing::Contains;
using ::testing::Key;
using ::testing::Not;

/// Spins for `seconds` of wall time (a sleep may oversleep by more on a loaded machine, which
/// would not break the lower bounds below either; spinning keeps the CPU seconds too).
void spin(double seconds) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
  }
}

TEST(CaseCost, NestedStagesAreRecordedExclusiveOfTheirChildrenUnderTheirPath) {
  CaseCostRecorder recorder(true);
  ASSERT_TRUE(case_cost_recording());
  const auto start = std::chrono::steady_clock::now();
  {
    CostStage outer("ablation");
    spin(0.02);
    {
      CostStage inner("paths");
      spin(0.03);
      count_cost("requests", 2);
    }
    count_cost("requests");
  }
  const double outer_total = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const CaseCost cost = recorder.finish();
  EXPECT_FALSE(case_cost_recording());
  ASSERT_THAT(cost.seconds, Contains(Key("ablation")));
  ASSERT_THAT(cost.seconds, Contains(Key("ablation/paths")));
  ASSERT_THAT(cost.seconds, Contains(Key("other")));
  EXPECT_GE(cost.seconds.at("ablation/paths"), 0.03);
  EXPECT_GE(cost.seconds.at("ablation"), 0.02);
  // Exclusive: the two add up to the outer stage's wall time (not the inner one's twice).
  EXPECT_NEAR(cost.seconds.at("ablation") + cost.seconds.at("ablation/paths"), outer_total, 1e-3);
  EXPECT_GT(cost.cpu_seconds.at("ablation/paths"), 0.0);
  EXPECT_EQ(cost.counts.at("ablation/paths/requests"), 2);
  EXPECT_EQ(cost.counts.at("ablation/requests"), 1);
}

TEST(CaseCost, NothingIsRecordedWithoutAnEnabledRecorder) {
  {
    CaseCostRecorder off(false);
    EXPECT_FALSE(case_cost_recording());
    CostStage stage("paths");
    count_cost("requests");
    EXPECT_TRUE(off.finish().seconds.empty());
  }
  CaseCostRecorder on(true);
  CaseCostRecorder nested(true);  // a second one on the thread records nothing
  EXPECT_TRUE(nested.finish().seconds.empty());
  EXPECT_TRUE(case_cost_recording());
}

TEST(CaseCost, RunCaseRecordsItsStagesAndTheBackendsPathRuns) {
  harness::CaseSpec spec;
  spec.ops = {harness::testing::op("Linear", {{"out", 6}}), harness::testing::op("Bias"), harness::testing::op("ReLU")};
  spec.fusions = {"ForwardLinearBiasActivation"};
  spec.dtype = "float64";
  spec.seed = 3;
  CaseCostRecorder recorder(true);
  const harness::CaseResult result = run_case(spec);
  const CaseCost cost = recorder.finish();
  ASSERT_EQ(result.verdict, harness::VerdictKind::kPass);
  for (const char* stage : {"paths/backend", "reference", "judge", "finite_differences", "signatures", "other"}) {
    EXPECT_THAT(cost.seconds, Contains(Key(stage))) << stage;
  }
  // The fused path fired a fusion, so the unfused path ran too, in the same request; no
  // caller tensor changed, so no writer run; no in-place op, so no ablation rerun.
  EXPECT_EQ(cost.counts.at("paths/backend/requests"), 1);
  EXPECT_EQ(cost.counts.at("paths/backend/path:fused"), 1);
  EXPECT_EQ(cost.counts.at("paths/backend/path:unfused"), 1);
  EXPECT_THAT(cost.counts, Not(Contains(Key("paths/backend/writer_runs"))));
  EXPECT_THAT(cost.counts, Not(Contains(Key("ablation/paths/backend/requests"))));
}

}  // namespace
}  // namespace gradfuzz::runner
