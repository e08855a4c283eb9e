// The small kernels around cuDNN's attention (cudnn_attention.cpp): staging f32 rows in bf16, and the
// ragged metadata of packed sequences.
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cudnn_attention.h"

namespace tessera::cuda {
namespace {

__global__ void to_bf16_kernel(const float4* __restrict__ src, __nv_bfloat162* __restrict__ dst, int64_t n4) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n4;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float4 x = src[i];
    dst[2 * i] = __floats2bfloat162_rn(x.x, x.y);
    dst[2 * i + 1] = __floats2bfloat162_rn(x.z, x.w);
  }
}
__global__ void to_bf16_tail_kernel(const float* __restrict__ src, __nv_bfloat16* __restrict__ dst,
                                    int64_t lo, int64_t n) {
  for (int64_t i = lo + blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    dst[i] = float_to_bf16(src[i]);
  }
}

__global__ void ragged_meta_kernel(const int32_t* cu_q, const int32_t* cu_k, int n, int64_t q_stride,
                                   int64_t kv_stride, int32_t* meta) {
  for (int s = threadIdx.x; s <= n; s += blockDim.x) {
    if (s < n) {
      meta[s] = cu_q[s + 1] - cu_q[s];
      meta[n + s] = cu_k[s + 1] - cu_k[s];
    }
    meta[2 * n + s] = static_cast<int32_t>(cu_q[s] * q_stride);
    meta[3 * n + 1 + s] = static_cast<int32_t>(cu_k[s] * kv_stride);
  }
}

}  // namespace

void to_bf16(const float* src, void* dst, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  auto* out = static_cast<__nv_bfloat16*>(dst);
  const int64_t n4 =
      (reinterpret_cast<uintptr_t>(src) % 16 == 0 && reinterpret_cast<uintptr_t>(dst) % 8 == 0) ? n / 4 : 0;
  if (n4 > 0) {
    const auto blocks = static_cast<unsigned>(std::min<int64_t>(ceil_div(n4, 256), 8192));
    to_bf16_kernel<<<blocks, 256, 0, s>>>(reinterpret_cast<const float4*>(src),
                                          reinterpret_cast<__nv_bfloat162*>(out), n4);
    check_launch("to_bf16");
  }
  if (4 * n4 < n) {
    const auto blocks = static_cast<unsigned>(std::min<int64_t>(ceil_div(n - 4 * n4, 256), 8192));
    to_bf16_tail_kernel<<<blocks, 256, 0, s>>>(src, out, 4 * n4, n);
    check_launch("to_bf16 (tail)");
  }
}

void ragged_meta(const int32_t* cu_q, const int32_t* cu_k, int n_seqs, int64_t q_stride, int64_t kv_stride,
                 int32_t* meta, cudaStream_t s) {
  ragged_meta_kernel<<<1, 256, 0, s>>>(cu_q, cu_k, n_seqs, q_stride, kv_stride, meta);
  check_launch("ragged_meta");
}

}  // namespace tessera::cuda
