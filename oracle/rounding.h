#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ops/reference.h"
#include "oracle/oracle.h"
#include "oracle/tolerances.h"

namespace gradfuzz::oracle {

/// The constants of the low-precision rule (docs/BACKENDS.md "Low precision"; why each has
/// its value is in rounding.cc). u is the unit roundoff of the case's dtype.
struct RoundingRule {
  /// A path may always be off by floor_units * u * (|e_k| + rms(e)) per element and
  /// floor_units * u * ||e|| as a whole (bfloat16, float16; float32 keeps its static tolerance).
  double floor_units = 2;
  /// Per element: element_factor times the rounding evidence at that element.
  double element_factor = 8;
  /// Per element also: noise_factor times the output noise at that element (the larger of
  /// the two allowances holds). The noise is already the largest of several samples of every
  /// op's results rounded once, also where an implementation computes nothing (a gradient
  /// passed through unchanged): an estimate from above, taken as it is.
  double noise_factor = 1;
  /// As a whole: norm_factor times the norm of the rounding evidence.
  double norm_factor = 4;
  /// The fused path's error norm may be at most fused_factor times the unfused path's (or the
  /// rounding baseline's, whichever is larger) plus the floor.
  double fused_factor = 4;
  /// An element is near a kink when |distance| <= kink_factor * (the rounding baseline's error
  /// of that distance + u * rms(distance)).
  double kink_factor = 8;
  /// FP8 rounding boundaries (runner: set_fp8_windows): an element of a quantized operand may
  /// round the other way when its reference value lies closer than fp8_window_factor * |its
  /// value in the rounding baseline - in the reference| to a boundary between two FP8 values:
  /// twice what the baseline's own rounding moved it by.
  double fp8_window_factor = 2;
  /// At most this many flipped reference runs per case (kink elements grouped per op and chunk).
  int64_t max_kink_groups = 8;
  /// A tensor whose input sensitivity exceeds cancellation_ratio * u * ||e|| is a small
  /// difference of large terms: counted as cancellation-widened.
  double cancellation_ratio = 4;
};

/// What a low-precision case's own rounding costs, per compared tensor (by name, as
/// compared_tensors names them), measured on the case's values (rounding.cc):
struct RoundingEvidence {
  /// |baseline - reference|: the plain reference rerun in the case's dtype (infinite where
  /// the baseline is not finite and the reference is: the dtype cannot hold the value).
  std::map<std::string, at::Tensor> baseline_error;
  /// max over samples |perturbed - reference|: the float64 reference with every input,
  /// parameter and cotangent perturbed by a relative u; large where the tensor is a small
  /// difference of large terms (the magnitude of the terms, computed, not guessed).
  std::map<std::string, at::Tensor> sensitivity;
  /// max over samples |noisy - reference|: the float64 reference on perturbed values with
  /// every op's results, forward and backward, rounded once more by a relative u
  /// (ReferenceEvaluator::set_output_noise). Where the baseline happens to round exactly (a
  /// result that lies on a value of the dtype, terms that round the same way in every
  /// sample), this is what another correct order of rounding may move an element by: the
  /// terms that meet in a sum or a reduction, each rounded. Per element only: the norm-wise
  /// bound stays with the baseline and the sensitivity, so a few-percent error of a whole
  /// tensor still fails.
  std::map<std::string, at::Tensor> output_noise;
  /// sum over kink groups |flipped - reference|: what taking the other branch at the elements
  /// near a kink changes.
  std::map<std::string, at::Tensor> kink_effect;
  /// Elements near a kink, over all ops.
  int64_t kink_elements = 0;
  /// The case quantizes (FP8): which element of an operand rounds the other way in a
  /// correct implementation is not predictable element by element, and one flip moves
  /// every output it feeds by up to the rounding evidence's largest, so each element is
  /// also allowed element_factor * max(evidence) of its tensor. The norm-wise bound is
  /// unchanged: it is what holds a quantized case to its FP8 rounding.
  bool quantized = false;
};

/// The bounds of a case's first, cheap check: float64 and float32 their static
/// case_tolerance; bfloat16 and float16 the rule's floor (per element and norm-wise). A case
/// within them passes without evidence; the evidence bounds are never tighter.
CaseBounds first_bounds(at::ScalarType dtype, const ToleranceContext& context,
                        const std::map<std::string, at::Tensor>& expected, const RoundingRule& rule = {});

/// The rule's bounds given evidence, for every tensor of `expected` (the reference's, by
/// name): per element the floor plus the larger of element_factor * max(baseline error,
/// sensitivity) and noise_factor * output noise, plus the kink effect; as a whole the floor's norm plus norm_factor *
/// ||max(baseline error, sensitivity)|| plus ||kink effect||. Counts into `cancellation_tensors` (when not null) the
/// tensors the sensitivity widened (RoundingRule::cancellation_ratio).
CaseBounds evidence_bounds(at::ScalarType dtype, const ToleranceContext& context,
                           const std::map<std::string, at::Tensor>& expected, const RoundingEvidence& evidence,
                           const RoundingRule& rule = {}, int64_t* cancellation_tensors = nullptr);

/// |other - reference| per tensor compared_tensors names (undefined where either lacks it;
/// infinite where `other` is not finite and the reference is).
std::map<std::string, at::Tensor> abs_differences(const CaseSpec& spec, const PathRun& reference, const PathRun& other);
/// Elementwise max (or sum) of `more` into `into`, tensor by tensor.
void accumulate_max(std::map<std::string, at::Tensor>& into, const std::map<std::string, at::Tensor>& more);
void accumulate_sum(std::map<std::string, at::Tensor>& into, const std::map<std::string, at::Tensor>& more);

/// The elements within rounding distance of a kink: per site of the float64 reference, those
/// with |d| <= kink_factor * (|d_baseline - d| + u * rms(d)), d the site's distance and
/// d_baseline the same site in the rounding baseline's run. Grouped (one group per op, the
/// largest ops split) into at most max_kink_groups flip sets: module index -> bool mask.
struct KinkGroups {
  std::vector<std::map<int64_t, at::Tensor>> groups;
  int64_t elements = 0;
};
KinkGroups near_kinks(const std::vector<ops::KinkProbe::Site>& reference,
                      const std::vector<ops::KinkProbe::Site>& baseline, double unit_roundoff,
                      const RoundingRule& rule = {});

/// The fused path far worse than the unfused one in the same dtype, tensor by tensor: a
/// finding (path pair "<fused>~unfused") where ||fused - e|| > fused_factor * max(||unfused -
/// e||, ||baseline error||, ||sampled rounding||) + floor + ||kink effect|| (the evidence
/// terms only with evidence). Only tensors both paths have. `unfused_reference`: where the
/// unfused path has a reference of its own (other quantization points than the fused path's,
/// ops::QuantizationPoints), ||unfused - e|| is measured against it; e, the evidence and the
/// worst element are the fused path's reference's.
void compare_fused_unfused(const CaseSpec& spec, const PathRun& reference, const PathRun& fused, const PathRun& unfused,
                           at::ScalarType dtype, const ToleranceContext& context, const RoundingEvidence* evidence,
                           std::vector<Finding>& findings, const RoundingRule& rule = {},
                           bool got_exposes_all_channels = true, const PathRun* unfused_reference = nullptr);

}  // namespace gradfuzz::oracle
