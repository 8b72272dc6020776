#include "oracle/oracle.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

#include "oracle/tolerances.h"

namespace gradfuzz::oracle {

using harness::PathRun;
using harness::TensorMismatch;
using harness::VerdictKind;
namespace {

at::Tensor doubles(std::vector<double> values, std::vector<int64_t> shape) {
  return at::tensor(values, at::TensorOptions().dtype(at::kDouble)).reshape(shape);
}

/// One comparison of `got` against `expected`, its details.
std::vector<TensorMismatch> compare(const at::Tensor& expected, const at::Tensor& got, bool gradient, Tolerance tol,
                                    const at::Tensor& rounding = at::Tensor()) {
  std::vector<TensorMismatch> details;
  std::vector<std::string> notes;
  Comparer comparer(details, notes);
  comparer.compare("fused~reference", "grad_channel[c]", "grad_channel", expected, got, gradient, tol, rounding);
  return details;
}

constexpr Tolerance kFloat64{1e-7, 1e-7};
constexpr Tolerance kBFloat16{1.6e-2, 1e-5};

TEST(Comparer, ValuesWithinToleranceRecordNothing) {
  const at::Tensor e = doubles({1, -2, 3, 0.5}, {2, 2});
  EXPECT_TRUE(compare(e, e + 1e-9, true, kFloat64).empty());
}

TEST(Comparer, TheWorstElementIsRecordedWithItsIndexAndValues) {
  const at::Tensor e = doubles({1, -2, 3, 0.5}, {2, 2});
  at::Tensor g = e.clone();
  g[1][0] = 3.5;    // off by 0.5
  g[0][1] = -2.01;  // off by 0.01, a smaller excess
  const auto details = compare(e, g, true, kFloat64);
  ASSERT_EQ(details.size(), 1u);
  const TensorMismatch& d = details[0];
  EXPECT_EQ(d.kind, VerdictKind::kMismatch);
  EXPECT_EQ(d.index, (std::vector<int64_t>{1, 0}));
  EXPECT_DOUBLE_EQ(d.expected, 3);
  EXPECT_DOUBLE_EQ(d.got, 3.5);
  EXPECT_NEAR(d.max_abs_err, 0.5, 1e-12);
  EXPECT_DOUBLE_EQ(d.scale, 3);
  EXPECT_EQ(d.role, "grad_channel");
}

TEST(Comparer, AnUndefinedGradientIsMissingOnlyWhereTheExpectedOneIsNonZero) {
  const auto missing = compare(doubles({0, 0, 0.25}, {3}), at::Tensor(), true, kFloat64);
  ASSERT_EQ(missing.size(), 1u);
  EXPECT_EQ(missing[0].kind, VerdictKind::kMissingGradient);
  EXPECT_EQ(missing[0].index, (std::vector<int64_t>{2}));
  EXPECT_TRUE(compare(doubles({0, 0, 0}, {3}), at::Tensor(), true, kFloat64).empty());
  // A gradient where none is expected must be zero.
  EXPECT_TRUE(compare(at::Tensor(), doubles({0, 0}, {2}), true, kFloat64).empty());
  EXPECT_EQ(compare(at::Tensor(), doubles({0, 1}, {2}), true, kFloat64).size(), 1u);
}

TEST(Comparer, NonFiniteValuesFailWhateverTheAllowance) {
  const at::Tensor e = doubles({1, 2}, {2});
  const at::Tensor rounding = doubles({1e30, 1e30}, {2});
  EXPECT_EQ(compare(e, doubles({1, std::nan("")}, {2}), true, kBFloat16, rounding).size(), 1u);
  EXPECT_EQ(compare(e, doubles({std::numeric_limits<double>::infinity(), 2}, {2}), true, kBFloat16, rounding).size(),
            1u);
}

TEST(Comparer, ADifferentShapeIsAMismatch) {
  EXPECT_EQ(compare(doubles({1, 2}, {2}), doubles({1, 2}, {1, 2}), true, kFloat64).size(), 1u);
}

TEST(Comparer, RoundingAllowsSixteenTimesTheBaselinesErrorPerElement) {
  // bfloat16 case; the baseline's error at element 0 is 0.01: 16 * 0.01 = 0.16 allowed there
  // on top of the static tolerance (about 0.016 * (1 + rms) here).
  const at::Tensor e = doubles({1.0, 1.0, 1.0, 1.0}, {4});
  const at::Tensor rounding = doubles({0.01, 0, 0, 0}, {4});
  at::Tensor g = e.clone();
  g[0] = 1.15;
  EXPECT_TRUE(compare(e, g, true, kBFloat16, rounding).empty());
  g[0] = 1.25;
  EXPECT_EQ(compare(e, g, true, kBFloat16, rounding).size(), 1u);
  // Without a baseline the same 0.15 is far outside bfloat16's static tolerance.
  g[0] = 1.15;
  EXPECT_EQ(compare(e, g, true, kBFloat16).size(), 1u);
  // The allowance is the element's own: element 1 (no baseline error) gets none of it.
  g = e.clone();
  g[1] = 1.15;
  EXPECT_EQ(compare(e, g, true, kBFloat16, rounding).size(), 1u);
}

TEST(Comparer, NoBaselineErrorExcusesAnErrorTheSizeOfTheTensor) {
  // The review's case: a channel gradient off by 1.26 where max|expected| is 0.96 passed
  // under the old whole-tensor floor. Even a wildly wrong baseline (error 10 everywhere)
  // grants at most a quarter of max(|e_k|, rms).
  const at::Tensor e = doubles({0.96, -0.5, 0.25, 0.1}, {4});
  const at::Tensor rounding = doubles({10, 10, 10, 10}, {4});
  at::Tensor g = e.clone();
  g[0] = 0.96 - 1.26;
  const auto details = compare(e, g, true, kBFloat16, rounding);
  ASSERT_EQ(details.size(), 1u);
  EXPECT_EQ(details[0].index, (std::vector<int64_t>{0}));
  // A dropped contribution of a third of an element's value is caught too.
  g = e.clone();
  g[1] = -0.5 * 2.0 / 3.0;
  EXPECT_EQ(compare(e, g, true, kBFloat16, rounding).size(), 1u);
}

TEST(RoundingErrors, ANonFiniteBaselineGrantsNoAllowance) {
  PathRun reference;
  reference.outputs = {doubles({1, 2, 3}, {3})};
  PathRun baseline;
  baseline.outputs = {doubles({1.5, std::numeric_limits<double>::infinity(), std::nan("")}, {3})};
  const PathRun r = rounding_errors(reference, baseline);
  ASSERT_EQ(r.outputs.size(), 1u);
  EXPECT_TRUE(at::equal(r.outputs[0], doubles({0.5, 0, 0}, {3})));
}

}  // namespace
}  // namespace gradfuzz::oracle
