#include "campaign/files.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "campaign/campaign.h"
#include "corpus/case_file.h"

namespace gradfuzz::campaign {
namespace {

std::string read_all(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

class TempDir {
 public:
  TempDir() : path_(make_temp_dir("gradfuzz-files-")) {}
  ~TempDir() { remove_tree(path_); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

harness::CaseSpec small_case(int64_t rows) {
  harness::CaseSpec spec;
  harness::OpSpec linear;
  linear.name = "Linear";
  linear.attrs = {{"out", 4}};
  spec.ops = {linear};
  spec.input_shape = {rows, 4};
  spec.seed = 7;
  return spec;
}

TEST(InflightFile, AShorterCaseOverwritesALongerOneAndStaysOneJsonDocument) {
  TempDir dir;
  InflightFile file(dir.path() / "inflight" / "1.json");
  harness::CaseSpec longer = small_case(2);
  longer.fusions = {"ForwardLinearBiasActivation", "BackwardLinearScale", "BackwardActivationBias"};
  file.write(inflight_case_text(longer, 1, std::nullopt));
  const harness::CaseSpec shorter = small_case(3);
  file.write(inflight_case_text(shorter, 1, std::nullopt));
  // The tail of the longer document is blanked, so the file parses as the shorter case.
  EXPECT_EQ(corpus::load_case_file(file.path()).spec, shorter);
  EXPECT_THAT(read_all(file.path()), ::testing::Not(::testing::HasSubstr("BackwardActivationBias")));
}

TEST(InflightFile, RemoveDeletesTheFile) {
  TempDir dir;
  InflightFile file(dir.path() / "inflight" / "1.json");
  file.write(inflight_case_text(small_case(2), 1, std::nullopt));
  EXPECT_EQ(count_regular_files(dir.path() / "inflight"), 1u);
  file.remove();
  EXPECT_EQ(count_regular_files(dir.path() / "inflight"), 0u);
}

TEST(FindLeftoverCases, FindsTheCaseOfARunThatEndedAndItsFault) {
  TempDir dir;
  {
    // A run that died: its in-flight file was written and never removed (its lock went with it).
    InflightFile file(dir.path() / kInflightDir / "4242-0.json");
    file.write(inflight_case_text(small_case(5), 3, std::string("slot-order")));
  }
  std::vector<std::string> problems;
  const auto leftovers = find_leftover_cases(dir.path(), problems);
  ASSERT_EQ(leftovers.size(), 1u);
  EXPECT_TRUE(problems.empty());
  EXPECT_EQ(leftovers[0].spec, small_case(5));
  EXPECT_EQ(leftovers[0].fault, std::optional<std::string>("slot-order"));
  // Found, not consumed: the campaign deletes it once the case's outcome is recorded.
  EXPECT_EQ(count_regular_files(dir.path() / kInflightDir), 1u);
}

TEST(FindLeftoverCases, LeavesTheFilesOfALiveCampaignAlone) {
  TempDir dir;
  InflightFile live(dir.path() / kInflightDir / "77-0.json");  // held (locked) by its owner
  live.write(inflight_case_text(small_case(2), 1, std::nullopt));
  std::vector<std::string> problems;
  EXPECT_TRUE(find_leftover_cases(dir.path(), problems).empty());
  EXPECT_TRUE(problems.empty());
  EXPECT_FALSE(owner_is_gone(live.path()));
}

TEST(FindLeftoverCases, MovesAnUnreadableLeftoverAsideAndSaysWhy) {
  TempDir dir;
  make_directories(dir.path() / kInflightDir);
  std::ofstream(dir.path() / kInflightDir / "9.json") << "{ not json";
  std::vector<std::string> problems;
  EXPECT_TRUE(find_leftover_cases(dir.path(), problems).empty());
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_THAT(problems[0], ::testing::HasSubstr("9.json"));
  EXPECT_EQ(count_regular_files(dir.path() / kInflightDir), 0u);
  EXPECT_EQ(count_regular_files(dir.path() / corpus::kCrashingDir), 1u);
}

}  // namespace
}  // namespace gradfuzz::campaign
