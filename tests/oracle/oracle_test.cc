#include "oracle/oracle.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

#include "oracle/tolerances.h"

namespace gradfuzz::oracle {
namespace {

at::Tensor doubles(std::vector<double> values, std::vector<int64_t> shape) {
  return at::tensor(values, at::TensorOptions().dtype(at::kDouble)).reshape(shape);
}

TensorBound bound(Tolerance t, const at::Tensor& allowance = at::Tensor(),
                  double norm = std::numeric_limits<double>::infinity()) {
  TensorBound b;
  b.rtol = t.rtol;
  b.atol = t.atol;
  b.allowance = allowance;
  b.norm_bound = norm;
  return b;
}

/// One comparison of `got` against `expected`, its findings.
std::vector<Finding> compare(const at::Tensor& expected, const at::Tensor& got, bool gradient, const TensorBound& b) {
  std::vector<Finding> findings;
  std::vector<std::string> notes;
  Comparer comparer(findings, notes);
  comparer.compare("fused~reference", "grad_channel[c]", "grad_channel", expected, got, gradient, b);
  return findings;
}

constexpr Tolerance kFloat64{1e-7, 1e-7};
constexpr Tolerance kBFloat16{1.6e-2, 1e-5};

TEST(Comparer, ValuesWithinToleranceRecordNothing) {
  const at::Tensor e = doubles({1, -2, 3, 0.5}, {2, 2});
  EXPECT_TRUE(compare(e, e + 1e-9, true, bound(kFloat64)).empty());
}

TEST(Comparer, TheWorstElementIsRecordedWithItsIndexAndValues) {
  const at::Tensor e = doubles({1, -2, 3, 0.5}, {2, 2});
  at::Tensor g = e.clone();
  g[1][0] = 3.5;    // off by 0.5
  g[0][1] = -2.01;  // off by 0.01, a smaller excess
  const auto findings = compare(e, g, true, bound(kFloat64));
  ASSERT_EQ(findings.size(), 1u);
  const Finding& d = findings[0];
  EXPECT_EQ(d.kind, VerdictKind::kMismatch);
  EXPECT_EQ(d.index, (std::vector<int64_t>{1, 0}));
  EXPECT_DOUBLE_EQ(d.expected, 3);
  EXPECT_DOUBLE_EQ(d.got, 3.5);
  EXPECT_NEAR(d.max_abs_err, 0.5, 1e-12);
  EXPECT_DOUBLE_EQ(d.scale, 3);
  EXPECT_EQ(d.role, "grad_channel");
}

TEST(Comparer, AnUndefinedGradientIsMissingOnlyWhereTheExpectedOneIsNonZero) {
  const auto missing = compare(doubles({0, 0, 0.25}, {3}), at::Tensor(), true, bound(kFloat64));
  ASSERT_EQ(missing.size(), 1u);
  EXPECT_EQ(missing[0].kind, VerdictKind::kMissingGradient);
  EXPECT_EQ(missing[0].index, (std::vector<int64_t>{2}));
  EXPECT_TRUE(compare(doubles({0, 0, 0}, {3}), at::Tensor(), true, bound(kFloat64)).empty());
  // A gradient where none is expected must be zero.
  EXPECT_TRUE(compare(at::Tensor(), doubles({0, 0}, {2}), true, bound(kFloat64)).empty());
  EXPECT_EQ(compare(at::Tensor(), doubles({0, 1}, {2}), true, bound(kFloat64)).size(), 1u);
}

TEST(Comparer, NonFiniteValuesFailWhateverTheFiniteAllowance) {
  const at::Tensor e = doubles({1, 2}, {2});
  const at::Tensor allowance = doubles({1e30, 1e30}, {2});
  EXPECT_EQ(compare(e, doubles({1, std::nan("")}, {2}), true, bound(kBFloat16, allowance)).size(), 1u);
  EXPECT_EQ(
      compare(e, doubles({std::numeric_limits<double>::infinity(), 2}, {2}), true, bound(kBFloat16, allowance)).size(),
      1u);
}

TEST(Comparer, AnInfiniteAllowanceIsWhereTheDtypeCannotHoldTheValue) {
  // The dtype's own reference overflows at element 1: nothing can be judged there.
  const at::Tensor e = doubles({1, 7e4}, {2});
  const at::Tensor allowance = doubles({0, std::numeric_limits<double>::infinity()}, {2});
  constexpr Tolerance kTight{0, 1e-5};  // no rtol: element 0's bound is not widened by the huge element 1
  EXPECT_TRUE(
      compare(e, doubles({1, std::numeric_limits<double>::infinity()}, {2}), true, bound(kTight, allowance)).empty());
  EXPECT_EQ(
      compare(e, doubles({3, std::numeric_limits<double>::infinity()}, {2}), true, bound(kTight, allowance)).size(),
      1u);
}

TEST(Comparer, ADifferentShapeIsAMismatch) {
  EXPECT_EQ(compare(doubles({1, 2}, {2}), doubles({1, 2}, {1, 2}), true, bound(kFloat64)).size(), 1u);
}

TEST(Comparer, TheAllowanceIsPerElement) {
  const at::Tensor e = doubles({1.0, 1.0, 1.0, 1.0}, {4});
  const at::Tensor allowance = doubles({0.16, 0, 0, 0}, {4});
  at::Tensor g = e.clone();
  g[0] = 1.15;
  EXPECT_TRUE(compare(e, g, true, bound(kBFloat16, allowance)).empty());
  g[0] = 1.25;
  EXPECT_EQ(compare(e, g, true, bound(kBFloat16, allowance)).size(), 1u);
  // Element 1 gets none of element 0's allowance.
  g = e.clone();
  g[1] = 1.15;
  EXPECT_EQ(compare(e, g, true, bound(kBFloat16, allowance)).size(), 1u);
}

TEST(Comparer, ATensorWithinEveryElementsBoundCanFailAsAWhole) {
  // Every element 4% off: inside a loose per-element bound, outside a norm bound of 1%.
  const at::Tensor e = doubles({1, -1, 1, -1}, {4});
  const double norm = 0.01 * e.norm().item<double>();
  const auto findings = compare(e, e * 1.04, true, bound({0.1, 0}, at::Tensor(), norm));
  ASSERT_EQ(findings.size(), 1u);
  EXPECT_NEAR(findings[0].norm_err, 0.08, 1e-12);
  EXPECT_DOUBLE_EQ(findings[0].norm_bound, norm);
  EXPECT_NE(findings[0].note.find("as a whole"), std::string::npos);
}

TEST(CaseBounds, ATensorWithoutItsOwnBoundGetsTheFallback) {
  CaseBounds bounds;
  bounds.fallback = kBFloat16;
  bounds.tensors["output"] = bound({0.5, 0.5});
  EXPECT_DOUBLE_EQ(bounds.bound("output").rtol, 0.5);
  EXPECT_DOUBLE_EQ(bounds.bound("grad_input").rtol, kBFloat16.rtol);
}

TEST(ComparedTensors, NamesEveryTensorTheOracleJudges) {
  CaseSpec spec;
  spec.ops.resize(2);
  spec.ops[0].name = "Linear";
  spec.ops[1].name = "RowStat";
  PathRun run;
  run.outputs = {doubles({1}, {1}), doubles({2}, {1})};
  run.grad_input = doubles({3}, {1});
  run.grad_params = {{doubles({4}, {1})}, {}};
  run.grad_extra_inputs = {doubles({5}, {1})};
  run.channel_grads = {{{"c0", doubles({6}, {1})}}};
  std::vector<std::string> names;
  for (const auto& t : compared_tensors(spec, run, run)) names.push_back(t.name);
  EXPECT_EQ(names, (std::vector<std::string>{"output", "extra_output[0]", "grad_input", "grad_param[0].Linear[0]",
                                             "grad_extra_input[0]", "grad_channel[c0]"}));
  // A backend that exposes only some channels is judged on those.
  PathRun partial = run;
  partial.channel_grads = {{}};
  EXPECT_EQ(compared_tensors(spec, run, partial, /*got_exposes_all_channels=*/false).size(), 5u);
}

}  // namespace
}  // namespace gradfuzz::oracle
