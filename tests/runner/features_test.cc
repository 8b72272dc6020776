#include "runner/features.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "harness/builder.h"
#include "tests/harness/test_specs.h"

namespace gradfuzz::runner {
namespace {

using harness::CaseResult;
using harness::CaseSpec;
using harness::OutputBindingSpec;
using harness::PathRun;
using harness::PlanGroup;
using harness::RepeatCall;
using harness::testing::op;
using ::testing::ElementsAre;
using ::testing::IsEmpty;

OutputBindingSpec hidden(std::string channel) { return {std::move(channel), false}; }

/// MakeExtraOutput -> ConstantScale -> AddExtraInput through one hidden channel "r".
CaseSpec residual() {
  CaseSpec spec;
  spec.ops = {op("MakeExtraOutput", {}, {}, {hidden("r")}), op("ConstantScale", {{"scale", 0.75}}),
              op("AddExtraInput", {}, {std::string("r")})};
  return spec;
}

std::vector<std::string> features_of(const CaseSpec& spec) { return static_features(spec, harness::plan_case(spec)); }

PlanGroup group(const std::string& name, int64_t begin, int64_t end, bool fused) {
  PlanGroup g;
  g.name = name;
  g.begin = begin;
  g.end = end;
  g.fused = fused;
  return g;
}

TEST(Features, APlainChainHasNone) {
  CaseSpec spec;
  spec.ops = {op("Linear", {{"out", 6}}), op("Bias"), op("ReLU")};
  EXPECT_THAT(features_of(spec), IsEmpty());
}

TEST(Features, AHiddenChannelIsABoundInputAndAHiddenOutput) {
  EXPECT_THAT(features_of(residual()), ElementsAre("bound_input", "hidden_output"));
}

TEST(Features, TwoConsumersOfOneChannelAreAFanout) {
  CaseSpec spec = residual();
  spec.ops.push_back(op("AddExtraInput", {}, {std::string("r")}));
  EXPECT_THAT(features_of(spec), ElementsAre("bound_input", "hidden_output", "fanout"));
}

TEST(Features, RepeatCallsWithoutGradAndAnInputWithoutGrad) {
  CaseSpec spec;
  spec.ops = {op("Linear", {{"out", 6}})};
  spec.input_requires_grad = false;
  RepeatCall no_grad;
  no_grad.no_grad = true;
  spec.repeat_calls = {RepeatCall{}, no_grad};
  EXPECT_THAT(features_of(spec), ElementsAre("no_grad_input", "repeat_calls", "no_grad_call"));
}

TEST(Features, AFusedGroupHoldingBothEndsOfAChannelIsSameFusionChannel) {
  const CaseSpec spec = residual();
  PathRun fused;
  harness::FuserPlans plans;
  plans.forward = {group("FusedResidual", 0, 3, true)};
  plans.backward = {group("AddExtraInput", 2, 3, false), group("BackwardScale", 0, 2, true)};
  fused.plans.push_back(plans);
  CaseResult result;
  add_plan_coverage(spec, fused, result);
  EXPECT_THAT(result.fusions_fired, ElementsAre("FusedResidual", "BackwardScale"));
  EXPECT_THAT(result.fused_forward, ElementsAre("FusedResidual"));
  EXPECT_THAT(result.fused_backward, ElementsAre("BackwardScale"));
  EXPECT_THAT(result.features, ElementsAre("same_fusion_channel"));
  add_compared_fusions(result);
  EXPECT_THAT(result.fused_compared, ElementsAre("FusedResidual", "BackwardScale"));
}

TEST(Features, AGroupThatHoldsOnlyTheConsumerIsNoSameFusionChannel) {
  const CaseSpec spec = residual();
  PathRun fused;
  harness::FuserPlans plans;
  plans.forward = {group("MakeExtraOutput", 0, 1, false), group("ScaleAdd", 1, 3, true)};
  fused.plans.push_back(plans);
  CaseResult result;
  add_plan_coverage(spec, fused, result);
  EXPECT_THAT(result.fused_forward, ElementsAre("ScaleAdd"));
  EXPECT_THAT(result.fused_backward, IsEmpty());
  EXPECT_THAT(result.features, IsEmpty());
}

}  // namespace
}  // namespace gradfuzz::runner
