// Tiled (flash-style) attention on the CPU: online softmax over key tiles, never the L x L matrix.
// Packed sequences, GQA, query subset vs key set by absolute positions, causal / block-causal.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/cpu/cpu_kernels.h"
#include "core/error.h"

namespace tessera::cpu {
namespace {

constexpr int kBQ = 32;
constexpr int kBK = 128;
constexpr int kMaxD = 256;

inline bool visible(MaskKind mask, int block, int32_t qp, int32_t kp) {
  switch (mask) {
    case MaskKind::None:
      return true;
    case MaskKind::Causal:
      return kp <= qp;
    case MaskKind::BlockCausal:
      return kp / block <= qp / block;
  }
  return true;
}

struct TileCtx {
  const float* q;
  const float* k;
  const float* v;
  int64_t q_stride, kv_stride;  // floats per row
  int d;
  float scale;
  int64_t q_start, n_qb, n_kb;  // block-sparse pattern geometry (AttnParams::block_mask)
};

// exp(x) for x <= 0, vectorisable: 2^(x log2 e) with a degree-6 polynomial for the fraction
// (relative error < 2e-7 on the range attention uses). Below about -87.3 (2^-126, the smallest
// normal float) it is exactly 0: masked scores (-inf) add nothing. The clamp is written
// max(-100, x) so that NaN (a NaN score, from NaN weights) becomes -100 too: converting NaN to int
// would be undefined, and the NaN reaches the outputs through the other ops anyway.
inline float exp_neg(float x) {
  x = std::max(-100.0f, x);
  const float t = x * 1.44269504088896341f;
  const float fl = std::floor(t);
  const float f = t - fl;  // [0, 1)
  float p = 1.5353362e-4f;
  p = p * f + 1.3398874e-3f;
  p = p * f + 9.6181291e-3f;
  p = p * f + 5.5504109e-2f;
  p = p * f + 2.4022651e-1f;
  p = p * f + 6.9314718e-1f;
  p = p * f + 1.0f;
  const int32_t e = static_cast<int32_t>(fl) + 127;
  uint32_t bits = static_cast<uint32_t>(e < 1 ? 0 : e) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  return p * scale;
}

// One (query tile, head): rows [qa, qb) of the query set against keys [ka, kb). K tiles are
// transposed into a local buffer so that scores are computed with the key index innermost.
void attend_tile(const TileCtx& c, const AttnParams& p, int64_t qa, int64_t qb, int64_t ka, int64_t kb,
                 int64_t hq, int64_t hk, void* out, DType out_dtype) {
  const int d = c.d;
  const int nq = static_cast<int>(qb - qa);
  alignas(64) float acc[kBQ][kMaxD];
  alignas(64) float kt[kMaxD][kBK];
  alignas(64) float s[kBK];
  float m[kBQ], l[kBQ];
  int32_t qmax = std::numeric_limits<int32_t>::min();
  for (int i = 0; i < nq; ++i) {
    m[i] = -std::numeric_limits<float>::infinity();
    l[i] = 0.0f;
    std::fill(acc[i], acc[i] + d, 0.0f);
    qmax = std::max(qmax, p.q_pos[qa + i]);
  }
  const bool masked = p.mask != MaskKind::None;
  const int64_t bs = p.sparse_block;
  const uint8_t* bm = p.block_mask != nullptr ? p.block_mask + hq * c.n_qb * c.n_kb : nullptr;
  // Key tiles to visit: [ka, kb) in steps of kBK; block-sparse: only the key blocks that some query
  // block of this tile keeps (runs of kept blocks, cut into tiles of at most kBK keys), so dropped
  // tiles cost nothing. Rows of a tile that spans several query blocks still mask per row below.
  // The tiles are generated one by one (a list of them, thread-local, allocated when a thread first
  // met a long key range after warm-up: an allocation inside a step).
  const int64_t qb0 = bm != nullptr ? (qa - c.q_start) / bs : 0,
                qb1 = bm != nullptr ? (qb - 1 - c.q_start) / bs : 0;
  auto kept = [&](int64_t j) {
    for (int64_t r = qb0; r <= qb1; ++r)
      if (bm[r * c.n_kb + j] != 0) return true;
    return false;
  };
  int64_t run_k = bm == nullptr ? ka : 0,
          run_end = bm == nullptr ? kb : 0;  // the current run [run_k, run_end)
  int64_t next_block = 0;                    // block-sparse: next block to scan
  auto next_tile = [&](int64_t& k0, int& nk) {
    while (run_k >= run_end) {  // block-sparse: the next run of kept blocks
      if (bm == nullptr) return false;
      while (next_block < c.n_kb && !kept(next_block)) ++next_block;
      if (next_block >= c.n_kb) return false;
      int64_t j1 = next_block;
      while (j1 < c.n_kb && kept(j1)) ++j1;
      run_k = ka + next_block * bs;
      run_end = std::min(ka + j1 * bs, kb);
      next_block = j1;
    }
    k0 = run_k;
    nk = static_cast<int>(std::min<int64_t>(kBK, run_end - run_k));
    run_k += nk;
    return true;
  };
  int64_t k0 = 0;
  int nk = 0;
  while (next_tile(k0, nk)) {
    if (masked) {  // skip tiles that no query of this tile can see
      int32_t kmin = std::numeric_limits<int32_t>::max();
      for (int j = 0; j < nk; ++j) kmin = std::min(kmin, p.k_pos[k0 + j]);
      if (!visible(p.mask, p.block_size, qmax, kmin)) continue;
    }
    for (int j = 0; j < nk; ++j) {
      const float* kj = c.k + (k0 + j) * c.kv_stride + hk * d;
      for (int t = 0; t < d; ++t) kt[t][j] = kj[t];
    }
    for (int i = 0; i < nq; ++i) {
      const float* qi = c.q + (qa + i) * c.q_stride + hq * d;
#pragma omp simd
      for (int j = 0; j < nk; ++j) s[j] = 0.0f;
      for (int t = 0; t < d; ++t) {
        const float qv = qi[t] * c.scale;
        const float* kr = kt[t];
#pragma omp simd
        for (int j = 0; j < nk; ++j) s[j] += qv * kr[j];
      }
      if (bm != nullptr) {  // block-sparse: whole (query block, key block) tiles dropped
        const uint8_t* row = bm + ((qa + i - c.q_start) / bs) * c.n_kb;
        for (int j = 0; j < nk; ++j) {
          if (row[(k0 + j - ka) / bs] == 0) s[j] = -std::numeric_limits<float>::infinity();
        }
      }
      if (masked) {
        const int32_t qp = p.q_pos[qa + i];
        for (int j = 0; j < nk; ++j) {
          if (!visible(p.mask, p.block_size, qp, p.k_pos[k0 + j]))
            s[j] = -std::numeric_limits<float>::infinity();
        }
      }
      float rowmax = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : rowmax)
      for (int j = 0; j < nk; ++j) rowmax = std::max(rowmax, s[j]);
      // Every key of the tile masked. (An OpenMP max reduction may start from lowest() rather than
      // -inf: clang's does.)
      if (rowmax <= std::numeric_limits<float>::lowest()) continue;
      const float mnew = std::max(m[i], rowmax);
      const float alpha = m[i] == -std::numeric_limits<float>::infinity() ? 0.0f : exp_neg(m[i] - mnew);
      float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
      for (int j = 0; j < nk; ++j) {
        const float e = exp_neg(s[j] - mnew);  // masked entries (-inf) give 0
        s[j] = e;
        sum += e;
      }
      l[i] = l[i] * alpha + sum;
      m[i] = mnew;
      float* ai = acc[i];
#pragma omp simd
      for (int t = 0; t < d; ++t) ai[t] *= alpha;
      for (int j = 0; j < nk; ++j) {
        const float pj = s[j];
        if (pj == 0.0f) continue;
        const float* vj = c.v + (k0 + j) * c.kv_stride + hk * d;
#pragma omp simd
        for (int t = 0; t < d; ++t) ai[t] += pj * vj[t];
      }
    }
  }
  for (int i = 0; i < nq; ++i) {
    const float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
    const int64_t off = (qa + i) * c.q_stride + hq * d;
    if (out_dtype == DType::F32) {
      float* o = static_cast<float*>(out) + off;
      for (int t = 0; t < d; ++t) o[t] = acc[i][t] * inv;
    } else {
      auto* o = static_cast<uint16_t*>(out) + off;
      for (int t = 0; t < d; ++t) o[t] = f32_to_bf16(acc[i][t] * inv);
    }
  }
}

// Scores scale * q_i . k_j of rows qi[0..nq) against the keys of one transposed tile kt[d][nk].
inline void tile_scores(const float* const* qi, int nq, const float (*kt)[kBK], int nk, int d, float scale,
                        float (*s)[kBK]) {
  for (int i = 0; i < nq; ++i) {
#pragma omp simd
    for (int j = 0; j < nk; ++j) s[i][j] = 0.0f;
    for (int t = 0; t < d; ++t) {
      const float qv = qi[i][t] * scale;
      const float* kr = kt[t];
#pragma omp simd
      for (int j = 0; j < nk; ++j) s[i][j] += qv * kr[j];
    }
  }
}

// Importance of every key block for query rows [r0, r1) of head hq (kv head hk), added into imp:
// sum over the rows of softmax_j(scores) summed over the keys of each block. Two passes over the
// keys (row max and sum, then the probabilities), so only one key tile of scores exists at a time.
void block_importance(const TileCtx& c, int64_t r0, int64_t r1, int64_t n_keys, int64_t hq, int64_t hk,
                      int64_t block, double* imp) {
  const int d = c.d;
  alignas(64) float kt[kMaxD][kBK];
  alignas(64) float s[kBQ][kBK];
  alignas(64) float col[kBK];
  float m[kBQ], l[kBQ];
  const float* qi[kBQ];
  for (int64_t a = r0; a < r1; a += kBQ) {
    const int nq = static_cast<int>(std::min<int64_t>(kBQ, r1 - a));
    for (int i = 0; i < nq; ++i) {
      qi[i] = c.q + (a + i) * c.q_stride + hq * d;
      m[i] = -std::numeric_limits<float>::infinity();
      l[i] = 0.0f;
    }
    for (int pass = 0; pass < 2; ++pass) {
      for (int64_t k0 = 0; k0 < n_keys; k0 += kBK) {
        const int nk = static_cast<int>(std::min<int64_t>(kBK, n_keys - k0));
        for (int j = 0; j < nk; ++j) {
          const float* kj = c.k + (k0 + j) * c.kv_stride + hk * d;
          for (int t = 0; t < d; ++t) kt[t][j] = kj[t];
        }
        tile_scores(qi, nq, kt, nk, d, c.scale, s);
        if (pass == 0) {
          for (int i = 0; i < nq; ++i) {
            float rowmax = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : rowmax)
            for (int j = 0; j < nk; ++j) rowmax = std::max(rowmax, s[i][j]);
            const float mnew = std::max(m[i], rowmax);
            float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
            for (int j = 0; j < nk; ++j) sum += exp_neg(s[i][j] - mnew);
            l[i] =
                (m[i] == -std::numeric_limits<float>::infinity() ? 0.0f : l[i] * exp_neg(m[i] - mnew)) + sum;
            m[i] = mnew;
          }
          continue;
        }
        std::fill(col, col + nk, 0.0f);
        for (int i = 0; i < nq; ++i) {
          const float mi = m[i], inv = 1.0f / l[i];
#pragma omp simd
          for (int j = 0; j < nk; ++j) col[j] += exp_neg(s[i][j] - mi) * inv;
        }
        for (int j = 0; j < nk; ++j) imp[(k0 + j) / block] += col[j];
      }
    }
  }
}

}  // namespace

void attention(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, int n_heads, int n_kv_heads,
               int head_dim, const AttnParams& p) {
  TESSERA_CHECK(q.dtype == DType::F32 && k.dtype == DType::F32 && v.dtype == DType::F32,
                "attention (cpu): q, k, v must be f32");
  TESSERA_CHECK(out.dtype == DType::F32 || out.dtype == DType::BF16, "attention: output must be f32 or bf16");
  TESSERA_CHECK(head_dim <= kMaxD, "attention: head_dim above 256 is not supported");
  TESSERA_CHECK(n_heads % n_kv_heads == 0, "attention: n_heads must be a multiple of n_kv_heads");
  TESSERA_CHECK(q.cols() == int64_t{n_heads} * head_dim && k.cols() == int64_t{n_kv_heads} * head_dim,
                "attention: q/k widths do not match the head counts");
  TESSERA_CHECK(p.block_mask == nullptr || (p.n_seqs == 1 && p.sparse_block > 0),
                "attention: a block-sparse pattern needs one sequence and sparse_block > 0");
  const int64_t bs = std::max(1, p.sparse_block);
  const TileCtx c{q.as<const float>(),
                  k.as<const float>(),
                  v.as<const float>(),
                  q.cols(),
                  k.cols(),
                  head_dim,
                  p.scale,
                  p.cu_q[0],
                  (q.rows() + bs - 1) / bs,
                  (k.rows() + bs - 1) / bs};
  const int group = n_heads / n_kv_heads;
  for (int s = 0; s < p.n_seqs; ++s) {
    const int64_t qa = p.cu_q[s], qb = p.cu_q[s + 1], ka = p.cu_k[s], kb = p.cu_k[s + 1];
    const int64_t ntiles = (qb - qa + kBQ - 1) / kBQ;
#pragma omp parallel for collapse(2) schedule(dynamic, 1)
    for (int64_t t = 0; t < ntiles; ++t) {
      for (int h = 0; h < n_heads; ++h) {
        const int64_t a = qa + t * kBQ;
        attend_tile(c, p, a, std::min(a + kBQ, qb), ka, kb, h, h / group, out.data, out.dtype);
      }
    }
  }
}

}  // namespace tessera::cpu

namespace tessera {

void check_sparse_select(const Tensor& q, const Tensor& k, int n_heads, int n_kv_heads, int head_dim,
                         const SparseSelectParams& p) {
  TESSERA_CHECK(q.dtype == DType::F32 && k.dtype == DType::F32, "sparse_select: q and k must be f32");
  TESSERA_CHECK(head_dim <= 256, "sparse_select: head_dim above 256 is not supported");
  TESSERA_CHECK(n_kv_heads > 0 && n_heads % n_kv_heads == 0,
                "sparse_select: n_heads must be a multiple of n_kv_heads");
  TESSERA_CHECK(q.cols() == int64_t{n_heads} * head_dim && k.cols() == int64_t{n_kv_heads} * head_dim,
                "sparse_select: q/k widths do not match the head counts");
  TESSERA_CHECK(p.block > 0, "sparse_select: block must be > 0");
  TESSERA_CHECK(p.rho >= 0.0f && p.rho <= 1.0f, "sparse_select: rho must be in [0, 1]");
  TESSERA_CHECK(p.n_prompt_keys >= 0 && p.n_prompt_keys <= k.rows(),
                "sparse_select: n_prompt_keys must be in [0, key rows]");
}

}  // namespace tessera

namespace tessera::cpu {

void sparse_select(const Tensor& q, const Tensor& k, int n_heads, int n_kv_heads, int head_dim,
                   const SparseSelectParams& p, uint8_t* mask) {
  check_sparse_select(q, k, n_heads, n_kv_heads, head_dim, p);
  const int64_t B = p.block, Mq = q.rows(), Mk = k.rows();
  const int64_t n_qb = (Mq + B - 1) / B, n_kb = (Mk + B - 1) / B;
  const int64_t g = p.n_prompt_keys / B;
  const int64_t keep_pre = sparse_keep(g, p.rho), keep_gen = sparse_keep(n_kb - g, p.rho);
  const TileCtx c{q.as<const float>(),
                  k.as<const float>(),
                  nullptr,
                  q.cols(),
                  k.cols(),
                  head_dim,
                  p.scale,
                  0,
                  n_qb,
                  n_kb};
  const int group = n_heads / n_kv_heads;
#pragma omp parallel
  {
    std::vector<double> imp(static_cast<size_t>(n_kb));
    std::vector<int64_t> order(static_cast<size_t>(n_kb));
#pragma omp for collapse(2) schedule(dynamic, 1)
    for (int64_t qb = 0; qb < n_qb; ++qb) {
      for (int h = 0; h < n_heads; ++h) {
        std::fill(imp.begin(), imp.end(), 0.0);
        block_importance(c, qb * B, std::min(qb * B + B, Mq), Mk, h, h / group, B, imp.data());
        uint8_t* row = mask + (h * n_qb + qb) * n_kb;
        std::fill(row, row + n_kb, uint8_t{0});
        auto keep = [&](int64_t a, int64_t b, int64_t n_keep) {  // the n_keep best blocks of [a, b)
          const auto first = order.begin(), mid = first + n_keep, last = first + (b - a);
          for (int64_t i = a; i < b; ++i) order[static_cast<size_t>(i - a)] = i;
          std::partial_sort(first, mid, last, [&](int64_t x, int64_t y) {
            const double ix = imp[static_cast<size_t>(x)], iy = imp[static_cast<size_t>(y)];
            return ix > iy || (ix == iy && x < y);
          });
          for (auto it = first; it != mid; ++it) row[*it] = 1;
        };
        keep(0, g, keep_pre);
        keep(g, n_kb, keep_gen);
      }
    }
  }
}

}  // namespace tessera::cpu
