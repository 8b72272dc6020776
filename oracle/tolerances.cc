#include "oracle/tolerances.h"

#include <ATen/Context.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <stdexcept>

namespace gradfuzz::oracle {

Tolerance base_tolerance(at::ScalarType dtype) {
  // torch.testing.assert_close defaults (torch/testing/_comparison.py, _DTYPE_PRECISIONS).
  switch (dtype) {
    case at::kDouble:
      return {1e-7, 1e-7};
    case at::kFloat:
      return {1.3e-6, 1e-5};
    case at::kHalf:
      return {1e-3, 1e-5};
    case at::kBFloat16:
      return {1.6e-2, 1e-5};
    default:
      throw std::invalid_argument(std::string("no tolerance for dtype ") + c10::toString(dtype));
  }
}

double reduction_factor(int64_t max_reduction_length) {
  // Rounding errors of the terms of a sum of length K behave like a random walk, so the
  // error of the result grows like sqrt(K). assert_close's defaults are tuned for ops with
  // short reductions; up to 16 terms they already hold, beyond that scale by sqrt(K / 16).
  return std::max(1.0, std::sqrt(static_cast<double>(std::max<int64_t>(max_reduction_length, 1)) / 16.0));
}

double depth_factor(at::ScalarType dtype, int64_t num_ops) {
  const double n = static_cast<double>(std::max<int64_t>(num_ops, 1));
  switch (dtype) {
    case at::kHalf:
    case at::kBFloat16:
      // Every op's output is rounded to the low-precision dtype (half an ulp: 2^-11 for fp16,
      // 2^-8 for bf16) and the next op starts from that rounded value, in forward and again in
      // backward. Those roundings are independent, so they add up like a random walk: sqrt of
      // the depth (the base rtol, about 4 ulps, covers one op). The worst case, linear in the
      // depth, is 12.8% for bf16 at 8 ops, wide enough to hide a dropped residual; a case
      // whose conditioning makes it round worse gets the per-element rounding allowance of
      // its baseline (oracle.cc), and a failure that passes in the widest dtype on the same
      // values is judged as rounding (runner.cc), so the static term need not be the worst case.
      return std::sqrt(n);
    case at::kFloat:
      // The fp32 base rtol is about 11 ulps (1.3e-6 / 1.2e-7), which absorbs the half-ulp
      // rounding of roughly four ops forward and backward; deeper chains scale linearly.
      return std::max(1.0, n / 4.0);
    default:
      // fp64 rounding (1.1e-16) is nine orders of magnitude below the base rtol of 1e-7.
      return 1.0;
  }
}

Tolerance case_tolerance(at::ScalarType dtype, const ToleranceContext& context) {
  Tolerance t = base_tolerance(dtype);
  t.rtol *= reduction_factor(context.max_reduction_length) * depth_factor(dtype, context.num_ops);
  return t;
}

Tolerance path_pair_tolerance(at::ScalarType dtype, const ToleranceContext& context) {
  Tolerance t = case_tolerance(dtype, context);
  // Both sides carry their own rounding error (triangle inequality through the exact value).
  t.rtol *= 2;
  t.atol *= 2;
  return t;
}

double effective_atol(const Tolerance& tolerance, double expected_rms) {
  return tolerance.atol + tolerance.rtol * (std::isfinite(expected_rms) ? expected_rms : 0.0);
}

Tolerance finite_difference_tolerance() {
  // Central differences with step h = 1e-6 on a float64 loss: the truncation error is
  // O(h^2 * |f'''|) ~ 1e-12 for our O(1)-scaled smooth ops, the cancellation error
  // O(eps * |loss| / h) ~ 1e-10 * |loss|. 1e-6 relative plus 1e-6 times the loss scale
  // (applied by the runner) leaves two orders of magnitude of headroom while a wrong
  // reference gradient (an O(1) relative error in at least one term) still fails.
  return {1e-6, 1e-6};
}

double finite_difference_step() { return 1e-6; }

void disable_tf32() {
  // Legacy setters only: mixing them with the newer per-backend fp32_precision API makes
  // LibTorch refuse to answer legacy queries.
  static std::once_flag once;
  std::call_once(once, [] {
    auto& context = at::globalContext();
    context.setFloat32MatmulPrecision("highest");
    context.setAllowTF32CuBLAS(false);
    context.setAllowTF32CuDNN(false);
  });
}

}  // namespace gradfuzz::oracle
