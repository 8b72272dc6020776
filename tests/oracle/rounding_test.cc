#include "oracle/rounding.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "harness/dtype.h"

namespace gradfuzz::oracle {
namespace {

using ::testing::HasSubstr;

// The low-precision rule on tensors whose rounding is real: values rounded to bfloat16 the
// way a path rounds them, evidence measured the way the runner measures it.

constexpr double kU = 0x1p-8;  // bfloat16's unit roundoff

at::Tensor normal(int64_t n, uint64_t seed, double scale = 1.0) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  return at::randn({n}, gen, at::TensorOptions().dtype(at::kDouble)) * scale;
}

at::Tensor in_bf16(const at::Tensor& t) { return t.to(at::kBFloat16).to(at::kDouble); }

/// Findings of one path tensor `got` against `e` under `bounds` (name "output").
std::vector<Finding> judge(const at::Tensor& e, const at::Tensor& got, const CaseBounds& bounds) {
  std::vector<Finding> findings;
  std::vector<std::string> notes;
  Comparer comparer(findings, notes);
  comparer.compare("fused~reference", "output", "output", e, got, false, bounds.bound("output"));
  return findings;
}

/// Evidence of a tensor that is `e` rounded once: the baseline error, and two samples of the
/// same rounding on inputs moved by a relative u.
RoundingEvidence rounded_once(const at::Tensor& e, uint64_t seed) {
  RoundingEvidence ev;
  ev.baseline_error["output"] = (in_bf16(e) - e).abs();
  at::Tensor s = at::zeros_like(e);
  for (uint64_t k = 0; k < 2; ++k) {
    const at::Tensor moved = e * (1 + kU * (at::rand(e.sizes(), at::detail::createCPUGenerator(seed + k),
                                                     at::TensorOptions().dtype(at::kDouble)) *
                                                2 -
                                            1));
    s = at::maximum(s, (in_bf16(moved) - e).abs());
  }
  ev.sensitivity["output"] = s;
  return ev;
}

const ToleranceContext kOneOp{1, 1};

TEST(LowPrecisionRule, AFivePercentErrorFailsWhereRoundingPasses) {
  const at::Tensor e = normal(64, 1);
  const std::map<std::string, at::Tensor> expected{{"output", e}};
  const CaseBounds first = first_bounds(at::kBFloat16, kOneOp, expected);
  // A correct path: the value rounded to bfloat16 (half an ulp at most per element).
  EXPECT_TRUE(judge(e, in_bf16(e), first).empty());
  const CaseBounds full = evidence_bounds(at::kBFloat16, kOneOp, expected, rounded_once(e, 7));
  EXPECT_TRUE(judge(e, in_bf16(e), full).empty());
  // 5% = 13 u: past the norm bound (2 u ||e|| plus 4x the rounding noise's norm).
  const auto five = judge(e, in_bf16(e * 1.05), full);
  ASSERT_EQ(five.size(), 1u);
  EXPECT_GT(five[0].norm_err, five[0].norm_bound);
  // And a doubled value by far.
  const auto twice = judge(e, in_bf16(e * 2), full);
  ASSERT_EQ(twice.size(), 1u);
  EXPECT_GT(twice[0].max_abs_err, 10 * twice[0].rounding);
}

TEST(LowPrecisionRule, ACancellationIsBoundedByItsTermsNotItsResult) {
  // e = a - b: terms of magnitude 10, a result of magnitude 1. A bfloat16 path rounds a and b
  // before subtracting: an error of u * 10, ten times u * |e|.
  const at::Tensor a = normal(32, 2, 10.0);
  const at::Tensor b = a + normal(32, 3, 1.0);
  const at::Tensor e = a - b;
  const at::Tensor path = in_bf16(in_bf16(a) - in_bf16(b));
  const std::map<std::string, at::Tensor> expected{{"output", e}};
  EXPECT_FALSE(judge(e, path, first_bounds(at::kBFloat16, kOneOp, expected)).empty());
  // The evidence: the same subtraction on inputs moved by a relative u, rounded.
  RoundingEvidence ev;
  ev.baseline_error["output"] = (path - e).abs();
  at::Tensor s = at::zeros_like(e);
  for (uint64_t k = 0; k < 2; ++k) {
    auto moved = [&](const at::Tensor& t, uint64_t seed) {
      return t * (1 + kU * (at::rand(t.sizes(), at::detail::createCPUGenerator(seed),
                                     at::TensorOptions().dtype(at::kDouble)) *
                                2 -
                            1));
    };
    s = at::maximum(s, (in_bf16(in_bf16(moved(a, 10 + k)) - in_bf16(moved(b, 20 + k))) - e).abs());
  }
  ev.sensitivity["output"] = s;
  int64_t widened = 0;
  const CaseBounds full = evidence_bounds(at::kBFloat16, kOneOp, expected, ev, {}, &widened);
  EXPECT_EQ(widened, 1);  // counted as a small difference of large terms
  // Another rounding of the same computation (the other order) passes...
  EXPECT_TRUE(judge(e, in_bf16(-(in_bf16(b) - in_bf16(a))), full).empty());
  // ...a dropped term does not (the path returns a alone).
  EXPECT_FALSE(judge(e, in_bf16(a), full).empty());
  // Nor does a doubled result.
  EXPECT_FALSE(judge(e, in_bf16(e * 2), full).empty());
}

TEST(LowPrecisionRule, WhereTheBaselineIsExactAnElementMayBeOffByTheRoundingOfItsTerms) {
  // A float16 sum e = a + b whose terms and result all lie on float16 values: the baseline
  // and every rounding sample are exact there, and the floor allows about one ulp. A correct
  // path that rounds the larger term once more (a = 40 comes out of a product as 40.03125,
  // one ulp of a) is off by 2 ulps of e: seen in a FusedResidual gradient on edge shapes.
  constexpr double kU16 = 0x1p-11;
  const auto options = at::TensorOptions().dtype(at::kDouble);
  // A large tensor (as on edge shapes), so that one element's 2 ulps stay far inside the
  // norm-wise bound and only the per-element rule decides.
  const at::Tensor a = at::full({4096}, 40.0, options);
  at::Tensor b = at::full({4096}, -39.0, options);
  b[3] = -21.5625;
  const at::Tensor e = a + b;  // 1, and 18.4375 at element 3: float16 values
  ASSERT_TRUE(at::equal(e.to(at::kHalf).to(at::kDouble), e));
  at::Tensor got = e.clone();
  got[3] = 18.46875;
  const std::map<std::string, at::Tensor> expected{{"output", e}};
  RoundingEvidence ev;
  ev.baseline_error["output"] = at::zeros_like(e);
  ev.sensitivity["output"] = at::zeros_like(e);
  EXPECT_FALSE(judge(e, got, evidence_bounds(at::kHalf, kOneOp, expected, ev)).empty());
  // Output noise: the float64 sum of the terms rounded once more, each by a relative u.
  at::Generator gen = at::detail::createCPUGenerator(5);
  auto noisy = [&](const at::Tensor& t) { return t * (1 + kU16 * (at::rand(t.sizes(), gen, options) * 2 - 1)); };
  at::Tensor n = at::zeros_like(e);
  for (int k = 0; k < 4; ++k) n = at::maximum(n, (noisy(noisy(a) + noisy(b)) - e).abs());
  ev.output_noise["output"] = n;
  const CaseBounds full = evidence_bounds(at::kHalf, kOneOp, expected, ev);
  EXPECT_TRUE(judge(e, got, full).empty());
  // Per element only: 5% of the whole tensor (100 u) still fails, by its norm.
  const auto five = judge(e, e * 1.05, full);
  ASSERT_EQ(five.size(), 1u);
  EXPECT_GT(five[0].norm_err, five[0].norm_bound);
  // And 16 ulps (1.4%) at one element is more than another order of rounding gives.
  got[3] = e[3].item<double>() + 16 * 0x1p-6;
  EXPECT_FALSE(judge(e, got, full).empty());
}

TEST(LowPrecisionRule, AnElementNearAKinkMayTakeTheOtherBranchAndNothingElse) {
  // The gradient of relu at x = [1e-4, 0.8, -0.5, 1.2] for g = [2, 1, 1, 1]: element 0 lies
  // within bfloat16 rounding of the kink (the baseline moved it by 1e-3).
  const at::Tensor x = at::tensor({1e-4, 0.8, -0.5, 1.2}, at::TensorOptions().dtype(at::kDouble));
  const at::Tensor moved = at::tensor({-9e-4, 0.8, -0.5, 1.2}, at::TensorOptions().dtype(at::kDouble));
  const at::Tensor g = at::tensor({2.0, 1.0, 1.0, 1.0}, at::TensorOptions().dtype(at::kDouble));
  const at::Tensor e = g * (x > 0);
  const KinkGroups kinks = near_kinks({{3, x}}, {{3, moved}}, kU);
  EXPECT_EQ(kinks.elements, 1);
  ASSERT_EQ(kinks.groups.size(), 1u);
  EXPECT_TRUE(kinks.groups[0].at(3)[0].item<bool>());
  EXPECT_FALSE(kinks.groups[0].at(3)[1].item<bool>());
  // The reference with element 0 flipped: its gradient there is 0 instead of 2.
  at::Tensor flipped = e.clone();
  flipped[0] = 0;
  RoundingEvidence ev;
  ev.baseline_error["output"] = at::zeros_like(e);
  ev.kink_effect["output"] = (flipped - e).abs();
  const std::map<std::string, at::Tensor> expected{{"output", e}};
  const CaseBounds full = evidence_bounds(at::kBFloat16, kOneOp, expected, ev);
  EXPECT_FALSE(judge(e, flipped, first_bounds(at::kBFloat16, kOneOp, expected)).empty());
  EXPECT_TRUE(judge(e, flipped, full).empty());  // the other branch at the kink: allowed
  at::Tensor wrong = e.clone();
  wrong[1] = 2;  // element 1 is far from its kink: a doubled gradient there is a finding
  EXPECT_FALSE(judge(e, wrong, full).empty());
}

TEST(LowPrecisionRule, ElementsFarFromAKinkAreNotNearIt) {
  const at::Tensor x = at::tensor({0.5, -0.25, 1e-6}, at::TensorOptions().dtype(at::kDouble));
  const KinkGroups kinks = near_kinks({{0, x}}, {{0, x}}, kU);
  // 1e-6 is within u * rms(x) * 8 of 0; the others are not.
  EXPECT_EQ(kinks.elements, 1);
}

TEST(LowPrecisionRule, AFusedPathFarWorseThanTheUnfusedOneIsAFinding) {
  CaseSpec spec;
  spec.ops.resize(1);
  spec.ops[0].name = "Linear";
  const at::Tensor e = normal(64, 4);
  PathRun reference;
  reference.outputs = {e};
  PathRun unfused;
  unfused.name = "unfused";
  unfused.outputs = {in_bf16(e)};  // one rounding
  PathRun fused;
  fused.name = "fused";
  // Sixteen roundings' worth of error in every element: what a half-precision accumulation does.
  fused.outputs = {e + 16 * kU * e.abs() * at::sign(normal(64, 5))};
  std::vector<Finding> findings;
  compare_fused_unfused(spec, reference, fused, unfused, at::kBFloat16, kOneOp, nullptr, findings);
  ASSERT_EQ(findings.size(), 1u);
  EXPECT_EQ(findings[0].path_pair, "fused~unfused");
  EXPECT_THAT(findings[0].note, HasSubstr("the unfused path's"));
  // A fused path as good as the unfused one is not.
  findings.clear();
  fused.outputs = {in_bf16(e * (1 + kU / 2))};
  compare_fused_unfused(spec, reference, fused, unfused, at::kBFloat16, kOneOp, nullptr, findings);
  EXPECT_TRUE(findings.empty());
}

TEST(LowPrecisionRule, FirstBoundsOfFloat32AndFloat64AreTheStaticTolerances) {
  const std::map<std::string, at::Tensor> expected{{"output", normal(4, 6)}};
  EXPECT_TRUE(first_bounds(at::kDouble, kOneOp, expected).tensors.empty());
  EXPECT_DOUBLE_EQ(first_bounds(at::kFloat, kOneOp, expected).fallback.rtol, case_tolerance(at::kFloat, kOneOp).rtol);
  EXPECT_DOUBLE_EQ(first_bounds(at::kBFloat16, kOneOp, expected).bound("output").rtol, 2 * kU);
}

TEST(LowPrecisionRule, AbsDifferencesAreInfiniteWhereOnlyTheOtherRunOverflows) {
  CaseSpec spec;
  PathRun reference;
  reference.outputs = {at::tensor({1.0, 7e4}, at::TensorOptions().dtype(at::kDouble))};
  PathRun half;
  half.outputs = {at::tensor({1.0, std::numeric_limits<double>::infinity()}, at::TensorOptions().dtype(at::kDouble))};
  const auto d = abs_differences(spec, reference, half);
  ASSERT_TRUE(d.count("output"));
  EXPECT_DOUBLE_EQ(d.at("output")[0].item<double>(), 0);
  EXPECT_TRUE(std::isinf(d.at("output")[1].item<double>()));
}

}  // namespace
}  // namespace gradfuzz::oracle
