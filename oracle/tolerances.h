#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>

namespace gradfuzz::oracle {

/// Relative and absolute tolerance: |got - expected| <= atol + rtol * |expected|.
struct Tolerance {
  double rtol = 0;
  double atol = 0;
};

/// torch.testing.assert_close defaults for `dtype`: fp64 1e-7/1e-7, fp32 1.3e-6/1e-5,
/// fp16 1e-3/1e-5, bf16 1.6e-2/1e-5. Throws std::invalid_argument for other dtypes.
Tolerance base_tolerance(at::ScalarType dtype);

/// What a case does to rounding error: how many catalog ops a value passes through and the
/// longest sum any op computes (features of a matmul, rows of a weight gradient...).
struct ToleranceContext {
  int64_t num_ops = 1;
  int64_t max_reduction_length = 1;
};

/// Factor applied to rtol for reductions: max(1, sqrt(length / 16)).
double reduction_factor(int64_t max_reduction_length);
/// Factor applied to rtol for op depth: sqrt(n) for fp16/bf16, max(1, n/4) for fp32, 1 for fp64.
double depth_factor(at::ScalarType dtype, int64_t num_ops);

/// Tolerance of a `dtype` path against the float64 reference for a case described by `context`:
/// the base tolerance with rtol multiplied by reduction_factor and depth_factor.
Tolerance case_tolerance(at::ScalarType dtype, const ToleranceContext& context);

/// Tolerance between two `dtype` paths (fused~unfused): each may be off from the exact value
/// by case_tolerance in opposite directions, so both terms are doubled.
Tolerance path_pair_tolerance(at::ScalarType dtype, const ToleranceContext& context);

/// Absolute tolerance actually used for one tensor: atol + rtol * rms(expected). Rounding
/// error of a sum is proportional to the size of its terms, not of its (possibly cancelled)
/// result, and with the harness's O(1) draws the terms' size is bounded by the tensor's RMS.
double effective_atol(const Tolerance& tolerance, double expected_rms);

/// Tolerance of the reference's directional derivative against central finite differences
/// (float64, step finite_difference_step()).
Tolerance finite_difference_tolerance();
/// Central difference step (relative to a unit-RMS direction).
double finite_difference_step();

/// Switches TF32 off for float32 matmuls and convolutions (cuBLAS, cuDNN) so float32
/// really means float32. Idempotent (runs once per process).
void disable_tf32();

}  // namespace gradfuzz::oracle
