// Replays every case file of corpus/regression: each must load, give its recorded verdict
// with its fault switched on, and pass with every fault off.
#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>

#include "corpus/case_file.h"
#include "harness/runner.h"
#include "ops/faults.h"

namespace gradfuzz::corpus {
namespace {

namespace fs = std::filesystem;

fs::path regression_dir() {
  const char* source = std::getenv("GRADFUZZ_SOURCE_DIR");
  return fs::path(source ? source : ".") / "corpus" / kRegressionDir;
}

TEST(RegressionCorpus, EveryCaseReplaysToItsRecordedVerdict) {
  const auto files = list_case_files(regression_dir());
  if (files.empty()) GTEST_SKIP() << "no case files in " << regression_dir();
  for (const auto& path : files) {
    SCOPED_TRACE(path.string());
    const CaseFile file = load_case_file(path);
    harness::CaseResult with_fault;
    {
      std::optional<ops::FaultScope> fault;
      if (file.verdict.fault) fault.emplace(ops::fault_from_name(*file.verdict.fault));
      with_fault = harness::run_case(file.spec);
    }
    EXPECT_EQ(with_fault.verdict, file.verdict.kind) << with_fault;
    if (file.verdict.fault) {
      const harness::CaseResult without = harness::run_case(file.spec);
      EXPECT_TRUE(without.passed()) << without;
    }
  }
}

}  // namespace
}  // namespace gradfuzz::corpus
