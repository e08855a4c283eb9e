// SparseD pattern selection on the GPU (Backend::sparse_select): per head and query block, the
// importance of each key block (the tile sum of the rows' softmax over all keys) and the blocks kept.
#include <cfloat>
#include <climits>

#include "backend/cuda/attn_tiles.h"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/mma.h"
#include "backend/op_checks.h"

namespace tessera::cuda {

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
