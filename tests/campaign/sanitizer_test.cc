// The compute-sanitizer wrapper, tested without a GPU: the command line a sanitized worker
// gets and the parsing of sanitizer logs (tests/campaign/data/*.log).
#include "campaign/sanitizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

namespace gradfuzz::campaign {

namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string read_data(const std::string& name) {
  const char* root = std::getenv("GRADFUZZ_SOURCE_DIR");
  std::ifstream in(std::string(root ? root : ".") + "/tests/campaign/data/" + name);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(Sanitizer, WrapsTheWorkerWithTheToolItsLogFileAndPadding) {
  SanitizerOptions o;
  o.tool = SanitizerTool::kMemcheck;
  o.executable = "/usr/local/cuda/bin/compute-sanitizer";
  o.log_pattern = "/tmp/s/worker-%p.log";
  const auto argv = sanitizer_argv(o, {"gradfuzz", "worker", "--backend", "model"});
  ASSERT_GE(argv.size(), 8u);
  EXPECT_EQ(argv.front(), "/usr/local/cuda/bin/compute-sanitizer");
  const std::string joined = [&] {
    std::string s;
    for (const auto& a : argv) s += a + " ";
    return s;
  }();
  EXPECT_THAT(joined, HasSubstr("--tool memcheck "));
  EXPECT_THAT(joined, HasSubstr("--log-file /tmp/s/worker-%p.log "));
  EXPECT_THAT(joined, HasSubstr("--padding 512 "));
  // The worker's own command comes last, unchanged.
  EXPECT_THAT(std::vector<std::string>(argv.end() - 4, argv.end()),
              ElementsAre("gradfuzz", "worker", "--backend", "model"));
  o.tool = SanitizerTool::kRacecheck;
  const auto race = sanitizer_argv(o, {"w"});
  EXPECT_EQ(std::find(race.begin(), race.end(), "--padding"), race.end());
  EXPECT_NE(std::find(race.begin(), race.end(), "racecheck"), race.end());
}

TEST(Sanitizer, TurnsPyTorchsCachingAllocatorOffSoEveryTensorIsItsOwnAllocation) {
  const auto env = sanitizer_environment();
  ASSERT_EQ(env.size(), 1u);
  EXPECT_EQ(env[0].first, "PYTORCH_NO_CUDA_MEMORY_CACHING");
  EXPECT_EQ(env[0].second, "1");
}

TEST(Sanitizer, ToolNamesRoundTripAndUnknownOnesAreRefused) {
  for (auto t :
       {SanitizerTool::kMemcheck, SanitizerTool::kRacecheck, SanitizerTool::kInitcheck, SanitizerTool::kSynccheck}) {
    EXPECT_EQ(sanitizer_tool_from_name(sanitizer_tool_name(t)), t);
  }
  try {
    sanitizer_tool_from_name("memchek");
    FAIL() << "unknown tool accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("'memchek'"));
    EXPECT_THAT(e.what(), HasSubstr("synccheck"));
  }
}

TEST(Sanitizer, ACleanLogHasNoError) {
  const SanitizerReport r = parse_sanitizer_log(read_data("memcheck_clean.log"));
  EXPECT_EQ(r.errors, 0);
  EXPECT_TRUE(r.first_error.empty());
}

TEST(Sanitizer, CountsEveryMemcheckErrorAndNamesTheFirstOnesKernel) {
  const std::string log = read_data("memcheck_two_errors.log");
  ASSERT_FALSE(log.empty()) << "fixture missing";
  const SanitizerReport r = parse_sanitizer_log(log);
  EXPECT_EQ(r.errors, 2);
  EXPECT_THAT(r.first_error, HasSubstr("Invalid __global__ write of size 1 bytes"));
  EXPECT_THAT(r.first_error, HasSubstr("is out of bounds"));
  EXPECT_THAT(r.first_error, ::testing::Not(HasSubstr("read of size")));
  EXPECT_EQ(r.kernel, "gradfuzz::ops::cuda::detail::bias_activation_forward_kernel<float>");
}

TEST(Sanitizer, ParsesTheLogRecordedOnTheH200WithThePlantedOutOfBoundsAccess) {
  // compute-sanitizer 2025 memcheck on the H200 (2026-12-01), oob-write fault on: the
  // kernel's read of the byte past its output, then the launch failure it caused.
  const SanitizerReport r = parse_sanitizer_log(read_data("memcheck_h200_oob.log"));
  EXPECT_EQ(r.errors, 2);
  EXPECT_THAT(r.first_error, HasSubstr("Invalid __global__ read of size 1 bytes"));
  EXPECT_THAT(r.first_error, HasSubstr("is out of bounds"));
  EXPECT_EQ(r.kernel, "gradfuzz::ops::cuda::detail::bias_activation_forward_kernel<double>");
}

TEST(Sanitizer, ReadsRacecheckHazardsAndSkipsItsSummary) {
  const SanitizerReport r = parse_sanitizer_log(read_data("racecheck_hazard.log"));
  EXPECT_EQ(r.errors, 1);
  EXPECT_THAT(r.first_error, HasSubstr("Race reported between Write access"));
}

}  // namespace
}  // namespace gradfuzz::campaign
