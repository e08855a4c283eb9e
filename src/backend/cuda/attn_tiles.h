// Tensor-core attention tiles shared by the flash attention kernel (attention.cu) and the SparseD
// selection (sparse_select.cu), internal to backend/cuda: swizzled bf16 tiles in shared memory, S = QK^T
// of a 64-key tile on mma.sync, and one step of the base-2 online softmax.
#pragma once
#ifdef __CUDACC__
#include <cuda_bf16.h>

#include "backend/cuda/mma.h"

namespace tessera::cuda {

constexpr float kLog2e = 1.4426950408889634f;

// 2^x with the hardware approximation (relative error ~2^-22; exp2(-inf) = 0).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
// Swizzled element offset of 16-byte chunk `c` of row `r` in a [rows][D] bf16 tile.
template <int D>
__device__ __forceinline__ int tsw(int r, int c) {
  if constexpr (D >= 64) {
    return r * D + ((c ^ (r & 7)) << 3);
  } else {
    return r * D + ((c ^ ((r >> 1) & 3)) << 3);
  }
}

// S += Q K^T for one 64-key tile: sc holds this warp's 16 rows x 64 keys in the mma accumulator layout
// (sc[jj][e]: row lane / 4 (+ 8 for e >= 2), key jj * 8 + (lane % 4) * 2 + e % 2), qf the warp's Q
// fragments, sK the swizzled [64][D] bf16 key tile.
template <int D>
__device__ __forceinline__ void qk_tile(float (&sc)[8][4], const unsigned (&qf)[D / 16][4],
                                        const __nv_bfloat16* sK, int lane) {
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
    for (int jp = 0; jp < 4; ++jp) {
      unsigned b[4];
      ldmatrix_x4(b, sK + tsw<D>(jp * 16 + ((lane >> 4) << 3) + (lane & 7), kk * 2 + ((lane >> 3) & 1)));
      mma_bf16_16816(sc[jp * 2], qf[kk], b);
      mma_bf16_16816(sc[jp * 2 + 1], qf[kk], b + 2);
    }
  }
}

// One tile of the online softmax (base 2) for the thread's two rows (lo, hi): mx_* are the thread's
// maxima of the tile's scaled scores sc. Folds the tile into the running max m and sum l (reduced over
// the 4 lanes that share a row), turns sc into exp2(s - m) and gives in al_* the factor by which what
// was accumulated before this tile must be rescaled.
__device__ __forceinline__ void online_softmax_tile(float (&sc)[8][4], float mx_lo, float mx_hi, float& m_lo,
                                                    float& m_hi, float& l_lo, float& l_hi, float& al_lo,
                                                    float& al_hi) {
  mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, 1));
  mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, 2));
  mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, 1));
  mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, 2));
  const float mn_lo = fmaxf(m_lo, mx_lo), mn_hi = fmaxf(m_hi, mx_hi);
  // A row with nothing visible yet keeps max -inf: subtract 0 instead (exp2(-inf) = 0, no NaN).
  const float sub_lo = mn_lo == -INFINITY ? 0.0f : mn_lo, sub_hi = mn_hi == -INFINITY ? 0.0f : mn_hi;
  al_lo = fast_exp2(m_lo - sub_lo);
  al_hi = fast_exp2(m_hi - sub_hi);
  float sum_lo = 0.0f, sum_hi = 0.0f;
#pragma unroll
  for (int jj = 0; jj < 8; ++jj) {
    sc[jj][0] = fast_exp2(sc[jj][0] - sub_lo);
    sc[jj][1] = fast_exp2(sc[jj][1] - sub_lo);
    sc[jj][2] = fast_exp2(sc[jj][2] - sub_hi);
    sc[jj][3] = fast_exp2(sc[jj][3] - sub_hi);
    sum_lo += sc[jj][0] + sc[jj][1];
    sum_hi += sc[jj][2] + sc[jj][3];
  }
  sum_lo += __shfl_xor_sync(0xffffffffu, sum_lo, 1);
  sum_lo += __shfl_xor_sync(0xffffffffu, sum_lo, 2);
  sum_hi += __shfl_xor_sync(0xffffffffu, sum_hi, 1);
  sum_hi += __shfl_xor_sync(0xffffffffu, sum_hi, 2);
  l_lo = l_lo * al_lo + sum_lo;
  l_hi = l_hi * al_hi + sum_hi;
  m_lo = mn_lo;
  m_hi = mn_hi;
}

}  // namespace tessera::cuda
#endif
