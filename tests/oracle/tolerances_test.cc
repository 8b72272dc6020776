#include "oracle/tolerances.h"

#include <gtest/gtest.h>

#include "harness/dtype.h"

namespace gradfuzz::oracle {

using harness::scalar_type_from_name;
namespace {

TEST(Tolerances, BaseTableIsAssertCloseDefaults) {
  EXPECT_DOUBLE_EQ(base_tolerance(at::kDouble).rtol, 1e-7);
  EXPECT_DOUBLE_EQ(base_tolerance(at::kDouble).atol, 1e-7);
  EXPECT_DOUBLE_EQ(base_tolerance(at::kFloat).rtol, 1.3e-6);
  EXPECT_DOUBLE_EQ(base_tolerance(at::kFloat).atol, 1e-5);
  EXPECT_DOUBLE_EQ(base_tolerance(at::kHalf).rtol, 1e-3);
  EXPECT_DOUBLE_EQ(base_tolerance(at::kHalf).atol, 1e-5);
  EXPECT_DOUBLE_EQ(base_tolerance(at::kBFloat16).rtol, 1.6e-2);
  EXPECT_DOUBLE_EQ(base_tolerance(at::kBFloat16).atol, 1e-5);
  EXPECT_THROW(base_tolerance(at::kLong), std::invalid_argument);
}

TEST(Tolerances, DtypeNamesMapToScalarTypes) {
  EXPECT_EQ(scalar_type_from_name("bfloat16"), at::kBFloat16);
  EXPECT_EQ(scalar_type_from_name("float16"), at::kHalf);
  EXPECT_THROW(scalar_type_from_name("half"), std::invalid_argument);
}

TEST(Tolerances, ShortReductionsAndOneOpKeepTheBase) {
  const Tolerance t = case_tolerance(at::kFloat, {1, 16});
  EXPECT_DOUBLE_EQ(t.rtol, 1.3e-6);
  EXPECT_DOUBLE_EQ(t.atol, 1e-5);
}

TEST(Tolerances, ReductionsScaleBySqrtOfLength) {
  EXPECT_DOUBLE_EQ(reduction_factor(64), 2.0);
  EXPECT_DOUBLE_EQ(reduction_factor(1), 1.0);
  EXPECT_DOUBLE_EQ(case_tolerance(at::kDouble, {1, 256}).rtol, 4e-7);
}

TEST(Tolerances, LowPrecisionScalesWithOpDepthFloat64DoesNot) {
  EXPECT_DOUBLE_EQ(case_tolerance(at::kBFloat16, {4, 16}).rtol, 2 * 1.6e-2);
  EXPECT_DOUBLE_EQ(case_tolerance(at::kHalf, {9, 16}).rtol, 3e-3);
  EXPECT_DOUBLE_EQ(case_tolerance(at::kDouble, {8, 16}).rtol, 1e-7);
  EXPECT_DOUBLE_EQ(case_tolerance(at::kFloat, {8, 16}).rtol, 2 * 1.3e-6);
  EXPECT_DOUBLE_EQ(case_tolerance(at::kFloat, {2, 16}).rtol, 1.3e-6);
}

TEST(Tolerances, PathPairIsTwiceTheCaseTolerance) {
  const Tolerance a = case_tolerance(at::kHalf, {2, 64});
  const Tolerance b = path_pair_tolerance(at::kHalf, {2, 64});
  EXPECT_DOUBLE_EQ(b.rtol, 2 * a.rtol);
  EXPECT_DOUBLE_EQ(b.atol, 2 * a.atol);
}

TEST(Tolerances, EffectiveAtolAddsRtolTimesRms) {
  EXPECT_DOUBLE_EQ(effective_atol({1e-2, 1e-5}, 3.0), 1e-5 + 3e-2);
  EXPECT_DOUBLE_EQ(effective_atol({1e-2, 1e-5}, std::numeric_limits<double>::infinity()), 1e-5);
}

}  // namespace
}  // namespace gradfuzz::oracle
