// `gradfuzz report merge|diff` and --junit/--html through the command line: exit statuses,
// files written, and one test per way the user can get an input wrong (exit 2, naming the
// file and, for a report, the JSON path).
#include "tools/report_tool.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "campaign/exit_codes.h"
#include "campaign/files.h"
#include "campaign/known_issues.h"
#include "tools/cli.h"

namespace gradfuzz::tools {

using campaign::InputError;
using campaign::make_temp_dir;
using campaign::regular_files;
using campaign::remove_tree;
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using Json = nlohmann::ordered_json;

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

std::string data(const std::string& name) {
  const char* root = std::getenv("GRADFUZZ_SOURCE_DIR");
  return std::string(root ? root : ".") + "/tests/reports/data/" + name;
}

std::string read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

bool exists(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0;
}

class ReportToolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = make_temp_dir(std::string("gradfuzz-report-tool-") +
                         ::testing::UnitTest::GetInstance()->current_test_info()->name() + "-")
               .string();
  }
  void TearDown() override { remove_tree(dir_); }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream(path(name), std::ios::binary) << text;
    return path(name);
  }
  /// A copy of a data report with `edit` applied.
  std::string edited(const std::string& source, const std::string& name, void (*edit)(Json&)) const {
    Json doc = Json::parse(read(data(source)));
    edit(doc);
    return write(name, doc.dump(2));
  }

  std::string dir_;
};

TEST_F(ReportToolTest, MergeWritesTheMergedReportJunitAndHtmlAndExitsOneWithFindings) {
  const CliRun r = run({"report", "merge", path("merged.json"), data("shard-2.json"), data("shard-1.json"), "--junit",
                        path("merged.xml"), "--html", path("merged.html")});
  EXPECT_EQ(r.exit, 1) << r.err;
  EXPECT_THAT(r.out,
              HasSubstr("report merge: 2 report(s) -> " + path("merged.json") + ": 12 cases, 7 failed, 3 cluster(s)"));
  const Json merged = Json::parse(read(path("merged.json")));
  EXPECT_EQ(merged["summary"]["cases_run"], 12);
  EXPECT_EQ(merged["merge"]["inputs"][0]["file"], data("shard-1.json"));
  EXPECT_THAT(read(path("merged.xml")), HasSubstr("<testsuite name=\"gradfuzz.fuzz\" tests=\"3\" failures=\"3\""));
  EXPECT_THAT(read(path("merged.html")), HasSubstr("id=\"summary-cases_run\">12</td>"));
  // Written through a temporary file and a rename: none is left behind.
  for (const auto& file : regular_files(dir_)) EXPECT_THAT(file.string(), Not(HasSubstr(".tmp-")));
}

TEST_F(ReportToolTest, MergeExitsZeroWithoutFinding) {
  const std::string one = edited("shard-1.json", "one.json", [](Json& d) { d["findings"] = Json::array(); });
  const std::string two = edited("shard-2.json", "two.json", [](Json& d) { d["findings"] = Json::array(); });
  const CliRun r = run({"report", "merge", path("merged.json"), one, two});
  EXPECT_EQ(r.exit, 0) << r.err;
  EXPECT_EQ(Json::parse(read(path("merged.json")))["summary"]["findings"], 0);
}

TEST_F(ReportToolTest, MergeReportsMissingShardsAndAnIncompleteRun) {
  const std::string one = edited("shard-1.json", "one.json", [](Json& d) { d["campaign"]["shard"] = "1/3"; });
  const CliRun r = run({"report", "merge", path("merged.json"), one});
  EXPECT_EQ(r.exit, 1) << r.err;
  EXPECT_THAT(r.out, HasSubstr("missing shards 2/3 3/3, incomplete"));
}

TEST_F(ReportToolTest, MergeRefusesAnUnreadableInputNamingIt) {
  const CliRun r = run({"report", "merge", path("merged.json"), data("shard-1.json"), path("absent.json")});
  EXPECT_EQ(r.exit, 2);
  EXPECT_THAT(r.err, HasSubstr(path("absent.json") + ": cannot read the report: No such file"));
  EXPECT_FALSE(exists(path("merged.json")));
}

TEST_F(ReportToolTest, MergeRefusesAnInvalidInputNamingTheFileAndTheJsonPath) {
  const std::string bad = edited("shard-2.json", "bad.json", [](Json& d) { d["summary"]["wall_s"] = "long"; });
  const CliRun r = run({"report", "merge", path("merged.json"), data("shard-1.json"), bad});
  EXPECT_EQ(r.exit, 2);
  EXPECT_THAT(r.err,
              HasSubstr(bad + ": /summary/wall_s: expected a non-negative number of seconds, got string \"long\""));
}

TEST_F(ReportToolTest, MergeRefusesShardsOfDifferentCampaigns) {
  const std::string other = edited("shard-2.json", "other.json", [](Json& d) { d["campaign"]["seed"] = 8; });
  const CliRun r = run({"report", "merge", path("merged.json"), data("shard-1.json"), other});
  EXPECT_EQ(r.exit, 2);
  EXPECT_THAT(r.err, HasSubstr(other + ": /campaign/seed: 8 differs from 7 in " + data("shard-1.json")));
  EXPECT_FALSE(exists(path("merged.json")));
}

TEST_F(ReportToolTest, MergeRefusesToOverwriteAShardWhenOutIsForgotten) {
  const std::string one = write("shard-1.json", read(data("shard-1.json")));
  const CliRun r = run({"report", "merge", one, data("shard-2.json")});
  EXPECT_EQ(r.exit, 2);
  EXPECT_THAT(r.err, HasSubstr(one + " is the report of shard 1/2; the first argument is the merged report to write"));
  EXPECT_EQ(read(one), read(data("shard-1.json")));
}

TEST_F(ReportToolTest, MergeRefusesAnOutputThatIsAlsoAnInput) {
  const CliRun r = run({"report", "merge", data("last.json"), data("last.json")});
  EXPECT_EQ(r.exit, 2);
  EXPECT_THAT(r.err, HasSubstr("is both the output and an input"));
}

TEST_F(ReportToolTest, MergeRefusesAnUnwritableJunitPathBeforeWriting) {
  const CliRun r = run({"report", "merge", path("merged.json"), data("shard-1.json"), data("shard-2.json"), "--junit",
                        path("no-such-dir/merged.xml")});
  EXPECT_EQ(r.exit, 2);
  EXPECT_THAT(r.err,
              HasSubstr("--junit: cannot write '" + path("no-such-dir/merged.xml") + "' (No such file or directory)"));
  EXPECT_FALSE(exists(path("merged.json")));
}

TEST_F(ReportToolTest, MergeNeedsAnInput) {
  const CliRun r = run({"report", "merge", path("merged.json")});
  EXPECT_EQ(r.exit, 2);
  EXPECT_THAT(r.err, HasSubstr("inputs is required"));
}

TEST_F(ReportToolTest, DiffExitsOneOnANewClusterAndWritesJson) {
  ASSERT_EQ(run({"report", "merge", path("merged.json"), data("shard-1.json"), data("shard-2.json")}).exit, 1);
  const CliRun r = run({"report", "diff", data("last.json"), path("merged.json"), "--json", path("diff.json")});
  EXPECT_EQ(r.exit, 1) << r.err;
  EXPECT_THAT(r.out, HasSubstr(": 2 new, 1 fixed, 1 still failing\n"));
  EXPECT_THAT(r.out, HasSubstr("  + missing_gradient|GroupedLinear|grad_param  count 1\n"));
  EXPECT_THAT(r.out, HasSubstr("  = mismatch|Dispatch,Linear|grad_channel  count 1 -> 5\n"));
  const Json diff = Json::parse(read(path("diff.json")));
  EXPECT_EQ(diff["new_clusters"].size(), 2u);
  EXPECT_EQ(diff["fixed"][0]["last_count"], 1);
  EXPECT_EQ(diff["still_failing"][0]["new_count"], 5);
}

TEST_F(ReportToolTest, DiffExitsZeroWhenNothingIsNew) {
  const CliRun r = run({"report", "diff", data("shard-2.json"), data("shard-2.json")});
  EXPECT_EQ(r.exit, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr(": 0 new, 0 fixed, 2 still failing\n"));
  const CliRun fixed = run({"report", "diff", data("last.json"),
                            edited("last.json", "clean.json", [](Json& d) { d["findings"] = Json::array(); })});
  EXPECT_EQ(fixed.exit, 0);
  EXPECT_THAT(fixed.out, HasSubstr(": 0 new, 2 fixed, 0 still failing\n"));
}

TEST_F(ReportToolTest, DiffRefusesAnInvalidReportNamingTheFileAndTheJsonPath) {
  const std::string bad = edited("last.json", "bad.json", [](Json& d) { d["findings"][1].erase("signature"); });
  const CliRun r = run({"report", "diff", bad, data("shard-1.json")});
  EXPECT_EQ(r.exit, 2);
  EXPECT_THAT(r.err, HasSubstr(bad + ": /findings/1/signature: missing (expected a string)"));
}

TEST_F(ReportToolTest, DiffRefusesAFileThatIsNotJson) {
  const std::string bad = write("truncated.json", read(data("last.json")).substr(0, 100));
  const CliRun r = run({"report", "diff", data("last.json"), bad});
  EXPECT_EQ(r.exit, 2);
  EXPECT_THAT(r.err, HasSubstr(bad + ": not valid JSON"));
}

TEST_F(ReportToolTest, DiffRefusesAnUnwritableJsonOutput) {
  const CliRun r = run({"report", "diff", data("last.json"), data("last.json"), "--json", dir_});
  EXPECT_EQ(r.exit, 2);
  EXPECT_THAT(r.err, HasSubstr("--json: cannot write '" + dir_ + "'"));
}

TEST_F(ReportToolTest, ReportNeedsMergeOrDiff) {
  EXPECT_EQ(run({"report"}).exit, 2);
  EXPECT_EQ(run({"report", "diff", data("last.json")}).exit, 2);
}

// One defect signed several ways (the same case's clusters, one first divergence) gives one
// test: `report upstream` writes it once, in the first cluster's folder, whose README names the
// other clusters; a cluster whose test differs gets its own folder.
TEST_F(ReportToolTest, UpstreamWritesOneFolderForClustersWithTheSameTest) {
  Json doc = Json::parse(read(data("last.json")));
  Json base = doc["findings"][0];
  base["confirmation"] = {{"diagnosis", "fused-only"}};
  doc["findings"] = Json::array();
  for (const char* signature : {"mismatch|Linear|grad_param", "mismatch|Bias|grad_input", "mismatch|RMSNorm|output"}) {
    Json f = base;
    f["signature"] = signature;
    doc["findings"].push_back(f);
  }
  const std::string report = write("report.json", doc.dump(2));
  CLI::App app;
  ReportCommand command(app);
  command.set_upstream_exporter([](const Json& cluster, const std::string&, const std::string& test_path) {
    const std::string signature = cluster["signature"];
    // The first two differ in their docstrings only; the third asserts elsewhere.
    const std::string body = signature.find("RMSNorm") != std::string::npos ? "    assert_close(y, y_ref)\n"
                                                                            : "    assert_close(dw, dw_ref)\n";
    const std::string text = "def test_it():\n    \"\"\"" + signature + "\"\"\"\n" + body;
    std::ofstream(test_path) << text;
    return UpstreamTest{text, {}, ""};
  });
  const std::string out_dir = path("out");
  std::vector<std::string> args = {"gradfuzz", "report", "upstream", report, "-o", out_dir, "--backend", "te"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  app.parse(static_cast<int>(argv.size()), argv.data());
  std::ostringstream out;
  EXPECT_EQ(command.run(out), 0);
  EXPECT_THAT(out.str(), HasSubstr("2 cluster(s) to file"));
  EXPECT_THAT(out.str(), HasSubstr("the same test as"));
  // Each folder written is a line "<dir>/<folder>: <title>".
  std::vector<std::string> readmes;
  std::istringstream lines(out.str());
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind(out_dir + "/", 0) != 0 || line.find("the same test as") != std::string::npos) continue;
    const std::string folder = line.substr(0, line.find(": "));
    EXPECT_TRUE(exists(folder + "/README.md")) << folder;
    readmes.push_back(read(folder + "/README.md"));
  }
  ASSERT_EQ(readmes.size(), 2u);
  int naming_the_other = 0;
  for (const auto& readme : readmes) {
    if (readme.find("The same test, other clusters") == std::string::npos) continue;
    ++naming_the_other;
    EXPECT_THAT(readme, HasSubstr("`mismatch|Bias|grad_input`"));
    EXPECT_THAT(readme, Not(HasSubstr("`mismatch|RMSNorm|output`")));
  }
  EXPECT_EQ(naming_the_other, 1);
}

TEST_F(ReportToolTest, FuzzWritesJunitAndHtmlOfItsReport) {
  const CliRun r = run({"fuzz", "--cases", "3", "--workers", "0", "--quiet", "--corpus", path("corpus"), "--junit",
                        path("fuzz.xml"), "--html", path("fuzz.html")});
  ASSERT_EQ(r.exit, 0) << r.err;
  EXPECT_THAT(read(path("fuzz.xml")),
              HasSubstr("<testcase classname=\"gradfuzz.fuzz\" name=\"no finding in 3 cases\""));
  EXPECT_THAT(read(path("fuzz.html")), HasSubstr("id=\"summary-cases_run\">3</td>"));
}

TEST_F(ReportToolTest, ReplayWritesAFailingTestcaseWithTheCaseFileAndItsDtype) {
  const std::string case_file = "corpus/regression/b8139f4071ec738a.json";  // float32, internal-requires-grad
  const CliRun r = run({"replay", case_file, "--fault", "internal-requires-grad", "--workers", "0", "--report",
                        path("replay.json"), "--junit", path("replay.xml"), "--html", path("replay.html")});
  ASSERT_EQ(r.exit, 1) << r.err;
  const std::string xml = read(path("replay.xml"));
  EXPECT_THAT(xml, HasSubstr("<failure type=\"mismatch\""));
  EXPECT_THAT(xml, HasSubstr("case file: " + case_file));
  EXPECT_THAT(xml, HasSubstr("reproduce: gradfuzz replay " + case_file + " --fault internal-requires-grad"));
  EXPECT_EQ(Json::parse(read(path("replay.json")))["findings"][0]["dtype"], "float32");
  EXPECT_THAT(read(path("replay.html")), HasSubstr("id=\"hist-dtype-float32\""));
}

TEST_F(ReportToolTest, RunCommandsRefuseAnUnwritableOutputBeforeRunning) {
  CliRun r = run(
      {"fuzz", "--cases", "1000000", "--workers", "0", "--corpus", path("corpus"), "--html", path("missing/r.html")});
  EXPECT_EQ(r.exit, 2);
  EXPECT_THAT(r.err, HasSubstr("--html: cannot write '" + path("missing/r.html") + "'"));
  r = run({"selftest", "--faults", "slot-order", "--junit", path("missing/r.xml")});
  EXPECT_EQ(r.exit, 2);
  EXPECT_THAT(r.err, HasSubstr("--junit: cannot write '" + path("missing/r.xml") + "'"));
  r = run({"replay", "corpus/regression", "--junit", ""});
  EXPECT_EQ(r.exit, 2);
  EXPECT_THAT(r.err, HasSubstr("expected a file name, got an empty one"));
  // An empty report or case-log name is refused too (it ran without a report before).
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"fuzz", "--cases", "1", "--report", ""},
        std::vector<std::string>{"fuzz", "--cases", "1", "--case-log", ""},
        std::vector<std::string>{"replay", "corpus/regression", "--report", ""},
        std::vector<std::string>{"selftest", "--faults", "slot-order", "--report", ""}}) {
    r = run(args);
    EXPECT_EQ(r.exit, 2) << args[0] << " " << args[args.size() - 2];
    EXPECT_THAT(r.err, HasSubstr("expected a file name, got an empty one")) << args[args.size() - 2];
  }
}

// report merge/diff --known on case-level entries (docs/KNOWN.md): a cluster is matched on
// the recipe and dtype its saved case records, and a recipe entry covers it only if every
// case counted in it ran under that recipe.
const char* kRecipeKnown = R"({"schema_version": 1, "entries": [
  {"id": "delayed", "status": "open-defect",
   "match": {"signature": "mismatch|Dispatch,Linear|grad_channel", "recipe": "DelayedScaling", "dtype": "float64",
             "recipe_options": ["fp8_format=HYBRID"]}},
  {"id": "locked", "status": "open-defect", "match": {"kind": "unexpected_error"}}]})";

/// last.json's first cluster as a campaign under DelayedScaling records it.
Json delayed_report() {
  Json doc = Json::parse(read(data("last.json")));
  doc["findings"][0]["recipe"] =
      Json{{"name", "DelayedScaling"}, {"fp8_format", "HYBRID"}, {"options", Json::object()}};
  doc["findings"][0]["recipes"] = Json{{"DelayedScaling", 1}};
  return doc;
}

TEST(ApplyKnown, MatchesCaseLevelEntriesOnTheRecipeAndDtypeAClusterRecords) {
  const campaign::KnownIssues known = campaign::known_issues_from_json(nlohmann::json::parse(kRecipeKnown), "k.json");
  Json doc = delayed_report();
  apply_known(doc, known);
  EXPECT_EQ(doc["findings"][0]["known"]["id"], "delayed");
  EXPECT_EQ(doc["findings"][1]["known"]["id"], "locked");  // a finding-level entry: as before
  EXPECT_EQ(doc["summary"]["new_findings"], 0);
  // Each condition off: no recipe, another format, another dtype, a case of the cluster under
  // another recipe, a report that does not record the recipe (older gradfuzz).
  const std::vector<void (*)(Json&)> edits{
      [](Json& f) { f["recipe"] = nullptr; },  [](Json& f) { f["recipe"]["fp8_format"] = "E4M3"; },
      [](Json& f) { f["dtype"] = "float32"; }, [](Json& f) { f["recipes"]["none"] = 2; },
      [](Json& f) { f.erase("recipe"); },
  };
  for (size_t i = 0; i < edits.size(); ++i) {
    Json edited = delayed_report();
    edits[i](edited["findings"][0]);
    apply_known(edited, known);
    EXPECT_TRUE(edited["findings"][0]["known"].is_null()) << "edit " << i;
    EXPECT_EQ(edited["summary"]["new_findings"], 1) << "edit " << i;
  }
  // Counts per recipe are optional (a replay's finding is its one case).
  doc = delayed_report();
  doc["findings"][0].erase("recipes");
  apply_known(doc, known);
  EXPECT_EQ(doc["findings"][0]["known"]["id"], "delayed");
}

TEST_F(ReportToolTest, DiffWithARecipeEntryCountsTheClusterNewOnlyWithoutTheRecipe) {
  const std::string known = write("known.json", kRecipeKnown);
  const std::string last = write("last.json", Json::parse(read(data("last.json"))).dump(2));
  auto night = [&](const std::string& name, void (*edit)(Json&)) {
    Json doc = delayed_report();
    doc["findings"][0]["cluster"] = "mismatch|Dispatch,Linear|grad_channel|known:delayed";
    edit(doc);
    return write(name, doc.dump(2));
  };
  // Under the recipe: the cluster is new to the diff but known, exit 0.
  CliRun r = run({"report", "diff", last, night("under.json", [](Json&) {}), "--known", known});
  EXPECT_EQ(r.exit, 0) << r.out << r.err;
  // The same signature in a case without a recipe: new, exit 1.
  r = run({"report", "diff", last, night("plain.json", [](Json& d) { d["findings"][0]["recipe"] = nullptr; }),
           "--known", known});
  EXPECT_EQ(r.exit, 1) << r.out << r.err;
}

// known accept writes the recipe of a cluster whose cases all ran under one (or all without
// one) when the night ran recipe cases; a cluster seen under several, or a night without any
// recipe case, gets none.
TEST_F(ReportToolTest, KnownAcceptNamesTheOneRecipeAClustersCasesRanUnder) {
  auto accept = [&](void (*edit)(Json&)) {
    Json doc = Json::parse(read(data("last.json")));
    doc["coverage"]["features"]["recipe"] = 3;
    edit(doc);
    const std::string report = write("night.json", doc.dump(2));
    const CliRun r = run({"known", "accept", report, "-o", path("known.json")});
    EXPECT_EQ(r.exit, 0) << r.err;
    // What accept writes loads again (recipe names are checked on load).
    const campaign::KnownIssues loaded = campaign::load_known_issues(path("known.json"));
    return Json::parse(read(path("known.json")));
  };
  Json known = accept([](Json& d) {
    d["findings"][0]["recipes"] = Json{{"DelayedScaling", 4}};
    d["findings"][1]["recipes"] = Json{{"none", 1}};
  });
  ASSERT_EQ(known["entries"].size(), 2u);
  EXPECT_EQ(known["entries"][0]["match"]["recipe"], "DelayedScaling");
  EXPECT_THAT(known["entries"][0]["note"].get<std::string>(), HasSubstr("seen only under DelayedScaling"));
  EXPECT_EQ(known["entries"][1]["match"]["recipe"], "none");
  EXPECT_THAT(known["entries"][1]["note"].get<std::string>(), HasSubstr("seen only in cases without a recipe"));
  // Several recipes: no condition. No counts: the saved case's recipe (a replay's one case).
  known = accept([](Json& d) {
    d["findings"][0]["recipes"] = Json{{"DelayedScaling", 2}, {"none", 1}};
    d["findings"][1]["recipe"] =
        Json{{"name", "Float8CurrentScaling"}, {"fp8_format", "E4M3"}, {"options", Json::object()}};
  });
  EXPECT_FALSE(known["entries"][0]["match"].contains("recipe"));
  EXPECT_EQ(known["entries"][1]["match"]["recipe"], "Float8CurrentScaling");
  // A night without a recipe case says nothing about recipes.
  known = accept([](Json& d) {
    d["coverage"]["features"].erase("recipe");
    d["findings"][0]["recipes"] = Json{{"none", 4}};
  });
  EXPECT_FALSE(known["entries"][0]["match"].contains("recipe"));
}

TEST_F(ReportToolTest, WriteFileAtomicallyReplacesTheFileWhole) {
  write_file_atomically(path("a.txt"), "first", "--x");
  write_file_atomically(path("a.txt"), "second", "--x");
  EXPECT_EQ(read(path("a.txt")), "second");
  EXPECT_EQ(regular_files(dir_).size(), 1u);
  try {
    write_file_atomically(path("none/a.txt"), "x", "--x");
    ADD_FAILURE() << "wrote into a missing directory";
  } catch (const InputError& e) {
    EXPECT_THAT(e.what(), HasSubstr("--x: cannot write '" + path("none/a.txt") + "'"));
  }
}

}  // namespace
}  // namespace gradfuzz::tools
