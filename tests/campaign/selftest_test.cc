#include "campaign/selftest.h"

#include <gtest/gtest.h>

#include "campaign/files.h"
#include "ops/faults.h"
#include "reports/reporter.h"

namespace gradfuzz::campaign {
namespace {

// The self-test is the fuzzer's own acceptance: the default campaign, with nothing tuned
// toward a fault, finds and shrinks each fault a comparison can see, and the saved case
// fails with the fault and passes without it. In process on the CPU (the faults that kill a
// process need workers; oob-write needs a GPU under compute-sanitizer).
TEST(Selftest, TheDefaultCampaignFindsEveryComparedFault) {
  const std::filesystem::path dir = make_temp_dir("gradfuzz-selftest-");
  SelftestOptions options;
  for (ops::Fault f : ops::all_faults()) {
    if (ops::fault_visibility(f) == ops::FaultVisibility::kCompared) options.faults.push_back(ops::fault_name(f));
  }
  options.campaign.cases = 2000;
  options.campaign.seed = 1;
  options.corpus_dir = dir;
  reports::MultiReporter none({});
  const auto entries = run_selftest(options, none, nullptr);
  ASSERT_EQ(entries.size(), options.faults.size());
  for (const auto& e : entries) {
    EXPECT_TRUE(e.ok()) << e.name << ": detected " << e.detected << ", replay with fault "
                        << e.replay_with_fault_exit.value_or(-1) << ", without "
                        << e.replay_without_fault_exit.value_or(-1);
    EXPECT_LE(e.shrunk_ops.value_or(99), 6) << e.name;
  }
  remove_tree(dir);
}

TEST(Selftest, AHalfPrecisionFaultIsHuntedInBothHalfDtypes) {
  CampaignOptions base;
  base.dtypes = {"float64", "float32"};
  const CampaignOptions half = selftest_campaign(base, "half-output-scale");
  EXPECT_EQ(half.dtypes, (std::vector<std::string>{"bfloat16", "float16"}));
  EXPECT_EQ(half.fault, std::optional<std::string>("half-output-scale"));
  base.dtypes = {"float16"};
  EXPECT_EQ(selftest_campaign(base, "half-dropped-grad-term").dtypes, (std::vector<std::string>{"float16"}));
  const CampaignOptions edge = selftest_campaign(base, "half-accumulation");
  EXPECT_EQ(edge.shapes, std::optional<generators::ShapeRegime>(generators::ShapeRegime::kEdge));
  EXPECT_LE(edge.max_tensor_elements, int64_t{1} << 14);
  // A fault of another backend is passed through as it is.
  EXPECT_EQ(selftest_campaign(base, "te-fuser-drops-consumer-grads").dtypes, base.dtypes);
}

}  // namespace
}  // namespace gradfuzz::campaign
