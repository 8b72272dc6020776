#include "tools/cli.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "campaign/files.h"
#include "corpus/case_file.h"
#include "ops/faults.h"

namespace gradfuzz::tools {

using campaign::make_temp_dir;
using campaign::remove_tree;
namespace {

using ::testing::HasSubstr;

struct CliRun {
  int exit = -1;
  std::string out;
  std::string err;
};

CliRun run(const std::vector<std::string>& args) {
  std::ostringstream out;
  std::ostringstream err;
  CliRun r;
  r.exit = run_cli(args, out, err, /*terminal=*/false);
  r.out = out.str();
  r.err = err.str();
  return r;
}

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = make_temp_dir(std::string("gradfuzz-cli-") +
                         ::testing::UnitTest::GetInstance()->current_test_info()->name() + "-");
  }
  void TearDown() override { remove_tree(dir_); }

  /// A valid one-op case file document.
  static nlohmann::json valid_document() {
    harness::CaseSpec spec;
    harness::OpSpec linear;
    linear.name = "Linear";
    spec.ops = {linear};
    spec.input_shape = {4, 8};
    spec.seed = 5;
    return corpus::case_file_to_json(corpus::make_case_file(spec, corpus::ExpectedVerdict{}, 0, "0.1.0", std::nullopt));
  }

  std::string write(const std::string& name, const std::string& text) const {
    const std::filesystem::path path = dir_ / name;
    std::ofstream(path) << text;
    return path.string();
  }

  std::filesystem::path dir_;
};

TEST_F(CliTest, ListFaultsPrintsEveryFaultName) {
  const CliRun r = run({"list", "faults"});
  EXPECT_EQ(r.exit, 0);
  for (ops::Fault fault : ops::all_faults()) {
    EXPECT_THAT(r.out, HasSubstr(ops::fault_name(fault) + "\t" + ops::fault_description(fault) + "\n"));
  }
}

TEST_F(CliTest, ListOpsJsonIsAnArrayOfNamedEntries) {
  const CliRun r = run({"list", "ops", "--json"});
  ASSERT_EQ(r.exit, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_TRUE(j.is_array());
  ASSERT_FALSE(j.empty());
  EXPECT_TRUE(j.front().contains("name"));
  EXPECT_EQ(run({"list", "fusions"}).exit, 0);
}

TEST_F(CliTest, BadFlagsAreUsageErrors) {
  EXPECT_EQ(run({}).exit, 2);
  EXPECT_EQ(run({"bogus"}).exit, 2);
  EXPECT_EQ(run({"fuzz", "--cases", "abc"}).exit, 2);
  EXPECT_EQ(run({"fuzz", "--cases", "3", "--time", "2"}).exit, 2);
  EXPECT_EQ(run({"list", "things"}).exit, 2);
  const CliRun dtype = run({"fuzz", "--cases", "1", "--dtypes", "float8"});
  EXPECT_EQ(dtype.exit, 2);
  EXPECT_THAT(dtype.err, HasSubstr("float8"));
  const CliRun fault = run({"fuzz", "--cases", "1", "--fault", "no-such-fault"});
  EXPECT_EQ(fault.exit, 2);
  EXPECT_THAT(fault.err, HasSubstr("slot-order"));  // the message lists the known names
  EXPECT_EQ(run({"selftest", "--faults", "nope"}).exit, 2);
  EXPECT_EQ(run({"fuzz", "--device", "tpu"}).exit, 2);
}

TEST_F(CliTest, HelpExitsZero) { EXPECT_EQ(run({"--help"}).exit, 0); }

TEST_F(CliTest, ReplayOfAMissingPathIsAnInputError) {
  const CliRun r = run({"replay", (dir_ / "absent.json").string()});
  EXPECT_EQ(r.exit, 2);
  EXPECT_THAT(r.err, HasSubstr("absent.json"));
}

TEST_F(CliTest, ReplayRejectsASyntaxErrorNamingTheFile) {
  const std::string path = write("syntax.json", "{\"schema_version\": 1, \"spec\": [");
  const CliRun r = run({"replay", path});
  EXPECT_EQ(r.exit, 2);
  EXPECT_THAT(r.err, HasSubstr("syntax.json"));
}

TEST_F(CliTest, ReplayRejectsATextFileThatIsNotJson) {
  const std::string path = write("notjson.json", "this is not a case file\n");
  const CliRun r = run({"replay", path});
  EXPECT_EQ(r.exit, 2);
  EXPECT_THAT(r.err, HasSubstr("notjson.json"));
}

TEST_F(CliTest, ReplayRejectsAnUnknownOpNamingFileAndJsonPath) {
  nlohmann::json doc = valid_document();
  doc["spec"]["ops"][0]["name"] = "NoSuchOp";
  const std::string path = write("unknown_op.json", doc.dump());
  const CliRun r = run({"replay", path});
  EXPECT_EQ(r.exit, 2);
  EXPECT_THAT(r.err, HasSubstr("unknown_op.json"));
  EXPECT_THAT(r.err, HasSubstr("/spec/ops/0/name"));
}

TEST_F(CliTest, ReplayRejectsABoundInputWithoutProducer) {
  nlohmann::json doc = valid_document();
  doc["spec"]["ops"].push_back({{"name", "AddExtraInput"}, {"input_channels", {"nowhere"}}});
  doc.erase("wiring_error");
  const std::string path = write("missing_producer.json", doc.dump());
  const CliRun r = run({"replay", path});
  EXPECT_EQ(r.exit, 2);
  EXPECT_THAT(r.err, HasSubstr("missing_producer.json"));
  EXPECT_THAT(r.err, HasSubstr("/spec/ops/1/input_channels/0"));
}

TEST_F(CliTest, ReplayRejectsAWrongSchemaVersion) {
  nlohmann::json doc = valid_document();
  doc["schema_version"] = 999;
  const std::string path = write("schema.json", doc.dump());
  const CliRun r = run({"replay", path});
  EXPECT_EQ(r.exit, 2);
  EXPECT_THAT(r.err, HasSubstr("schema.json"));
  EXPECT_THAT(r.err, HasSubstr("/schema_version"));
}

TEST_F(CliTest, ReplayRunsNothingWhenOneFileOfADirectoryIsMalformed) {
  write("good.json", valid_document().dump());
  write("bad.json", "{");
  const CliRun r = run({"replay", dir_.string()});
  EXPECT_EQ(r.exit, 2);
  EXPECT_THAT(r.err, HasSubstr("bad.json"));
}

TEST_F(CliTest, ReplayOfAPassingCaseExitsZeroAndWritesAReport) {
  const std::string path = write("good.json", valid_document().dump());
  const std::string report = (dir_ / "report.json").string();
  const CliRun r = run({"replay", path, "--report", report});
  EXPECT_EQ(r.exit, 0) << r.out << r.err;
  std::ifstream in(report);
  const auto j = nlohmann::json::parse(in);
  EXPECT_EQ(j["campaign"]["command"], "replay");
  EXPECT_EQ(j["summary"]["cases_run"], 1);
  EXPECT_EQ(j["summary"]["failed"], 0);
}

TEST_F(CliTest, FuzzWritesAReportConsistentWithItsExitStatus) {
  const std::string report = (dir_ / "fuzz.json").string();
  const CliRun r = run({"fuzz", "--cases", "3", "--seed", "4", "--max-ops", "3", "--corpus", (dir_ / "corpus").string(),
                        "--report", report, "--quiet"});
  ASSERT_TRUE(r.exit == 0 || r.exit == 1) << r.err;
  EXPECT_TRUE(r.out.empty()) << "--quiet printed: " << r.out;
  std::ifstream in(report);
  const auto j = nlohmann::json::parse(in);
  EXPECT_EQ(j["schema_version"], 1);
  EXPECT_EQ(j["summary"]["cases_run"], 3);
  EXPECT_EQ(j["campaign"]["seed"], 4);
  EXPECT_EQ(r.exit, j["summary"]["failed"].get<int>() > 0 ? 1 : 0);
  for (const auto& key : {"tool", "environment", "campaign", "summary", "coverage", "findings"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  EXPECT_TRUE(j["coverage"]["features"].contains("call_then_bind"));
}

// A selftest's shrink can be capped as a campaign's (a slow backend's bounded stage): with no
// shrink run the fault's case is saved as found, still failing with the fault and passing
// without; a cap that is no number is a usage error naming the flag.
TEST_F(CliTest, SelftestTakesTheShrinkCapOfACampaign) {
  const std::string report = (dir_ / "selftest.json").string();
  const auto selftest = [&](const std::string& cap) {
    return run({"selftest", "--faults", "internal-requires-grad", "--cases", "500", "--seed", "1", "--workers", "0",
                "--max-shrink-calls", cap, "--corpus", (dir_ / ("c" + cap)).string(), "--report", report});
  };
  const CliRun shrunk = selftest("2000");
  ASSERT_EQ(shrunk.exit, 0) << shrunk.err;
  std::ifstream first(report);
  const auto j = nlohmann::json::parse(first);
  const CliRun unshrunk = selftest("0");
  ASSERT_EQ(unshrunk.exit, 0) << unshrunk.err;
  std::ifstream second(report);
  const auto k = nlohmann::json::parse(second);
  ASSERT_EQ(j["selftest"].size(), 1u);
  ASSERT_EQ(k["selftest"].size(), 1u);
  EXPECT_TRUE(k["selftest"][0]["ok"].get<bool>()) << k["selftest"].dump();
  EXPECT_EQ(k["selftest"][0]["cases_to_detect"], j["selftest"][0]["cases_to_detect"]);
  // The shrink makes the shapes small (1x1 on this case); the uncapped one keeps its own.
  const auto spec_of = [](const nlohmann::json& selftest_report) {
    std::ifstream in(selftest_report["selftest"][0]["case_file"].get<std::string>());
    return nlohmann::json::parse(in)["spec"];
  };
  const nlohmann::json small = spec_of(j);
  const nlohmann::json as_found = spec_of(k);
  EXPECT_NE(small, as_found);
  EXPECT_LT(small.dump().size(), as_found.dump().size());
  const CliRun bad = selftest("many");
  EXPECT_EQ(bad.exit, 2);
  EXPECT_THAT(bad.err, ::testing::HasSubstr("--max-shrink-calls"));
}

TEST_F(CliTest, ReportToAnUnwritablePathIsAUsageError) {
  const CliRun r = run({"fuzz", "--cases", "1", "--report", (dir_ / "no" / "such" / "dir" / "r.json").string()});
  EXPECT_EQ(r.exit, 2);
  EXPECT_THAT(r.err, HasSubstr("--report"));
}

}  // namespace
}  // namespace gradfuzz::tools

namespace gradfuzz::tools {
namespace {

TEST(CliBench, ShapesScalingPrintsOneRowPerDecadeOfElements) {
  const CliRun r = run({"bench", "--shapes", "scaling", "--device", "cpu", "--max-tensor-elements", "1000"});
  ASSERT_EQ(r.exit, 0) << r.err;
  EXPECT_THAT(r.out, ::testing::HasSubstr("elements   rows x features"));
  // 10^2 and 10^3 elements: 12 x 8 and 62 x 16 (features grow as sqrt, rows take the rest);
  // 10^4 (156 x 64) is past the limit.
  EXPECT_THAT(r.out, ::testing::ContainsRegex("96 +12 x +8 .* pass"));
  EXPECT_THAT(r.out, ::testing::ContainsRegex("992 +62 x +16 .* pass"));
  EXPECT_THAT(r.out, ::testing::Not(::testing::HasSubstr("9984")));
  EXPECT_EQ(run({"bench", "--shapes", "scaling", "--dtypes", "float32,float16"}).exit, 2);
  EXPECT_EQ(run({"bench", "--shapes", "scaling", "--max-tensor-elements", "10"}).exit, 2);
}

TEST_F(CliTest, AFaultAKnownFileCoversIsReportedAsKnownAndExitsZero) {
  const std::string corpus = (dir_ / "c").string();
  const std::string report = (dir_ / "r.json").string();
  const std::vector<std::string> fuzz{
      "fuzz",      "--cases", "300",     "--seed",   "1",   "--fault", "scale-bias-grad",
      "--workers", "0",       "--quiet", "--corpus", corpus};
  // Without a known file the fault's findings fail the run.
  std::vector<std::string> args = fuzz;
  args.insert(args.end(), {"--report", report});
  const CliRun found = run(args);
  ASSERT_EQ(found.exit, 1) << found.err;
  // `known accept` turns the report's clusters into entries...
  const std::string known = (dir_ / "known.json").string();
  const CliRun accepted = run({"known", "accept", report, "-o", known});
  ASSERT_EQ(accepted.exit, 0) << accepted.err;
  EXPECT_THAT(accepted.out, HasSubstr("known accept: wrote"));
  std::ifstream in(known);
  const auto entries = nlohmann::json::parse(in);
  ASSERT_FALSE(entries["entries"].empty());
  EXPECT_EQ(entries["entries"][0]["status"], "open-defect");
  EXPECT_EQ(entries["entries"][0]["match"]["backend"], "model");
  // ...and the same campaign with them exits 0, every finding reported as known, none shrunk.
  args = fuzz;
  const std::string again = (dir_ / "again.json").string();
  args.insert(args.end(), {"--report", again, "--known", known});
  const CliRun quiet = run(args);
  EXPECT_EQ(quiet.exit, 0) << quiet.err;
  std::ifstream again_in(again);
  const auto doc = nlohmann::json::parse(again_in);
  EXPECT_GT(doc["summary"]["failed"].get<int64_t>(), 0);
  EXPECT_EQ(doc["summary"]["known_failed"], doc["summary"]["failed"]);
  EXPECT_EQ(doc["summary"]["new_findings"], 0);
  ASSERT_FALSE(doc["findings"].empty());
  for (const auto& f : doc["findings"]) {
    EXPECT_TRUE(f["known"].is_object()) << f.dump();
    EXPECT_THAT(f["case_file"].get<std::string>(), HasSubstr("/findings/known/"));
  }
  EXPECT_EQ(doc["campaign"]["known_file"], known);
  // --fail-on-known makes them count again.
  args.push_back("--fail-on-known");
  EXPECT_EQ(run(args).exit, 1);
  // Accepting a report whose findings are all known adds nothing.
  const CliRun twice = run({"known", "accept", again, "-o", (dir_ / "k2.json").string(), "--known", known});
  ASSERT_EQ(twice.exit, 0) << twice.err;
  EXPECT_THAT(twice.out, HasSubstr("(0 new from"));
}

TEST_F(CliTest, AMalformedKnownFileIsAUsageErrorNamingIt) {
  const std::string known = write("known.json", R"({"schema_version": 1, "entries": [{"id": "x"}]})");
  const CliRun r =
      run({"fuzz", "--cases", "1", "--workers", "0", "--quiet", "--known", known, "--corpus", (dir_ / "c").string()});
  EXPECT_EQ(r.exit, 2);
  EXPECT_THAT(r.err, HasSubstr(known + ": /entries/0/status: missing"));
}

TEST_F(CliTest, AnUnknownFaultNamesTheBackendsFaults) {
  const CliRun r = run({"fuzz", "--cases", "1", "--workers", "0", "--fault", "te-fp8-scale-inv-applied-twice",
                        "--corpus", (dir_ / "c").string()});
  EXPECT_EQ(r.exit, 2);
  EXPECT_THAT(r.err, HasSubstr("the model backend has no fault 'te-fp8-scale-inv-applied-twice'"));
  EXPECT_THAT(r.err, HasSubstr("half-output-scale"));
}

}  // namespace
}  // namespace gradfuzz::tools
