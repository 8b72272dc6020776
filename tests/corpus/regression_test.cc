// Replays every case file of corpus/regression as its own test: each must load, give its
// recorded verdict with its fault switched on, and pass with every fault off. The files are
// listed when ctest runs (DISCOVERY_MODE PRE_TEST), so a file added to the corpus is replayed
// without touching any build file.
#include <gtest/gtest.h>

#include <cctype>
#include <cstdlib>
#include <optional>

#include "corpus/case_file.h"
#include "ops/faults.h"
#include "runner/run_case.h"

namespace gradfuzz::corpus {
namespace {

namespace fs = std::filesystem;

fs::path regression_dir() {
  const char* source = std::getenv("GRADFUZZ_SOURCE_DIR");
  return fs::path(source ? source : ".") / "corpus" / kRegressionDir;
}

std::vector<fs::path> regression_files() { return list_case_files(regression_dir()); }

class RegressionCorpus : public ::testing::TestWithParam<fs::path> {};

TEST_P(RegressionCorpus, ReplaysToItsRecordedVerdict) {
  const CaseFile file = load_case_file(GetParam());
  harness::CaseResult with_fault;
  {
    std::optional<ops::FaultScope> fault;
    if (file.verdict.fault) fault.emplace(ops::fault_from_name(*file.verdict.fault));
    with_fault = runner::run_case(file.spec);
  }
  EXPECT_EQ(with_fault.verdict, file.verdict.kind) << with_fault;
  if (file.verdict.fault) {
    const harness::CaseResult without = runner::run_case(file.spec);
    EXPECT_TRUE(without.passed()) << "fails with every fault off: " << without;
  }
}

// An empty corpus is a broken checkout, not a pass.
TEST(RegressionCorpusFiles, AreThere) { EXPECT_FALSE(regression_files().empty()) << regression_dir(); }

/// Test name: the recorded fault (or "pass") and the content hash.
std::string case_name(const ::testing::TestParamInfo<fs::path>& info) {
  std::string name;
  try {
    const CaseFile file = load_case_file(info.param);
    name = file.verdict.fault ? *file.verdict.fault : harness::verdict_name(file.verdict.kind);
  } catch (const std::exception&) {
    name = "unreadable";  // the test itself reports why
  }
  name += "_" + info.param.stem().string();
  for (char& c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return name;
}

INSTANTIATE_TEST_SUITE_P(Corpus, RegressionCorpus, ::testing::ValuesIn(regression_files()), case_name);

}  // namespace
}  // namespace gradfuzz::corpus
