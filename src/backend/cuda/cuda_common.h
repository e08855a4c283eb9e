// Shared helpers of the CUDA backend (internal: included only by files under backend/cuda).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <string>

#include "core/error.h"

namespace tessera::cuda {

inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail(std::string("cuda: ") + what + ": " + cudaGetErrorString(e));
}
// Checks the launch just made (configuration errors surface here; execution errors at the next sync).
inline void check_launch(const char* kernel) {
  check(cudaGetLastError(), kernel);
}

inline int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

#ifdef __CUDACC__
__device__ __forceinline__ int64_t ceil_div_dev(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}
__device__ __forceinline__ float bf16_to_float(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
// Round-to-nearest-even, as the CPU's f32_to_bf16.
__device__ __forceinline__ __nv_bfloat16 float_to_bf16(float v) {
  return __float2bfloat16_rn(v);
}
__device__ __forceinline__ float round_bf16_dev(float v) {
  return __bfloat162float(__float2bfloat16_rn(v));
}
// Reads element i of a float array of dtype f32 (0), bf16 (1) or f16 (2).
__device__ __forceinline__ float load_any(const void* p, int dtype, int64_t i) {
  if (dtype == 0) return static_cast<const float*>(p)[i];
  if (dtype == 1) return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  return __half2float(static_cast<const __half*>(p)[i]);
}

// splitmix64 counter RNG, identical to backend.h's rng_uniform on the host.
__device__ __forceinline__ uint64_t rng_mix_dev(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
__device__ __forceinline__ double rng_uniform_dev(uint64_t seed, uint64_t a, uint64_t b) {
  const uint64_t h = rng_mix_dev(seed ^ rng_mix_dev(a ^ rng_mix_dev(b + 0x632be59bd9b4e019ull)));
  return (static_cast<double>(h >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ double warp_sum(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
#endif

}  // namespace tessera::cuda
