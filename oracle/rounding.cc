#include "oracle/rounding.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "harness/dtype.h"

// The low-precision rule: a bfloat16/float16 (or float32) case is decided in its own dtype.
//
// A static tolerance cannot know a case's conditioning (a norm over nearly equal features, a
// residual that cancels, a long reduction), and the widest-dtype rerun that used to excuse
// every finite low-precision difference runs other code wherever a kernel or a fusion is
// chosen by dtype (TE fuses ForwardLinearBiasActivation for bf16/fp16 only). So the bound of
// each compared tensor is built from what the case's own dtype costs on its own values:
//
// - the floor, c * u * (|e_k| + rms(e)) per element and c * u * ||e|| as a whole (c = 2, u
//   the unit roundoff: 2^-8 bfloat16, 2^-11 float16): two roundings of the result, which any
//   correct implementation may differ by even where the rounding baseline happens to be exact
//   (float32 keeps its static assert_close-based tolerance as its floor);
// - the rounding baseline r: the plain reference rerun in the case's dtype (every op's output
//   rounded, LibTorch's accumulation); one sample of what rounding does here;
// - the input sensitivity s: the float64 reference with every input, parameter and
//   cotangent perturbed by a relative u; where a tensor is a small difference of large terms
//   (after a norm, a residual that cancels) s is of the order u * (magnitude of the terms), so
//   the bound scales with the terms, computed, not guessed; a tensor whose ||s|| exceeds
//   4 u ||e|| is counted as cancellation-widened;
// - the kink effect D: elements whose reference lies within rounding distance of a
//   non-differentiable point (a ReLU pre-activation near 0, two nearly equal router logits)
//   may take the other branch in a correct path; the reference is rerun with those elements
//   flipped and what that changes is allowed (and counted), nothing else is excused;
// - the output noise n, per element only: the float64 reference with every op's results,
//   forward and backward, rounded once more by a relative u (uniform noise). The baseline is
//   one order of rounding on one set of values, and where its result happens to be exact (a
//   float16 sum of two terms that lands on a float16 value, a reduction whose terms round
//   alike in every sample) it allows an element nothing beyond the floor, while a correct
//   path that rounds its terms in another order is off there by u times the terms (seen: 2
//   ulps of a float16 residual gradient, 0.05 rms of a 64-term bfloat16 reduction that
//   cancels). n measures that from the terms themselves. It stays out of the norm-wise bound,
//   which keeps a whole tensor's few-percent error failing.
//
// Per element: |g_k - e_k| <= atol + c u (|e_k| + rms) + max(F_e max(r_k, s_k), F_o n_k) + D_k
// with F_e = 8 (one baseline sample is noisy element by element; a path may round 8x worse
// than it at an element without being wrong) and F_o = 1: n is already the largest of several
// samples of a model that rounds at every op boundary, forward and backward, also where an
// implementation computes nothing (a gradient passed through Bias or AddExtraInput): an
// estimate from above, taken as it is. F_o >= 2 hid a saved input rounded to FP8 (the
// half-saved-dtype fault, 13x the baseline at its worst element, 4x the noise). As a whole: ||g - e|| <= c u ||e|| +
// F_n ||max(r, s)|| + ||D|| with F_n = 4 (a norm averages the noise; a fused path that rounds 4x worse than a plain
// implementation in every element is a defect: a half-precision accumulation, a saved tensor
// in the wrong dtype). And the fused path against the unfused one in the same dtype: the
// fused error norm may be at most G = 4 times the larger of the unfused path's and the
// baseline's. A 5% error in bfloat16 is 13 u: past the norm bound of a shallow case; a
// doubled output, a dropped term or a misrouted gradient are errors the size of the tensor.

namespace gradfuzz::oracle {

namespace {

at::Tensor as_double_cpu(const at::Tensor& t) {
  return t.detach().to(at::TensorOptions().dtype(at::kDouble).device(at::kCPU)).contiguous();
}

bool is_half(at::ScalarType dtype) { return dtype == at::kBFloat16 || dtype == at::kHalf; }

/// The per-element relative floor: half types c*u, float32 and float64 their static rtol.
Tolerance floor_tolerance(at::ScalarType dtype, const ToleranceContext& context, const RoundingRule& rule) {
  Tolerance t = case_tolerance(dtype, context);
  if (is_half(dtype)) t.rtol = rule.floor_units * harness::unit_roundoff(dtype);
  return t;
}

/// ||t||_2 over the finite elements (0 for an undefined tensor).
double finite_norm(const at::Tensor& t) {
  if (!t.defined() || t.numel() == 0) return 0;
  const at::Tensor d = as_double_cpu(t);
  return at::where(d.isfinite(), d, at::zeros_like(d)).norm().item<double>();
}

at::Tensor lookup(const std::map<std::string, at::Tensor>& m, const std::string& name) {
  auto it = m.find(name);
  return it == m.end() ? at::Tensor() : it->second;
}

/// `t` as float64 CPU of `shape`, or zeros when undefined or of another shape.
at::Tensor or_zeros(const at::Tensor& t, at::IntArrayRef shape) {
  if (t.defined() && t.sizes() == shape) return as_double_cpu(t);
  return at::zeros(shape, at::TensorOptions().dtype(at::kDouble));
}

}  // namespace

CaseBounds first_bounds(at::ScalarType dtype, const ToleranceContext& context,
                        const std::map<std::string, at::Tensor>& expected, const RoundingRule& rule) {
  CaseBounds bounds;
  bounds.fallback = case_tolerance(dtype, context);
  if (!is_half(dtype)) return bounds;
  const Tolerance floor = floor_tolerance(dtype, context, rule);
  bounds.fallback = floor;
  for (const auto& [name, e] : expected) {
    if (!e.defined()) continue;
    TensorBound b;
    b.atol = floor.atol;
    b.rtol = floor.rtol;
    b.norm_bound = floor.rtol * finite_norm(e) + floor.atol * std::sqrt(static_cast<double>(e.numel()));
    bounds.tensors[name] = b;
  }
  return bounds;
}

CaseBounds evidence_bounds(at::ScalarType dtype, const ToleranceContext& context,
                           const std::map<std::string, at::Tensor>& expected, const RoundingEvidence& evidence,
                           const RoundingRule& rule, int64_t* cancellation_tensors) {
  const Tolerance floor = floor_tolerance(dtype, context, rule);
  const double u = harness::unit_roundoff(dtype);
  CaseBounds bounds;
  bounds.fallback = floor;
  for (const auto& [name, e_in] : expected) {
    if (!e_in.defined()) continue;
    const at::Tensor e = as_double_cpu(e_in);
    const at::Tensor r = or_zeros(lookup(evidence.baseline_error, name), e.sizes());
    const at::Tensor s = or_zeros(lookup(evidence.sensitivity, name), e.sizes());
    const at::Tensor kink = or_zeros(lookup(evidence.kink_effect, name), e.sizes());
    const at::Tensor rho = at::maximum(r, s);
    const at::Tensor noise = or_zeros(lookup(evidence.output_noise, name), e.sizes());
    TensorBound b;
    b.atol = floor.atol;
    b.rtol = floor.rtol;
    b.allowance = at::maximum(rule.element_factor * rho, rule.noise_factor * noise) + kink;
    if (evidence.quantized && rho.numel() > 0) {
      const double largest = at::where(rho.isfinite(), rho, at::zeros_like(rho)).max().item<double>();
      b.allowance = b.allowance + rule.element_factor * largest;
    }
    const double e_norm = finite_norm(e);
    b.norm_bound = floor.rtol * e_norm + rule.norm_factor * finite_norm(rho) + finite_norm(kink) +
                   floor.atol * std::sqrt(static_cast<double>(e.numel()));
    if (cancellation_tensors && finite_norm(s) > rule.cancellation_ratio * u * e_norm) ++*cancellation_tensors;
    bounds.tensors[name] = std::move(b);
  }
  return bounds;
}

std::map<std::string, at::Tensor> abs_differences(const CaseSpec& spec, const PathRun& reference,
                                                  const PathRun& other) {
  std::map<std::string, at::Tensor> out;
  auto difference = [&](const std::string& name, const at::Tensor& expected, const at::Tensor& got) {
    if (!expected.defined() || !got.defined() || expected.sizes() != got.sizes()) return;
    const at::Tensor e = as_double_cpu(expected);
    const at::Tensor g = as_double_cpu(got);
    at::Tensor diff = (g - e).abs();
    // The other run cannot hold a value the reference has: nothing there can be judged.
    diff = at::where(g.isfinite().logical_not() & e.isfinite(),
                     at::full_like(diff, std::numeric_limits<double>::infinity()), diff);
    const double inf = std::numeric_limits<double>::infinity();
    out[name] = diff.nan_to_num(inf, inf, inf);
  };
  for (const auto& t : compared_tensors(spec, reference, other)) difference(t.name, t.expected, t.got);
  // Traced runs (the reference's every op): the trace's bounds come from the same evidence.
  if (!reference.trace.empty() && !other.trace.empty()) {
    const auto theirs = trace_tensors(other);
    for (const auto& [name, t] : trace_tensors(reference)) {
      const auto it = theirs.find(name);
      if (it != theirs.end()) difference(name, t, it->second);
    }
  }
  return out;
}

void accumulate_max(std::map<std::string, at::Tensor>& into, const std::map<std::string, at::Tensor>& more) {
  for (const auto& [name, t] : more) {
    auto it = into.find(name);
    if (it == into.end() || !it->second.defined() || it->second.sizes() != t.sizes()) {
      into[name] = t;
    } else {
      it->second = at::maximum(it->second, t);
    }
  }
}

void accumulate_sum(std::map<std::string, at::Tensor>& into, const std::map<std::string, at::Tensor>& more) {
  for (const auto& [name, t] : more) {
    auto it = into.find(name);
    if (it == into.end() || !it->second.defined() || it->second.sizes() != t.sizes()) {
      into[name] = t;
    } else {
      it->second = it->second + t;
    }
  }
}

KinkGroups near_kinks(const std::vector<ops::KinkProbe::Site>& reference,
                      const std::vector<ops::KinkProbe::Site>& baseline, double unit_roundoff,
                      const RoundingRule& rule) {
  KinkGroups out;
  std::vector<std::pair<int64_t, at::Tensor>> masks;  // (module, mask) per site with kinks
  for (size_t i = 0; i < reference.size(); ++i) {
    const auto& site = reference[i];
    const at::Tensor d = as_double_cpu(site.distance);
    // The baseline evaluates the same ops in the same order; without a matching site, its
    // own rounding of the distance is unknown and only the u * rms term remains.
    at::Tensor moved = at::zeros_like(d);
    if (i < baseline.size() && baseline[i].op == site.op && baseline[i].distance.sizes() == d.sizes()) {
      moved = (as_double_cpu(baseline[i].distance) - d).abs().nan_to_num(0, 0, 0);
    }
    const double rms = d.numel() ? d.pow(2).mean().sqrt().item<double>() : 0.0;
    const at::Tensor near = d.abs() <= rule.kink_factor * (moved + unit_roundoff * rms);
    const int64_t n = near.sum().item<int64_t>();
    if (n == 0) continue;
    out.elements += n;
    masks.emplace_back(site.op, near);
  }
  if (masks.empty()) return out;
  if (out.elements <= rule.max_kink_groups) {
    // Few enough to flip one at a time: the sum of the single effects bounds any subset.
    for (const auto& [op, mask] : masks) {
      const at::Tensor flat = mask.reshape({-1});
      for (int64_t k = 0; k < flat.numel(); ++k) {
        if (!flat[k].item<bool>()) continue;
        at::Tensor single = at::zeros_like(flat);
        single[k] = true;
        out.groups.push_back({{op, single.reshape(mask.sizes())}});
      }
    }
    return out;
  }
  for (const auto& [op, mask] : masks) {
    if (static_cast<int64_t>(out.groups.size()) < rule.max_kink_groups) {
      out.groups.push_back({{op, mask}});
    } else {
      auto& last = out.groups.back();
      auto it = last.find(op);
      last[op] = it == last.end() ? mask : (it->second | mask);
    }
  }
  return out;
}

void compare_fused_unfused(const CaseSpec& spec, const PathRun& reference, const PathRun& fused, const PathRun& unfused,
                           at::ScalarType dtype, const ToleranceContext& context, const RoundingEvidence* evidence,
                           std::vector<Finding>& findings, const RoundingRule& rule, bool got_exposes_all_channels,
                           const PathRun* unfused_reference) {
  const Tolerance floor = floor_tolerance(dtype, context, rule);
  const auto fused_tensors = compared_tensors(spec, reference, fused, got_exposes_all_channels);
  std::map<std::string, at::Tensor> unfused_by_name;
  std::map<std::string, at::Tensor> unfused_expected;
  for (const auto& t :
       compared_tensors(spec, unfused_reference ? *unfused_reference : reference, unfused, got_exposes_all_channels)) {
    unfused_by_name[t.name] = t.got;
    unfused_expected[t.name] = t.expected;
  }
  for (const auto& t : fused_tensors) {
    const at::Tensor u_got = lookup(unfused_by_name, t.name);
    const at::Tensor u_expected = lookup(unfused_expected, t.name);
    if (!t.expected.defined() || !t.got.defined() || !u_got.defined() || !u_expected.defined()) continue;
    if (t.got.sizes() != t.expected.sizes() || u_got.sizes() != t.expected.sizes() ||
        u_expected.sizes() != t.expected.sizes()) {
      continue;
    }
    const double err_f = error_norm(t.expected, t.got);
    const double err_u = error_norm(u_expected, u_got);
    // The noise of a plain implementation in this dtype: the baseline's and the sampled one's.
    const double base = evidence ? std::max(finite_norm(lookup(evidence->baseline_error, t.name)),
                                            finite_norm(lookup(evidence->sensitivity, t.name)))
                                 : 0.0;
    const double kink = evidence ? finite_norm(lookup(evidence->kink_effect, t.name)) : 0.0;
    const double e_norm = finite_norm(t.expected);
    const double bound = rule.fused_factor * std::max(err_u, base) + floor.rtol * e_norm + kink +
                         floor.atol * std::sqrt(static_cast<double>(t.expected.numel()));
    if (!(err_f > bound)) continue;
    Finding d;
    d.kind = VerdictKind::kMismatch;
    d.path_pair = fused.name + "~unfused";
    d.tensor = t.name;
    d.role = t.role;
    d.rtol = floor.rtol;
    d.atol = floor.atol;
    d.norm_err = err_f;
    d.norm_bound = bound;
    // The worst element of the fused path against the reference, for the reader.
    const at::Tensor e = as_double_cpu(t.expected);
    const at::Tensor g = as_double_cpu(t.got);
    const at::Tensor diff = (g - e).abs().nan_to_num(std::numeric_limits<double>::infinity());
    const int64_t worst = diff.numel() ? diff.reshape({-1}).argmax().item<int64_t>() : 0;
    if (diff.numel()) {
      d.expected = e.reshape({-1})[worst].item<double>();
      d.got = g.reshape({-1})[worst].item<double>();
      d.max_abs_err = diff.max().item<double>();
      d.scale = e.abs().max().item<double>();
      int64_t rest = worst;
      d.index.assign(static_cast<size_t>(e.dim()), 0);
      for (int64_t k = e.dim() - 1; k >= 0; --k) {
        d.index[static_cast<size_t>(k)] = rest % e.size(k);
        rest /= e.size(k);
      }
    }
    std::ostringstream note;
    note.precision(3);
    note << "fused error norm " << err_f << " is "
         << (err_u > 0 ? err_f / err_u : std::numeric_limits<double>::infinity()) << "x the unfused path's (" << err_u
         << ") in the same dtype";
    d.note = note.str();
    findings.push_back(std::move(d));
  }
}

}  // namespace gradfuzz::oracle
