#include "generators/validate.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "ops/errors.h"
#include "tests/generators/test_specs.h"

namespace gradfuzz::generators {
namespace {

using ::testing::HasSubstr;
using testing::make_case;
using testing::op;
using testing::with_inputs;
using testing::with_output;

std::string first_kind(const harness::CaseSpec& spec) {
  const auto problems = validate_case(spec);
  return problems.empty() ? "" : problems.front().kind;
}

TEST(Validate, AcceptsAChannelFromAnEarlierProducerWithAMatchingSlot) {
  const auto spec = make_case(
      {with_output(op("MakeExtraOutput"), 0, "c", false), op("ReLU"), with_inputs(op("AddExtraInput"), {"c"})});
  EXPECT_TRUE(validate_case(spec).empty());
}

TEST(Validate, ReportsAConsumerBeforeItsProducer) {
  const auto spec = make_case({with_inputs(op("AddExtraInput"), {"c"}), with_output(op("MakeExtraOutput"), 0, "c")});
  const auto problems = validate_case(spec);
  ASSERT_FALSE(problems.empty());
  EXPECT_EQ(problems.front().kind, "producer-not-earlier");
  EXPECT_EQ(problems.front().path, "/ops/0/input_channels/0");
  EXPECT_THAT(problems.front().message, HasSubstr("'c'"));
}

TEST(Validate, ReportsAChannelAcrossABoundaryAsMissingProducer) {
  const auto spec = make_case(
      {with_output(op("MakeExtraOutput"), 0, "c"), op(harness::kBoundaryOp), with_inputs(op("AddExtraInput"), {"c"})});
  EXPECT_EQ(first_kind(spec), "missing-producer");
}

TEST(Validate, ReportsTwoProducersOfOneChannel) {
  auto dual = op("DualExtraOutput", {{"s0", 1}, {"s1", 2}});
  dual.output_bindings = {{"c", true}, {"c", false}};
  EXPECT_EQ(first_kind(make_case({dual})), "duplicate-producer");
}

TEST(Validate, ReportsASlotShapeMismatch) {
  // RowStat produces [rows]; AddExtraInput wants [rows, features].
  const auto spec = make_case({with_output(op("RowStat"), 0, "c"), with_inputs(op("AddExtraInput"), {"c"})});
  const auto problems = validate_case(spec);
  ASSERT_FALSE(problems.empty());
  EXPECT_EQ(problems.front().kind, "invalid-argument");
  EXPECT_THAT(problems.front().message, HasSubstr("expects"));
}

TEST(Validate, ReportsSplitSizesThatSumToAnotherRowCount) {
  // Reshape changes the rows between Dispatch and GroupedLinear: shapes [G] still match.
  const auto spec =
      make_case({with_output(op("Dispatch", {{"groups", 2}}), 0, "split"), op("Reshape", {{"features", 4}}),
                 with_inputs(op("GroupedLinear", {{"groups", 2}, {"out", 4}}), {"split"})});
  EXPECT_EQ(first_kind(spec), "invalid-argument");
}

TEST(Validate, ReportsUnknownOpsAndFusions) {
  EXPECT_EQ(first_kind(make_case({op("NoSuchOp")})), "unknown-name");
  EXPECT_EQ(first_kind(make_case({op("ReLU")}, {4, 8}, {"NoSuchFusion"})), "unknown-name");
}

TEST(Validate, ReportsAttrsThatDoNotFitTheShape) {
  EXPECT_EQ(first_kind(make_case({op("SwiGLU")}, {4, 5})), "invalid-argument");
}

TEST(Validate, ReportsTooManyBindingsAsSlotOutOfRange) {
  EXPECT_EQ(first_kind(make_case({with_inputs(op("ReLU"), {"c"})})), "slot-out-of-range");
}

TEST(Validate, ReportsInvalidKnobsWithTheirErrorKind) {
  auto spec = make_case({op("AddExtraInput")});
  spec.extra_input_count_delta = 1;
  EXPECT_EQ(first_kind(spec), "extra-input-count");
  spec.extra_input_count_delta = -2;
  EXPECT_EQ(first_kind(spec), kSpecProblem);

  auto split = make_case({op("GroupedLinear", {{"groups", 2}, {"out", 4}})});
  split.corrupt_split_sizes = true;
  EXPECT_EQ(first_kind(split), "invalid-argument");

  auto late = make_case({op("AddExtraInput")});
  late.late_binds = {{0, 0, "c"}};
  EXPECT_EQ(first_kind(late), "locked");
  late.late_binds = {{0, 1, "c"}};
  EXPECT_EQ(first_kind(late), "slot-out-of-range");
  late.late_binds = {{0, 0, ""}};
  EXPECT_EQ(first_kind(late), "invalid-channel-name");
}

TEST(Validate, LayoutPropagatesShapesAndFusers) {
  const auto spec = make_case({op("Linear", {{"out", 6}}), op(harness::kBoundaryOp), op("SwiGLU")}, {3, 8});
  const auto layout = compute_layout(spec);
  ASSERT_TRUE(layout.has_value());
  EXPECT_EQ(layout->num_fusers, 2);
  EXPECT_EQ(layout->modules[2].input_shape, (std::vector<int64_t>{3, 6}));
  EXPECT_EQ(layout->modules[2].signature.output_shape, (std::vector<int64_t>{3, 3}));
  EXPECT_EQ(layout->modules[1].fuser, -1);
}

TEST(Validate, CanonicalizeDropsTrailingDefaults) {
  auto spec = make_case({with_inputs(op("AddExtraInput"), {std::nullopt})});
  spec.ops[0].output_bindings = {harness::OutputBindingSpec{}};
  spec.ops[0].extra_input_requires_grad = {true};
  spec.ops[0].param_requires_grad = {false, true};
  canonicalize(spec);
  EXPECT_TRUE(spec.ops[0].input_channels.empty());
  EXPECT_TRUE(spec.ops[0].output_bindings.empty());
  EXPECT_TRUE(spec.ops[0].extra_input_requires_grad.empty());
  EXPECT_EQ(spec.ops[0].param_requires_grad, std::vector<bool>{false});
}

}  // namespace
}  // namespace gradfuzz::generators
