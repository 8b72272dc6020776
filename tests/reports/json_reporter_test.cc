// Golden tests of the report document (fuzzer.md "Reports"): a fixed context and fixed
// CaseResults give exactly the checked-in JSON. Volatile fields (git SHA, date, wall time)
// are injected as fixed values. Set GRADFUZZ_UPDATE_GOLDEN=1 to rewrite the golden files
// after an intentional format change (then review the diff).
#include "reports/json_reporter.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "ops/fusion_registry.h"
#include "ops/op_registry.h"
#include "reports/build_info.h"
#include "reports/console_reporter.h"

namespace gradfuzz::reports {
namespace {

using ::testing::HasSubstr;

std::string golden_path(const std::string& name) {
  const char* root = std::getenv("GRADFUZZ_SOURCE_DIR");
  return std::string(root ? root : ".") + "/tests/reports/golden/" + name;
}

/// Compares `text` with the golden file `name` (or rewrites it in update mode).
void expect_golden(const std::string& name, const std::string& text) {
  const std::string path = golden_path(name);
  const char* update = std::getenv("GRADFUZZ_UPDATE_GOLDEN");
  if (update && std::string(update) == "1") {
    std::ofstream(path) << text;
    GTEST_SKIP() << "rewrote " << path;
  }
  std::ifstream in(path);
  ASSERT_TRUE(in) << "missing golden file " << path;
  std::stringstream golden;
  golden << in.rdbuf();
  EXPECT_EQ(text, golden.str()) << "report differs from " << path;
}

ReportContext fixed_context(const std::string& command, std::optional<std::string> fault) {
  ReportContext c;
  c.tool = ToolInfo{"gradfuzz", "0.1.0", "abc1234"};
  c.environment = EnvironmentInfo{"2.11.0", "cpu", "cpu", "model", {}};
  c.campaign.command = command;
  c.campaign.seed = 7;
  c.campaign.cases_requested = 2;
  c.campaign.dtypes = {"float64", "float32"};
  c.campaign.devices = {"cpu"};
  c.campaign.fault = std::move(fault);
  c.coverage_names.ops = {"Linear", "Bias", "ReLU", "Dispatch"};
  c.coverage_names.fusions = {"ForwardLinearBiasActivation", "BackwardActivationBias"};
  c.coverage_names.features = {"bound_input", "public_input", "fresh_producer", "no_grad_input"};
  c.date = "2025-01-31T12:00:00Z";
  return c;
}

harness::CaseResult passing_result() {
  harness::CaseResult r;
  r.seed = 11;
  r.op_types = {"Linear", "Bias", "ReLU"};
  r.fusions_fired = {"ForwardLinearBiasActivation"};
  r.features = {"public_input"};
  return r;
}

harness::CaseResult mismatch_result() {
  harness::CaseResult r;
  r.verdict = harness::VerdictKind::kMismatch;
  r.seed = 12;
  r.op_types = {"Dispatch", "Linear"};
  r.features = {"bound_input", "fresh_producer"};
  harness::Finding d;
  d.kind = harness::VerdictKind::kMismatch;
  d.signature = "mismatch|ForwardLinearBiasAdd|grad_channel";
  d.op = "ForwardLinearBiasAdd";
  d.path_pair = "fused~reference";
  d.tensor = "grad_channel[probs]";
  d.role = "grad_channel";
  d.index = {3};
  d.expected = 0.5;
  d.got = 0.25;
  d.max_abs_err = 0.25;
  d.max_rel_err = 0.5;
  d.atol = 1e-7;
  d.rtol = 1e-7;
  r.findings = {d};
  return r;
}

/// A passing case, counted in summary and coverage only.
CaseRecord passing_record() {
  CaseRecord record;
  record.result = passing_result();
  return record;
}

CaseRecord finding_record(const std::optional<std::string>& fault) {
  CaseRecord record;
  record.result = mismatch_result();
  // The case ran under a recipe; the cluster's second member (cluster_member) without one.
  record.recipe = "DelayedScaling";
  Finding f;
  f.result = mismatch_result();
  f.case_file = "gradfuzz-out/corpus/findings/0123456789abcdef.json";
  f.reproduce = reproduce_line(f.case_file, fault);
  f.fault = fault;
  f.dtype = "float32";
  f.recipe = harness::RecipeSpec{"DelayedScaling", "HYBRID", {{"amax_history_len", "16"}, {"margin", "0"}}};
  f.signature = f.result.findings.front().signature;
  record.new_findings = {f};
  // The failing case is the first of its cluster, which one more member joins below.
  record.clusters = {f.signature};
  return record;
}

/// A later failing case counted in the finding's cluster, saved as an example.
CaseRecord cluster_member() {
  CaseRecord record;
  record.result = mismatch_result();
  record.recipe = kNoRecipe;
  const std::string key = record.result.findings.front().signature;
  record.clusters = {key};
  record.example_files = {{key, "gradfuzz-out/corpus/findings/examples/fedcba9876543210.json"}};
  return record;
}

TEST(JsonReporter, FuzzReportMatchesGolden) {
  std::ostringstream out;
  JsonReporter reporter(out);
  reporter.report_context(fixed_context("fuzz", std::string("internal-requires-grad")));
  reporter.report_case(passing_record());
  reporter.report_case(finding_record(std::string("internal-requires-grad")));
  reporter.report_case(cluster_member());
  reporter.finalize(RunSummary{2.5, std::nullopt});
  expect_golden("fuzz_report.json", out.str());
}

TEST(JsonReporter, SelftestReportMatchesGolden) {
  std::ostringstream out;
  JsonReporter reporter(out);
  reporter.report_context(fixed_context("selftest", std::nullopt));
  reporter.report_case(passing_record());
  reporter.report_case(finding_record(std::string("slot-order")));
  SelftestEntry found;
  found.name = "slot-order";
  found.detected = true;
  found.cases_to_detect = 2;
  found.seconds_to_detect = 0.75;
  found.shrunk_ops = 2;
  found.case_file = "gradfuzz-out/selftest/slot-order/findings/0123456789abcdef.json";
  found.replay_with_fault_exit = 1;
  found.replay_without_fault_exit = 0;
  SelftestEntry missed;
  missed.name = "transient-lock";
  reporter.finalize(RunSummary{4.0, std::vector<SelftestEntry>{found, missed}});
  expect_golden("selftest_report.json", out.str());
}

TEST(JsonReporter, ListsZeroCountsForEveryCatalogOpAndFusion) {
  ReportContext context = fixed_context("fuzz", std::nullopt);
  context.coverage_names = catalog_coverage_names({"bound_input"});
  std::ostringstream out;
  JsonReporter reporter(out);
  reporter.report_context(context);
  const auto doc = reporter.document(RunSummary{});
  for (const auto& name : ops::OpRegistry::catalog().names()) {
    ASSERT_TRUE(doc["coverage"]["ops"].contains(name)) << name;
    EXPECT_EQ(doc["coverage"]["ops"][name], 0) << name;
  }
  for (const auto& name : ops::FusionRegistry::catalog().names()) {
    ASSERT_TRUE(doc["coverage"]["fusions"].contains(name)) << name;
  }
  EXPECT_EQ(doc["coverage"]["features"]["bound_input"], 0);
  EXPECT_EQ(doc["summary"]["cases_per_s"], 0.0);  // no time measured: 0, not infinity
}

TEST(JsonReporter, CountsCoverageNamesOutsideTheListedOnes) {
  std::ostringstream out;
  JsonReporter reporter(out);
  ReportContext context = fixed_context("fuzz", std::nullopt);
  context.coverage_names = {};
  reporter.report_context(context);
  reporter.report_case(passing_record());
  reporter.report_case(passing_record());
  const auto doc = reporter.document(RunSummary{1.0, std::nullopt});
  EXPECT_EQ(doc["coverage"]["ops"]["Linear"], 2);
  EXPECT_EQ(doc["coverage"]["fusions"]["ForwardLinearBiasActivation"], 2);
  EXPECT_EQ(doc["summary"]["cases_per_s"], 2.0);
}

TEST(JsonReporter, FindingCarriesItsDtypeRecipeAndAClusterKeyOtherThanItsSignature) {
  Finding f;
  f.result = mismatch_result();
  f.case_file = "x.json";
  f.dtype = "float32";
  f.signature = f.result.findings.front().signature;
  f.cluster = f.signature + "|persists-without-fault";
  auto j = finding_to_json(f);
  EXPECT_EQ(j["dtype"], "float32");
  EXPECT_EQ(j["cluster"], "mismatch|ForwardLinearBiasAdd|grad_channel|persists-without-fault");
  // The recipe goes with the dtype (both from the saved case): null for a case without one.
  EXPECT_TRUE(j["recipe"].is_null());
  f.recipe = harness::RecipeSpec{"Float8CurrentScaling", "E4M3", {{"backward_override", "dequantized"}}};
  j = finding_to_json(f);
  EXPECT_EQ(j["recipe"], (nlohmann::ordered_json{{"name", "Float8CurrentScaling"},
                                                 {"fp8_format", "E4M3"},
                                                 {"options", {{"backward_override", "dequantized"}}}}));
  // None is written when it says nothing: no dtype known (so no recipe either), a cluster that
  // is the signature.
  f.dtype.clear();
  f.cluster = f.signature;
  j = finding_to_json(f);
  EXPECT_FALSE(j.contains("dtype"));
  EXPECT_FALSE(j.contains("recipe"));
  EXPECT_FALSE(j.contains("cluster"));
}

// `known accept` names the recipe of a cluster seen under one only: the report counts a
// cluster's cases per recipe (cases whose recipe is not known are not counted).
TEST(JsonReporter, CountsAClustersCasesPerRecipe) {
  std::ostringstream out;
  JsonReporter reporter(out);
  reporter.report_context(fixed_context("fuzz", std::nullopt));
  reporter.report_case(finding_record(std::nullopt));
  reporter.report_case(cluster_member());
  reporter.report_case(cluster_member());
  CaseRecord unknown = cluster_member();
  unknown.recipe.clear();
  reporter.report_case(unknown);
  const auto doc = reporter.document(RunSummary{1.0, std::nullopt});
  ASSERT_EQ(doc["findings"].size(), 1U);
  EXPECT_EQ(doc["findings"][0]["count"], 4);
  EXPECT_EQ(doc["findings"][0]["recipes"], (nlohmann::ordered_json{{"DelayedScaling", 1}, {"none", 2}}));
}

TEST(JsonReporter, AKnownClusterCarriesItsEntryAndCountsAsKnown) {
  std::ostringstream out;
  JsonReporter reporter(out);
  reporter.report_context(fixed_context("fuzz", std::nullopt));
  CaseRecord record = finding_record(std::nullopt);
  record.result.findings.front().known = "te-review-3";
  record.new_findings.front().result = record.result;
  record.new_findings.front().known = KnownRef{"te-review-3", "open-defect", "https://example/3", "call then bind"};
  reporter.report_case(record);
  reporter.report_case(finding_record(std::nullopt));  // a second, new, finding of the same cluster key
  const auto doc = reporter.document(RunSummary{1.0, std::nullopt});
  EXPECT_EQ(doc["summary"]["failed"], 2);
  EXPECT_EQ(doc["summary"]["known_failed"], 1);  // the first case's only finding is known
  EXPECT_EQ(doc["findings"][0]["known"]["id"], "te-review-3");
  EXPECT_EQ(doc["findings"][0]["known"]["status"], "open-defect");
  EXPECT_EQ(doc["findings"][0]["details"][0]["known"], "te-review-3");
  EXPECT_EQ(doc["summary"]["known_findings"], 1);
}

// Known findings counted by cause (issue 13: the known causes as a handful of rows however
// many signatures they take): one row per entry, its cases and its distinct signatures.
TEST(JsonReporter, KnownFindingsAreCountedPerEntryWithTheirCasesAndSignatures) {
  std::ostringstream out;
  JsonReporter reporter(out);
  reporter.report_context(fixed_context("fuzz", std::nullopt));
  auto known_record = [](const std::vector<std::pair<std::string, std::string>>& findings) {
    CaseRecord record = finding_record(std::nullopt);
    const harness::Finding model = record.result.findings.front();
    record.result.findings.clear();
    for (const auto& [signature, id] : findings) {
      harness::Finding f = model;
      f.signature = signature;
      f.known = id;
      record.result.findings.push_back(f);
    }
    record.new_findings.clear();
    return record;
  };
  // Entry a: two signatures over two cases (one case has both); entry b: one case.
  reporter.report_case(known_record({{"s1", "a"}, {"s2", "a"}, {"s3", "b"}}));
  reporter.report_case(known_record({{"s1", "a"}}));
  reporter.report_case(known_record({{"s4", ""}}));  // a new finding counts in no entry
  const auto doc = reporter.document(RunSummary{1.0, std::nullopt});
  EXPECT_EQ(doc["summary"]["known_causes"], 2);
  ASSERT_EQ(doc["known"].size(), 2U);
  EXPECT_EQ(doc["known"][0], (nlohmann::ordered_json{{"id", "a"}, {"cases", 2}, {"signatures", 2}}));
  EXPECT_EQ(doc["known"][1], (nlohmann::ordered_json{{"id", "b"}, {"cases", 1}, {"signatures", 1}}));
}

TEST(JsonReporter, AClusterListsOnlyItsOwnFindingsAndNamesTheOthers) {
  Finding f;
  f.result = mismatch_result();
  harness::Finding other;
  other.kind = harness::VerdictKind::kModifiedInput;
  other.tensor = "cotangent[0]";
  other.signature = "modified_input|MakeExtraOutput|in_place=1|cotangent";
  f.result.findings.push_back(other);
  f.signature = f.result.findings.front().signature;
  const auto j = finding_to_json(f);
  ASSERT_EQ(j["details"].size(), 1u);
  EXPECT_EQ(j["details"][0]["tensor"], "grad_channel[probs]");
  EXPECT_EQ(j["other_signatures"][0], other.signature);
  EXPECT_EQ(j["kind"], "mismatch");
}

TEST(ReproduceLine, NamesTheFaultOnlyWhenOneWasOn) {
  EXPECT_EQ(reproduce_line("corpus/regression/ab.json", std::nullopt), "gradfuzz replay corpus/regression/ab.json");
  EXPECT_EQ(reproduce_line("x.json", std::string("slot-order")), "gradfuzz replay x.json --fault slot-order");
}

TEST(ConsoleReporter, PrintsOneReproduceLinePerFindingAndASummary) {
  std::ostringstream out;
  ConsoleReporter reporter(out);
  reporter.report_context(fixed_context("fuzz", std::nullopt));
  reporter.report_case(passing_record());
  reporter.report_case(finding_record(std::nullopt));
  reporter.finalize(RunSummary{2.0, std::nullopt});
  EXPECT_THAT(out.str(), HasSubstr("gradfuzz replay gradfuzz-out/corpus/findings/0123456789abcdef.json\n"));
  EXPECT_THAT(out.str(), HasSubstr("fuzz: 2 cases, 1 failed, 1 findings"));
}

TEST(BuildInfo, ReportsToolNameVersionAndTorchVersion) {
  const ToolInfo info = build_tool_info();
  EXPECT_EQ(info.name, "gradfuzz");
  EXPECT_FALSE(info.version.empty());
  EXPECT_FALSE(info.git_sha.empty());
  EXPECT_THAT(torch_version(), ::testing::StartsWith("2."));
}

}  // namespace
}  // namespace gradfuzz::reports
