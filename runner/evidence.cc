#include "runner/evidence.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <limits>
#include <utility>

#include "harness/dtype.h"
#include "runner/case_cost.h"

namespace gradfuzz::runner {

using harness::CaseTensors;
using harness::PathRun;

namespace {

/// `values` with every floating value perturbed by a relative u * xi, xi uniform in [-1, 1]
/// drawn from `gen`.
CaseTensors perturbed(const CaseTensors& values, double u, at::Generator& gen) {
  CaseTensors t = values;
  auto jitter = [&](at::Tensor& x) {
    if (!x.defined() || !x.is_floating_point()) return;
    const at::Tensor xi = at::rand(x.sizes(), gen, at::TensorOptions().dtype(at::kDouble)) * 2 - 1;
    x = x.to(at::kDouble) * (1 + u * xi.to(x.device()));
  };
  jitter(t.input);
  for (auto& op : t.params) {
    for (auto& p : op) jitter(p);
  }
  for (auto& e : t.extra_inputs) jitter(e);
  for (auto& c : t.cotangents) jitter(c);
  return t;
}

at::Generator cloned(const at::Generator& g) { return g.defined() ? g.clone() : at::Generator(); }

}  // namespace

Draws Draws::clone() const { return {cloned(samples), cloned(noise)}; }

oracle::CaseBounds uniform_allowance(oracle::CaseBounds bounds) {
  for (auto& [name, b] : bounds.tensors) {
    if (b.allowance.defined() && b.allowance.numel() > 0) {
      b.allowance = at::full_like(b.allowance, b.allowance.max().item<double>());
    }
  }
  return bounds;
}

oracle::CaseBounds stepped_allowance(oracle::CaseBounds bounds) {
  bounds = uniform_allowance(std::move(bounds));
  for (auto& [name, b] : bounds.tensors) b.norm_bound = std::numeric_limits<double>::infinity();
  return bounds;
}

EvidenceSampler::EvidenceSampler(const ReferenceSet& set, Options options) : set_(set), options_(std::move(options)) {}

bool EvidenceSampler::gather() {
  if (!begun_ahead_) {
    while (!gather_piece()) {
    }
    return gathering_.ok;
  }
  if (gathering_.step != Gathering::Step::kDone) {
    // Begun ahead, not done: the rest of its pieces, in order.
    while (!gather_piece()) {
    }
    ahead_.valid = gathering_.ok;
    ahead_.draws = draws_.clone();
    count_cost("ahead_gathered_in_part");
  } else {
    count_cost("ahead_gathered_used");
  }
  return gathering_.ok;
}

void EvidenceSampler::add_round(int round) {
  int64_t n = kEvidenceSamples.at(static_cast<size_t>(round));
  const Ahead::Round& ahead = ahead_.rounds.at(static_cast<size_t>(round));
  if (ahead_.valid && ahead.taken > 0) {
    // The maxima are the same in any grouping of the samples.
    oracle::accumulate_max(evidence_.sensitivity, ahead.sensitivity);
    oracle::accumulate_max(evidence_.output_noise, ahead.output_noise);
    draws_ = ahead.after.clone();
    n -= ahead.taken;
    count_cost("ahead_samples_used", ahead.taken);
  }
  for (int64_t k = 0; k < n; ++k) rounding_sample(draws_, evidence_.sensitivity, evidence_.output_noise);
}

oracle::CaseBounds EvidenceSampler::bounds(int64_t* cancellation) const {
  return oracle::evidence_bounds(options_.dtype, options_.context, set_.evidence_values(), evidence_, options_.rule,
                                 cancellation);
}

std::optional<oracle::CaseBounds> EvidenceSampler::repeat_call_bounds() {
  if (!wants_coarse()) return std::nullopt;
  if (!coarse_) {
    if (ahead_.valid && ahead_.coarse) {
      coarse_ = *ahead_.coarse;
      draws_.samples = ahead_.after_coarse.clone();
      count_cost("ahead_coarse_used");
    } else {
      coarse_ = coarse_evidence(draws_.samples);
    }
  }
  return uniform_allowance(
      oracle::evidence_bounds(options_.dtype, options_.context, set_.evidence_values(), *coarse_, options_.rule));
}

bool EvidenceSampler::advance() {
  if (gathering_.step != Gathering::Step::kDone) {
    begun_ahead_ = true;
    count_cost("ahead_pieces");
    if (!gather_piece()) return true;
    // Done: the pieces after it draw from copies of the generators it leaves.
    ahead_.valid = gathering_.ok;
    ahead_.draws = draws_.clone();
    count_cost("ahead_gathered");
    return ahead_.valid;
  }
  if (!ahead_.valid) return false;
  if (wants_coarse() && !ahead_.coarse) {
    ahead_.coarse = coarse_evidence(ahead_.draws.samples);
    ahead_.after_coarse = ahead_.draws.samples.clone();
    count_cost("ahead_coarse");
    count_cost("ahead_pieces");
    return true;
  }
  for (int round = 1; round < kEvidenceRounds; ++round) {
    Ahead::Round& r = ahead_.rounds.at(static_cast<size_t>(round));
    if (r.taken >= kEvidenceSamples.at(static_cast<size_t>(round))) continue;
    rounding_sample(ahead_.draws, r.sensitivity, r.output_noise);
    ++r.taken;
    r.after = ahead_.draws.clone();
    count_cost("ahead_samples");
    count_cost("ahead_pieces");
    return true;
  }
  return false;
}

void EvidenceSampler::continue_from(const EvidenceSampler& previous) {
  if (&previous == this) return;
  draws_ = previous.draws_.clone();
  ahead_ = Ahead{};
}

EvidenceSampler::Carry EvidenceSampler::carry() const {
  return {set_.points(), set_.evidence_values(), evidence_, coarse_, windows_, draws_.clone()};
}

bool EvidenceSampler::matches(const Carry& carry) const {
  if (!(set_.points() == carry.points)) return false;
  const auto mine = set_.evidence_values();
  if (mine.size() != carry.reference.size()) return false;
  for (const auto& [name, t] : mine) {
    const auto it = carry.reference.find(name);
    if (it == carry.reference.end() || t.defined() != it->second.defined()) return false;
    if (t.defined() && !(t.sizes() == it->second.sizes() && t.scalar_type() == it->second.scalar_type() &&
                         t.device() == it->second.device() && at::equal(t, it->second))) {
      return false;
    }
  }
  return true;
}

void EvidenceSampler::take(const Carry& carry) {
  evidence_ = carry.evidence;
  coarse_ = carry.coarse;
  windows_ = carry.windows;
  draws_ = carry.draws.clone();
  gathering_.step = Gathering::Step::kDone;
  gathering_.ok = true;
  ahead_ = Ahead{};
}

bool EvidenceSampler::wants_coarse() const {
  return set_.reference_case().quantizes && !set_.reference_case().spec->repeat_calls.empty();
}

/// The next piece of the gathering; true once it is done (its result in gathering_.ok).
bool EvidenceSampler::gather_piece() {
  using Step = Gathering::Step;
  Gathering& g = gathering_;
  const ReferenceCase& c = set_.reference_case();
  const CaseTensors& values = c.prepared->tensors;
  switch (g.step) {
    case Step::kBaseline:
      g.baseline = set_.evaluate(values, options_.dtype, {nullptr, nullptr, &g.baseline_scaled}, &g.probe, {}, c.trace);
      if (!g.baseline.ok()) {
        g.ok = false;
        g.step = Step::kDone;
        return true;
      }
      evidence_.quantized = c.quantizes;
      if (c.quantizes) windows_ = {};
      g.windows = c.quantizes && options_.fp8_reference_exact;
      g.step = g.windows ? Step::kFp8Reference : Step::kWindows;
      return false;
    case Step::kFp8Reference: {
      const PathRun reference =
          set_.evaluate(values, at::kDouble, {nullptr, nullptr, &g.reference_scaled}, nullptr, {}, c.trace);
      g.windows = reference.ok() && g.reference_scaled.size() == g.baseline_scaled.size();
      // An accumulation error ahead of a quantizer moves its input as a rounding does.
      g.step = g.windows && c.accumulation ? Step::kAccumulation : Step::kWindows;
      return false;
    }
    case Step::kAccumulation: {
      // The float64 reference with every FP8 GEMM up, then down, by its accumulation term.
      const auto mode = g.accumulated.empty() ? ops::AccumulationMode::kPlus : ops::AccumulationMode::kMinus;
      std::vector<at::Tensor> scaled;
      const PathRun run = set_.evaluate(values, at::kDouble, {nullptr, nullptr, &scaled, mode});
      if (!run.ok() || scaled.size() != g.reference_scaled.size()) {
        g.windows = false;
        g.step = Step::kWindows;
        return false;
      }
      g.accumulated.push_back(std::move(scaled));
      if (g.accumulated.size() == 2) g.step = Step::kWindows;
      return false;
    }
    case Step::kWindows:
      if (g.windows) set_fp8_windows(g.baseline_scaled, std::move(g.reference_scaled), g.accumulated);
      evidence_.baseline_error = oracle::abs_differences(*c.spec, set_.evidence_reference(), g.baseline);
      draws_.samples = at::detail::createCPUGenerator(c.spec->seed ^ 0x5e9517u);
      draws_.noise = at::detail::createCPUGenerator(c.spec->seed ^ 0x0e0153u);
      g.step = Step::kSamples;
      [[fallthrough]];
    case Step::kSamples:
      rounding_sample(draws_, evidence_.sensitivity, evidence_.output_noise);
      if (++g.samples < 2) return false;
      g.kinks = oracle::near_kinks(set_.reference_kinks(), g.probe.sites(), harness::unit_roundoff(options_.dtype),
                                   options_.rule);
      evidence_.kink_elements = g.kinks.elements;
      g.step = Step::kKinks;
      if (!g.kinks.groups.empty()) return false;
      g.step = Step::kDone;
      return true;
    case Step::kKinks: {
      ops::KinkProbe flips;
      for (const auto& [op, mask] : g.kinks.groups.at(g.group)) flips.set_flip(op, mask);
      const PathRun run = set_.evaluate(values, at::kDouble, {}, &flips, {}, c.trace);
      if (run.ok()) {
        oracle::accumulate_sum(evidence_.kink_effect, oracle::abs_differences(*c.spec, set_.evidence_reference(), run));
      }
      if (++g.group < g.kinks.groups.size()) return false;
      g.step = Step::kDone;
      return true;
    }
    case Step::kDone:
      return true;
  }
  return true;
}

/// One rounding sample: the rounding baseline on values perturbed by a relative u (each
/// value moved to a neighbour in the dtype or not; a quantizing case's quantized elements
/// also moved by one FP8 value or not), its distance to the float64 reference kept element by
/// element at its largest in `sensitivity`; for a case that does not quantize, the float64
/// reference on values perturbed likewise with every op's results rounded once more, its
/// distance kept in `output_noise` (RoundingEvidence::output_noise). Each generator of `draws`
/// draws in the same order as samples in a row draw them.
void EvidenceSampler::rounding_sample(Draws& draws, std::map<std::string, at::Tensor>& sensitivity,
                                      std::map<std::string, at::Tensor>& output_noise) {
  const ReferenceCase& c = set_.reference_case();
  const double u = harness::unit_roundoff(options_.dtype);
  Quantization jittered;
  if (c.quantizes) {
    jittered.jitter = &draws.samples;
    jittered.windows = &windows_;
  }
  const PathRun run =
      set_.evaluate(perturbed(c.prepared->tensors, u, draws.samples), options_.dtype, jittered, nullptr, {}, c.trace);
  if (run.ok()) oracle::accumulate_max(sensitivity, oracle::abs_differences(*c.spec, set_.evidence_reference(), run));
  // A quantizing case's elements already get their tensor's largest evidence (its FP8
  // rounding dominates the dtype's), and noise ahead of a quantizer would move whole FP8
  // steps: output noise is the half-precision rule's alone.
  if (c.quantizes) return;
  const PathRun noisy = set_.evaluate(perturbed(c.prepared->tensors, u, draws.noise), at::kDouble, {}, nullptr,
                                      {u, &draws.noise}, c.trace);
  if (noisy.ok()) {
    oracle::accumulate_max(output_noise, oracle::abs_differences(*c.spec, set_.evidence_reference(), noisy));
  }
}

/// The coarse evidence (repeat_call_bounds): the evidence so far with the sensitivity of four
/// samples drawn from `samples` that jitter every quantized element (no windows). Under delayed
/// scaling a repeat call quantizes with the scales of the calls before it, which call 1's fresh
/// state does not have (its scale 1 can saturate what a later scale resolves): each sample
/// then runs the calls in order on one state, and each call's differences from its expected
/// values count.
oracle::RoundingEvidence EvidenceSampler::coarse_evidence(at::Generator& samples) {
  const ReferenceCase& c = set_.reference_case();
  oracle::RoundingEvidence coarse = evidence_;
  coarse.sensitivity.clear();
  const double u = harness::unit_roundoff(options_.dtype);
  const bool in_order = set_.delayed() && !c.spec->repeat_calls.empty();
  for (int k = 0; k < 4; ++k) {
    const CaseTensors values = perturbed(c.prepared->tensors, u, samples);
    if (in_order) {
      const std::vector<PathRun> runs = set_.evaluate_calls(values, options_.dtype, {&samples});
      for (size_t i = 0; i < runs.size(); ++i) {
        if (!runs[i].ok()) continue;
        const PathRun expected = i == 0 ? set_.evidence_reference() : set_.expected_for_call(i - 1);
        oracle::accumulate_max(coarse.sensitivity, oracle::abs_differences(*c.spec, expected, runs[i]));
      }
      continue;
    }
    const PathRun run = set_.evaluate(values, options_.dtype, {&samples}, nullptr, {}, c.trace);
    if (run.ok()) {
      oracle::accumulate_max(coarse.sensitivity, oracle::abs_differences(*c.spec, set_.evidence_reference(), run));
    }
  }
  return coarse;
}

/// FP8 rounding boundaries are the quantizer's kinks. The scaled values of the float64
/// reference (a run of its own, recorded) and of the rounding baseline, quantization by
/// quantization, give each element's window, fp8_window_factor * |baseline - reference|:
/// what this dtype's rounding of the operand and of its scale moves it by, with room (on a
/// backend whose FP8 GEMMs accumulate inexactly, the larger of that and how far the float64
/// reference with every FP8 GEMM up, or down, by its accumulation term moves it: the term
/// already estimates each GEMM's error from above, so it is taken once). An element whose
/// reference value lies closer than its window to a rounding boundary can round the other way
/// in a correct implementation; elsewhere a correct implementation rounds as the reference
/// does (a leaf tensor's values are the reference's, bit for bit, and the cast rounds a tie to
/// even in every implementation). The rounding samples start from the reference's codes and
/// move only the elements within their window. On a backend whose FP8 is not the reference's
/// bit for bit (capabilities.fp8_reference_exact), or without a match (another number of
/// quantizations, a shape that differs) samples round their own values and move every element
/// (no windows). The runs are gather_piece's; this sets the windows from them, or leaves none
/// where they do not match.
void EvidenceSampler::set_fp8_windows(const std::vector<at::Tensor>& baseline_scaled,
                                      std::vector<at::Tensor> reference_scaled,
                                      const std::vector<std::vector<at::Tensor>>& accumulated) {
  const double factor = options_.rule.fp8_window_factor;
  std::vector<at::Tensor> windows;
  for (size_t i = 0; i < reference_scaled.size(); ++i) {
    const at::Tensor& r = reference_scaled[i];
    const at::Tensor& b = baseline_scaled[i];
    if (!r.defined() || !b.defined() || r.sizes() != b.sizes()) return;
    at::Tensor window = factor * (b.to(r.device()) - r).abs();
    for (const auto& run : accumulated) {
      const at::Tensor& a = run[i];
      if (!a.defined() || a.sizes() != r.sizes()) return;
      // The term is an upper estimate of each GEMM's error already: taken once.
      window = at::maximum(window, (a.to(r.device()) - r).abs());
    }
    windows.push_back(window.cpu());
    reference_scaled[i] = r.cpu();
  }
  windows_.windows = std::move(windows);
  windows_.reference = std::move(reference_scaled);
}

}  // namespace gradfuzz::runner
