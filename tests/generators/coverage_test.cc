#include "generators/coverage.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "ops/fusion_registry.h"
#include "tests/generators/test_specs.h"

namespace gradfuzz::generators {
namespace {

using testing::make_case;
using testing::op;
using testing::with_inputs;
using testing::with_output;

bool has_match(const std::vector<PatternMatch>& matches, const std::string& fusion, int64_t begin, int64_t end) {
  for (const auto& m : matches) {
    if (m.fusion == fusion && m.begin == begin && m.end == end) return true;
  }
  return false;
}

TEST(Coverage, FindsTheResidualPatternAndItsSameFusionChannel) {
  const auto spec = make_case({with_output(op("MakeExtraOutput"), 0, "c", false), op("Linear", {{"out", 8}}),
                               with_inputs(op("AddExtraInput"), {"c"})},
                              {4, 8}, ops::FusionRegistry::catalog().names());
  const auto matches = fusion_pattern_matches(spec, true);
  EXPECT_TRUE(has_match(matches, "FusedResidual.joint", 0, 3));
  EXPECT_TRUE(has_match(matches, "FusedResidual.forward", 0, 3));
  EXPECT_TRUE(has_match(matches, "BackwardLinearAdd", 0, 2));
  EXPECT_TRUE(has_match(matches, "ForwardLinearBiasAdd", 1, 3));
  const auto cov = static_coverage(spec);
  EXPECT_EQ(cov.features.count("same_fusion_channel"), 1u);
  EXPECT_EQ(cov.features.count("hidden_output"), 1u);
  EXPECT_EQ(cov.features.count("bound_input"), 1u);
  EXPECT_EQ(cov.features.count("public_input"), 0u);
}

TEST(Coverage, PatternsNeverSpanABoundaryAndNeedTheFusionEnabled) {
  const auto spec = make_case({op("Linear", {{"out", 8}}), op(harness::kBoundaryOp), op("Bias"), op("ReLU")}, {4, 8},
                              {"ForwardLinearBiasActivation"});
  EXPECT_TRUE(fusion_pattern_matches(spec, true).empty());
  EXPECT_TRUE(has_match(fusion_pattern_matches(spec, false), "BackwardActivationBias", 2, 4));
  EXPECT_EQ(static_coverage(spec).features.count("fuser_boundary"), 1u);
}

TEST(Coverage, CountsFreshProducersScaleBiasAndMixedSlots) {
  const auto spec =
      make_case({with_output(op("RowStat"), 0, "p"),
                 with_inputs(op("GroupedLinear", {{"groups", 2}, {"out", 4}, {"scale_bias", 1}}), {std::nullopt, "p"}),
                 with_inputs(op("ScaledSReLU"), {"p"})});
  const auto cov = static_coverage(spec);
  for (const char* f : {"fresh_producer", "scale_bias", "mixed_slot_order", "fanout", "bound_input", "public_input"}) {
    EXPECT_EQ(cov.features.count(f), 1u) << f;
  }
  EXPECT_EQ(cov.ops.at("GroupedLinear"), 1);
}

TEST(Coverage, MergeAddsCounts) {
  StaticCoverage a;
  a.ops["Linear"] = 2;
  StaticCoverage b;
  b.ops["Linear"] = 1;
  b.features["fanout"] = 1;
  a.merge(b);
  EXPECT_EQ(a.ops["Linear"], 3);
  EXPECT_EQ(a.features["fanout"], 1);
}

}  // namespace
}  // namespace gradfuzz::generators
