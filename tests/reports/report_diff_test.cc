// `report diff`: clusters new in NEW, fixed since LAST and still failing, by cluster key.
#include "reports/report_diff.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sstream>
#include <string>

#include "reports/report_merge.h"
#include "tests/reports/report_test_util.h"

namespace gradfuzz::reports {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::ordered_json;
using test_util::data_report;

/// LAST: an earlier night with clusters A and D; NEW: the two shards merged (A, B, C).
Json new_night() {
  return merge_reports({{"shard-1.json", data_report("shard-1.json")}, {"shard-2.json", data_report("shard-2.json")}});
}

TEST(ReportDiff, ListsNewFixedAndStillFailingClusters) {
  const ReportDiff diff = diff_reports(data_report("last.json"), new_night());
  ASSERT_EQ(diff.added.size(), 2u);
  EXPECT_EQ(diff.added[0].key, "missing_gradient|GroupedLinear|grad_param");
  EXPECT_EQ(diff.added[0].new_count, 1);
  EXPECT_EQ(diff.added[0].last_count, 0);
  EXPECT_EQ(diff.added[1].key, "mismatch|LayerNorm,Linear|output");
  ASSERT_EQ(diff.fixed.size(), 1u);
  EXPECT_EQ(diff.fixed[0].key, "unexpected_error|Linear|fused=locked unfused=none reference=none");
  EXPECT_EQ(diff.fixed[0].last_count, 1);
  ASSERT_EQ(diff.still_failing.size(), 1u);
  EXPECT_EQ(diff.still_failing[0].last_count, 1);
  EXPECT_EQ(diff.still_failing[0].new_count, 5);
  // The repro of a cluster still failing is NEW's.
  EXPECT_EQ(diff.still_failing[0].case_file, "corpus/findings/aaaa000000000001.json");
  EXPECT_TRUE(diff.notes.empty());
}

TEST(ReportDiff, JsonAndTextMatchGolden) {
  const ReportDiff diff = diff_reports(data_report("last.json"), new_night());
  test_util::expect_golden("diff.json", diff_to_json(diff, "last.json", "merged.json").dump(2) + "\n");
  std::ostringstream text;
  print_diff(diff, "last.json", "merged.json", text);
  test_util::expect_golden("diff.txt", text.str());
}

TEST(ReportDiff, AReportComparedWithItselfHasOnlyStillFailingClusters) {
  const Json night = new_night();
  const ReportDiff diff = diff_reports(night, night);
  EXPECT_TRUE(diff.added.empty());
  EXPECT_TRUE(diff.fixed.empty());
  EXPECT_EQ(diff.still_failing.size(), 3u);
}

TEST(ReportDiff, AddsUpCountsOfOneKeyWithinAReport) {
  // Unmerged shard reports may each hold the cluster: compared as one.
  Json last = data_report("shard-2.json");
  last["findings"].push_back(last["findings"][1]);
  const ReportDiff diff = diff_reports(last, data_report("shard-1.json"));
  ASSERT_EQ(diff.still_failing.size(), 1u);
  EXPECT_EQ(diff.still_failing[0].last_count, 6);
}

TEST(ReportDiff, NotesDifferentBackendsAndAnIncompleteNewRun) {
  Json next = new_night();
  next["environment"]["backend"] = "te";
  next["summary"]["complete"] = false;
  const ReportDiff diff = diff_reports(data_report("last.json"), next);
  ASSERT_EQ(diff.notes.size(), 1u);
  EXPECT_THAT(diff.notes[0], HasSubstr("different backends (\"model\" vs \"te\")"));
  std::ostringstream text;
  print_diff(diff, "last.json", "new.json", text);
  EXPECT_THAT(text.str(), HasSubstr("note: new.json is incomplete"));
}

}  // namespace
}  // namespace gradfuzz::reports
