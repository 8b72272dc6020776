#include "runner/evidence.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "harness/dtype.h"
#include "runner/case_cost.h"
#include "tests/harness/test_specs.h"
#include "tests/runner/prepared_set.h"

namespace gradfuzz::runner {
namespace {

using harness::CaseSpec;
using harness::RepeatCall;
using harness::testing::op;

/// Linear -> GELU -> Linear under Float8CurrentScaling with a repeat call (FP8 windows,
/// coarse evidence), or without a recipe in bfloat16 (output noise, kinks of the ReLU).
CaseSpec quantizing() {
  CaseSpec spec;
  spec.ops = {op("Linear", {{"out", 16}}), op("GELU"), op("Linear", {{"out", 8}})};
  spec.input_shape = {8, 32};
  spec.dtype = "float32";
  spec.recipe = harness::RecipeSpec{"Float8CurrentScaling", "E4M3", {}};
  spec.repeat_calls = {RepeatCall{}};
  spec.seed = 21;
  return spec;
}

CaseSpec half_precision() {
  CaseSpec spec;
  spec.ops = {op("Linear", {{"out", 6}}), op("Bias"), op("ReLU")};
  spec.input_shape = {8, 12};
  spec.dtype = "bfloat16";
  spec.seed = 3;
  return spec;
}

using Case = testing::PreparedSet;

bool same(const std::map<std::string, at::Tensor>& a, const std::map<std::string, at::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [name, t] : a) {
    const auto it = b.find(name);
    if (it == b.end() || t.defined() != it->second.defined()) return false;
    if (t.defined() && !(t.sizes() == it->second.sizes() && at::equal(t, it->second))) return false;
  }
  return true;
}

void expect_same_evidence(const oracle::RoundingEvidence& a, const oracle::RoundingEvidence& b) {
  EXPECT_TRUE(same(a.baseline_error, b.baseline_error));
  EXPECT_TRUE(same(a.sensitivity, b.sensitivity));
  EXPECT_TRUE(same(a.output_noise, b.output_noise));
  EXPECT_TRUE(same(a.kink_effect, b.kink_effect));
  EXPECT_EQ(a.kink_elements, b.kink_elements);
  EXPECT_EQ(a.quantized, b.quantized);
}

/// Whether two samplers' generators stand at the same state.
bool same_draws(const EvidenceSampler& a, const EvidenceSampler& b) {
  const Draws da = a.carry().draws;
  const Draws db = b.carry().draws;
  return at::equal(da.samples.get_state(), db.samples.get_state()) &&
         at::equal(da.noise.get_state(), db.noise.get_state());
}

/// Judging's order on a sampler: the gathering, the coarse evidence, rounds 1 and 2.
void judge_all(EvidenceSampler& sampler) {
  ASSERT_TRUE(sampler.gather());
  (void)sampler.repeat_call_bounds();
  sampler.add_round(1);
  sampler.add_round(2);
}

TEST(EvidenceSampler, DrawsTheSameSamplesInPiecesAsInOneGo) {
  for (CaseSpec spec : {quantizing(), half_precision()}) {
    SCOPED_TRACE(spec.dtype);
    Case c(spec);
    EvidenceSampler at_once(*c.set, c.options);
    judge_all(at_once);
    // However many pieces were drawn ahead before judging asks: none of the gathering done,
    // part of it, all of it and part of round 1, everything there is.
    for (const int pieces : {1, 3, 9, 1000}) {
      SCOPED_TRACE(pieces);
      EvidenceSampler ahead(*c.set, c.options);
      CaseCostRecorder recorder(true);
      for (int k = 0; k < pieces && ahead.advance(); ++k) {
      }
      judge_all(ahead);
      const CaseCost cost = recorder.finish();
      expect_same_evidence(ahead.evidence(), at_once.evidence());
      EXPECT_TRUE(same_draws(ahead, at_once));
      const auto a = ahead.repeat_call_bounds();
      const auto b = at_once.repeat_call_bounds();
      ASSERT_EQ(a.has_value(), b.has_value());
      if (a) {
        EXPECT_TRUE(at::equal(a->tensors.at("output").allowance, b->tensors.at("output").allowance));
      }
      EXPECT_GT(cost.counts.count("ahead_pieces"), 0u);
    }
  }
}

TEST(EvidenceSampler, AQuantizingCaseGetsWindowsAndCoarseRepeatBounds) {
  Case c(quantizing());
  EvidenceSampler sampler(*c.set, c.options);
  ASSERT_TRUE(sampler.gather());
  EXPECT_TRUE(sampler.evidence().quantized);
  EXPECT_EQ(sampler.carry().windows.windows.size(), sampler.carry().windows.reference.size());
  EXPECT_FALSE(sampler.carry().windows.windows.empty());
  const auto repeat = sampler.repeat_call_bounds();
  ASSERT_TRUE(repeat.has_value());
  // Each tensor's allowance is uniform: its largest element's.
  const at::Tensor allowance = repeat->tensors.at("output").allowance;
  EXPECT_TRUE(at::equal(allowance, at::full_like(allowance, allowance.max().item<double>())));
  Case plain(half_precision());
  EvidenceSampler none(*plain.set, plain.options);
  ASSERT_TRUE(none.gather());
  EXPECT_FALSE(none.repeat_call_bounds().has_value());
  EXPECT_FALSE(none.evidence().output_noise.empty());
}

TEST(EvidenceSampler, HandsItsStateOnToASamplerOfTheSameReference) {
  Case c(quantizing());
  EvidenceSampler parent(*c.set, c.options);
  ASSERT_TRUE(parent.gather());
  (void)parent.repeat_call_bounds();
  parent.add_round(1);
  const EvidenceSampler::Carry carry = parent.carry();
  EvidenceSampler rerun(*c.set, c.options);
  ASSERT_TRUE(rerun.matches(carry));
  rerun.take(carry);
  EXPECT_TRUE(rerun.gather());  // nothing left to gather
  parent.add_round(2);
  rerun.add_round(2);
  expect_same_evidence(rerun.evidence(), parent.evidence());
  EXPECT_TRUE(same_draws(rerun, parent));
  // Another case's values are not what the carry was measured against.
  CaseSpec other = quantizing();
  other.seed = 22;
  Case d(other);
  EXPECT_FALSE(EvidenceSampler(*d.set, d.options).matches(carry));
}

TEST(EvidenceSampler, ContinuesTheStreamOfTheSamplerBeforeIt) {
  Case c(half_precision());
  Case d([] {
    CaseSpec spec = half_precision();
    spec.seed = 4;
    return spec;
  }());
  EvidenceSampler first(*c.set, c.options);
  ASSERT_TRUE(first.gather());
  first.add_round(1);
  // A sampler that drew ahead from its own generators and one that did not draw the same
  // samples once they continue from `first`: the pieces drawn ahead are dropped.
  EvidenceSampler ahead(*d.set, d.options);
  while (ahead.advance()) {
  }
  ASSERT_TRUE(ahead.gather());
  EvidenceSampler plain(*d.set, d.options);
  ASSERT_TRUE(plain.gather());
  ahead.continue_from(first);
  plain.continue_from(first);
  EXPECT_TRUE(same_draws(ahead, first));
  ahead.add_round(1);
  plain.add_round(1);
  expect_same_evidence(ahead.evidence(), plain.evidence());
  // Continuing from itself changes nothing.
  const Draws before = first.carry().draws;
  first.continue_from(first);
  EXPECT_TRUE(at::equal(before.samples.get_state(), first.carry().draws.samples.get_state()));
}

TEST(EvidenceSampler, BoundsGrowWithTheEvidence) {
  Case c(half_precision());
  EvidenceSampler sampler(*c.set, c.options);
  ASSERT_TRUE(sampler.gather());
  const oracle::CaseBounds round0 = sampler.bounds();
  sampler.add_round(1);
  sampler.add_round(2);
  const oracle::CaseBounds round2 = sampler.bounds();
  for (const auto& [name, b] : round0.tensors) {
    if (!b.allowance.defined()) continue;
    EXPECT_TRUE(at::all(round2.tensors.at(name).allowance >= b.allowance).item<bool>()) << name;
  }
}

TEST(SteppedAllowance, KeepsTheLargestElementAllowanceAndDropsCallOnesNormBound) {
  oracle::CaseBounds bounds;
  oracle::TensorBound b;
  b.allowance = at::tensor({0.1, 0.3, 0.2}, at::TensorOptions().dtype(at::kDouble));
  b.norm_bound = 1e-5;  // call 1's values rounded exactly: the floor
  bounds.tensors["output"] = b;
  const oracle::CaseBounds repeat = uniform_allowance(bounds);
  EXPECT_EQ(repeat.tensors.at("output").norm_bound, 1e-5);
  const oracle::CaseBounds stepped = stepped_allowance(bounds);
  const oracle::TensorBound& s = stepped.tensors.at("output");
  EXPECT_TRUE(at::equal(s.allowance, at::full({3}, 0.3, at::TensorOptions().dtype(at::kDouble))));
  EXPECT_TRUE(std::isinf(s.norm_bound));
}

}  // namespace
}  // namespace gradfuzz::runner
