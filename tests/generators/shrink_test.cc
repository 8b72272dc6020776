#include "generators/shrink.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "generators/case_gen.h"
#include "generators/coverage.h"
#include "generators/invalid_gen.h"
#include "generators/validate.h"
#include "tests/generators/test_specs.h"

namespace gradfuzz::generators {
namespace {

using harness::CaseSpec;
using testing::make_case;
using testing::op;
using testing::with_inputs;
using testing::with_output;

bool has_scale_bias_grouped_linear(const CaseSpec& spec) {
  for (const auto& o : spec.ops) {
    if (o.name == "GroupedLinear" && attr_or_default(o, "scale_bias") != 0) return true;
  }
  return false;
}

bool has_fanout(const CaseSpec& spec) { return static_coverage(spec).features.count("fanout") > 0; }

/// First generated case (seeds from 0) that satisfies `predicate` and has at least `min_ops` ops.
CaseSpec find_case(const std::function<bool(const CaseSpec&)>& predicate, int64_t min_ops) {
  for (uint64_t seed = 0; seed < 5000; ++seed) {
    CaseSpec spec = generate_case(seed, 100);
    if (spec.num_ops() >= min_ops && predicate(spec)) return spec;
  }
  ADD_FAILURE() << "no generated case satisfies the predicate";
  return {};
}

/// Local minimality, checked independently of shrink(): no valid candidate still fails.
void expect_locally_minimal(const CaseSpec& minimal, const std::function<bool(const CaseSpec&)>& predicate) {
  for (const auto& candidate : shrink_candidates(minimal)) {
    if (!is_valid_case(candidate)) continue;
    EXPECT_FALSE(predicate(candidate)) << "candidate still fails:\n" << candidate;
  }
}

TEST(Shrink, ScaleBiasGroupedLinearShrinksToThatOneOp) {
  const CaseSpec failing = find_case(has_scale_bias_grouped_linear, 5);
  const auto result = shrink(failing, has_scale_bias_grouped_linear);
  EXPECT_TRUE(result.locally_minimal);
  EXPECT_GT(result.steps, 0);
  EXPECT_LE(result.predicate_calls, ShrinkOptions{}.max_predicate_calls);
  ASSERT_EQ(result.minimal.ops.size(), 1u) << result.minimal;
  const auto& gl = result.minimal.ops[0];
  EXPECT_EQ(gl.name, "GroupedLinear");
  EXPECT_TRUE(gl.input_channels.empty());
  EXPECT_EQ(gl.output_style, ops::OutputStyle::kVector);
  EXPECT_EQ(attr_or_default(gl, "groups"), 1);
  EXPECT_EQ(attr_or_default(gl, "out"), 1);
  EXPECT_EQ(result.minimal.input_shape, (std::vector<int64_t>{1, 1}));
  EXPECT_TRUE(result.minimal.fusions.empty());
  EXPECT_TRUE(result.minimal.call_then_bind.empty());
  EXPECT_TRUE(result.minimal.input_requires_grad);
  EXPECT_TRUE(is_valid_case(result.minimal));
  expect_locally_minimal(result.minimal, has_scale_bias_grouped_linear);
}

TEST(Shrink, FanOutShrinksToOneProducerAndTwoConsumers) {
  const CaseSpec failing = find_case(has_fanout, 6);
  const auto result = shrink(failing, has_fanout);
  EXPECT_TRUE(result.locally_minimal);
  EXPECT_EQ(result.minimal.num_ops(), 3) << result.minimal;
  EXPECT_TRUE(is_valid_case(result.minimal));
  expect_locally_minimal(result.minimal, has_fanout);
}

TEST(Shrink, IsDeterministic) {
  const CaseSpec failing = find_case(has_fanout, 6);
  const auto a = shrink(failing, has_fanout);
  const auto b = shrink(failing, has_fanout);
  EXPECT_EQ(a.minimal, b.minimal);
  EXPECT_EQ(a.steps, b.steps);
  EXPECT_EQ(a.predicate_calls, b.predicate_calls);
}

TEST(Shrink, StopsAtThePredicateCallCap) {
  const CaseSpec failing = find_case(has_scale_bias_grouped_linear, 5);
  int64_t calls = 0;
  const auto result = shrink(
      failing,
      [&](const CaseSpec& s) {
        ++calls;
        return has_scale_bias_grouped_linear(s);
      },
      ShrinkOptions{}.set_max_predicate_calls(3));
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(result.predicate_calls, 3);
  EXPECT_FALSE(result.locally_minimal);
}

TEST(Shrink, SkipsStaticallyInvalidCandidates) {
  const CaseSpec failing = find_case(has_fanout, 4);
  const auto result = shrink(failing, [](const CaseSpec& s) {
    EXPECT_TRUE(is_valid_case(s)) << s;
    return has_fanout(s);
  });
  EXPECT_TRUE(result.locally_minimal);
}

TEST(Shrink, RemovingAProducerUnbindsItsConsumersAndRenumbersSteps) {
  auto spec = make_case(
      {op("ReLU"), with_output(op("MakeExtraOutput"), 0, "c"), op("GELU"), with_inputs(op("AddExtraInput"), {"c"})});
  spec.call_then_bind = {{1, true}, {3, false}};
  const auto candidates = shrink_candidates(spec);
  // Candidate 1 removes module 1 (the producer).
  const CaseSpec& removed = candidates.at(1);
  ASSERT_EQ(removed.ops.size(), 3u);
  EXPECT_EQ(removed.ops[2].name, "AddExtraInput");
  EXPECT_TRUE(removed.ops[2].input_channels.empty());
  ASSERT_EQ(removed.call_then_bind.size(), 1u);
  EXPECT_EQ(removed.call_then_bind[0].op, 2);
  EXPECT_FALSE(removed.call_then_bind[0].grad_mode);
  EXPECT_TRUE(is_valid_case(removed));
}

TEST(Shrink, HalvingAShapeAlsoOffersAVariantWithBrokenBindingsUnbound) {
  // Halving Linear's out breaks the [rows, 8] channel around it; the repaired variant unbinds it.
  const auto spec = make_case({with_output(op("MakeExtraOutput"), 0, "c"), op("Linear", {{"out", 8}}),
                               with_inputs(op("AddExtraInput"), {"c"})});
  bool found = false;
  for (const auto& c : shrink_candidates(spec)) {
    if (c.ops.size() == 3 && c.ops[1].name == "Linear" && c.ops[1].attrs.at("out") == 4)
      found = found || (is_valid_case(c) && c.ops[2].input_channels.empty());
  }
  EXPECT_TRUE(found);
}

TEST(Shrink, InvalidCasesShrinkByThePredicateAlone) {
  InvalidCase invalid;
  for (uint64_t seed = 0; seed < 500; ++seed) {
    invalid = generate_invalid_case(seed, 100);
    if (invalid.expected_kind == "producer-not-earlier" && invalid.spec.num_ops() >= 5) break;
  }
  ASSERT_EQ(invalid.expected_kind, "producer-not-earlier");
  const auto still_invalid = [](const CaseSpec& s) {
    const auto problems = validate_case(s);
    return !problems.empty() && problems.front().kind == "producer-not-earlier";
  };
  const auto result = shrink(invalid.spec, still_invalid);
  EXPECT_TRUE(result.locally_minimal);
  EXPECT_EQ(result.minimal.num_ops(), 2) << result.minimal;
}

}  // namespace
}  // namespace gradfuzz::generators

namespace gradfuzz::generators {
namespace {

bool has_linear_under_a_recipe(const harness::CaseSpec& spec) {
  if (!spec.recipe) return false;
  for (const auto& o : spec.ops) {
    if (o.name == "Linear") return true;
  }
  return false;
}

// A recipe case shrinks to FP8-aligned GEMMs (TE's FP8 GEMMs refuse dimensions that are not
// multiples of 16: a [1, 1] case would fail for that instead of the defect seen), and drops
// the recipe when the finding does not need it.
TEST(Shrink, ARecipeCaseKeepsItsGemmsAlignedAndDropsARecipeItDoesNotNeed) {
  harness::CaseSpec failing = testing::make_case(
      {testing::op("Linear", {{"out", 64}}), testing::op("ReLU"), testing::op("Linear", {{"out", 32}})}, {64, 64});
  failing.recipe = harness::RecipeSpec{"Float8CurrentScaling", "HYBRID", {}};
  const auto result = shrink(failing, has_linear_under_a_recipe);
  ASSERT_TRUE(result.minimal.recipe.has_value()) << result.minimal;
  ASSERT_EQ(result.minimal.ops.size(), 1u) << result.minimal;
  EXPECT_EQ(result.minimal.input_shape, (std::vector<int64_t>{16, 16})) << result.minimal;
  EXPECT_EQ(attr_or_default(result.minimal.ops[0], "out"), 16);

  const auto any_linear = [](const harness::CaseSpec& spec) {
    return std::any_of(spec.ops.begin(), spec.ops.end(), [](const harness::OpSpec& o) { return o.name == "Linear"; });
  };
  const auto plain = shrink(failing, any_linear);
  EXPECT_FALSE(plain.minimal.recipe.has_value()) << plain.minimal;
  EXPECT_EQ(plain.minimal.input_shape, (std::vector<int64_t>{1, 1})) << plain.minimal;
}

}  // namespace
}  // namespace gradfuzz::generators
