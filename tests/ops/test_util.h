#pragma once

// Shared helpers of the ops/ test suite: ops by catalog name, seeded tensors, running a
// Sequential through the fused path and through the ReferenceEvaluator with the same
// cotangents, and tensor comparisons that report the worst element. Every tensor handed to
// the runtime lives on test_device() (GRADFUZZ_TEST_DEVICE=cuda runs the suite on the GPU).

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ops/basic_op.h"
#include "ops/fuser.h"
#include "ops/fusion_registry.h"
#include "ops/op_registry.h"
#include "ops/reference.h"
#include "ops/sequential.h"

namespace gradfuzz::ops::testing {

/// Tolerances of torch.testing.assert_close's defaults for a dtype.
struct Tolerance {
  double rtol;
  double atol;
};
/// float64: rtol 1e-7, atol 1e-7 (torch.testing defaults); the fused path and the
/// reference do the same float64 math in different orders, so only rounding differs.
inline constexpr Tolerance kFloat64Tol{1e-7, 1e-7};
/// float32: torch.testing defaults (rtol 1.3e-6, atol 1e-5) scaled by 10, because a chain
/// of several ops compared against a float64 reference accumulates one rounding per op and
/// per reduction (sums over up to 32 features).
inline constexpr Tolerance kFloat32Tol{1.3e-5, 1e-4};

/// Tolerance for comparing a path run in `dtype` against the float64 reference.
Tolerance tolerance_for(at::ScalarType dtype);

/// The device the suite runs the runtime on, read once from GRADFUZZ_TEST_DEVICE: unset,
/// empty or "cpu" -> CPU (the default); "cuda" -> the current CUDA device, as a concrete
/// cuda:N (one allocation there proves it usable). A gtest environment resolves it before
/// any test and fails the run with the message when it throws. Throws
/// std::runtime_error naming the variable for any other value, and for "cuda" when this
/// LibTorch has no CUDA support or sees no CUDA device (never a silent CPU fallback).
at::Device test_device();
/// TensorOptions of `dtype` on test_device(): for op parameters and tensors a test builds.
at::TensorOptions test_options(at::ScalarType dtype = at::kDouble);
/// `t` on test_device(): `t` itself when already there, else a detached copy that keeps
/// `t`'s requires_grad (a leaf, so gradients can be asked for it as for `t`).
at::Tensor on_device(const at::Tensor& t);

/// Creates a catalog op by name for a main input of `input_shape` in `dtype`, with its
/// parameters on test_device().
BasicOpPtr make_op(const std::string& name, const OpAttrs& attrs, const std::vector<int64_t>& input_shape,
                   at::ScalarType dtype = at::kDouble);

/// A seeded normal tensor on test_device(); `away_from_zero` pushes values to |v| >= 0.2
/// (activation kinks). Drawn in float64 on the CPU generator and cast on the CPU, then
/// moved, so the values are the same on every device.
at::Tensor seeded_randn(at::IntArrayRef shape, at::Generator& gen, at::ScalarType dtype = at::kDouble,
                        bool requires_grad = false, bool away_from_zero = false);
/// An explicit CPU generator with a fixed seed.
at::Generator make_generator(uint64_t seed);
/// int64 [values.size()] tensor on test_device().
at::Tensor int_tensor(const std::vector<int64_t>& values);
/// int64 [values.size()] tensor on `device` (test ops: the device of their input).
at::Tensor int_tensor(const std::vector<int64_t>& values, at::Device device);

/// What one path produced: outputs and gradients (undefined where no gradient was asked
/// for or none arrived).
struct PathResult {
  std::vector<at::Tensor> outputs;
  at::Tensor grad_input;
  /// Per basic op (module order, plain modules skipped), per parameter.
  std::vector<std::vector<at::Tensor>> grad_params;
  /// Per public extra input.
  std::vector<at::Tensor> grad_extra_inputs;
  /// Per fuser: channel name -> gradient (the fuser's trace, or the reference's).
  std::vector<std::map<std::string, at::Tensor>> channel_grads;
};

/// One cotangent per output: seeded normal for floating outputs (float64, drawn on the CPU
/// generator, then placed on that output's device), undefined for integer ones.
std::vector<at::Tensor> make_cotangents(const std::vector<at::Tensor>& outputs, uint64_t seed);

/// Runs the fused path: input and extras are used as given (their requires_grad decides
/// what gets gradients); gradients of sum_k <outputs_k, cotangents_k> via autograd::grad.
PathResult run_fused(Sequential& sequential, const at::Tensor& input, const std::vector<at::Tensor>& extra_inputs,
                     uint64_t cotangent_seed = 77);
/// Same through the ReferenceEvaluator (float64 CPU) with the same cotangents.
PathResult run_reference(const Sequential& sequential, const at::Tensor& input,
                         const std::vector<at::Tensor>& extra_inputs, uint64_t cotangent_seed = 77);

/// Whether `got` matches `expected` elementwise (|got - exp| <= atol + rtol·|exp|, after
/// casting both to float64). An undefined `got` matches only an undefined or all-zero
/// `expected` (a dropped gradient that should be non-zero is a failure).
::testing::AssertionResult tensors_close(const at::Tensor& got, const at::Tensor& expected, Tolerance tol,
                                         const std::string& what);
/// Every output and gradient (channel gradients included) of `got` against `expected`.
::testing::AssertionResult results_close(const PathResult& got, const PathResult& expected, Tolerance tol);

/// Builds a Sequential (with `fusions`), runs the fused path and the reference on the same
/// data and compares them; exceptions are caught and reported as a failure.
::testing::AssertionResult fused_matches_reference(Sequential& sequential, const at::Tensor& input,
                                                   const std::vector<at::Tensor>& extra_inputs, Tolerance tol);
/// The opposite check, for faults: succeeds only when both paths run and some value or
/// gradient differs beyond `tol` (a throw is a failure, so a broken build cannot pass it).
::testing::AssertionResult fused_differs_from_reference(Sequential& sequential, const at::Tensor& input,
                                                        const std::vector<at::Tensor>& extra_inputs, Tolerance tol);

/// Central finite differences in float64 of L = Σ_k <outputs_k, cotangents_k> (the fused
/// path's forward, grad mode off, the cotangents run_fused draws for `cotangent_seed`) with
/// respect to every element of the input, of every parameter and of every floating public
/// extra input that requires grad; compared with the gradients `got` (run_fused's result on
/// the same data) within `tol`. Parameters are perturbed in place and restored. Every
/// tensor must be float64.
::testing::AssertionResult gradients_match_finite_differences(Sequential& sequential, const at::Tensor& input,
                                                              const std::vector<at::Tensor>& extra_inputs,
                                                              const PathResult& got, double step, Tolerance tol,
                                                              uint64_t cotangent_seed = 77);

/// The plan entry of `plan` named `name`, or nullptr.
const PlanEntry* find_entry(const std::vector<PlanEntry>& plan, const std::string& name);

/// A test op: `y = x`, extra output 0 = fixed int64 split sizes (a split-size producer that
/// does not depend on Dispatch).
class SplitSource final : public BasicOp {
 public:
  explicit SplitSource(std::vector<int64_t> sizes) : BasicOp("SplitSource"), sizes_(std::move(sizes)) {}
  int64_t num_extra_outputs() const override { return 1; }

 protected:
  GRADFUZZ_BASIC_OP_IMPL();

 private:
  std::vector<int64_t> sizes_;
};

/// A test op: `y = x` that counts its forward and backward calls (to prove backward
/// stopped early).
class CountingIdentity final : public BasicOp {
 public:
  CountingIdentity() : BasicOp("CountingIdentity") {}
  mutable int forward_calls = 0;
  mutable int backward_calls = 0;

 protected:
  GRADFUZZ_BASIC_OP_IMPL();
};

}  // namespace gradfuzz::ops::testing
