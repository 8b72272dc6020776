// Shared runs (RunOptions::shared_runs, issue 15 item 5: a path's own first call names the
// writer of a changed caller tensor, one fresh Sequential per requires-grad pattern, the
// single-pass paths in the case's one request, the in-place ablation's rerun without writers
// or plan checks) give the findings each check in its own run gives: the same campaign run
// both ways (`--no-shared-runs`), compared case by case, on te (TE's own Python over the
// stubbed extension, adapter/tests/te_stub_python.sh) and on the model backend.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "campaign/files.h"
#include "tools/cli.h"

namespace gradfuzz::tools {

using campaign::make_temp_dir;
using campaign::remove_tree;
using nlohmann::json;
namespace {

struct CliRun {
  int exit = 0;
  std::string out;
  std::string err;
};

CliRun cli(const std::vector<std::string>& args) {
  std::ostringstream out;
  std::ostringstream err;
  const int code = run_cli(args, out, err, /*terminal=*/false);
  return {code, out.str(), err.str()};
}

std::string source_dir() {
  const char* root = std::getenv("GRADFUZZ_SOURCE_DIR");
  return root ? root : ".";
}

std::vector<json> read_lines(const std::filesystem::path& file) {
  std::ifstream in(file);
  std::vector<json> out;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) out.push_back(json::parse(line));
  }
  return out;
}

/// What a case's outcome is made of (the case log's fields): verdict, signatures (sorted),
/// whether a finding is new, the fused ops that ran and were compared.
std::map<int64_t, json> outcomes(const std::filesystem::path& case_log) {
  std::map<int64_t, json> out;
  for (json e : read_lines(case_log)) {
    auto signatures = e.at("signatures").get<std::vector<std::string>>();
    std::sort(signatures.begin(), signatures.end());
    out[e.at("number").get<int64_t>()] = json{{"verdict", e.at("verdict")},
                                              {"signatures", signatures},
                                              {"new", e.at("new")},
                                              {"fused_forward", e.at("fused_forward")},
                                              {"fused_backward", e.at("fused_backward")},
                                              {"fused_compared", e.at("fused_compared")}};
  }
  return out;
}

/// Sum over the cases of a GRADFUZZ_CASE_COST file of every count whose name ends in `what`
/// (the ablation's nested counts included).
int64_t total_count(const std::vector<json>& costs, const std::string& what) {
  int64_t total = 0;
  for (const auto& c : costs) {
    for (const auto& [name, n] : c.at("counts").items()) {
      if (name.size() >= what.size() && name.compare(name.size() - what.size(), what.size(), what) == 0) {
        total += n.get<int64_t>();
      }
    }
  }
  return total;
}

/// A torch campaign of bfloat16 FP8 cases (the recipe emulation) with a planted gradient
/// fault: many cases fail on every path and gather evidence.
std::vector<std::string> fp8_fault_campaign(const std::string& cases, const std::string& seed) {
  return {"fuzz",
          "--backend",
          "torch",
          "--device",
          "cpu",
          "--workers",
          "0",
          "--shapes",
          "tiny",
          "--cases",
          cases,
          "--seed",
          seed,
          "--dtypes",
          "bfloat16",
          "--recipe",
          "any",
          "--fault",
          "torch-fp8-dgrad-scaled-down",
          "--max-shrink-calls",
          "0"};
}

class SharedRuns : public ::testing::Test {
 protected:
  // One cost file for the suite: run_case reads GRADFUZZ_CASE_COST once per process (the
  // workers of each campaign start afresh and read it too).
  static void SetUpTestSuite() {
    suite_dir_ = new std::filesystem::path(make_temp_dir("gradfuzz-shared-runs-"));
    ::setenv("GRADFUZZ_CASE_COST", (*suite_dir_ / "cost.jsonl").string().c_str(), 1);
  }
  static void TearDownTestSuite() {
    ::unsetenv("GRADFUZZ_CASE_COST");
    remove_tree(*suite_dir_);
    delete suite_dir_;
  }
  void SetUp() override { dir_ = make_temp_dir("gradfuzz-shared-runs-"); }
  void TearDown() override { remove_tree(dir_); }

  struct Campaign {
    CliRun run;
    std::map<int64_t, json> cases;
    std::vector<json> costs;
    json report;
  };

  /// `args` (a fuzz command) with its own corpus, report and case log, and the case costs
  /// the run appended.
  Campaign fuzz(std::vector<std::string> args, const std::string& tag) {
    const std::filesystem::path cost = *suite_dir_ / "cost.jsonl";
    std::ofstream(cost, std::ios::trunc).close();
    for (const std::string& a : {std::string("--corpus"), (dir_ / (tag + "-corpus")).string(), std::string("--report"),
                                 (dir_ / (tag + ".json")).string(), std::string("--case-log"),
                                 (dir_ / (tag + ".jsonl")).string(), std::string("--quiet")}) {
      args.push_back(a);
    }
    Campaign c;
    c.run = cli(args);
    c.cases = outcomes(dir_ / (tag + ".jsonl"));
    c.costs = read_lines(cost);
    std::ifstream report(dir_ / (tag + ".json"));
    if (report) c.report = json::parse(report);
    return c;
  }

  static void expect_same_outcomes(const Campaign& shared, const Campaign& separate) {
    ASSERT_EQ(shared.cases.size(), separate.cases.size());
    for (const auto& [number, outcome] : separate.cases) {
      ASSERT_TRUE(shared.cases.count(number)) << "case " << number;
      EXPECT_EQ(shared.cases.at(number), outcome) << "case " << number;
    }
    EXPECT_EQ(shared.report.at("known"), separate.report.at("known"));
    EXPECT_EQ(shared.report.at("summary").at("findings"), separate.report.at("summary").at("findings"));
  }

  static std::filesystem::path* suite_dir_;
  std::filesystem::path dir_;
};

std::filesystem::path* SharedRuns::suite_dir_ = nullptr;

TEST_F(SharedRuns, TeCasesOverTEsOwnPythonYieldTheSameFindingsWithFewerRuns) {
  const std::string stub = source_dir() + "/adapter/tests/te_stub_python.sh";
  const CliRun caps = cli({"list", "capabilities", "--backend", "te", "--python-exe", stub, "--json"});
  if (caps.exit != 0) GTEST_SKIP() << "TE's Python over the stub does not run here: " << caps.err;
  // The ops that run on TE's Python without its kernels (te_stub.py): the channel ops with
  // their in-place options, the custom ops, FusedResidual's three fusions.
  json capabilities = json::parse(caps.out);
  json ops = json::object();
  for (const auto& [name, op] : capabilities.at("ops").items()) {
    for (const char* plain : {"AddExtraInput", "Bias", "Combine", "ConstantScale", "Dispatch", "DualExtraOutput",
                              "Identity", "MakeExtraOutput", "Reshape", "RowStat"}) {
      if (name == plain) ops[name] = op;
    }
  }
  capabilities["ops"] = ops;
  const std::string caps_file = (dir_ / "te-plain-ops.json").string();
  std::ofstream(caps_file) << capabilities.dump();
  const std::vector<std::string> args{"fuzz",
                                      "--backend",
                                      "te",
                                      "--python-exe",
                                      stub,
                                      "--device",
                                      "cpu",
                                      "--workers",
                                      "1",
                                      "--shapes",
                                      "tiny",
                                      "--dtypes",
                                      "float32",
                                      "--known",
                                      source_dir() + "/known/te-2.20.2.json",
                                      "--max-shrink-calls",
                                      "0",
                                      "--cases",
                                      "150",
                                      "--seed",
                                      "7",
                                      "--generate-as",
                                      caps_file};
  const Campaign shared = fuzz(args, "shared");
  std::vector<std::string> separate_args = args;
  separate_args.push_back("--no-shared-runs");
  const Campaign separate = fuzz(separate_args, "separate");
  ASSERT_LE(shared.run.exit, 1) << shared.run.err;
  EXPECT_EQ(shared.run.exit, separate.run.exit) << separate.run.err;
  expect_same_outcomes(shared, separate);

  // The cases exercise what the shared runs change: caller tensors written in place (their
  // writers), findings the ablation attributes to the in-place ops, repeat calls.
  int64_t modified = 0;
  int64_t ablated = 0;
  for (const auto& [number, outcome] : shared.cases) {
    for (const auto& s : outcome.at("signatures")) {
      modified += s.get<std::string>().rfind("modified_input|", 0) == 0;
      ablated += s.get<std::string>().find("|in_place:") != std::string::npos;
    }
  }
  EXPECT_GT(modified, 10);
  EXPECT_GT(ablated, 10);
  ASSERT_EQ(shared.costs.size(), separate.costs.size());
  EXPECT_GT(total_count(shared.costs, "repeat_calls"), 10);
  // Fewer runs for the same findings: no second run per changed path, fewer fresh
  // Sequentials, no second request for the single-pass paths.
  EXPECT_GT(total_count(separate.costs, "writer_runs"), 10);
  EXPECT_LT(total_count(shared.costs, "writer_runs"), total_count(separate.costs, "writer_runs") / 4);
  EXPECT_GT(total_count(shared.costs, "watched_paths"), 0);
  EXPECT_LT(total_count(shared.costs, "fresh_plans"), total_count(separate.costs, "fresh_plans"));
  EXPECT_LE(total_count(shared.costs, "requests"), total_count(separate.costs, "requests"));
}

TEST_F(SharedRuns, ModelCasesYieldTheSameFindingsInFewerRequests) {
  const std::vector<std::string> args{"fuzz",      "--backend", "model",    "--device", "cpu",
                                      "--workers", "0",         "--shapes", "tiny",     "--cases",
                                      "400",       "--seed",    "3",        "--dtypes", "float64,float32"};
  const Campaign shared = fuzz(args, "shared");
  std::vector<std::string> separate_args = args;
  separate_args.push_back("--no-shared-runs");
  const Campaign separate = fuzz(separate_args, "separate");
  ASSERT_EQ(shared.run.exit, 0) << shared.run.err;
  ASSERT_EQ(separate.run.exit, 0) << separate.run.err;
  expect_same_outcomes(shared, separate);
  // Cases that ran the single-pass paths did so in their one request.
  EXPECT_GT(total_count(separate.costs, "path:forward_fused"), 0);
  EXPECT_EQ(total_count(shared.costs, "path:forward_fused"), total_count(separate.costs, "path:forward_fused"));
  EXPECT_EQ(total_count(shared.costs, "requests") + total_count(shared.costs, "path:forward_fused"),
            total_count(separate.costs, "requests"));
}

// The in-place ablation's rerun takes the first run's low-precision evidence where its
// reference sets match (EvidenceCarry in runner/run_case.cc) instead of drawing the same
// samples again: FP8 cases of the torch backend's recipe emulation with a planted gradient
// fault fail on every path, with and without in-place ops, so their ablation reruns need the
// evidence. Same outcomes case by case as each rerun gathering its own.
TEST_F(SharedRuns, TheAblationsRerunTakesTheFirstRunsEvidenceAndFindsTheSame) {
  const std::vector<std::string> args = fp8_fault_campaign("150", "5");
  const Campaign shared = fuzz(args, "shared");
  std::vector<std::string> separate_args = args;
  separate_args.push_back("--no-shared-runs");
  const Campaign separate = fuzz(separate_args, "separate");
  ASSERT_EQ(shared.run.exit, 1) << shared.run.err;  // the planted fault is found
  ASSERT_EQ(separate.run.exit, 1) << separate.run.err;
  expect_same_outcomes(shared, separate);
  EXPECT_EQ(total_count(separate.costs, "evidence_carried"), 0);
  const int64_t carried = total_count(shared.costs, "evidence_carried");
  EXPECT_GT(carried, 0);
  // Every rerun that gathered evidence without the carry takes it with the carry: the
  // ablation's reruns here differ from their parents only in in_place.
  int64_t reruns_with_evidence = 0;
  for (const auto& c : separate.costs) {
    if (c.at("seconds").contains("ablation/judge/evidence")) ++reruns_with_evidence;
  }
  EXPECT_EQ(carried, reruns_with_evidence);
}

/// A report's findings with the campaign's own folder names taken out (the rest, bounds and
/// errors included, is the judging's).
json findings_without(const json& report, const std::string& folder) {
  std::string text = report.at("findings").dump();
  for (size_t at = text.find(folder); at != std::string::npos; at = text.find(folder, at))
    text.erase(at, folder.size());
  return json::parse(text);
}

TEST_F(SharedRuns, EvidenceDrawnAheadOverTheTorchAdapterFindsTheSame) {
  // The worker draws the reference and the evidence while the adapter runs the paths
  // (--overlap evidence; over the real pipes, the answer comes when it comes): bfloat16 FP8
  // cases with a planted defect, so that many cases gather evidence.
  std::vector<std::string> args = fp8_fault_campaign("120", "7");
  std::vector<std::string> none_args = args;
  none_args.insert(none_args.end(), {"--overlap", "none"});
  args.insert(args.end(), {"--overlap", "evidence"});
  const Campaign ahead = fuzz(args, "ahead");
  const Campaign none = fuzz(none_args, "none");
  ASSERT_EQ(ahead.run.exit, 1) << ahead.run.err;
  ASSERT_EQ(none.run.exit, 1) << none.run.err;
  expect_same_outcomes(ahead, none);
  EXPECT_EQ(findings_without(ahead.report, (dir_ / "ahead-corpus").string()),
            findings_without(none.report, (dir_ / "none-corpus").string()));
  EXPECT_EQ(total_count(none.costs, "ahead_gathered"), 0);
  EXPECT_GT(total_count(ahead.costs, "ahead_gathered"), 0);
  int64_t overlapped = 0;
  for (const auto& c : ahead.costs) overlapped += c.at("seconds").contains("paths/backend/overlap") ? 1 : 0;
  EXPECT_GT(overlapped, 0);
  // A bad mode is the user's error, named.
  const CliRun bad = cli({"fuzz", "--cases", "1", "--overlap", "sometimes", "--quiet"});
  EXPECT_EQ(bad.exit, 2);
  EXPECT_THAT(bad.err, ::testing::HasSubstr("--overlap"));
}

}  // namespace
}  // namespace gradfuzz::tools
