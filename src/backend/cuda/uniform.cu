// The CUDA kernels of uniform-noise diffusion (DiffusionGemma: Backend::rmsnorm_ex, geglu, scale, softcap,
// canvas_sample and the softmax of soft_embed, whose GEMM is cuBLASLt's in cuda_backend.cpp). Semantics
// are the CPU kernels' (backend/cpu/elementwise.cpp and uniform_ops.cpp): the sampler's Gumbel noise is
// the same counter RNG in f64, so both backends draw the same tokens from the same logits.
#include <cfloat>
#include <climits>

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

constexpr int kRowThreads = 1024;  // one block per logits row
constexpr int kWarps = kRowThreads / 32;

// The block's best (value, index): larger value, ties to the lower index. Every thread gets the result.
template <typename T>
__device__ void block_argmax(T& v, int64_t& idx, T* sv, int64_t* si) {
  for (int o = 16; o > 0; o >>= 1) {
    const T ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int64_t oi = __shfl_xor_sync(0xffffffffu, idx, o);
    if (ov > v || (ov == v && oi < idx)) {
      v = ov;
      idx = oi;
    }
  }
  const int w = threadIdx.x >> 5;
  __syncthreads();
  if ((threadIdx.x & 31) == 0) {
    sv[w] = v;
    si[w] = idx;
  }
  __syncthreads();
  v = sv[0];
  idx = si[0];
  for (int k = 1; k < kWarps; ++k) {
    if (sv[k] > v || (sv[k] == v && si[k] < idx)) {
      v = sv[k];
      idx = si[k];
    }
  }
}

// The block's sum of v (a fixed order: deterministic). Every thread gets the result.
__device__ double block_sum(double v, double* sd) {
  v = warp_sum(v);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sd[threadIdx.x >> 5] = v;
  __syncthreads();
  double s = 0.0;
  for (int k = 0; k < kWarps; ++k) s += sd[k];
  return s;
}

// One block per row: the argmax; the Gumbel-max sample at T drawn only where a token can still win
// (L_v + 37.5 T below the argmax's own perturbed value: -log(-log U) <= 37.43 for every U of the RNG, so
// the skip is exact, as on the CPU); the entropy of softmax(L / T) in f64.
__global__ void __launch_bounds__(kRowThreads)
    canvas_sample_kernel(const float* logits, int64_t V, const int32_t* keys, double T, uint64_t seed,
                         int32_t* token, int32_t* argmax, float* entropy) {
  __shared__ float sf[kWarps];
  __shared__ double sd[kWarps];
  __shared__ int64_t si[kWarps];
  const int64_t r = blockIdx.x;
  const float* L = logits + r * V;
  const auto key = static_cast<uint64_t>(static_cast<uint32_t>(keys[r]));
  float best = -INFINITY;
  int64_t best_i = V;  // past every index (a row with nothing above -inf takes index 0, as on the CPU)
  for (int64_t v = threadIdx.x; v < V; v += kRowThreads) {
    if (L[v] > best || (L[v] == best && v < best_i)) {
      best = L[v];
      best_i = v;
    }
  }
  block_argmax(best, best_i, sf, si);
  if (best_i >= V) best_i = 0;
  auto gumbel = [&](int64_t v) {
    return static_cast<double>(L[v]) - T * log(-log(rng_uniform_dev(seed, key, static_cast<uint64_t>(v))));
  };
  const double bar = gumbel(best_i);
  const double reach = 37.5 * T;
  double g_best = -INFINITY;
  int64_t g_i = V;
  for (int64_t v = threadIdx.x; v < V; v += kRowThreads) {
    if (static_cast<double>(L[v]) + reach < bar) continue;
    const double g = gumbel(v);
    if (g > g_best || (g == g_best && v < g_i)) {
      g_best = g;
      g_i = v;
    }
  }
  block_argmax(g_best, g_i, sd, si);
  if (g_i >= V) g_i = best_i;
  const double mx = best;
  double z = 0.0, pz = 0.0;
  for (int64_t v = threadIdx.x; v < V; v += kRowThreads) {
    const double zi = (static_cast<double>(L[v]) - mx) / T;
    const double e = exp(zi);
    z += e;
    pz += e * zi;
  }
  z = block_sum(z, sd);
  pz = block_sum(pz, sd);
  if (threadIdx.x == 0) {
    token[r] = static_cast<int32_t>(g_i);
    argmax[r] = static_cast<int32_t>(best_i);
    entropy[r] = static_cast<float>(log(z) - pz / z);
  }
}

// One block per row: probs[r, :] = softmax(L / T) (max in f32, the sum in f64, each value in f32) in the
// table's dtype, as the CPU kernel.
__global__ void __launch_bounds__(kRowThreads)
    softmax_rows_kernel(const float* logits, int64_t V, float inv_t, void* probs, bool bf16) {
  __shared__ float sf[kWarps];
  __shared__ double sd[kWarps];
  const int64_t r = blockIdx.x;
  const float* L = logits + r * V;
  float mx = -INFINITY;
  for (int64_t v = threadIdx.x; v < V; v += kRowThreads) mx = fmaxf(mx, L[v] * inv_t);
  mx = warp_max(mx);
  if ((threadIdx.x & 31) == 0) sf[threadIdx.x >> 5] = mx;
  __syncthreads();
  mx = sf[0];
  for (int k = 1; k < kWarps; ++k) mx = fmaxf(mx, sf[k]);
  double sum = 0.0;
  for (int64_t v = threadIdx.x; v < V; v += kRowThreads) sum += exp(static_cast<double>(L[v] * inv_t - mx));
  sum = block_sum(sum, sd);
  const auto inv = static_cast<float>(1.0 / sum);
  for (int64_t v = threadIdx.x; v < V; v += kRowThreads) {
    const float pv = expf(L[v] * inv_t - mx) * inv;
    if (bf16)
      static_cast<__nv_bfloat16*>(probs)[r * V + v] = float_to_bf16(pv);
    else
      static_cast<float*>(probs)[r * V + v] = pv;
  }
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

void canvas_sample(const Tensor& logits, const Tensor& row_keys, const SampleParams& p, Tensor& token,
                   Tensor& argmax, Tensor& entropy, cudaStream_t s) {
  check_canvas_sample(logits, row_keys, p, token, argmax, entropy);
  const int64_t R = logits.rows();
  if (R == 0) return;
  canvas_sample_kernel<<<static_cast<unsigned>(R), kRowThreads, 0, s>>>(
      logits.as<const float>(), logits.cols(), row_keys.as<const int32_t>(),
      static_cast<double>(p.temperature), p.seed, token.as<int32_t>(), argmax.as<int32_t>(),
      entropy.as<float>());
  check_launch("canvas_sample");
}

void softmax_rows(const Tensor& logits, float temperature, Tensor& probs, cudaStream_t s) {
  const int64_t R = logits.rows();
  if (R == 0) return;
  softmax_rows_kernel<<<static_cast<unsigned>(R), kRowThreads, 0, s>>>(
      logits.as<const float>(), logits.cols(), 1.0f / temperature, probs.data, probs.dtype == DType::BF16);
  check_launch("soft_embed (softmax)");
}

}  // namespace tessera::cuda
