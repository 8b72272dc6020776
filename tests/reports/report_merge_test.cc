// `report merge`: shards of one campaign join into the unsharded campaign's report, and
// reports of different campaigns are refused naming the file and the field.
#include "reports/report_merge.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "reports/report_document.h"
#include "tests/reports/report_test_util.h"

namespace gradfuzz::reports {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Json = nlohmann::ordered_json;
using test_util::data_report;

std::vector<NamedReport> two_shards() {
  return {{"shard-1.json", data_report("shard-1.json")}, {"shard-2.json", data_report("shard-2.json")}};
}

std::string merge_error(std::vector<NamedReport> inputs) {
  try {
    merge_reports(std::move(inputs));
  } catch (const ReportError& e) {
    return e.what();
  }
  ADD_FAILURE() << "merged";
  return "";
}

TEST(ReportMerge, TwoShardsMatchGolden) {
  const Json merged = merge_reports(two_shards());
  EXPECT_NO_THROW(check_report(merged, "merged"));
  test_util::expect_golden("merged_report.json", merged.dump(2) + "\n");
}

TEST(ReportMerge, SumsCountsTakesTheLongestWallTimeAndRecomputesTheRate) {
  const Json merged = merge_reports(two_shards());
  const Json& s = merged["summary"];
  EXPECT_EQ(s["cases_run"], 12);
  EXPECT_EQ(s["passed"], 5);
  EXPECT_EQ(s["failed"], 7);
  EXPECT_EQ(s["wall_s"], 3.0);       // the slowest shard: they ran side by side
  EXPECT_EQ(s["cases_per_s"], 4.0);  // 12 cases / 3 s, not the mean of 3 and 2 cases/s
  EXPECT_EQ(s["findings"], 3);       // clusters after merging, not 2 + 2
  EXPECT_EQ(s["complete"], true);
  EXPECT_EQ(merged["campaign"]["cases_requested"], 12);
  EXPECT_EQ(merged["campaign"]["workers"], 4);
  EXPECT_TRUE(merged["campaign"]["shard"].is_null());
  EXPECT_EQ(merged["date"], "2026-12-01T02:00:03Z");  // the earliest start
  EXPECT_EQ(merged["environment"]["device_name"], "cpu, cpu (host b)");
}

TEST(ReportMerge, SumsCoverageKeepingNamesSeenInOneShardOnly) {
  const Json c = merge_reports(two_shards())["coverage"];
  EXPECT_EQ(c["ops"]["Linear"], 9);
  EXPECT_EQ(c["ops"]["LayerNorm"], 2);
  EXPECT_EQ(c["ops"]["Bias"], 1);
  EXPECT_EQ(c["fusions"]["BackwardActivationBias"], 2);
  EXPECT_EQ(c["features"]["fanout"], 1);
  EXPECT_EQ(c["fused_ops"]["backward"]["BackwardActivationBias"], 2);
  EXPECT_EQ(c["kernels"]["grouped_linear_forward"]["launches"], 4);
}

TEST(ReportMerge, MergesClustersSummingCountsAndKeepingThreeExamples) {
  const Json findings = merge_reports(two_shards())["findings"];
  ASSERT_EQ(findings.size(), 3u);
  const Json& a = findings[0];
  EXPECT_EQ(a["signature"], "mismatch|Dispatch,Linear|grad_channel");
  EXPECT_EQ(a["count"], 5);
  // The first shard's case is the representative; examples joined in shard order, cut at 3.
  EXPECT_EQ(a["case_file"], "corpus/findings/aaaa000000000001.json");
  EXPECT_THAT(a["examples"].get<std::vector<std::string>>(),
              ElementsAre("corpus/findings/examples/a1.json", "corpus/findings/examples/a2.json",
                          "corpus/findings/examples/a3.json"));
  EXPECT_EQ(findings[2]["signature"], "mismatch|LayerNorm,Linear|output");
  EXPECT_EQ(findings[2]["count"], 1);
}

// A cluster's cases per recipe (what `known accept` reads) add up like its count; a shard
// that does not count them (an older gradfuzz) leaves the merged cluster without counts
// rather than with partial ones.
TEST(ReportMerge, SumsAClustersCasesPerRecipeOnlyWhenEveryShardCountsThem) {
  std::vector<NamedReport> inputs = two_shards();
  inputs[0].doc["findings"][0]["recipes"] = Json{{"DelayedScaling", 2}, {"none", 1}};
  inputs[1].doc["findings"][1]["recipes"] = Json{{"none", 1}, {"Float8CurrentScaling", 1}};
  Json merged = merge_reports(inputs);
  EXPECT_NO_THROW(check_report(merged, "merged"));
  EXPECT_EQ(merged["findings"][0]["recipes"], (Json{{"DelayedScaling", 2}, {"none", 2}, {"Float8CurrentScaling", 1}}));
  inputs[1].doc["findings"][1].erase("recipes");
  merged = merge_reports(inputs);
  EXPECT_FALSE(merged["findings"][0].contains("recipes"));
}

TEST(ReportMerge, TakesShardsInShardOrderWhateverTheArgumentOrder) {
  std::vector<NamedReport> reversed = two_shards();
  std::swap(reversed[0], reversed[1]);
  EXPECT_EQ(merge_reports(reversed), merge_reports(two_shards()));
}

TEST(ReportMerge, KeepsClustersApartWhenTheirClusterKeysDiffer) {
  std::vector<NamedReport> inputs = two_shards();
  inputs[1].doc["findings"][1]["cluster"] = "mismatch|Dispatch,Linear|grad_channel|persists-without-fault";
  EXPECT_EQ(merge_reports(inputs)["findings"].size(), 4u);
}

TEST(ReportMerge, IsIncompleteWhenAnInputIs) {
  std::vector<NamedReport> inputs = two_shards();
  inputs[1].doc["summary"]["complete"] = false;
  const Json merged = merge_reports(inputs);
  EXPECT_EQ(merged["summary"]["complete"], false);
  EXPECT_EQ(merged["merge"]["inputs"][1]["complete"], false);
}

TEST(ReportMerge, IsIncompleteAndListsTheMissingShards) {
  std::vector<NamedReport> inputs = two_shards();
  inputs[0].doc["campaign"]["shard"] = "1/3";
  inputs[1].doc["campaign"]["shard"] = "3/3";
  const Json merged = merge_reports(inputs);
  EXPECT_EQ(merged["summary"]["complete"], false);
  EXPECT_EQ(merged["merge"]["missing_shards"], Json::array({"2/3"}));
  EXPECT_EQ(merged["merge"]["shards"], 3);
}

TEST(ReportMerge, TakesOneUnshardedReportAlone) {
  Json doc = data_report("last.json");
  const Json merged = merge_reports({{"last.json", doc}});
  EXPECT_EQ(merged["summary"]["cases_run"], 10);
  EXPECT_TRUE(merged["merge"]["shards"].is_null());
  EXPECT_EQ(merged["summary"]["complete"], true);
}

TEST(ReportMerge, RefusesDifferentCampaignSeeds) {
  std::vector<NamedReport> inputs = two_shards();
  inputs[1].doc["campaign"]["seed"] = 8;
  EXPECT_THAT(merge_error(inputs), HasSubstr("shard-2.json: /campaign/seed: 8 differs from 7 in shard-1.json"));
}

TEST(ReportMerge, RefusesDifferentToolVersions) {
  std::vector<NamedReport> inputs = two_shards();
  inputs[0].doc["tool"]["version"] = "0.2.0";
  EXPECT_THAT(merge_error(inputs),
              HasSubstr("shard-2.json: /tool/version: \"0.1.0\" differs from \"0.2.0\" in shard-1.json"));
  inputs = two_shards();
  inputs[1].doc["tool"]["git_sha"] = "def5678";
  EXPECT_THAT(merge_error(inputs), HasSubstr("shard-2.json: /tool/git_sha: \"def5678\" differs from \"abc1234\""));
}

TEST(ReportMerge, RefusesDifferentBackends) {
  std::vector<NamedReport> inputs = two_shards();
  inputs[1].doc["environment"]["backend"] = "te";
  EXPECT_THAT(merge_error(inputs),
              HasSubstr("shard-2.json: /environment/backend: \"te\" differs from \"model\" in shard-1.json"));
}

TEST(ReportMerge, RefusesDifferentDtypesAndFaults) {
  std::vector<NamedReport> inputs = two_shards();
  inputs[1].doc["campaign"]["dtypes"] = Json::array({"float32"});
  EXPECT_THAT(merge_error(inputs), HasSubstr("shard-2.json: /campaign/dtypes:"));
  inputs = two_shards();
  inputs[1].doc["campaign"]["fault"] = "slot-order";
  EXPECT_THAT(merge_error(inputs), HasSubstr("shard-2.json: /campaign/fault: \"slot-order\" differs from null"));
}

TEST(ReportMerge, RefusesShardsOfDifferentCounts) {
  std::vector<NamedReport> inputs = two_shards();
  inputs[1].doc["campaign"]["shard"] = "2/3";
  EXPECT_THAT(merge_error(inputs),
              HasSubstr("shard-2.json: /campaign/shard: 2/3 is of 3 shards, but shard-1.json is of 2"));
}

TEST(ReportMerge, RefusesTheSameShardTwice) {
  std::vector<NamedReport> inputs = two_shards();
  inputs.push_back({"copy.json", inputs[0].doc});
  EXPECT_THAT(merge_error(inputs), HasSubstr("copy.json: /campaign/shard: 1/2 is also the shard of shard-1.json"));
}

TEST(ReportMerge, RefusesAnUnshardedReportAmongOthers) {
  std::vector<NamedReport> inputs = two_shards();
  inputs.push_back({"last.json", data_report("last.json")});
  EXPECT_THAT(merge_error(inputs), HasSubstr("last.json: /campaign/shard: null: not a shard of a campaign"));
}

TEST(ReportMerge, RefusesASelftestReport) {
  const Json selftest = load_report(test_util::golden_path("selftest_report.json"));
  EXPECT_THAT(merge_error({{"selftest.json", selftest}}), HasSubstr("selftest.json: /selftest: a selftest report"));
}

TEST(ReportMerge, RefusesACountThatOverflowsWhenSummed) {
  std::vector<NamedReport> inputs = two_shards();
  inputs[0].doc["coverage"]["ops"]["Linear"] = INT64_MAX;
  EXPECT_THAT(merge_error(inputs), HasSubstr("shard-2.json: /coverage/ops/Linear: the sum over the inputs overflows"));
}

TEST(ReportMerge, RefusesNoInput) { EXPECT_THAT(merge_error({}), HasSubstr("report merge: no input report")); }

}  // namespace
}  // namespace gradfuzz::reports
