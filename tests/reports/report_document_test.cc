// Reading report documents: every report gradfuzz writes is accepted, and each way a file
// can be wrong is refused with the file name and the JSON path of the problem.
#include "reports/report_document.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "tests/reports/report_test_util.h"

namespace gradfuzz::reports {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;
using Json = nlohmann::ordered_json;
using test_util::data_report;

/// The message of the ReportError that parse_report raises for `doc`.
std::string error_of(const Json& doc) {
  try {
    check_report(doc, "night.json");
  } catch (const ReportError& e) {
    return e.what();
  }
  ADD_FAILURE() << "accepted " << doc.dump();
  return "";
}

std::string parse_error_of(const std::string& text) {
  try {
    parse_report(text, "night.json");
  } catch (const ReportError& e) {
    return e.what();
  }
  ADD_FAILURE() << "accepted " << text.substr(0, 80);
  return "";
}

TEST(ReportDocument, AcceptsTheGoldenReportsOfTheJsonReporter) {
  EXPECT_NO_THROW(load_report(test_util::golden_path("fuzz_report.json")));
  EXPECT_NO_THROW(load_report(test_util::golden_path("selftest_report.json")));
  EXPECT_NO_THROW(data_report("shard-1.json"));
}

TEST(ReportDocument, AcceptsNullErrorsOfNanDetails) {
  const Json doc = data_report("shard-2.json");
  EXPECT_TRUE(doc["findings"][0]["details"][0]["max_abs_err"].is_null());
}

TEST(ReportDocument, RefusesTextThatIsNotJsonNamingTheFile) {
  EXPECT_THAT(parse_error_of("{\"schema_version\": 1,"), StartsWith("night.json: not valid JSON"));
  EXPECT_THAT(parse_error_of(""), StartsWith("night.json: not valid JSON"));
}

TEST(ReportDocument, RefusesANumberThatOverflowsNamingTheFile) {
  EXPECT_THAT(parse_error_of("{\"schema_version\": 1E400}"), StartsWith("night.json: not valid JSON"));
}

TEST(ReportDocument, RefusesDeepNestingBeforeParsing) {
  const std::string deep = std::string(60000, '[') + std::string(60000, ']');
  EXPECT_THAT(parse_error_of(deep), HasSubstr("night.json: not a gradfuzz report: JSON nested deeper than 64"));
}

TEST(ReportDocument, RefusesAnotherSchemaVersion) {
  Json doc = data_report("shard-1.json");
  doc["schema_version"] = 2;
  EXPECT_THAT(error_of(doc), HasSubstr("night.json: /schema_version: expected 1"));
  EXPECT_THAT(error_of(Json::object()), HasSubstr("night.json: /schema_version: missing"));
}

TEST(ReportDocument, RefusesAMissingSummaryCount) {
  Json doc = data_report("shard-1.json");
  doc["summary"].erase("cases_run");
  EXPECT_EQ(error_of(doc), "night.json: /summary/cases_run: missing (expected a non-negative integer)");
}

TEST(ReportDocument, RefusesANegativeCoverageCountNamingItsPath) {
  Json doc = data_report("shard-1.json");
  doc["coverage"]["ops"]["Linear"] = -1;
  EXPECT_EQ(error_of(doc), "night.json: /coverage/ops/Linear: expected a non-negative integer, got number -1");
}

TEST(ReportDocument, RefusesAWrongTypeInAFindingsDetail) {
  Json doc = data_report("shard-1.json");
  doc["findings"][1]["details"][0]["atol"] = "1e-5";
  EXPECT_EQ(error_of(doc), "night.json: /findings/1/details/0/atol: expected a number or null, got string \"1e-5\"");
}

TEST(ReportDocument, RefusesAMalformedRecipeOfAFindingNamingItsPath) {
  Json doc = data_report("shard-1.json");
  doc["findings"][0]["recipe"] =
      Json{{"name", "DelayedScaling"}, {"fp8_format", "HYBRID"}, {"options", {{"margin", 1}}}};
  EXPECT_EQ(error_of(doc), "night.json: /findings/0/recipe/options/margin: expected a string, got number 1");
  doc["findings"][0]["recipe"] = "DelayedScaling";
  EXPECT_EQ(error_of(doc), "night.json: /findings/0/recipe: expected an object, got string \"DelayedScaling\"");
  doc["findings"][0]["recipe"] = nullptr;  // a case without a recipe
  doc["findings"][0]["recipes"] = Json{{"none", -1}};
  EXPECT_EQ(error_of(doc), "night.json: /findings/0/recipes/none: expected a non-negative integer, got number -1");
}

// What report merge and diff read of a finding's case: its recipe, or that it is not recorded.
TEST(ReportDocument, ReadsTheRecipeAFindingRecords) {
  Json f = data_report("shard-1.json")["findings"][0];
  EXPECT_FALSE(finding_recipe(f).has_value());  // an older report: not recorded
  f["recipe"] = nullptr;
  ASSERT_TRUE(finding_recipe(f).has_value());
  EXPECT_FALSE(finding_recipe(f)->has_value());  // recorded: no recipe
  f["recipe"] =
      Json{{"name", "Float8BlockScaling"}, {"fp8_format", "E4M3"}, {"options", {{"backward_override", "none"}}}};
  const harness::RecipeSpec expected{"Float8BlockScaling", "E4M3", {{"backward_override", "none"}}};
  EXPECT_EQ(finding_recipe(f), std::optional<std::optional<harness::RecipeSpec>>(expected));
}

TEST(ReportDocument, RefusesAZeroClusterCount) {
  Json doc = data_report("shard-1.json");
  doc["findings"][0]["count"] = 0;
  EXPECT_THAT(error_of(doc), HasSubstr("night.json: /findings/0/count: expected a count of at least 1"));
}

TEST(ReportDocument, RefusesAShardOutsideItsCount) {
  Json doc = data_report("shard-1.json");
  doc["campaign"]["shard"] = "3/2";
  EXPECT_THAT(error_of(doc),
              HasSubstr("night.json: /campaign/shard: expected \"i/N\" with 1 <= i <= N, got string \"3/2\""));
}

TEST(ReportDocument, RefusesAReportThatIsNotAnObject) {
  EXPECT_EQ(error_of(Json::array()), "night.json: /: expected a report object, got an array");
}

TEST(ReportDocument, RefusesAMissingFileAndADirectory) {
  try {
    load_report("/nonexistent/night.json");
    ADD_FAILURE() << "loaded a missing file";
  } catch (const ReportError& e) {
    EXPECT_THAT(e.what(), HasSubstr("/nonexistent/night.json: cannot read the report: No such file"));
  }
  try {
    load_report(test_util::data_path(""));
    ADD_FAILURE() << "loaded a directory";
  } catch (const ReportError& e) {
    EXPECT_THAT(e.what(), HasSubstr("cannot read the report: it is a directory"));
  }
}

TEST(ReportDocument, ReadsTheFileItIsGiven) {
  const std::string dir = test_util::make_temp_dir();
  std::ofstream(dir + "/empty.json") << "{}";
  try {
    load_report(dir + "/empty.json");
    ADD_FAILURE() << "loaded {}";
  } catch (const ReportError& e) {
    // A run killed before its first snapshot leaves "{}": the message says so plainly.
    EXPECT_EQ(std::string(e.what()),
              dir + "/empty.json: /schema_version: missing (expected the report schema version)");
  }
  test_util::remove_dir(dir);
}

TEST(ClusterKey, IsTheClusterWhenPresentElseTheSignature) {
  Json f{{"signature", "mismatch|Linear|output"}};
  EXPECT_EQ(cluster_key(f), "mismatch|Linear|output");
  f["cluster"] = "mismatch|Linear|output|persists-without-fault";
  EXPECT_EQ(cluster_key(f), "mismatch|Linear|output|persists-without-fault");
}

TEST(ClusterCount, IsOneForAFindingWithoutCount) {
  EXPECT_EQ(cluster_count(Json{{"signature", "s"}}), 1);
  EXPECT_EQ(cluster_count(Json{{"signature", "s"}, {"count", 4}}), 4);
}

}  // namespace
}  // namespace gradfuzz::reports
