// The elementwise CUDA kernels of uniform-noise diffusion (DiffusionGemma: Backend::rmsnorm_ex, geglu, scale,
// softcap; the per-row sampling kernels, canvas_sample and soft_embed's softmax, are sample.cu's). Semantics
// are the CPU kernels' (backend/cpu/elementwise.cpp).
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/op_checks.h"

namespace tessera::cuda {
namespace {

int dtype_code(DType t) {
  return t == DType::F32 ? 0 : (t == DType::BF16 ? 1 : 2);
}

// Group gi of y from its row xr of x and inverse RMS: elements start, start + stride, ... (w == nullptr: no
// scale; bf16 rounded as rmsnorm; accumulate: added).
__device__ __forceinline__ void norm_write(const float* xr, const void* w, int wdt, int64_t group, float inv,
                                           bool accumulate, void* y, bool y_bf16, int64_t gi, int64_t start,
                                           int64_t stride) {
  for (int64_t i = start; i < group; i += stride) {
    const float wv = w != nullptr ? load_any(w, wdt, i) : 1.0f;
    if (y_bf16) {
      static_cast<__nv_bfloat16*>(y)[gi * group + i] = float_to_bf16(round_bf16_dev(xr[i] * inv) * wv);
    } else if (accumulate) {
      static_cast<float*>(y)[gi * group + i] += xr[i] * inv * wv;
    } else {
      static_cast<float*>(y)[gi * group + i] = xr[i] * inv * wv;
    }
  }
}

// One warp per group; w == nullptr: no scale. y (= | +=) rmsnorm(x) * w, or bf16 rounded as rmsnorm.
__global__ void rmsnorm_ex_kernel(const float* x, const void* w, int wdt, int64_t n_groups, int64_t group,
                                  float eps, bool accumulate, void* y, bool y_bf16) {
  const int64_t gi = static_cast<int64_t>(blockIdx.x) * 8 + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (gi >= n_groups) return;
  const float* xr = x + gi * group;
  float ss = 0.0f;
  for (int64_t i = lane; i < group; i += 32) ss += xr[i] * xr[i];
  ss = warp_sum(ss);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(group) + eps);
  norm_write(xr, w, wdt, group, inv, accumulate, y, y_bf16, gi, lane, 32);
}

// One block of kNormThreads per group, for wide groups (a model's hidden size): a warp per row of 2,816
// leaves the GPU idle at 256 rows (32 blocks, 88 dependent loads a lane: the norms took 10 ms of a 69 ms
// canvas step at 26B-A4B on an H100).
constexpr int kNormThreads = 256;
__global__ void __launch_bounds__(kNormThreads)
    rmsnorm_ex_row_kernel(const float* x, const void* w, int wdt, int64_t group, float eps, bool accumulate,
                          void* y, bool y_bf16) {
  __shared__ float part[kNormThreads / 32];
  const int64_t gi = blockIdx.x;
  const float* xr = x + gi * group;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < group; i += kNormThreads) ss += xr[i] * xr[i];
  ss = warp_sum(ss);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = ss;
  __syncthreads();
  ss = 0.0f;
  for (int k = 0; k < kNormThreads / 32; ++k) ss += part[k];
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(group) + eps);
  norm_write(xr, w, wdt, group, inv, accumulate, y, y_bf16, gi, threadIdx.x, kNormThreads);
}

__device__ __forceinline__ float gelu_tanh(float x) {
  constexpr float kC = 0.7978845608028654f;  // sqrt(2 / pi)
  return 0.5f * x * (1.0f + tanhf(kC * (x + 0.044715f * x * x * x)));
}

__global__ void geglu_kernel(const void* g, const void* u, void* o, int64_t n, bool bf16) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  if (bf16) {  // the activation rounded to bf16 before the multiply (HF)
    const float gv = bf16_to_float(static_cast<const __nv_bfloat16*>(g)[i]);
    const float uv = bf16_to_float(static_cast<const __nv_bfloat16*>(u)[i]);
    static_cast<__nv_bfloat16*>(o)[i] = float_to_bf16(round_bf16_dev(gelu_tanh(gv)) * uv);
  } else {
    static_cast<float*>(o)[i] = gelu_tanh(static_cast<const float*>(g)[i]) * static_cast<const float*>(u)[i];
  }
}

// x *= f, or (cap) x = f * tanh(x / f): the embedding / layer scales and the final logit soft-capping.
__global__ void scale_kernel(float* x, int64_t n, float f, bool cap) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] = cap ? f * tanhf(x[i] / f) : x[i] * f;
}

unsigned blocks(int64_t n, int threads = 256) {
  return static_cast<unsigned>(ceil_div(n, threads));
}

}  // namespace

void rmsnorm_ex(const Tensor& x, const Tensor* w, int64_t group, float eps, bool accumulate, Tensor& y,
                cudaStream_t s) {
  check_rmsnorm_ex(x, w, group, accumulate, y);
  const int64_t n_groups = x.numel() / group;
  if (n_groups == 0) return;
  if (group >= 1024) {
    rmsnorm_ex_row_kernel<<<static_cast<unsigned>(n_groups), kNormThreads, 0, s>>>(
        x.as<const float>(), w != nullptr ? w->data : nullptr, w != nullptr ? dtype_code(w->dtype) : 0, group,
        eps, accumulate, y.data, y.dtype == DType::BF16);
    check_launch("rmsnorm_ex");
    return;
  }
  rmsnorm_ex_kernel<<<blocks(n_groups, 8), 256, 0, s>>>(
      x.as<const float>(), w != nullptr ? w->data : nullptr, w != nullptr ? dtype_code(w->dtype) : 0,
      n_groups, group, eps, accumulate, y.data, y.dtype == DType::BF16);
  check_launch("rmsnorm_ex");
}

void geglu(const Tensor& gate, const Tensor& up, Tensor& out, cudaStream_t s) {
  check_swiglu(gate, up, out);
  const int64_t n = gate.numel();
  if (n == 0) return;
  geglu_kernel<<<blocks(n), 256, 0, s>>>(gate.data, up.data, out.data, n, gate.dtype == DType::BF16);
  check_launch("geglu");
}

void scale(Tensor& x, float f, bool cap, cudaStream_t s) {
  const char* op = cap ? "softcap" : "scale";
  check_scale(x, op);
  const int64_t n = x.numel();
  if (n == 0) return;
  scale_kernel<<<blocks(n), 256, 0, s>>>(x.as<float>(), n, f, cap);
  check_launch(op);
}

}  // namespace tessera::cuda
