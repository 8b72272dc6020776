#pragma once

// Hand-written CUDA kernels behind the catalog fusions (ops.md, "Fused ops"). This header
// compiles without CUDA headers: the definitions live in kernels.cu, which is built only
// when GRADFUZZ_CUDA is on (then GRADFUZZ_WITH_CUDA is defined for every user). Callers
// guard each call with `#ifdef GRADFUZZ_WITH_CUDA` and `tensor.is_cuda()`.
//
// Every function takes tensors of one floating dtype (float32, float64, float16, bfloat16)
// on one CUDA device, makes them contiguous itself, and accumulates in float (float64 for
// float64 inputs). A leading batch shape is flattened into rows: "[rows, n]" means any
// tensor whose last dimension is n. Misuse throws c10::Error (TORCH_CHECK).

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace gradfuzz::ops::cuda {

/// Elementwise activation applied after the bias in the epilogue kernels.
enum class EpilogueActivation {
  kNone,  // identity: the epilogue is a bias add only
  kReLU,  // max(x, 0)
  kGELU,  // tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
};

/// Result of bias_activation_forward_cuda.
struct BiasActivationForward {
  /// y + bias [rows, n] (what the activation op saves); undefined unless requested.
  at::Tensor pre_activation;
  /// act(y + bias) [rows, n], dtype of y.
  at::Tensor output;
};

/// Bias + activation epilogue of ForwardLinearBiasActivation, one pass over y:
/// y [rows, n], bias [n] (same dtype) -> act(y + bias), and y + bias when
/// `keep_pre_activation` (with kNone both are the same tensor).
BiasActivationForward bias_activation_forward_cuda(const at::Tensor& y, const at::Tensor& bias, EpilogueActivation kind,
                                                   bool keep_pre_activation);

/// Result of bias_activation_backward_cuda.
struct BiasActivationBackward {
  /// grad_output · act'(pre_activation) [rows, n], dtype of grad_output.
  at::Tensor grad_pre_activation;
  /// Column sums of grad_pre_activation [n], dtype of grad_output.
  at::Tensor grad_bias;
};

/// BackwardActivationBias in one pass: grad_output [rows, n] and the activation's input
/// pre_activation [rows, n] (same dtype) -> d act and d bias.
BiasActivationBackward bias_activation_backward_cuda(const at::Tensor& grad_output, const at::Tensor& pre_activation,
                                                     EpilogueActivation kind);

/// Scaled SwiGLU forward of GroupedMLP: input [rows, 2h], scales [rows] ->
/// y [rows, h] = silu(a) · b · scales[r]. interleave == 0: a = first half, b = second half;
/// interleave k > 0: the features alternate k-wide a and b blocks (h must be a multiple of k).
at::Tensor scaled_swiglu_forward_cuda(const at::Tensor& input, const at::Tensor& scales, int64_t interleave);

/// Result of scaled_swiglu_backward_cuda.
struct ScaledSwigluBackward {
  /// [rows, 2h], dtype of input.
  at::Tensor grad_input;
  /// [rows], dtype of scales; undefined unless requested.
  at::Tensor grad_scales;
};

/// Backward of scaled_swiglu_forward_cuda: grad_output [rows, h] -> d input [rows, 2h] and,
/// when `want_grad_scales`, d scales[r] = Σ_j grad_output · silu(a) · b.
ScaledSwigluBackward scaled_swiglu_backward_cuda(const at::Tensor& grad_output, const at::Tensor& input,
                                                 const at::Tensor& scales, int64_t interleave, bool want_grad_scales);

/// Result of add_rmsnorm_backward_cuda.
struct AddRmsNormBackward {
  /// [rows, n], dtype of input.
  at::Tensor grad_input;
  /// [n], dtype of gamma.
  at::Tensor grad_gamma;
};

/// BackwardAddRMSNorm: RMSNorm y = x · rstd · (gamma + gamma_offset) with
/// rstd = 1/sqrt(mean(x²) + eps); gamma_offset is 1 for TE's zero-centred gamma, else 0,
/// and is added in the accumulation type (d gamma is the same for both forms).
/// grad_output, input [rows, n], gamma [n]; `rstd` [rows] (float or the accumulation
/// type) may be undefined, then it is recomputed from input and eps; `grad_extra`
/// [rows, n] may be undefined (treated as zero) and is added to d input in the same pass.
AddRmsNormBackward add_rmsnorm_backward_cuda(const at::Tensor& grad_output, const at::Tensor& input,
                                             const at::Tensor& gamma, const at::Tensor& rstd, double eps,
                                             const at::Tensor& grad_extra, double gamma_offset);

}  // namespace gradfuzz::ops::cuda
