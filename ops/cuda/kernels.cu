// Hand-written CUDA kernels of the catalog fusions; contracts in kernels.h.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>

#include "ops/cuda/kernels.h"
#include "ops/cuda/launch_stats.h"
#include "ops/faults.h"

namespace gradfuzz::ops::cuda {
namespace detail {

constexpr int kWarpSize = 32;
constexpr int kRowThreads = 256;  // threads per block of the row-wise kernels

// Overloads so one template serves float and double accumulation.
__device__ __forceinline__ float dev_exp(float v) { return expf(v); }
__device__ __forceinline__ double dev_exp(double v) { return exp(v); }
__device__ __forceinline__ float dev_tanh(float v) { return tanhf(v); }
__device__ __forceinline__ double dev_tanh(double v) { return tanh(v); }
__device__ __forceinline__ float dev_rsqrt(float v) { return rsqrtf(v); }
__device__ __forceinline__ double dev_rsqrt(double v) { return rsqrt(v); }

template <typename acc_t>
__device__ __forceinline__ acc_t apply_activation(acc_t v, EpilogueActivation kind) {
  switch (kind) {
    case EpilogueActivation::kReLU:
      return v > acc_t(0) ? v : acc_t(0);
    case EpilogueActivation::kGELU: {
      const acc_t k0 = acc_t(0.7978845608028654);  // sqrt(2/pi)
      const acc_t t = dev_tanh(k0 * (v + acc_t(0.044715) * v * v * v));
      return acc_t(0.5) * v * (acc_t(1) + t);
    }
    case EpilogueActivation::kNone:
    default:
      return v;
  }
}

template <typename acc_t>
__device__ __forceinline__ acc_t activation_derivative(acc_t v, EpilogueActivation kind) {
  switch (kind) {
    case EpilogueActivation::kReLU:
      return v > acc_t(0) ? acc_t(1) : acc_t(0);
    case EpilogueActivation::kGELU: {
      const acc_t k0 = acc_t(0.7978845608028654);
      const acc_t k1 = acc_t(0.044715);
      const acc_t t = dev_tanh(k0 * (v + k1 * v * v * v));
      return acc_t(0.5) * (acc_t(1) + t) +
             acc_t(0.5) * v * (acc_t(1) - t * t) * k0 * (acc_t(1) + acc_t(3) * k1 * v * v);
    }
    case EpilogueActivation::kNone:
    default:
      return acc_t(1);
  }
}

template <typename acc_t>
__device__ __forceinline__ acc_t sigmoid(acc_t v) {
  return acc_t(1) / (acc_t(1) + dev_exp(-v));
}

// Sum over the block; every thread gets the result. `shared` holds one value per warp.
template <typename acc_t>
__device__ acc_t block_sum(acc_t v, acc_t* shared) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    v += __shfl_down_sync(0xffffffffu, v, offset);
  }
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  __syncthreads();  // `shared` may still be read from a previous call
  if (lane == 0) {
    shared[warp] = v;
  }
  __syncthreads();
  const int num_warps = (blockDim.x + kWarpSize - 1) / kWarpSize;
  acc_t total = acc_t(0);
  for (int w = 0; w < num_warps; ++w) {
    total += shared[w];
  }
  return total;
}

// ---- (a) bias + activation epilogue --------------------------------------------------

template <typename scalar_t>
__global__ void bias_activation_forward_kernel(const scalar_t* __restrict__ y, const scalar_t* __restrict__ bias,
                                               scalar_t* __restrict__ out, scalar_t* __restrict__ pre, int64_t total,
                                               int64_t n, EpilogueActivation kind, int64_t oob_index) {
  using acc_t = at::opmath_type<scalar_t>;
  if (oob_index >= 0 && blockIdx.x == 0 && threadIdx.x == 0) {
    // The oob-write fault: one element just past `out`'s allocation is read and written back
    // unchanged, so no compared value moves; only a memory checker can see it.
    volatile unsigned char* past = reinterpret_cast<volatile unsigned char*>(out + oob_index);
    *past = *past;
  }
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const acc_t v = static_cast<acc_t>(y[i]) + static_cast<acc_t>(bias[i % n]);
    if (pre != nullptr) {
      pre[i] = static_cast<scalar_t>(v);
    }
    out[i] = static_cast<scalar_t>(apply_activation(v, kind));
  }
}

// ---- (b) activation + bias backward ----------------------------------------------------
// Block (32, 8): x walks 32 consecutive columns (coalesced), y walks rows; blockIdx.y picks
// a row chunk and writes one partial column sum per chunk.

constexpr int kColTile = 32;
constexpr int kRowLanes = 8;

template <typename scalar_t>
__global__ void bias_activation_backward_kernel(const scalar_t* __restrict__ grad_out, const scalar_t* __restrict__ pre,
                                                scalar_t* __restrict__ grad_pre,
                                                at::opmath_type<scalar_t>* __restrict__ partial_bias, int64_t rows,
                                                int64_t n, int64_t rows_per_chunk, EpilogueActivation kind) {
  using acc_t = at::opmath_type<scalar_t>;
  __shared__ acc_t tile[kRowLanes][kColTile];
  const int64_t col = blockIdx.x * static_cast<int64_t>(kColTile) + threadIdx.x;
  const int64_t row_begin = blockIdx.y * rows_per_chunk;
  const int64_t row_end = min(rows, row_begin + rows_per_chunk);
  acc_t sum = acc_t(0);
  if (col < n) {
    for (int64_t r = row_begin + threadIdx.y; r < row_end; r += kRowLanes) {
      const int64_t i = r * n + col;
      const acc_t g = static_cast<acc_t>(grad_out[i]) * activation_derivative(static_cast<acc_t>(pre[i]), kind);
      const scalar_t g_stored = static_cast<scalar_t>(g);
      grad_pre[i] = g_stored;
      // d bias is the column sum of the d act the caller receives (same rounding).
      sum += static_cast<acc_t>(g_stored);
    }
  }
  tile[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && col < n) {
    acc_t total = acc_t(0);
    for (int lane = 0; lane < kRowLanes; ++lane) {
      total += tile[lane][threadIdx.x];
    }
    partial_bias[blockIdx.y * n + col] = total;
  }
}

// ---- (c) scaled SwiGLU ---------------------------------------------------------------

// Columns of a and b in the [rows, 2h] input for output column j.
__device__ __forceinline__ void glu_columns(int64_t j, int64_t h, int64_t interleave, int64_t* a_col, int64_t* b_col) {
  if (interleave <= 0) {
    *a_col = j;
    *b_col = h + j;
  } else {
    const int64_t block = j / interleave;
    const int64_t offset = j % interleave;
    *a_col = block * 2 * interleave + offset;
    *b_col = *a_col + interleave;
  }
}

template <typename scalar_t>
__global__ void scaled_swiglu_forward_kernel(const scalar_t* __restrict__ input, const scalar_t* __restrict__ scales,
                                             scalar_t* __restrict__ out, int64_t rows, int64_t h, int64_t interleave) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t total = rows * h;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / h;
    const int64_t j = i % h;
    int64_t a_col = 0;
    int64_t b_col = 0;
    glu_columns(j, h, interleave, &a_col, &b_col);
    const acc_t a = static_cast<acc_t>(input[r * 2 * h + a_col]);
    const acc_t b = static_cast<acc_t>(input[r * 2 * h + b_col]);
    out[i] = static_cast<scalar_t>(a * sigmoid(a) * b * static_cast<acc_t>(scales[r]));
  }
}

// One block per row (grid-stride over rows); the block sums d scales of its row.
template <typename scalar_t>
__global__ void scaled_swiglu_backward_kernel(const scalar_t* __restrict__ grad_out, const scalar_t* __restrict__ input,
                                              const scalar_t* __restrict__ scales, scalar_t* __restrict__ grad_input,
                                              scalar_t* __restrict__ grad_scales, int64_t rows, int64_t h,
                                              int64_t interleave) {
  using acc_t = at::opmath_type<scalar_t>;
  __shared__ acc_t shared[kRowThreads / kWarpSize];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const acc_t s = static_cast<acc_t>(scales[r]);
    const scalar_t* in_row = input + r * 2 * h;
    scalar_t* grad_in_row = grad_input + r * 2 * h;
    acc_t row_sum = acc_t(0);
    for (int64_t j = threadIdx.x; j < h; j += blockDim.x) {
      int64_t a_col = 0;
      int64_t b_col = 0;
      glu_columns(j, h, interleave, &a_col, &b_col);
      const acc_t a = static_cast<acc_t>(in_row[a_col]);
      const acc_t b = static_cast<acc_t>(in_row[b_col]);
      const acc_t g = static_cast<acc_t>(grad_out[r * h + j]);
      const acc_t sig = sigmoid(a);
      const acc_t silu = a * sig;
      const acc_t dsilu = sig * (acc_t(1) + a * (acc_t(1) - sig));
      grad_in_row[a_col] = static_cast<scalar_t>(g * s * b * dsilu);
      grad_in_row[b_col] = static_cast<scalar_t>(g * s * silu);
      row_sum += g * silu * b;
    }
    if (grad_scales != nullptr) {
      const acc_t total = block_sum(row_sum, shared);
      if (threadIdx.x == 0) {
        grad_scales[r] = static_cast<scalar_t>(total);
      }
    }
  }
}

// ---- (d) RMSNorm backward with the residual gradient ----------------------------------
// Block b handles rows b, b + gridDim.x, ...; thread t owns columns t, t + blockDim.x, ...
// of partial_gamma row b, so the d gamma partial sums need no atomics.

template <typename scalar_t, typename gamma_t>
__global__ void add_rmsnorm_backward_kernel(const scalar_t* __restrict__ grad_out, const scalar_t* __restrict__ input,
                                            const gamma_t* __restrict__ gamma, const float* __restrict__ rstd_f,
                                            const double* __restrict__ rstd_d, const scalar_t* __restrict__ grad_extra,
                                            scalar_t* __restrict__ grad_input,
                                            at::opmath_type<scalar_t>* __restrict__ partial_gamma, int64_t rows,
                                            int64_t n, double eps, double gamma_offset) {
  using acc_t = at::opmath_type<scalar_t>;
  // The effective scale γ_j = gamma_j + offset (offset 1: zero-centred gamma), in acc_t.
  const acc_t offset = static_cast<acc_t>(gamma_offset);
  __shared__ acc_t shared[kRowThreads / kWarpSize];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const scalar_t* x_row = input + r * n;
    const scalar_t* g_row = grad_out + r * n;
    acc_t rstd = acc_t(0);
    if (rstd_f != nullptr) {
      rstd = static_cast<acc_t>(rstd_f[r]);
    } else if (rstd_d != nullptr) {
      rstd = static_cast<acc_t>(rstd_d[r]);
    } else {
      acc_t sum_sq = acc_t(0);
      for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
        const acc_t x = static_cast<acc_t>(x_row[j]);
        sum_sq += x * x;
      }
      sum_sq = block_sum(sum_sq, shared);
      rstd = dev_rsqrt(sum_sq / static_cast<acc_t>(n) + static_cast<acc_t>(eps));
    }
    // dot = Σ_k g_k γ_k x_k
    acc_t dot = acc_t(0);
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      dot += static_cast<acc_t>(g_row[j]) * (static_cast<acc_t>(gamma[j]) + offset) * static_cast<acc_t>(x_row[j]);
    }
    dot = block_sum(dot, shared);
    const acc_t coeff = dot * rstd * rstd * rstd / static_cast<acc_t>(n);
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const acc_t x = static_cast<acc_t>(x_row[j]);
      const acc_t g = static_cast<acc_t>(g_row[j]);
      acc_t dx = rstd * g * (static_cast<acc_t>(gamma[j]) + offset) - x * coeff;
      if (grad_extra != nullptr) {
        dx += static_cast<acc_t>(grad_extra[r * n + j]);
      }
      grad_input[r * n + j] = static_cast<scalar_t>(dx);
      partial_gamma[blockIdx.x * n + j] += g * x * rstd;
    }
  }
}

int64_t elementwise_blocks(int64_t total, int threads) {
  const int64_t needed = (total + threads - 1) / threads;
  const int64_t cap = static_cast<int64_t>(at::cuda::getCurrentDeviceProperties()->multiProcessorCount) * 32;
  return std::max<int64_t>(1, std::min(needed, cap));
}

void check_float_cuda(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.defined(), "gradfuzz cuda kernel: ", what, " must be defined");
  TORCH_CHECK(t.is_cuda(), "gradfuzz cuda kernel: ", what, " must be a CUDA tensor, got ", t.device());
  TORCH_CHECK(at::isFloatingType(t.scalar_type()), "gradfuzz cuda kernel: ", what, " must be floating point, got ",
              t.scalar_type());
}

}  // namespace detail

BiasActivationForward bias_activation_forward_cuda(const at::Tensor& y, const at::Tensor& bias, EpilogueActivation kind,
                                                   bool keep_pre_activation) {
  detail::check_float_cuda(y, "bias_activation_forward y");
  detail::check_float_cuda(bias, "bias_activation_forward bias");
  TORCH_CHECK(y.dim() >= 1 && bias.dim() == 1 && y.size(-1) == bias.size(0),
              "bias_activation_forward: y [..., n] and bias [n] expected, got ", y.sizes(), " and ", bias.sizes());
  TORCH_CHECK(y.scalar_type() == bias.scalar_type(),
              "bias_activation_forward: y and bias dtypes differ: ", y.scalar_type(), " vs ", bias.scalar_type());
  const c10::cuda::CUDAGuard guard(y.device());
  const at::Tensor y_c = y.contiguous();
  const at::Tensor bias_c = bias.contiguous();
  BiasActivationForward result;
  result.output = at::empty_like(y_c);
  const bool separate_pre = keep_pre_activation && kind != EpilogueActivation::kNone;
  if (separate_pre) {
    result.pre_activation = at::empty_like(y_c);
  }
  const int64_t total = y_c.numel();
  const int64_t n = bias_c.numel();
  // PyTorch allocates in multiples of 512 bytes: the first element past that is outside
  // the allocation (into the memory checker's padding).
  const int64_t item = static_cast<int64_t>(y_c.element_size());
  const int64_t oob_index = fault_enabled(Fault::kOobWrite) ? (total * item + 511) / 512 * 512 / item : -1;
  if (total > 0) {
    constexpr int kThreads = 256;
    const int64_t blocks = detail::elementwise_blocks(total, kThreads);
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, y_c.scalar_type(), "bias_activation_forward_cuda", [&] {
      detail::bias_activation_forward_kernel<scalar_t>
          <<<static_cast<unsigned>(blocks), kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
              y_c.const_data_ptr<scalar_t>(), bias_c.const_data_ptr<scalar_t>(),
              result.output.mutable_data_ptr<scalar_t>(),
              separate_pre ? result.pre_activation.mutable_data_ptr<scalar_t>() : nullptr, total, n, kind, oob_index);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
    record_launch("bias_activation_forward", blocks);
  }
  if (keep_pre_activation && !separate_pre) {
    result.pre_activation = result.output;
  }
  return result;
}

BiasActivationBackward bias_activation_backward_cuda(const at::Tensor& grad_output, const at::Tensor& pre_activation,
                                                     EpilogueActivation kind) {
  detail::check_float_cuda(grad_output, "bias_activation_backward grad_output");
  detail::check_float_cuda(pre_activation, "bias_activation_backward pre_activation");
  TORCH_CHECK(grad_output.sizes() == pre_activation.sizes() && grad_output.dim() >= 1,
              "bias_activation_backward: grad_output and pre_activation shapes differ: ", grad_output.sizes(), " vs ",
              pre_activation.sizes());
  TORCH_CHECK(grad_output.scalar_type() == pre_activation.scalar_type(),
              "bias_activation_backward: dtypes differ: ", grad_output.scalar_type(), " vs ",
              pre_activation.scalar_type());
  const c10::cuda::CUDAGuard guard(grad_output.device());
  const at::Tensor g_c = grad_output.contiguous();
  const at::Tensor pre_c = pre_activation.contiguous();
  const int64_t n = g_c.size(-1);
  const int64_t rows = n == 0 ? 0 : g_c.numel() / n;
  BiasActivationBackward result;
  result.grad_pre_activation = at::empty_like(g_c);
  const auto acc_type = at::toOpMathType(g_c.scalar_type());
  if (rows == 0 || n == 0) {
    result.grad_bias = at::zeros({n}, g_c.options());
    return result;
  }
  // Enough row chunks to fill the device, each at least 64 rows long.
  const int64_t col_blocks = (n + detail::kColTile - 1) / detail::kColTile;
  const int64_t sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const int64_t wanted_chunks = std::max<int64_t>(1, (4 * sms + col_blocks - 1) / col_blocks);
  const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>({wanted_chunks, (rows + 63) / 64, 65535}));
  const int64_t rows_per_chunk = (rows + chunks - 1) / chunks;
  at::Tensor partial = at::empty({chunks, n}, g_c.options().dtype(acc_type));
  const dim3 grid(static_cast<unsigned>(col_blocks), static_cast<unsigned>(chunks));
  const dim3 block(detail::kColTile, detail::kRowLanes);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, g_c.scalar_type(), "bias_activation_backward_cuda", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    detail::bias_activation_backward_kernel<scalar_t><<<grid, block, 0, at::cuda::getCurrentCUDAStream()>>>(
        g_c.const_data_ptr<scalar_t>(), pre_c.const_data_ptr<scalar_t>(),
        result.grad_pre_activation.mutable_data_ptr<scalar_t>(), partial.mutable_data_ptr<acc_t>(), rows, n,
        rows_per_chunk, kind);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  record_launch("bias_activation_backward", col_blocks * chunks);
  result.grad_bias = partial.sum(0).to(g_c.scalar_type());
  return result;
}

namespace {

// Shared checks of the scaled SwiGLU entry points; returns h.
int64_t check_swiglu(const at::Tensor& input, const at::Tensor& scales, int64_t interleave) {
  detail::check_float_cuda(input, "scaled_swiglu input");
  detail::check_float_cuda(scales, "scaled_swiglu scales");
  TORCH_CHECK(input.dim() >= 1 && input.size(-1) % 2 == 0, "scaled_swiglu: input [..., 2h] expected, got ",
              input.sizes());
  const int64_t h = input.size(-1) / 2;
  const int64_t rows = h == 0 ? 0 : input.numel() / input.size(-1);
  TORCH_CHECK(scales.numel() == rows, "scaled_swiglu: scales must have rows=", rows, " elements, got ", scales.numel());
  TORCH_CHECK(interleave >= 0 && (interleave == 0 || h % interleave == 0),
              "scaled_swiglu: interleave must be 0 or divide h=", h, ", got ", interleave);
  return h;
}

}  // namespace

at::Tensor scaled_swiglu_forward_cuda(const at::Tensor& input, const at::Tensor& scales, int64_t interleave) {
  const int64_t h = check_swiglu(input, scales, interleave);
  const c10::cuda::CUDAGuard guard(input.device());
  const at::Tensor in_c = input.contiguous();
  const at::Tensor s_c = scales.to(in_c.scalar_type()).contiguous();
  std::vector<int64_t> out_shape = in_c.sizes().vec();
  out_shape.back() = h;
  at::Tensor out = at::empty(out_shape, in_c.options());
  const int64_t rows = h == 0 ? 0 : in_c.numel() / (2 * h);
  if (rows * h > 0) {
    constexpr int kThreads = 256;
    const int64_t blocks = detail::elementwise_blocks(rows * h, kThreads);
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, in_c.scalar_type(), "scaled_swiglu_forward_cuda", [&] {
      detail::scaled_swiglu_forward_kernel<scalar_t>
          <<<static_cast<unsigned>(blocks), kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
              in_c.const_data_ptr<scalar_t>(), s_c.const_data_ptr<scalar_t>(), out.mutable_data_ptr<scalar_t>(), rows,
              h, interleave);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
    record_launch("scaled_swiglu_forward", blocks);
  }
  return out;
}

ScaledSwigluBackward scaled_swiglu_backward_cuda(const at::Tensor& grad_output, const at::Tensor& input,
                                                 const at::Tensor& scales, int64_t interleave, bool want_grad_scales) {
  const int64_t h = check_swiglu(input, scales, interleave);
  detail::check_float_cuda(grad_output, "scaled_swiglu grad_output");
  TORCH_CHECK(grad_output.numel() == input.numel() / 2 && grad_output.size(-1) == h,
              "scaled_swiglu_backward: grad_output [..., ", h, "] expected, got ", grad_output.sizes());
  const c10::cuda::CUDAGuard guard(input.device());
  const at::Tensor in_c = input.contiguous();
  const at::Tensor g_c = grad_output.to(in_c.scalar_type()).contiguous();
  const at::Tensor s_c = scales.to(in_c.scalar_type()).contiguous();
  const int64_t rows = h == 0 ? 0 : in_c.numel() / (2 * h);
  ScaledSwigluBackward result;
  result.grad_input = at::empty_like(in_c);
  at::Tensor grad_scales;
  if (want_grad_scales) {
    grad_scales = rows > 0 && h > 0 ? at::empty({rows}, in_c.options()) : at::zeros({rows}, in_c.options());
  }
  if (rows > 0 && h > 0) {
    const int64_t blocks = std::min<int64_t>(rows, 65535);
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, in_c.scalar_type(), "scaled_swiglu_backward_cuda", [&] {
      detail::scaled_swiglu_backward_kernel<scalar_t>
          <<<static_cast<unsigned>(blocks), detail::kRowThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
              g_c.const_data_ptr<scalar_t>(), in_c.const_data_ptr<scalar_t>(), s_c.const_data_ptr<scalar_t>(),
              result.grad_input.mutable_data_ptr<scalar_t>(),
              want_grad_scales ? grad_scales.mutable_data_ptr<scalar_t>() : nullptr, rows, h, interleave);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
    record_launch("scaled_swiglu_backward", blocks);
  }
  if (want_grad_scales) {
    result.grad_scales = grad_scales.to(scales.scalar_type()).view(scales.sizes());
  }
  return result;
}

AddRmsNormBackward add_rmsnorm_backward_cuda(const at::Tensor& grad_output, const at::Tensor& input,
                                             const at::Tensor& gamma, const at::Tensor& rstd, double eps,
                                             const at::Tensor& grad_extra, double gamma_offset) {
  detail::check_float_cuda(grad_output, "add_rmsnorm_backward grad_output");
  detail::check_float_cuda(input, "add_rmsnorm_backward input");
  detail::check_float_cuda(gamma, "add_rmsnorm_backward gamma");
  TORCH_CHECK(input.dim() >= 1 && gamma.dim() == 1 && input.size(-1) == gamma.size(0),
              "add_rmsnorm_backward: input [..., n] and gamma [n] expected, got ", input.sizes(), " and ",
              gamma.sizes());
  TORCH_CHECK(grad_output.sizes() == input.sizes(), "add_rmsnorm_backward: grad_output shape ", grad_output.sizes(),
              " differs from input shape ", input.sizes());
  const c10::cuda::CUDAGuard guard(input.device());
  const at::Tensor x_c = input.contiguous();
  const at::Tensor g_c = grad_output.to(x_c.scalar_type()).contiguous();
  const at::Tensor gamma_c = gamma.contiguous();
  at::Tensor extra_c;
  if (grad_extra.defined()) {
    detail::check_float_cuda(grad_extra, "add_rmsnorm_backward grad_extra");
    TORCH_CHECK(grad_extra.sizes() == input.sizes(), "add_rmsnorm_backward: grad_extra shape ", grad_extra.sizes(),
                " differs from input shape ", input.sizes());
    extra_c = grad_extra.to(x_c.scalar_type()).contiguous();
  }
  const int64_t n = x_c.size(-1);
  const int64_t rows = n == 0 ? 0 : x_c.numel() / n;
  at::Tensor rstd_c;
  if (rstd.defined()) {
    TORCH_CHECK(rstd.numel() == rows, "add_rmsnorm_backward: rstd must have rows=", rows, " elements, got ",
                rstd.numel());
    rstd_c = rstd.to(rstd.scalar_type() == at::kDouble ? at::kDouble : at::kFloat).contiguous();
  }
  AddRmsNormBackward result;
  result.grad_input = at::empty_like(x_c);
  const auto acc_type = at::toOpMathType(x_c.scalar_type());
  if (rows == 0 || n == 0) {
    result.grad_input.zero_();
    result.grad_gamma = at::zeros({n}, gamma_c.options());
    return result;
  }
  const int64_t blocks =
      std::min<int64_t>(rows, static_cast<int64_t>(at::cuda::getCurrentDeviceProperties()->multiProcessorCount) * 4);
  at::Tensor partial = at::zeros({blocks, n}, x_c.options().dtype(acc_type));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x_c.scalar_type(), "add_rmsnorm_backward_cuda", [&] {
    using x_t = scalar_t;
    using acc_t = at::opmath_type<x_t>;
    const float* rstd_f =
        rstd_c.defined() && rstd_c.scalar_type() == at::kFloat ? rstd_c.const_data_ptr<float>() : nullptr;
    const double* rstd_d =
        rstd_c.defined() && rstd_c.scalar_type() == at::kDouble ? rstd_c.const_data_ptr<double>() : nullptr;
    const x_t* extra_ptr = extra_c.defined() ? extra_c.const_data_ptr<x_t>() : nullptr;
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, gamma_c.scalar_type(), "add_rmsnorm_backward_gamma", [&] {
      detail::add_rmsnorm_backward_kernel<x_t, scalar_t>
          <<<static_cast<unsigned>(blocks), detail::kRowThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
              g_c.const_data_ptr<x_t>(), x_c.const_data_ptr<x_t>(), gamma_c.const_data_ptr<scalar_t>(), rstd_f, rstd_d,
              extra_ptr, result.grad_input.mutable_data_ptr<x_t>(), partial.mutable_data_ptr<acc_t>(), rows, n, eps,
              gamma_offset);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
  record_launch("add_rmsnorm_backward", blocks);
  result.grad_gamma = partial.sum(0).to(gamma_c.scalar_type());
  return result;
}

}  // namespace gradfuzz::ops::cuda
