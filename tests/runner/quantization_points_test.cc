#include "runner/quantization_points.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace gradfuzz::runner {
namespace {

harness::CaseSpec linear_scale_case(double scale) {
  harness::CaseSpec spec;
  spec.ops = {harness::OpSpec{"GELU", {}, {}, {}, ops::OutputStyle::kVector, {}, {}},
              harness::OpSpec{"Linear", {{"out", 16}}, {}, {}, ops::OutputStyle::kVector, {}, {}},
              harness::OpSpec{"ConstantScale", {{"scale", scale}}, {}, {}, ops::OutputStyle::kVector, {}, {}}};
  return spec;
}

harness::PlanGroup group(const std::string& name, int64_t begin, int64_t end, bool fused) {
  harness::PlanGroup g;
  g.name = name;
  g.begin = begin;
  g.end = end;
  g.fused = fused;
  return g;
}

/// A path whose one fuser ran these backward groups (forward unfused).
harness::PathRun path(std::vector<harness::PlanGroup> backward) {
  harness::PathRun run;
  run.name = "fused";
  harness::FuserPlans plans;
  plans.forward = {group("GELU", 0, 1, false), group("Linear", 1, 2, false), group("ConstantScale", 2, 3, false)};
  plans.backward = std::move(backward);
  run.plans.push_back(plans);
  return run;
}

TEST(QuantizationPoints, AFiredBackwardLinearScaleGivesItsLinearTheScaleAsAlpha) {
  const harness::CaseSpec spec = linear_scale_case(3.0);
  const ops::QuantizationPoints points =
      quantization_points(spec, path({group("GELU", 0, 1, false), group("BackwardLinearScale", 1, 3, true)}));
  EXPECT_EQ(points.backward_gemm_alpha, (std::map<int64_t, double>{{1, 3.0}}));
  EXPECT_EQ(points.gradient_passthrough, (std::set<int64_t>{2}));
}

TEST(QuantizationPoints, UnfusedGroupsAndOtherPatternsGiveNone) {
  const harness::CaseSpec spec = linear_scale_case(1.5);
  // The unfused path: one group per op.
  EXPECT_TRUE(quantization_points(spec, path({group("GELU", 0, 1, false), group("Linear", 1, 2, false),
                                              group("ConstantScale", 2, 3, false)}))
                  .empty());
  // A group of that name over ops that are not its pattern, and one in the forward pass.
  EXPECT_TRUE(quantization_points(spec, path({group("BackwardLinearScale", 0, 2, true)})).empty());
  harness::PathRun forward = path({});
  forward.plans[0].forward = {group("BackwardLinearScale", 1, 3, true)};
  EXPECT_TRUE(quantization_points(spec, forward).empty());
  // A path without plans (it failed before its fusers were built).
  EXPECT_TRUE(quantization_points(spec, harness::PathRun{}).empty());
}

TEST(QuantizationPoints, TheCatalogsDefaultScaleWhereTheCaseLeavesItOut) {
  harness::CaseSpec spec = linear_scale_case(1.5);
  spec.ops[2].attrs.clear();
  const ops::QuantizationPoints points = quantization_points(spec, path({group("BackwardLinearScale", 1, 3, true)}));
  EXPECT_EQ(points.backward_gemm_alpha.at(1), 0.5);
}

}  // namespace
}  // namespace gradfuzz::runner
