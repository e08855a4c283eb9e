// Bidirectional flash attention on the GPU: online softmax over key tiles, the score matrix never
// leaves registers. Packed sequences, GQA, query subset vs key set by absolute positions, causal /
// block-causal masks, and a block-sparse variant driven by a per-head block mask (SparseD; the
// selection of the pattern is sparse_select.cu).
//
// Tensor-core kernel (head_dim 32 / 64 / 128, bf16 output): k and v are first rounded to bf16 into
// the planned scratch (AttnParams::kv_scratch); 128 query rows (8 warps x 16) per block stream 64-key
// tiles through a two-stage cp.async buffer; S = QK^T and O = PV run on mma.sync m16n8k16 with f32
// accumulators (q and P rounded to bf16). Heads of 256 and 512 and sliding windows (Gemma 4) take a tiled
// f32 kernel (32 query rows share each chunk of keys); other head dims, f32 outputs (f32 precision) or no
// scratch take the SIMT kernel (f32 math, a block per query row), which is also the in-backend reference.
#include <cfloat>
#include <climits>

#include "backend/cuda/attn_tiles.h"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/mma.h"
#include "backend/op_checks.h"

namespace tessera::cuda {
namespace {

constexpr int kFlashBQ = 128, kBKV = 64, kFlashThreads = 256;

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
  int window;  // AttnParams::window (the SIMT and tiled kernels)
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
// SIMT kernel: one block of 128 threads per (query row, head); keys in chunks of 128; head_dim up to 512
// (each thread accumulates output dims t, t + 128, t + 256, t + 384). Sliding window (AttnParams::window
// > 0): keys before q0 - (window - 1), q0 the sequence's first (lowest) query position, are seen by no
// row; causal rows also drop keys at or beyond `window` positions back (the CPU kernel's semantics).
constexpr int kSimtMaxD = 512;
__global__ void __launch_bounds__(128) attn_simt_kernel(const AttnArgs a, int d) {
  __shared__ float sq[kSimtMaxD];
  __shared__ float sp[128];
  __shared__ float red[4];
  __shared__ int32_t red_pos[4];
  const int64_t i = blockIdx.x;
  const int h = blockIdx.y;
  const int hk = h / a.group;
  int s = 0;
  while (s + 1 < a.n_seqs && i >= a.cu_q[s + 1]) ++s;
  const int64_t ka = a.cu_k[s], kb = a.cu_k[s + 1];
  const int32_t qp = a.q_pos[i];
  int64_t from = INT64_MIN;  // the window's first visible key position
  if (a.window > 0) {
    int32_t q0 = INT_MAX;
    for (int64_t r = a.cu_q[s] + threadIdx.x; r < a.cu_q[s + 1]; r += 128) q0 = min(q0, a.q_pos[r]);
    for (int o = 16; o > 0; o >>= 1) q0 = min(q0, __shfl_xor_sync(0xffffffffu, q0, o));
    if ((threadIdx.x & 31) == 0) red_pos[threadIdx.x >> 5] = q0;
    __syncthreads();
    q0 = min(min(red_pos[0], red_pos[1]), min(red_pos[2], red_pos[3]));
    from = static_cast<int64_t>(q0) - (a.window - 1);
  }
  for (int t = threadIdx.x; t < d; t += 128) sq[t] = a.q[i * a.q_stride + h * d + t];
  __syncthreads();
  float m = -INFINITY, l = 0.0f, acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int64_t k0 = ka; k0 < kb; k0 += 128) {
    const int64_t j = k0 + threadIdx.x;
    float sc = -INFINITY;
    if (j < kb) {
      const int32_t kp = a.k_pos[j];
      bool vis = visible(a.mask, a.block_size, qp, kp) && sparse_keep(a, h, i - a.cu_q[s], j - ka);
      if (a.window > 0)
        vis = vis && kp >= from && (a.mask != MaskKind::Causal || static_cast<int64_t>(qp) - kp < a.window);
      if (vis) {
        const float* kr = a.k + j * a.kv_stride + hk * d;
        float dot = 0.0f;
        for (int t = 0; t < d; ++t) dot = fmaf(sq[t], kr[t], dot);
        sc = dot * a.scale;
      }
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
#pragma unroll
    for (int c = 0; c < 4; ++c) acc[c] *= alpha;
    const int64_t nk = kb - k0 < 128 ? kb - k0 : 128;
    for (int jj = 0; jj < nk; ++jj) {
      const float pj = sp[jj];
      if (pj == 0.0f) continue;
      const float* vr = a.v + (k0 + jj) * a.kv_stride + hk * d;
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int dc = threadIdx.x + 128 * c;
        if (dc < d) acc[c] = fmaf(pj, vr[dc], acc[c]);
      }
    }
    __syncthreads();
  }
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
  const int64_t o = i * a.q_stride + h * d;
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const int dc = threadIdx.x + 128 * c;
    if (dc >= d) continue;
    if (a.out_bf16)
      static_cast<__nv_bfloat16*>(a.out)[o + dc] = float_to_bf16(acc[c] * inv);
    else
      static_cast<float*>(a.out)[o + dc] = acc[c] * inv;
  }
}

// ---------------------------------------------------------------------------------------------
// Tiled f32 kernel for wide heads and sliding windows (Gemma 4: heads of 256 and 512, windows of 1024),
// where neither cuDNN nor the tensor-core kernel applies. A block of 8 warps owns 32 query rows of one
// sequence and one head: warp w the rows 4w .. 4w + 3. Q of the tile stays in shared memory; K and V
// stream through it in chunks of 32 keys (K padded to D + 1 floats a row: lane j reads key j's column t
// without bank conflicts), so every key is read once per 32 rows instead of once per row. Scores: lane j
// computes key j against the warp's 4 rows; online softmax per row in the warp's lanes; P V: lane c owns
// output columns c, c + 32, ... of the 4 rows. Masks (causal, block-causal, the window) as the SIMT kernel;
// no block-sparse pattern (SparseD takes the SIMT kernel).
constexpr int kWideBQ = 32, kWideBK = 32, kWideThreads = 256, kWideRows = kWideBQ / (kWideThreads / 32);

template <int D>
constexpr size_t wide_smem_bytes() {
  return sizeof(float) * (static_cast<size_t>(kWideBQ) * D + static_cast<size_t>(kWideBK) * (D + 1) +
                          static_cast<size_t>(kWideBK) * D) +
         sizeof(int32_t) * kWideBK;
}

template <int D>
__global__ void __launch_bounds__(kWideThreads) attn_wide_kernel(const AttnArgs a) {
  extern __shared__ float smem[];
  float* qs = smem;                                          // [kWideBQ][D]
  float* ks = qs + kWideBQ * D;                              // [kWideBK][D + 1]
  float* vs = ks + kWideBK * (D + 1);                        // [kWideBK][D]
  auto* kps = reinterpret_cast<int32_t*>(vs + kWideBK * D);  // [kWideBK] key positions
  __shared__ int32_t red_pos[kWideThreads / 32];
  int seq = 0;
  int64_t row0 = 0;
  if (!find_tile(a.cu_q, a.n_seqs, blockIdx.x, kWideBQ, seq, row0)) return;
  const int h = blockIdx.y, hk = h / a.group;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t q_end = a.cu_q[seq + 1], ka = a.cu_k[seq], kb = a.cu_k[seq + 1];
  const int n_rows = static_cast<int>(q_end - row0 < kWideBQ ? q_end - row0 : kWideBQ);
  int64_t from = INT64_MIN;  // the window's first visible key position
  if (a.window > 0) {
    int32_t q0 = INT_MAX;
    for (int64_t r = a.cu_q[seq] + threadIdx.x; r < q_end; r += kWideThreads) q0 = min(q0, a.q_pos[r]);
    for (int o = 16; o > 0; o >>= 1) q0 = min(q0, __shfl_xor_sync(0xffffffffu, q0, o));
    if (lane == 0) red_pos[warp] = q0;
    __syncthreads();
    q0 = red_pos[0];
    for (int w = 1; w < kWideThreads / 32; ++w) q0 = min(q0, red_pos[w]);
    from = static_cast<int64_t>(q0) - (a.window - 1);
  }
  for (int e = threadIdx.x; e < kWideBQ * D; e += kWideThreads) {
    const int r = e / D, c = e % D;
    qs[e] = r < n_rows ? a.q[(row0 + r) * a.q_stride + static_cast<int64_t>(h) * D + c] : 0.0f;
  }
  int32_t qp[kWideRows];
  bool live[kWideRows];
  float m[kWideRows], l[kWideRows], acc[kWideRows][D / 32];
#pragma unroll
  for (int i = 0; i < kWideRows; ++i) {
    const int r = warp * kWideRows + i;
    live[i] = r < n_rows;
    qp[i] = live[i] ? a.q_pos[row0 + r] : 0;
    m[i] = -INFINITY;
    l[i] = 0.0f;
#pragma unroll
    for (int c = 0; c < D / 32; ++c) acc[i][c] = 0.0f;
  }
  for (int64_t k0 = ka; k0 < kb; k0 += kWideBK) {
    const int nk = static_cast<int>(kb - k0 < kWideBK ? kb - k0 : kWideBK);
    __syncthreads();  // the previous chunk's readers are done (and qs is written before the first)
    for (int e = threadIdx.x; e < kWideBK * D; e += kWideThreads) {
      const int j = e / D, c = e % D;
      float kv = 0.0f, vv = 0.0f;
      if (j < nk) {
        const int64_t off = (k0 + j) * a.kv_stride + static_cast<int64_t>(hk) * D + c;
        kv = a.k[off];
        vv = a.v[off];
      }
      ks[j * (D + 1) + c] = kv;
      vs[j * D + c] = vv;
    }
    if (threadIdx.x < kWideBK) kps[threadIdx.x] = threadIdx.x < nk ? a.k_pos[k0 + threadIdx.x] : 0;
    __syncthreads();
    // Lane = key: its visibility for each of the warp's rows.
    const int32_t kp = kps[lane];
    bool vis[kWideRows];
    bool any = false;
#pragma unroll
    for (int i = 0; i < kWideRows; ++i) {
      bool v = live[i] && lane < nk && visible(a.mask, a.block_size, qp[i], kp);
      if (a.window > 0)
        v = v && kp >= from && (a.mask != MaskKind::Causal || static_cast<int64_t>(qp[i]) - kp < a.window);
      vis[i] = v;
      any = any || v;
    }
    if (!__any_sync(0xffffffffu, any)) continue;  // nothing of this chunk is seen by the warp's rows
    float sc[kWideRows];
#pragma unroll
    for (int i = 0; i < kWideRows; ++i) sc[i] = 0.0f;
    const float* kr = ks + lane * (D + 1);
    const float* q0 = qs + warp * kWideRows * D;
#pragma unroll 8
    for (int t = 0; t < D; ++t) {
      const float kt = kr[t];
#pragma unroll
      for (int i = 0; i < kWideRows; ++i) sc[i] = fmaf(q0[i * D + t], kt, sc[i]);
    }
    float p[kWideRows];
#pragma unroll
    for (int i = 0; i < kWideRows; ++i) {
      const float si = vis[i] ? sc[i] * a.scale : -INFINITY;
      const float cmax = warp_max(si);
      if (cmax == -INFINITY) {  // the whole chunk is masked for this row
        p[i] = 0.0f;
        continue;
      }
      const float mnew = fmaxf(m[i], cmax);
      const float alpha = m[i] == -INFINITY ? 0.0f : expf(m[i] - mnew);
      p[i] = si == -INFINITY ? 0.0f : expf(si - mnew);
      l[i] = l[i] * alpha + warp_sum(p[i]);
      m[i] = mnew;
#pragma unroll
      for (int c = 0; c < D / 32; ++c) acc[i][c] *= alpha;
    }
    for (int j = 0; j < nk; ++j) {
      float pj[kWideRows];
#pragma unroll
      for (int i = 0; i < kWideRows; ++i) pj[i] = __shfl_sync(0xffffffffu, p[i], j);
      const float* vr = vs + j * D + lane;
#pragma unroll
      for (int c = 0; c < D / 32; ++c) {
        const float vv = vr[32 * c];
#pragma unroll
        for (int i = 0; i < kWideRows; ++i) acc[i][c] = fmaf(pj[i], vv, acc[i][c]);
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kWideRows; ++i) {
    if (!live[i]) continue;
    const float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
    const int64_t o = (row0 + warp * kWideRows + i) * a.q_stride + static_cast<int64_t>(h) * D + lane;
#pragma unroll
    for (int c = 0; c < D / 32; ++c) {
      if (a.out_bf16)
        static_cast<__nv_bfloat16*>(a.out)[o + 32 * c] = float_to_bf16(acc[i][c] * inv);
      else
        static_cast<float*>(a.out)[o + 32 * c] = acc[i][c] * inv;
    }
  }
}

template <int D>
void launch_wide(const AttnArgs& a, int64_t n_query, cudaStream_t s) {
  static bool attr = false;
  if (!attr) {
    check(cudaFuncSetAttribute(attn_wide_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(wide_smem_bytes<D>())),
          "attention (wide): shared memory limit");
    attr = true;
  }
  const auto slots = static_cast<unsigned>(ceil_div(n_query, kWideBQ) + a.n_seqs);
  attn_wide_kernel<D>
      <<<dim3(slots, static_cast<unsigned>(a.n_heads)), kWideThreads, wide_smem_bytes<D>(), s>>>(a);
  check_launch("attention (wide)");
}

// ---------------------------------------------------------------------------------------------
// Tensor-core kernel.
__device__ __forceinline__ unsigned pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<unsigned*>(&v);
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
  check_attention(q, k, v, out, n_heads, n_kv_heads, head_dim, p, Device::CUDA);
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
  a.window = p.window;
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
  // Heads wider than the tensor-core kernel's, and sliding windows: the tiled f32 kernel.
  if ((head_dim > 128 || p.window > 0) && p.block_mask == nullptr) {
    switch (head_dim) {
      case 32:
        return launch_wide<32>(a, q.rows(), s);
      case 64:
        return launch_wide<64>(a, q.rows(), s);
      case 128:
        return launch_wide<128>(a, q.rows(), s);
      case 256:
        return launch_wide<256>(a, q.rows(), s);
      case 512:
        return launch_wide<512>(a, q.rows(), s);
      default:
        break;  // other widths: the SIMT kernel
    }
  }
  const bool tc_dim = head_dim == 32 || head_dim == 64 || head_dim == 128;
  // f32 outputs (f32 precision), other head dims, or no bf16 staging scratch: f32 SIMT kernel.
  if (out.dtype != DType::BF16 || !tc_dim || p.kv_scratch == nullptr || k.numel() % 4 != 0 || p.window > 0) {
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

}  // namespace tessera::cuda
