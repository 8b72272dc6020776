#include "generators/parallel_gen.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <map>
#include <set>

#include "generators/shrink.h"
#include "generators/validate.h"
#include "harness/builder.h"
#include "harness/sharding.h"
#include "runner/run_case.h"

namespace gradfuzz::generators {
namespace {

using ::testing::HasSubstr;

GenOptions ranks(int64_t n, ShapeRegime shapes = ShapeRegime::kTiny) {
  GenOptions o;
  o.set_world_size(n).set_shapes(shapes).set_dtypes({"float64", "float32", "bfloat16"});
  return o;
}

RC_GTEST_PROP(ParallelGen, EveryCaseIsValidOnItsRanks, ()) {
  const int64_t n = *rc::gen::inRange<int64_t>(1, 5);
  const auto shapes = *rc::gen::element(ShapeRegime::kTiny, ShapeRegime::kEdge);
  GenOptions options = ranks(n, shapes);
  options.set_max_tensor_elements(int64_t{1} << 14);
  const harness::CaseSpec spec = *gen_parallel_case(options);
  RC_ASSERT(spec.world_size == n);
  const auto problems = validate_case(spec);
  RC_ASSERT(problems.empty());
  // Rows divide, and so do features wherever they are split (each rank's slice is equal).
  const harness::CasePlan plan = harness::plan_case(spec);
  const harness::ShardingPlan sharding = harness::plan_sharding(spec, plan);
  for (size_t i = 0; i < plan.ops.size(); ++i) {
    RC_ASSERT(plan.ops[i].input_shape[0] % n == 0);
    if (sharding.ops[i].input == harness::Layout::kFeatures) RC_ASSERT(plan.ops[i].input_shape[1] % n == 0);
  }
}

TEST(ParallelGen, ReachesEveryCollectiveModeLayoutAndSplitParameter) {
  std::map<std::string, int> seen;
  for (uint64_t seed = 0; seed < 600; ++seed) {
    const harness::CaseSpec spec = gen_parallel_case(ranks(2))(rc::Random(seed), 100).value();
    ++seen["input:" + spec.input_layout];
    for (const auto& op : spec.ops) {
      ++seen[op.name];
      auto mode = op.attrs.find("tensor_parallel_mode");
      auto sp = op.attrs.find("sequence_parallel");
      if (mode != op.attrs.end()) {
        ++seen["mode" + std::to_string(static_cast<int>(mode->second)) +
               (sp != op.attrs.end() && sp->second == 1 ? "+sp" : "")];
      }
      if (op.attrs.count("tensor_parallel")) ++seen["bias_tp"];
      if (!op.input_channels.empty()) ++seen["channel"];
    }
  }
  for (const char* key : {"input:replicated", "input:rows", "input:features", "AllGather", "ReduceScatter", "AllReduce",
                          "mode1", "mode1+sp", "mode2", "mode2+sp", "bias_tp", "channel", "RMSNorm", "SwiGLU"}) {
    EXPECT_GT(seen[key], 0) << key << " never drawn";
  }
}

TEST(ParallelGen, IsDeterministicAndLeavesOneProcessCasesAsTheyWere) {
  for (uint64_t seed = 0; seed < 20; ++seed) {
    EXPECT_EQ(generate_case(seed, 100, ranks(2)), generate_case(seed, 100, ranks(2)));
    // Without world_size the generator draws exactly the one-process cases, no collective.
    const harness::CaseSpec one = generate_case(seed, 100);
    EXPECT_EQ(one.world_size, 1);
    for (const auto& op : one.ops) {
      EXPECT_TRUE(op.name != "AllGather" && op.name != "ReduceScatter" && op.name != "AllReduce") << op.name;
    }
  }
  EXPECT_THROW(gen_parallel_case(GenOptions{}), std::invalid_argument);
}

RC_GTEST_PROP(ParallelGen, InvalidCasesAreSplitsTeRefusesReportedFirst, ()) {
  const int64_t n = *rc::gen::inRange<int64_t>(2, 5);
  const InvalidCase c = *gen_parallel_invalid_case(ranks(n));
  const auto problems = validate_case(c.spec);
  RC_ASSERT(!problems.empty());
  RC_ASSERT(problems.front().kind == std::string("invalid-argument"));
  RC_ASSERT(runner::intends_error(c.spec));
}

TEST(ParallelGen, InvalidCasesOfTheModelsCampaignAreOneProcessOnes) {
  // On one rank nothing is refused: invalid cases are the one-process mutations.
  const InvalidCase c = generate_invalid_case(3, 100, ranks(1));
  EXPECT_EQ(c.spec.world_size, 1);
  EXPECT_THROW(gen_parallel_invalid_case(ranks(1)), std::invalid_argument);
}

// The reference refuses an invalid split as te.ops does (every path's error agrees), and the
// model declines cases of several ranks.
TEST(ParallelGen, TheReferenceRaisesTheSplitAndTheModelDeclinesSeveralRanks) {
  runner::RunOptions options;
  options.finite_differences = false;
  for (uint64_t seed = 0; seed < 6; ++seed) {
    const InvalidCase c = gen_parallel_invalid_case(ranks(2))(rc::Random(seed), 100).value();
    EXPECT_EQ(runner::reference_error_kind(c.spec).value_or("none"), "invalid-argument") << c.description;
    EXPECT_EQ(runner::run_case(c.spec, options).verdict, harness::VerdictKind::kUnsupported);
  }
}

// On one rank every mode is off and every collective the identity: the model runs the same
// chains and passes.
TEST(ParallelGen, OneRankChainsPassOnTheModel) {
  runner::RunOptions options;
  options.finite_differences = false;
  for (uint64_t seed = 0; seed < 40; ++seed) {
    const harness::CaseSpec spec = generate_case(seed, 100, ranks(1));
    const auto result = runner::run_case(spec, options);
    EXPECT_TRUE(result.passed()) << "seed " << seed << ": " << result.notes;
  }
}

TEST(ParallelGen, ShrinkingTriesOneRankAndPairsOfOps) {
  harness::CaseSpec spec = generate_case(5, 100, ranks(2));
  spec.ops = {
      harness::OpSpec{"Linear", {{"out", 4}, {"tensor_parallel_mode", 1}}, {}, {}, ops::OutputStyle::kVector, {}, {}},
      harness::OpSpec{"ReLU", {}, {}, {}, ops::OutputStyle::kVector, {}, {}},
      harness::OpSpec{"Linear", {{"out", 3}, {"tensor_parallel_mode", 2}}, {}, {}, ops::OutputStyle::kVector, {}, {}}};
  spec.input_layout = "replicated";
  spec.input_shape = {4, 6};
  ASSERT_TRUE(is_valid_case(spec));
  const auto candidates = shrink_candidates(spec);
  bool one_rank = false;
  bool pair = false;
  for (const auto& c : candidates) {
    one_rank = one_rank || (c.world_size == 1 && c.ops.size() == 3);
    pair = pair || (c.ops.size() == 1 && c.ops[0].name == "ReLU");
  }
  EXPECT_TRUE(one_rank);
  EXPECT_TRUE(pair);  // the column and the row Linear removed together: still valid
}

}  // namespace
}  // namespace gradfuzz::generators
