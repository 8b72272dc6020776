#include "generators/invalid_gen.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <map>

#include "generators/validate.h"
#include "ops/errors.h"
#include "runner/run_case.h"

namespace gradfuzz::generators {
namespace {

using ::testing::HasSubstr;

RC_GTEST_PROP(InvalidGen, ValidatorReportsThePromisedKindFirst, ()) {
  const InvalidCase c = *gen_invalid_case();
  const auto problems = validate_case(c.spec);
  RC_ASSERT(!problems.empty());
  RC_ASSERT(problems.front().kind == c.expected_kind);
}

TEST(InvalidGen, ReachesEveryPromisedKind) {
  std::map<std::string, int> counts;
  for (uint64_t seed = 0; seed < 400; ++seed) ++counts[generate_invalid_case(seed, 100).expected_kind];
  for (const auto& kind : invalid_case_kinds()) EXPECT_GT(counts[kind], 0) << kind;
  EXPECT_EQ(counts.size(), invalid_case_kinds().size());
}

TEST(InvalidGen, KeepsEveryGemmWeightWithinTheTensorBudget) {
  // Edge shapes reach 8191 features; a shape-preserving GroupedLinear inserted for public
  // split sizes would hold [8191, 8191] weights per group (the 2026-12-02 edge soak's
  // timeouts: 9-17 GB and 30-150 s a case on the CPU).
  GenOptions options;
  options.set_shapes(ShapeRegime::kEdge).set_max_tensor_elements(int64_t{1} << 14);
  int64_t split_cases = 0;
  for (uint64_t seed = 0; seed < 400; ++seed) {
    const InvalidCase c = generate_invalid_case(seed, 100, options);
    split_cases += c.expected_kind == std::string(ops::InvalidArgumentError::kKind);
    const auto layout = compute_layout(c.spec);
    ASSERT_TRUE(layout) << c;
    for (size_t i = 0; i < c.spec.ops.size(); ++i) {
      const auto& o = c.spec.ops[i];
      if (o.name != "Linear" && o.name != "GroupedLinear") continue;
      // Each weight tensor ([out, in], one per group) within the budget, as valid cases are.
      const int64_t in = layout->modules[i].input_shape.back();
      EXPECT_LE(in * static_cast<int64_t>(o.attrs.at("out")), int64_t{1} << 14) << c;
    }
  }
  EXPECT_GT(split_cases, 0);
}

TEST(InvalidGen, IsDeterministicForASeed) {
  for (uint64_t seed = 0; seed < 20; ++seed) {
    const auto a = generate_invalid_case(seed, 100);
    const auto b = generate_invalid_case(seed, 100);
    EXPECT_EQ(a.spec, b.spec);
    EXPECT_EQ(a.expected_kind, b.expected_kind);
  }
}

// Through the runtime: every path raises the promised kind and no failed construction
// leaves an op locked (run_case turns either problem into unexpected_error).
TEST(InvalidGen, EveryPathRaisesThePromisedKind) {
  runner::RunOptions options;
  options.finite_differences = false;
  for (uint64_t seed = 0; seed < 48; ++seed) {
    const auto c = generate_invalid_case(seed, 100);
    const auto result = runner::run_case(c.spec, options);
    EXPECT_TRUE(result.passed()) << "seed " << seed << " (" << c.description << "): " << result.notes;
    EXPECT_THAT(result.notes, HasSubstr(c.expected_kind)) << "seed " << seed << " (" << c.description << ")";
  }
}

}  // namespace
}  // namespace gradfuzz::generators
