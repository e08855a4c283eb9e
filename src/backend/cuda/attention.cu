// Bidirectional flash attention on the GPU: online softmax over key tiles, the score matrix never
// leaves registers. Packed sequences, GQA, query subset vs key set by absolute positions, causal /
// block-causal masks, and a block-sparse variant driven by a per-head block mask (SparseD).
//
// Tensor-core kernel (head_dim 32 / 64 / 128, bf16 output): k and v are first rounded to bf16 into
// the planned scratch (AttnParams::kv_scratch); 128 query rows (8 warps x 16) per block stream 64-key
// tiles through a two-stage cp.async buffer; S = QK^T and O = PV run on mma.sync m16n8k16 with f32
// accumulators (q and P rounded to bf16). Other head dims, f32 outputs (f32 precision) or no scratch
// take the SIMT kernel (f32 math), which is also the in-backend reference.
#include <cfloat>
#include <climits>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/mma.h"

namespace tessera::cuda {
namespace {

constexpr int kFlashBQ = 128, kBKV = 64, kFlashThreads = 256;
constexpr float kLog2e = 1.4426950408889634f;

struct AttnArgs {
  const float* q;
  const float* k;
  const float* v;
  void* out;
  bool out_bf16;
  int n_heads, group;  // group = n_heads / n_kv_heads
  int64_t q_stride, kv_stride;
  float scale;
  MaskKind mask;
  int block_size;
  int n_seqs;
  const int32_t* cu_q;
  const int32_t* cu_k;
  const int32_t* q_pos;
  const int32_t* k_pos;
  const uint8_t* block_mask;  // n_seqs == 1
  int sparse_block;
  int64_t n_qb, n_kb;
  const __nv_bfloat16* k16;  // bf16 copies of k and v (tensor-core kernel)
  const __nv_bfloat16* v16;
};

__device__ __forceinline__ bool visible(MaskKind mask, int block, int32_t qp, int32_t kp) {
  if (mask == MaskKind::Causal) return kp <= qp;
  if (mask == MaskKind::BlockCausal) return kp / block <= qp / block;
  return true;
}
__device__ __forceinline__ bool sparse_keep(const AttnArgs& a, int h, int64_t qi, int64_t kj) {
  if (a.block_mask == nullptr) return true;
  const int64_t qb = qi / a.sparse_block, kb = kj / a.sparse_block;
  return a.block_mask[(static_cast<int64_t>(h) * a.n_qb + qb) * a.n_kb + kb] != 0;
}

// Maps a tile slot to (sequence, first query row); false when the slot is past the last tile.
__device__ bool find_tile(const int32_t* cu, int n_seqs, int64_t slot, int tile, int& seq, int64_t& row0) {
  for (int s = 0; s < n_seqs; ++s) {
    const int64_t len = cu[s + 1] - cu[s];
    const int64_t tiles = (len + tile - 1) / tile;
    if (slot < tiles) {
      seq = s;
      row0 = cu[s] + slot * tile;
      return true;
    }
    slot -= tiles;
  }
  return false;
}

// ---------------------------------------------------------------------------------------------
// SIMT kernel: one block of 128 threads per (query row, head); keys in chunks of 128.
__global__ void __launch_bounds__(128) attn_simt_kernel(const AttnArgs a, int d) {
  __shared__ float sq[256];
  __shared__ float sp[128];
  __shared__ float red[4];
  const int64_t i = blockIdx.x;
  const int h = blockIdx.y;
  const int hk = h / a.group;
  int s = 0;
  while (s + 1 < a.n_seqs && i >= a.cu_q[s + 1]) ++s;
  const int64_t ka = a.cu_k[s], kb = a.cu_k[s + 1];
  const int32_t qp = a.q_pos[i];
  for (int t = threadIdx.x; t < d; t += 128) sq[t] = a.q[i * a.q_stride + h * d + t];
  __syncthreads();
  float m = -INFINITY, l = 0.0f, acc0 = 0.0f, acc1 = 0.0f;
  const int d0 = threadIdx.x, d1 = threadIdx.x + 128;
  for (int64_t k0 = ka; k0 < kb; k0 += 128) {
    const int64_t j = k0 + threadIdx.x;
    float sc = -INFINITY;
    if (j < kb && visible(a.mask, a.block_size, qp, a.k_pos[j]) && sparse_keep(a, h, i - a.cu_q[s], j - ka)) {
      const float* kr = a.k + j * a.kv_stride + hk * d;
      float dot = 0.0f;
      for (int t = 0; t < d; ++t) dot = fmaf(sq[t], kr[t], dot);
      sc = dot * a.scale;
    }
    float cmax = warp_max(sc);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = cmax;
    __syncthreads();
    cmax = fmaxf(fmaxf(red[0], red[1]), fmaxf(red[2], red[3]));
    __syncthreads();
    if (cmax == -INFINITY) continue;  // nothing visible in this chunk
    const float mnew = fmaxf(m, cmax);
    const float alpha = m == -INFINITY ? 0.0f : expf(m - mnew);
    const float p = sc == -INFINITY ? 0.0f : expf(sc - mnew);
    sp[threadIdx.x] = p;
    float psum = warp_sum(p);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = psum;
    __syncthreads();
    psum = red[0] + red[1] + red[2] + red[3];
    l = l * alpha + psum;
    m = mnew;
    acc0 *= alpha;
    acc1 *= alpha;
    const int64_t nk = kb - k0 < 128 ? kb - k0 : 128;
    for (int jj = 0; jj < nk; ++jj) {
      const float pj = sp[jj];
      if (pj == 0.0f) continue;
      const float* vr = a.v + (k0 + jj) * a.kv_stride + hk * d;
      if (d0 < d) acc0 = fmaf(pj, vr[d0], acc0);
      if (d1 < d) acc1 = fmaf(pj, vr[d1], acc1);
    }
    __syncthreads();
  }
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
  const int64_t o = i * a.q_stride + h * d;
  if (a.out_bf16) {
    auto* out = static_cast<__nv_bfloat16*>(a.out);
    if (d0 < d) out[o + d0] = float_to_bf16(acc0 * inv);
    if (d1 < d) out[o + d1] = float_to_bf16(acc1 * inv);
  } else {
    auto* out = static_cast<float*>(a.out);
    if (d0 < d) out[o + d0] = acc0 * inv;
    if (d1 < d) out[o + d1] = acc1 * inv;
  }
}

// ---------------------------------------------------------------------------------------------
// Tensor-core kernel.
// 2^x with the hardware approximation (relative error ~2^-22; exp2(-inf) = 0).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ unsigned pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<unsigned*>(&v);
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

// Loads a [rows][D] tile of f32 rows (row stride `stride` floats, rows >= n_valid zero) into bf16
// shared memory, swizzled.
template <int D>
__device__ __forceinline__ void load_q_tile(__nv_bfloat16* dst, const float* src, int64_t stride, int rows,
                                            int n_valid) {
  constexpr int kVec = D / 4;  // float4 per row
  for (int e = threadIdx.x; e < rows * kVec; e += kFlashThreads) {
    const int r = e / kVec, c4 = e % kVec;
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (r < n_valid) v = *reinterpret_cast<const float4*>(src + r * stride + c4 * 4);
    const int col = c4 * 4;
    __nv_bfloat162* p = reinterpret_cast<__nv_bfloat162*>(dst + tsw<D>(r, col >> 3) + (col & 7));
    p[0] = __floats2bfloat162_rn(v.x, v.y);
    p[1] = __floats2bfloat162_rn(v.z, v.w);
  }
}

// K and V (f32) -> bf16 copies in the planned scratch; 4 elements per thread.
__global__ void kv_to_bf16_kernel(const float* k, const float* v, __nv_bfloat16* k16, __nv_bfloat16* v16,
                                  int64_t n4) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n4) return;
  const float4 a = reinterpret_cast<const float4*>(k)[i];
  const float4 b = reinterpret_cast<const float4*>(v)[i];
  __nv_bfloat162* kk = reinterpret_cast<__nv_bfloat162*>(k16) + 2 * i;
  __nv_bfloat162* vv = reinterpret_cast<__nv_bfloat162*>(v16) + 2 * i;
  kk[0] = __floats2bfloat162_rn(a.x, a.y);
  kk[1] = __floats2bfloat162_rn(a.z, a.w);
  vv[0] = __floats2bfloat162_rn(b.x, b.y);
  vv[1] = __floats2bfloat162_rn(b.z, b.w);
}

template <int D>
constexpr int flash_smem_bytes() {
  return 2 * 2 * kBKV * D * 2 + 2 * kBKV * 4;  // 2 stages of (K, V) bf16 tiles + key positions
}

// Whether key tile [k0, k0 + nk) can matter to the query tile (computed identically by every warp:
// no block barrier needed). Causal masks compare the tile's smallest key position with the query
// tile's largest position; block-sparse patterns keep a tile when any covered block pair is kept.
__device__ bool tile_kept(const AttnArgs& a, int h, int64_t k0, int nk, int64_t ka, int64_t qi0, int nq,
                          int32_t qmax) {
  const int lane = threadIdx.x & 31;
  if (a.mask != MaskKind::None) {
    int32_t kmin = INT_MAX;
    for (int j = lane; j < nk; j += 32) kmin = min(kmin, a.k_pos[k0 + j]);
    for (int o = 16; o > 0; o >>= 1) kmin = min(kmin, __shfl_xor_sync(0xffffffffu, kmin, o));
    if (!visible(a.mask, a.block_size, qmax, kmin)) return false;
  }
  if (a.block_mask == nullptr) return true;
  const int64_t kj0 = k0 - ka;
  const int64_t qb0 = qi0 / a.sparse_block, qb1 = (qi0 + nq - 1) / a.sparse_block;
  const int64_t kb0 = kj0 / a.sparse_block, kb1 = (kj0 + nk - 1) / a.sparse_block;
  const int64_t nkb = kb1 - kb0 + 1, pairs = (qb1 - qb0 + 1) * nkb;
  int keep = 0;
  for (int64_t t = lane; t < pairs; t += 32) {
    const int64_t qb = qb0 + t / nkb, kb = kb0 + t % nkb;
    keep |= a.block_mask[(static_cast<int64_t>(h) * a.n_qb + qb) * a.n_kb + kb] != 0;
  }
  return __any_sync(0xffffffffu, keep) != 0;
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

// 128 query rows per block (8 warps x 16 rows) against 64-key tiles of bf16 K / V that stream
// through a two-stage cp.async buffer: the next kept tile loads while this one is computed.
template <int D>
__global__ void __launch_bounds__(kFlashThreads) attn_flash_kernel(const AttnArgs a) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  auto* tiles = reinterpret_cast<__nv_bfloat16*>(smem_raw);                  // [stage][K, V][64][D]
  auto* kpos = reinterpret_cast<int32_t*>(smem_raw + 2 * 2 * kBKV * D * 2);  // [stage][64]
  int seq;
  int64_t row0;
  if (!find_tile(a.cu_q, a.n_seqs, blockIdx.x, kFlashBQ, seq, row0)) return;
  const int h = blockIdx.y, hk = h / a.group;
  const int64_t q_end = a.cu_q[seq + 1];
  const int nq = static_cast<int>(q_end - row0 < kFlashBQ ? q_end - row0 : kFlashBQ);
  const int64_t ka = a.cu_k[seq], kb = a.cu_k[seq + 1];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  const int64_t qi0 = row0 - a.cu_q[seq];

  // Q tile (f32 -> bf16) through the stage buffers, then into registers.
  load_q_tile<D>(tiles, a.q + row0 * a.q_stride + h * D, a.q_stride, kFlashBQ, nq);
  const int r_lo = warp * 16 + g, r_hi = r_lo + 8;
  const int32_t qp_lo = r_lo < nq ? a.q_pos[row0 + r_lo] : 0;
  const int32_t qp_hi = r_hi < nq ? a.q_pos[row0 + r_hi] : 0;
  int32_t qmax = INT_MIN;
  for (int r = lane; r < nq; r += 32) qmax = max(qmax, a.q_pos[row0 + r]);
  for (int o = 16; o > 0; o >>= 1) qmax = max(qmax, __shfl_xor_sync(0xffffffffu, qmax, o));
  __syncthreads();
  constexpr int KS = D / 16;
  unsigned qf[KS][4];
#pragma unroll
  for (int kk = 0; kk < KS; ++kk)
    ldmatrix_x4(qf[kk], tiles + tsw<D>(warp * 16 + (lane & 15), kk * 2 + (lane >> 4)));
  __syncthreads();  // the stage buffers are free again

  const int64_t n_tiles = (kb - ka + kBKV - 1) / kBKV;
  auto tile_len = [&](int64_t j) {
    const int64_t k0 = ka + j * kBKV;
    return static_cast<int>(kb - k0 < kBKV ? kb - k0 : kBKV);
  };
  auto next_kept = [&](int64_t j) {
    while (j < n_tiles && !tile_kept(a, h, ka + j * kBKV, tile_len(j), ka, qi0, nq, qmax)) ++j;
    return j;
  };
  constexpr int kChunks = kBKV * D / 8;  // 16-byte chunks per K (or V) tile
  auto issue = [&](int64_t j, int stage) {
    const int64_t k0 = ka + j * kBKV;
    const int nk = tile_len(j);
    __nv_bfloat16* sk = tiles + stage * 2 * kBKV * D;
    __nv_bfloat16* sv = sk + kBKV * D;
    for (int c = threadIdx.x; c < kChunks; c += kFlashThreads) {
      const int r = c / (D / 8), ch = c % (D / 8);
      const bool ok = r < nk;
      const int64_t off = (k0 + (ok ? r : 0)) * a.kv_stride + hk * D + ch * 8;
      cp_async16(sk + tsw<D>(r, ch), a.k16 + off, ok ? 16 : 0);
      cp_async16(sv + tsw<D>(r, ch), a.v16 + off, ok ? 16 : 0);
    }
    if (a.mask != MaskKind::None && threadIdx.x < kBKV) {  // key positions, asynchronously too
      const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(kpos + stage * kBKV + threadIdx.x));
      const int32_t* src = a.k_pos + k0 + (threadIdx.x < nk ? threadIdx.x : 0);
      asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src),
                   "r"(threadIdx.x < nk ? 4 : 0));
    }
    cp_async_commit();
  };

  float o[D / 8][4];
#pragma unroll
  for (int j = 0; j < D / 8; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.0f, l_hi = 0.0f;
  const float sl2 = a.scale * kLog2e;
  const bool fine_sparse =
      a.block_mask != nullptr && (a.sparse_block % kBKV != 0 || a.sparse_block % kFlashBQ != 0);

  int64_t j = next_kept(0);
  if (j < n_tiles) issue(j, 0);
  int stage = 0;
  while (j < n_tiles) {
    const int64_t jn = next_kept(j + 1);
    if (jn < n_tiles) {
      issue(jn, stage ^ 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const __nv_bfloat16* sK = tiles + stage * 2 * kBKV * D;
    const __nv_bfloat16* sV = sK + kBKV * D;
    const int32_t* sKpos = kpos + stage * kBKV;
    const int64_t k0 = ka + j * kBKV;
    const int nk = tile_len(j);

    float sc[8][4];
#pragma unroll
    for (int jj = 0; jj < 8; ++jj) sc[jj][0] = sc[jj][1] = sc[jj][2] = sc[jj][3] = 0.0f;
    qk_tile<D>(sc, qf, sK, lane);
    float mx_lo = -INFINITY, mx_hi = -INFINITY;
    if (nk == kBKV && nq == kFlashBQ && a.mask == MaskKind::None && !fine_sparse) {
      // Full, unmasked tile (the common case): scale only.
#pragma unroll
      for (int jj = 0; jj < 8; ++jj) {
        sc[jj][0] *= sl2;
        sc[jj][1] *= sl2;
        sc[jj][2] *= sl2;
        sc[jj][3] *= sl2;
        mx_lo = fmaxf(mx_lo, fmaxf(sc[jj][0], sc[jj][1]));
        mx_hi = fmaxf(mx_hi, fmaxf(sc[jj][2], sc[jj][3]));
      }
    } else {
#pragma unroll
      for (int jj = 0; jj < 8; ++jj) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int col = jj * 8 + t4 * 2 + (e & 1);
          const bool hi = e >= 2;
          const int r = hi ? r_hi : r_lo;
          bool ok = col < nk && r < nq;
          if (ok && a.mask != MaskKind::None)
            ok = visible(a.mask, a.block_size, hi ? qp_hi : qp_lo, sKpos[col]);
          if (ok && fine_sparse) ok = sparse_keep(a, h, qi0 + r, k0 - ka + col);
          const float v = ok ? sc[jj][e] * sl2 : -INFINITY;
          sc[jj][e] = v;
          if (hi)
            mx_hi = fmaxf(mx_hi, v);
          else
            mx_lo = fmaxf(mx_lo, v);
        }
      }
    }
    float al_lo, al_hi;
    online_softmax_tile(sc, mx_lo, mx_hi, m_lo, m_hi, l_lo, l_hi, al_lo, al_hi);
#pragma unroll
    for (int jj = 0; jj < D / 8; ++jj) {
      o[jj][0] *= al_lo;
      o[jj][1] *= al_lo;
      o[jj][2] *= al_hi;
      o[jj][3] *= al_hi;
    }
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      unsigned pa[4];
      pa[0] = pack_bf16(sc[2 * kk][0], sc[2 * kk][1]);
      pa[1] = pack_bf16(sc[2 * kk][2], sc[2 * kk][3]);
      pa[2] = pack_bf16(sc[2 * kk + 1][0], sc[2 * kk + 1][1]);
      pa[3] = pack_bf16(sc[2 * kk + 1][2], sc[2 * kk + 1][3]);
#pragma unroll
      for (int dn = 0; dn < D / 16; ++dn) {
        unsigned b[4];
        ldmatrix_x4_trans(b, sV + tsw<D>(kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, dn * 2 + (lane >> 4)));
        mma_bf16_16816(o[dn * 2], pa, b);
        mma_bf16_16816(o[dn * 2 + 1], pa, b + 2);
      }
    }
    __syncthreads();  // this stage is refilled by the prefetch two tiles from now
    j = jn;
    stage ^= 1;
  }

  const float inv_lo = l_lo > 0.0f ? 1.0f / l_lo : 0.0f;
  const float inv_hi = l_hi > 0.0f ? 1.0f / l_hi : 0.0f;
#pragma unroll
  for (int jj = 0; jj < D / 8; ++jj) {
    const int col = jj * 8 + t4 * 2;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = half ? r_hi : r_lo;
      if (r >= nq) continue;
      const float inv = half ? inv_hi : inv_lo;
      const float v0 = o[jj][half * 2] * inv, v1 = o[jj][half * 2 + 1] * inv;
      const int64_t off = (row0 + r) * a.q_stride + h * D + col;
      *reinterpret_cast<__nv_bfloat162*>(static_cast<__nv_bfloat16*>(a.out) + off) =
          __floats2bfloat162_rn(v0, v1);
    }
  }
}

template <int D>
void launch_flash(dim3 grid, const AttnArgs& a, cudaStream_t s) {
  static bool attr = false;
  if (!attr) {
    check(cudaFuncSetAttribute(attn_flash_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               flash_smem_bytes<D>()),
          "attention: shared memory limit");
    attr = true;
  }
  attn_flash_kernel<D><<<grid, kFlashThreads, flash_smem_bytes<D>(), s>>>(a);
  check_launch("attention (flash)");
}

AttnArgs make_args(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, int n_heads,
                   int n_kv_heads, int head_dim, const AttnParams& p) {
  TESSERA_CHECK(q.dtype == DType::F32 && k.dtype == DType::F32 && v.dtype == DType::F32,
                "attention (cuda): q, k, v must be f32");
  TESSERA_CHECK(out.dtype == DType::F32 || out.dtype == DType::BF16, "attention: output must be f32 or bf16");
  TESSERA_CHECK(head_dim <= 256, "attention: head_dim above 256 is not supported");
  TESSERA_CHECK(n_heads % n_kv_heads == 0, "attention: n_heads must be a multiple of n_kv_heads");
  TESSERA_CHECK(q.cols() == int64_t{n_heads} * head_dim && k.cols() == int64_t{n_kv_heads} * head_dim,
                "attention: q/k widths do not match the head counts");
  TESSERA_CHECK(p.block_mask == nullptr || (p.n_seqs == 1 && p.sparse_block > 0),
                "attention: a block-sparse pattern needs one sequence and sparse_block > 0");
  AttnArgs a{};
  a.q = q.as<const float>();
  a.k = k.as<const float>();
  a.v = v.as<const float>();
  a.out = out.data;
  a.out_bf16 = out.dtype == DType::BF16;
  a.n_heads = n_heads;
  a.group = n_heads / n_kv_heads;
  a.q_stride = q.cols();
  a.kv_stride = k.cols();
  a.scale = p.scale;
  a.mask = p.mask;
  a.block_size = p.block_size > 0 ? p.block_size : 1;
  a.n_seqs = p.n_seqs;
  a.cu_q = p.cu_q;
  a.cu_k = p.cu_k;
  a.q_pos = p.q_pos;
  a.k_pos = p.k_pos;
  a.block_mask = p.block_mask;
  a.sparse_block = p.sparse_block > 0 ? p.sparse_block : 1;
  a.n_qb = ceil_div(q.rows(), a.sparse_block);
  a.n_kb = ceil_div(k.rows(), a.sparse_block);
  return a;
}

}  // namespace

void attention_simt(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, int n_heads,
                    int n_kv_heads, int head_dim, const AttnParams& p, cudaStream_t s) {
  const AttnArgs a = make_args(q, k, v, out, n_heads, n_kv_heads, head_dim, p);
  if (q.rows() == 0) return;
  attn_simt_kernel<<<dim3(static_cast<unsigned>(q.rows()), static_cast<unsigned>(n_heads)), 128, 0, s>>>(
      a, head_dim);
  check_launch("attention (simt)");
}

void attention(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, int n_heads, int n_kv_heads,
               int head_dim, const AttnParams& p, cudaStream_t s) {
  AttnArgs a = make_args(q, k, v, out, n_heads, n_kv_heads, head_dim, p);
  if (q.rows() == 0) return;
  const bool tc_dim = head_dim == 32 || head_dim == 64 || head_dim == 128;
  // f32 outputs (f32 precision), other head dims, or no bf16 staging scratch: f32 SIMT kernel.
  if (out.dtype != DType::BF16 || !tc_dim || p.kv_scratch == nullptr || k.numel() % 4 != 0) {
    attention_simt(q, k, v, out, n_heads, n_kv_heads, head_dim, p, s);
    return;
  }
  auto* k16 = static_cast<__nv_bfloat16*>(p.kv_scratch);
  auto* v16 = k16 + k.numel();
  if (k.numel() > 0) {
    const int64_t n4 = k.numel() / 4;
    kv_to_bf16_kernel<<<static_cast<unsigned>(ceil_div(n4, 256)), 256, 0, s>>>(a.k, a.v, k16, v16, n4);
    check_launch("attention: k, v to bf16");
  }
  a.k16 = k16;
  a.v16 = v16;
  const auto slots = static_cast<unsigned>(ceil_div(q.rows(), kFlashBQ) + p.n_seqs);
  const dim3 grid(slots, static_cast<unsigned>(n_heads));
  switch (head_dim) {
    case 32:
      launch_flash<32>(grid, a, s);
      break;
    case 64:
      launch_flash<64>(grid, a, s);
      break;
    default:
      launch_flash<128>(grid, a, s);
      break;
  }
}

namespace {
// SparseD selection (Backend::sparse_select): one block per (query block, head), 8 warps. For every
// group of up to kSelRows query rows the rows are staged in shared memory; warp w owns key blocks
// w, w + 8, ... and each lane the keys lane, lane + 32, ... of them, so a loaded key row serves all the
// staged rows and every per-block sum has one fixed summation order (deterministic, no atomics).
// Pass 1 finds each row's softmax max and sum, pass 2 adds the probabilities into imp[kb] (shared).
// Then each thread ranks its key blocks inside their set (prompt / generation) and writes the mask.
constexpr int kSelThreads = 256, kSelWarps = kSelThreads / 32, kSelRows = 8;

__device__ __forceinline__ int64_t min64(int64_t a, int64_t b) {
  return a < b ? a : b;
}

struct SelArgs {
  const float* q;
  const float* k;
  int64_t q_stride, kv_stride, n_query, n_keys, n_qb, n_kb, g, keep_pre, keep_gen;
  int head_dim, group, block;
  float scale;
  uint8_t* mask;
};

// Each thread ranks its key blocks inside their set (prompt / generation) by imp[] and writes the
// mask row of (query block qb, head h); ties go to the lower block.
__device__ void write_selection(const SelArgs& a, int64_t qb, int h, const float* imp) {
  uint8_t* row = a.mask + (static_cast<int64_t>(h) * a.n_qb + qb) * a.n_kb;
  for (int64_t kb = threadIdx.x; kb < a.n_kb; kb += kSelThreads) {
    const bool pre = kb < a.g;
    const int64_t lo = pre ? 0 : a.g, hi = pre ? a.g : a.n_kb, keep = pre ? a.keep_pre : a.keep_gen;
    const float v = imp[kb];
    int64_t rank = 0;
    for (int64_t c = lo; c < hi && rank < keep; ++c) {
      const float w = imp[c];
      rank += (w > v || (w == v && c < kb)) ? 1 : 0;
    }
    row[kb] = rank < keep ? 1 : 0;
  }
}

__global__ void __launch_bounds__(kSelThreads) sparse_select_kernel(SelArgs a) {
  extern __shared__ float sel_smem[];
  float* imp = sel_smem;          // [n_kb]
  float* qs = sel_smem + a.n_kb;  // [kSelRows][head_dim]
  __shared__ float red_m[kSelWarps][kSelRows], red_l[kSelWarps][kSelRows];
  __shared__ float row_m[kSelRows], row_inv[kSelRows];
  const int64_t qb = blockIdx.x;
  const int h = static_cast<int>(blockIdx.y), hk = h / a.group;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int D = a.head_dim;
  for (int64_t i = threadIdx.x; i < a.n_kb; i += kSelThreads) imp[i] = 0.0f;
  const int64_t r_end = min64(qb * a.block + a.block, a.n_query);
  for (int64_t r0 = qb * a.block; r0 < r_end; r0 += kSelRows) {
    const int nr = static_cast<int>(min64(kSelRows, r_end - r0));
    __syncthreads();  // qs and row_m / row_inv of the previous group are no longer read
    for (int i = threadIdx.x; i < nr * D; i += kSelThreads)
      qs[i] = a.q[(r0 + i / D) * a.q_stride + static_cast<int64_t>(h) * D + i % D] * a.scale;
    __syncthreads();
    float m[kSelRows], l[kSelRows];
#pragma unroll
    for (int i = 0; i < kSelRows; ++i) {
      m[i] = -INFINITY;
      l[i] = 0.0f;
    }
    for (int pass = 0; pass < 2; ++pass) {
      for (int64_t kb = warp; kb < a.n_kb; kb += kSelWarps) {
        float part = 0.0f;
        for (int64_t j = kb * a.block + lane; j < min64(kb * a.block + a.block, a.n_keys); j += 32) {
          const float* kj = a.k + j * a.kv_stride + static_cast<int64_t>(hk) * D;
          float s[kSelRows];
#pragma unroll
          for (int i = 0; i < kSelRows; ++i) s[i] = 0.0f;
          for (int t = 0; t < D; ++t) {
            const float kv = kj[t];
#pragma unroll
            for (int i = 0; i < kSelRows; ++i)
              if (i < nr) s[i] += qs[i * D + t] * kv;
          }
#pragma unroll
          for (int i = 0; i < kSelRows; ++i) {
            if (i >= nr) continue;
            if (pass == 0) {
              const float mn = fmaxf(m[i], s[i]);
              l[i] = l[i] * __expf(m[i] - mn) + __expf(s[i] - mn);
              m[i] = mn;
            } else {
              part += __expf(s[i] - row_m[i]) * row_inv[i];
            }
          }
        }
        if (pass == 1) {
          part = warp_sum(part);
          if (lane == 0) imp[kb] += part;
        }
      }
      if (pass == 1) break;
        // Combine the (max, sum) pairs: lanes of a warp, then the warps in order (thread 0).
#pragma unroll
      for (int i = 0; i < kSelRows; ++i) {
        for (int o = 16; o > 0; o >>= 1) {
          const float mo = __shfl_xor_sync(0xffffffffu, m[i], o), lo = __shfl_xor_sync(0xffffffffu, l[i], o);
          const float mn = fmaxf(m[i], mo);
          l[i] = (mn == -INFINITY) ? 0.0f : l[i] * __expf(m[i] - mn) + lo * __expf(mo - mn);
          m[i] = mn;
        }
        if (lane == 0) {
          red_m[warp][i] = m[i];
          red_l[warp][i] = l[i];
        }
      }
      __syncthreads();
      if (threadIdx.x < nr) {
        const int i = static_cast<int>(threadIdx.x);
        float mm = -INFINITY, ll = 0.0f;
        for (int w = 0; w < kSelWarps; ++w) {
          const float mn = fmaxf(mm, red_m[w][i]);
          if (mn == -INFINITY) continue;
          ll = ll * __expf(mm - mn) + red_l[w][i] * __expf(red_m[w][i] - mn);
          mm = mn;
        }
        row_m[i] = mm;
        row_inv[i] = 1.0f / ll;
      }
      __syncthreads();
    }
  }
  __syncthreads();
  write_selection(a, qb, h, imp);
}

// Tensor-core selection for head dims 32 / 64 / 128 and blocks that are a multiple of 8: the same two
// passes (row max and sum, then the probabilities summed per key block) with S = QK^T on mma.sync. To
// keep f32 accuracy (the ranking compares sums that differ in the 4th digit), q and k are split into
// bf16 hi + lo parts and S = qh.kh + qh.kl + ql.kh (error about 2^-16 relative). The scalar kernel
// above (f32 FMAs) made SparseD 2.2x slower than dense attention for a 32-step LLaDA-8B generation
// at 16k tokens on an H100: its one selection cost more than all the sparse steps saved. One block per (query
// block, head), 128 query rows (8 warps x 16) at a time against 64-key tiles; every 8-key column group lies
// inside one key block and its sum is reduced lanes -> warps -> imp[] in a fixed order.
constexpr int kSelBQ = 128, kSelBK = 64;

// Rows [0, rows) of f32 src (row stride `stride`) -> hi (or lo = x - hi) bf16 parts, swizzled; rows >=
// n_valid are zeros.
template <int D, bool Lo>
__device__ __forceinline__ void load_split_tile(__nv_bfloat16* dst, const float* src, int64_t stride,
                                                int rows, int n_valid) {
  constexpr int kVec = D / 4;
  for (int e = threadIdx.x; e < rows * kVec; e += kSelThreads) {
    const int r = e / kVec, col = (e % kVec) * 4;
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (r < n_valid) v = *reinterpret_cast<const float4*>(src + r * stride + col);
    float x[4] = {v.x, v.y, v.z, v.w};
    if constexpr (Lo) {
#pragma unroll
      for (int i = 0; i < 4; ++i) x[i] -= __bfloat162float(__float2bfloat16_rn(x[i]));
    }
    __nv_bfloat162* p = reinterpret_cast<__nv_bfloat162*>(dst + tsw<D>(r, col >> 3) + (col & 7));
    p[0] = __floats2bfloat162_rn(x[0], x[1]);
    p[1] = __floats2bfloat162_rn(x[2], x[3]);
  }
}

template <int D>
__global__ void __launch_bounds__(kSelThreads) sparse_select_mma_kernel(SelArgs a) {
  extern __shared__ __align__(128) unsigned char sel_raw[];
  auto* kh = reinterpret_cast<__nv_bfloat16*>(sel_raw);  // [64][D] hi, then [64][D] lo (Q staging too)
  auto* kl = kh + kSelBK * D;
  float* imp = reinterpret_cast<float*>(sel_raw + 2 * kSelBK * D * 2);  // [n_kb]
  __shared__ float red[kSelWarps][8], grp[8];
  const int64_t qb = blockIdx.x;
  const int h = static_cast<int>(blockIdx.y), hk = h / a.group;
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  const int r_lo = warp * 16 + g, r_hi = r_lo + 8;
  constexpr int KS = D / 16;
  const float sl2 = a.scale * kLog2e;
  const int64_t n_tiles = (a.n_keys + kSelBK - 1) / kSelBK;
  for (int64_t i = threadIdx.x; i < a.n_kb; i += kSelThreads) imp[i] = 0.0f;
  const int64_t r_end = min64(qb * a.block + a.block, a.n_query);
  for (int64_t r0 = qb * a.block; r0 < r_end; r0 += kSelBQ) {
    const int nr = static_cast<int>(min64(kSelBQ, r_end - r0));
    // Q's hi and lo parts through the K buffers (128 x D bf16 = both of them) into registers.
    unsigned qh[KS][4], ql[KS][4];
    const float* qsrc = a.q + r0 * a.q_stride + static_cast<int64_t>(h) * D;
    __syncthreads();
    load_split_tile<D, false>(kh, qsrc, a.q_stride, kSelBQ, nr);
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < KS; ++kk)
      ldmatrix_x4(qh[kk], kh + tsw<D>(warp * 16 + (lane & 15), kk * 2 + (lane >> 4)));
    __syncthreads();
    load_split_tile<D, true>(kh, qsrc, a.q_stride, kSelBQ, nr);
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < KS; ++kk)
      ldmatrix_x4(ql[kk], kh + tsw<D>(warp * 16 + (lane & 15), kk * 2 + (lane >> 4)));
    float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.0f, l_hi = 0.0f, inv_lo = 0.0f, inv_hi = 0.0f;
    for (int pass = 0; pass < 2; ++pass) {
      for (int64_t j = 0; j < n_tiles; ++j) {
        const int64_t k0 = j * kSelBK;
        const int nk = static_cast<int>(min64(kSelBK, a.n_keys - k0));
        const float* ksrc = a.k + k0 * a.kv_stride + static_cast<int64_t>(hk) * D;
        __syncthreads();  // the previous tile (or Q) is no longer read
        load_split_tile<D, false>(kh, ksrc, a.kv_stride, kSelBK, nk);
        load_split_tile<D, true>(kl, ksrc, a.kv_stride, kSelBK, nk);
        __syncthreads();
        float sc[8][4];
#pragma unroll
        for (int jj = 0; jj < 8; ++jj) sc[jj][0] = sc[jj][1] = sc[jj][2] = sc[jj][3] = 0.0f;
        qk_tile<D>(sc, ql, kh, lane);  // the small terms first
        qk_tile<D>(sc, qh, kl, lane);
        qk_tile<D>(sc, qh, kh, lane);
        // Scaled to base 2; padding rows and keys past the end drop out.
#pragma unroll
        for (int jj = 0; jj < 8; ++jj) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int col = jj * 8 + t4 * 2 + (e & 1);
            const bool ok = col < nk && (e >= 2 ? r_hi : r_lo) < nr;
            sc[jj][e] = ok ? sc[jj][e] * sl2 : -INFINITY;
          }
        }
        if (pass == 0) {
          float mx_lo = -INFINITY, mx_hi = -INFINITY;
#pragma unroll
          for (int jj = 0; jj < 8; ++jj) {
            mx_lo = fmaxf(mx_lo, fmaxf(sc[jj][0], sc[jj][1]));
            mx_hi = fmaxf(mx_hi, fmaxf(sc[jj][2], sc[jj][3]));
          }
          float al_lo, al_hi;
          online_softmax_tile(sc, mx_lo, mx_hi, m_lo, m_hi, l_lo, l_hi, al_lo, al_hi);
          continue;
        }
        // Pass 2: each 8-column group's probabilities, summed over this warp's 16 rows, then over the
        // warps in order, then added to its key block.
        float cs[8];
#pragma unroll
        for (int jj = 0; jj < 8; ++jj) {
          cs[jj] = (fast_exp2(sc[jj][0] - m_lo) + fast_exp2(sc[jj][1] - m_lo)) * inv_lo +
                   (fast_exp2(sc[jj][2] - m_hi) + fast_exp2(sc[jj][3] - m_hi)) * inv_hi;
          cs[jj] = warp_sum(cs[jj]);
        }
        if (lane == 0) {
#pragma unroll
          for (int jj = 0; jj < 8; ++jj) red[warp][jj] = cs[jj];
        }
        __syncthreads();
        if (threadIdx.x < 8) {
          float s = 0.0f;
          for (int w = 0; w < kSelWarps; ++w) s += red[w][threadIdx.x];
          grp[threadIdx.x] = s;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
          for (int jj = 0; jj < 8 && jj * 8 < nk; ++jj) imp[(k0 + jj * 8) / a.block] += grp[jj];
        }
      }
      if (pass == 0) {
        // Rows with nothing (padding) keep m = -inf and contribute 0 in pass 2 (exp2(-inf) * 0).
        inv_lo = l_lo > 0.0f ? 1.0f / l_lo : 0.0f;
        inv_hi = l_hi > 0.0f ? 1.0f / l_hi : 0.0f;
        if (m_lo == -INFINITY) m_lo = 0.0f;
        if (m_hi == -INFINITY) m_hi = 0.0f;
      }
    }
  }
  __syncthreads();
  write_selection(a, qb, h, imp);
}
}  // namespace

void sparse_select(const Tensor& q, const Tensor& k, int n_heads, int n_kv_heads, int head_dim,
                   const SparseSelectParams& p, uint8_t* mask, cudaStream_t s) {
  check_sparse_select(q, k, n_heads, n_kv_heads, head_dim, p);
  SelArgs a{};
  a.q = q.as<const float>();
  a.k = k.as<const float>();
  a.q_stride = q.cols();
  a.kv_stride = k.cols();
  a.n_query = q.rows();
  a.n_keys = k.rows();
  a.n_qb = ceil_div(a.n_query, p.block);
  a.n_kb = ceil_div(a.n_keys, p.block);
  a.g = p.n_prompt_keys / p.block;
  a.keep_pre = tessera::sparse_keep(a.g, p.rho);
  a.keep_gen = tessera::sparse_keep(a.n_kb - a.g, p.rho);
  a.head_dim = head_dim;
  a.group = n_heads / n_kv_heads;
  a.block = p.block;
  a.scale = p.scale;
  a.mask = mask;
  if (a.n_qb == 0) return;
  constexpr size_t kMaxSmem = 200 * 1024;
  const bool tc = (head_dim == 32 || head_dim == 64 || head_dim == 128) && p.block % 8 == 0 &&
                  reinterpret_cast<uintptr_t>(a.q) % 16 == 0 && reinterpret_cast<uintptr_t>(a.k) % 16 == 0 &&
                  a.q_stride % 4 == 0 && a.kv_stride % 4 == 0;
  const dim3 grid(static_cast<unsigned>(a.n_qb), static_cast<unsigned>(n_heads));
  if (tc) {
    const size_t smem = static_cast<size_t>(2 * kSelBK * head_dim * 2) + static_cast<size_t>(a.n_kb) * 4;
    TESSERA_CHECK(smem <= kMaxSmem, "sparse_select: " + std::to_string(a.n_kb) +
                                        " key blocks do not fit in shared memory; use a larger sparse block");
    const auto launch = [&](auto kernel) {
      check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)),
            "sparse_select: shared memory");
      kernel<<<grid, kSelThreads, smem, s>>>(a);
    };
    if (head_dim == 32)
      launch(sparse_select_mma_kernel<32>);
    else if (head_dim == 64)
      launch(sparse_select_mma_kernel<64>);
    else
      launch(sparse_select_mma_kernel<128>);
    check_launch("sparse_select (tensor cores)");
    return;
  }
  const size_t smem = static_cast<size_t>(a.n_kb + int64_t{kSelRows} * head_dim) * sizeof(float);
  TESSERA_CHECK(smem <= kMaxSmem, "sparse_select: " + std::to_string(a.n_kb) +
                                      " key blocks do not fit in shared memory; use a larger sparse block");
  if (smem > 48 * 1024)
    check(cudaFuncSetAttribute(sparse_select_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(smem)),
          "sparse_select: shared memory");
  sparse_select_kernel<<<grid, kSelThreads, smem, s>>>(a);
  check_launch("sparse_select");
}

}  // namespace tessera::cuda
