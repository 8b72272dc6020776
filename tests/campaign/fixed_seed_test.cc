// The fixed-seed comparison (issue 27): small campaigns of fixed seeds on the model and torch
// backends, whose outcome must not change while code moves (a refactor keeps the same seeds'
// findings and clusters). Each campaign's outcome (passed, failed and unsupported cases, its
// clusters with their counts, the low-precision evidence's coverage counts) is held against
// tests/campaign/data/fixed_seed/<campaign>.json. A change that is meant to alter what the
// fuzzer finds regenerates them: GRADFUZZ_UPDATE_GOLDEN=1 ctest -R FixedSeed, then review the
// diff. The campaigns take about a minute together on 2 cores (float results of the CPU this was
// recorded on: a CPU whose kernels round otherwise may move a case near its bound).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "campaign/files.h"
#include "tools/cli.h"

namespace gradfuzz::tools {
namespace {

using campaign::make_temp_dir;
using campaign::remove_tree;
using nlohmann::ordered_json;

std::string golden_path(const std::string& campaign) {
  const char* root = std::getenv("GRADFUZZ_SOURCE_DIR");
  return std::string(root ? root : ".") + "/tests/campaign/data/fixed_seed/" + campaign + ".json";
}

/// What must not change of a campaign: its arguments (beside the report and corpus), the
/// summary's counts, every cluster (its key) with its count, the low-precision coverage.
ordered_json outcome(const std::vector<std::string>& args, const nlohmann::json& report) {
  ordered_json out;
  out["args"] = args;
  for (const char* key : {"cases_run", "passed", "failed", "unsupported"}) out[key] = report["summary"][key];
  ordered_json clusters = ordered_json::object();
  std::map<std::string, int64_t> sorted;
  for (const auto& f : report["findings"]) {
    sorted[f.value("cluster", f["signature"].get<std::string>())] = f.value("count", int64_t{0});
  }
  for (const auto& [key, count] : sorted) clusters[key] = count;
  out["clusters"] = std::move(clusters);
  out["low_precision"] = report["coverage"]["low_precision"];
  return out;
}

class FixedSeed : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = make_temp_dir("gradfuzz-fixed-seed-"); }
  void TearDown() override { remove_tree(dir_); }

  /// Runs `gradfuzz fuzz <args>` (with a report and a corpus of its own) and compares its
  /// outcome with the golden file of `campaign`, or rewrites that with GRADFUZZ_UPDATE_GOLDEN=1.
  void expect_unchanged(const std::string& campaign, const std::vector<std::string>& args) {
    const std::string report = (dir_ / "report.json").string();
    std::vector<std::string> cli_args{"fuzz"};
    cli_args.insert(cli_args.end(), args.begin(), args.end());
    for (const std::string& a : {std::string("--quiet"), std::string("--report"), report, std::string("--corpus"),
                                 (dir_ / "corpus").string()}) {
      cli_args.push_back(a);
    }
    std::ostringstream out;
    std::ostringstream err;
    const int exit = run_cli(cli_args, out, err, /*terminal=*/false);
    ASSERT_TRUE(exit == 0 || exit == 1) << "exit " << exit << ": " << err.str();  // 1: findings
    std::ifstream in(report);
    ASSERT_TRUE(in.good()) << "no report: " << err.str();
    const ordered_json got = outcome(args, nlohmann::json::parse(in));
    const std::string path = golden_path(campaign);
    const char* update = std::getenv("GRADFUZZ_UPDATE_GOLDEN");
    if (update && std::string(update) == "1") {
      std::ofstream(path) << got.dump(2) << '\n';
      GTEST_SKIP() << "rewrote " << path;
    }
    std::ifstream golden(path);
    ASSERT_TRUE(golden.good()) << "no golden file " << path << " (GRADFUZZ_UPDATE_GOLDEN=1 writes it)";
    const ordered_json expected = ordered_json::parse(golden);
    EXPECT_EQ(got.dump(2), expected.dump(2)) << campaign << " differs from " << path;
  }

  std::filesystem::path dir_;
};

TEST_F(FixedSeed, ModelFloatCampaign) {
  expect_unchanged("model", {"--cases", "600", "--seed", "11", "--workers", "0"});
}

TEST_F(FixedSeed, ModelCampaignWithAPlantedFault) {
  expect_unchanged("model_scale_bias_grad",
                   {"--cases", "400", "--seed", "11", "--workers", "0", "--fault", "scale-bias-grad"});
}

// Half precision: cases that fail the first check are judged with the low-precision rule's
// evidence (output noise, kinks, cancellation).
TEST_F(FixedSeed, ModelHalfPrecisionCampaign) {
  expect_unchanged("model_half", {"--cases", "600", "--seed", "11", "--workers", "0", "--dtypes", "bfloat16,float16"});
}

TEST_F(FixedSeed, ModelHalfPrecisionCampaignWithAPlantedFault) {
  expect_unchanged("model_half_output_scale", {"--cases", "400", "--seed", "11", "--workers", "0", "--dtypes",
                                               "bfloat16,float16", "--fault", "half-output-scale"});
}

// The torch backend through a worker and its adapter, under FP8 recipes (the quantized
// reference, per-path quantization points).
TEST_F(FixedSeed, TorchRecipeCampaign) {
  expect_unchanged("torch", {"--backend", "torch", "--device", "cpu", "--cases", "300", "--seed", "5", "--recipe",
                             "any", "--workers", "1"});
}

TEST_F(FixedSeed, TorchRecipeCampaignWithAPlantedFault) {
  expect_unchanged("torch_fp8_dgrad_scaled_down",
                   {"--backend", "torch", "--device", "cpu", "--cases", "150", "--seed", "5", "--recipe", "any",
                    "--workers", "1", "--fault", "torch-fp8-dgrad-scaled-down"});
}

// In bfloat16 under recipes, with the evidence drawn ahead while the adapter runs the paths
// (--overlap evidence): FP8 windows, coarse repeat-call evidence, rounds, and the evidence the
// in-place ablation's rerun is handed.
TEST_F(FixedSeed, TorchHalfPrecisionRecipeCampaignWithEvidenceDrawnAhead) {
  expect_unchanged(
      "torch_half_overlap_fp8_dgrad_scaled_down",
      {"--backend", "torch", "--device", "cpu", "--cases", "200", "--seed", "5", "--recipe", "any", "--workers", "1",
       "--dtypes", "bfloat16,float32", "--overlap", "evidence", "--fault", "torch-fp8-dgrad-scaled-down"});
}

}  // namespace
}  // namespace gradfuzz::tools
