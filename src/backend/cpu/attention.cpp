// Tiled (flash-style) attention on the CPU: tiles of 128 query rows against 128 keys with an online
// softmax, never the L x L matrix; f32 arithmetic in register-blocked micro-kernels. Packed sequences,
// GQA, query subset vs key set by absolute positions, causal / block-causal, block-sparse patterns. With
// `bf16` the same drivers run attention_bf16.cpp's tiles (bf16 operands, f32 accumulation).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "backend/cpu/attention_tile.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/simd.h"
#include "backend/op_checks.h"
#include "core/error.h"

namespace tessera::cpu {
namespace {

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

// Register-blocked micro-kernels (backend/cpu/simd.h: the vector width follows the build's ISA): kR
// query rows by kNV vectors of keys (scores) or of head dimensions (P V) stay in registers while the
// inner loop runs over the head dimension (scores) or the keys (P V). Dot products and P V sums are
// taken in the order of a plain scalar loop (t = 0..d-1; keys in order); only the softmax normaliser
// is summed lane by lane, so it alone depends (in rounding) on the vector width.
using simd::kW;
using simd::load;
using simd::splat;
using simd::store;
using simd::vf;
using simd::vi;
constexpr int kR = 4;                  // query rows per micro-kernel
constexpr int kNV = kW >= 16 ? 4 : 2;  // vectors per row in the micro-kernel (16 or 8 accumulators)
constexpr int kMaxDP = kMaxD;          // padded head dimension (a multiple of kW)
// Row stride of the transposed K tile: kBK floats plus one vector, so that the d rows a key's column
// is written into fall in different L1 sets (a stride of 512 bytes put them all in 8 of the 64 sets:
// the transposition then thrashed L1 and took more time than the arithmetic).
constexpr int kKt = kBK + kW;
static_assert(kBQ % kR == 0 && kBK % (kW * kNV) == 0 && kMaxD % kW == 0, "attention tile sizes");

// exp_neg on a vector, the same arithmetic lane by lane (simd::floor_parts: floor as truncation corrected
// by the sign, which is exact for the range used), so its results equal the scalar function's.
inline vf exp_neg(vf x) {
  const vf lim = splat(-100.0f);
  const vi keep = x >= lim;  // false for NaN, as max(-100, NaN) = -100
  x = simd::select(keep, x, lim);
  const vf t = x * 1.44269504088896341f;
  vi n;
  const vf f = t - simd::floor_parts(t, n);
  vf p = splat(1.5353362e-4f);
  p = p * f + 1.3398874e-3f;
  p = p * f + 9.6181291e-3f;
  p = p * f + 5.5504109e-2f;
  p = p * f + 2.4022651e-1f;
  p = p * f + 6.9314718e-1f;
  p = p * f + 1.0f;
  const vi e = n + 127;
  const vi bits = (e & ~(e < 1)) << 23;
  return p * (vf)bits;
}

// s[r][j0 + ...] = sum_t q[r][t] kt[t][j0 + ...] for kR rows and NV vectors of keys.
template <int NV>
inline void score_block(const float* q, int d, const float* kt, float* s) {
  vf acc[kR][NV] = {};
  for (int t = 0; t < d; ++t) {
    vf kv[NV];
    for (int v = 0; v < NV; ++v) kv[v] = load(kt + t * kKt + v * kW);
    for (int r = 0; r < kR; ++r) {
      const float qv = q[r * d + t];
      for (int v = 0; v < NV; ++v) acc[r][v] += qv * kv[v];
    }
  }
  for (int r = 0; r < kR; ++r)
    for (int v = 0; v < NV; ++v) store(s + r * kBK + v * kW, acc[r][v]);
}

// acc[r][t0 + ...] = acc * alpha[r] + sum over the listed keys j of p[r][j] v[j][t0 + ...].
template <int NV>
inline void pv_block(float* acc, int dp, const float* alpha, const float* p, const float* v, int64_t vstride,
                     const int* keys, int n_keys) {
  vf a[kR][NV];
  for (int r = 0; r < kR; ++r)
    for (int w = 0; w < NV; ++w) a[r][w] = load(acc + r * dp + w * kW) * alpha[r];
  for (int jj = 0; jj < n_keys; ++jj) {
    const int j = keys[jj];
    vf vv[NV];
    for (int w = 0; w < NV; ++w) vv[w] = load(v + j * vstride + w * kW);
    for (int r = 0; r < kR; ++r) {
      const float pj = p[r * kBK + j];
      for (int w = 0; w < NV; ++w) a[r][w] += pj * vv[w];
    }
  }
  for (int r = 0; r < kR; ++r)
    for (int w = 0; w < NV; ++w) store(acc + r * dp + w * kW, a[r][w]);
}

// Runs f.template operator()<NV>(offset) over [0, n) in blocks of kNV vectors, the last block shorter.
template <class F>
inline void vector_blocks(int n_vectors, F&& f) {
  int v0 = 0;
  for (; v0 + kNV <= n_vectors; v0 += kNV) f.template operator()<kNV>(v0 * kW);
  switch (n_vectors - v0) {
    case 3:
      if constexpr (kNV > 3) f.template operator()<3>(v0 * kW);
      break;
    case 2:
      if constexpr (kNV > 2) f.template operator()<2>(v0 * kW);
      break;
    case 1:
      f.template operator()<1>(v0 * kW);
      break;
    default:
      break;
  }
}

// The query rows [qa, qa + nq) of head hq, scaled, into qs[nr][d] (rows nq..nr zero); with positions,
// returns their smallest and largest position.
inline std::pair<int32_t, int32_t> load_queries(const TileCtx& c, const int32_t* q_pos, int64_t qa, int nq,
                                                int nr, int64_t hq, float* qs) {
  const int d = c.d;
  for (int i = 0; i < nr; ++i) {
    float* qi = qs + i * d;
    if (i >= nq) {
      std::fill(qi, qi + d, 0.0f);
      continue;
    }
    const float* src = c.q + (qa + i) * c.q_stride + hq * d;
    for (int t = 0; t < d; ++t) qi[t] = src[t] * c.scale;
  }
  return position_span(q_pos, qa, nq);
}

// Keys [i0, i0 + nk) of rows, kv head hk, transposed into kt[d][kKt], padded with zero keys to whole
// vectors: whole kW x kW blocks (kW keys by kW dimensions) transposed in registers, the rest element by
// element. K and V rows are a page or more apart (every head's K of a row lies together), so the
// hardware prefetchers, which stop at page boundaries, miss every row: the K rows of the next kW keys
// are prefetched (into the next tile too) and, with prefetch_v, these keys' V, read after the scores.
inline void load_keys(const TileCtx& c, const KeyRows& rows, int64_t i0, int nk, int64_t hk, bool prefetch_v,
                      float* kt) {
  const int d = c.d;
  auto prefetch = [&](int j0, int n) {  // keys [j0, j0 + n) of the tile
    for (int j = j0; j < j0 + n; ++j) {
      const bool pf = i0 + j + kW < rows.n;
      const float* kpf = pf ? c.k + rows[i0 + j + kW] * c.kv_stride + hk * d : nullptr;
      const float* vpf = prefetch_v ? c.v + rows[i0 + j] * c.kv_stride + hk * d : nullptr;  // c.v may be null
      for (int t = 0; t < d; t += 16) {
        if (pf) __builtin_prefetch(kpf + t);
        if (prefetch_v) __builtin_prefetch(vpf + t);
      }
    }
  };
  const int nk_full = nk / kW * kW, d_full = d / kW * kW;
  for (int j0 = 0; j0 < nk_full; j0 += kW) {
    prefetch(j0, kW);
    const float* kj[kW];
    for (int i = 0; i < kW; ++i) kj[i] = c.k + rows[i0 + j0 + i] * c.kv_stride + hk * d;
    for (int t0 = 0; t0 < d_full; t0 += kW) {
      vf r[kW];
      for (int i = 0; i < kW; ++i) r[i] = load(kj[i] + t0);
      simd::transpose(r);
      for (int i = 0; i < kW; ++i) store(kt + (t0 + i) * kKt + j0, r[i]);
    }
    for (int i = 0; i < kW; ++i)
      for (int t = d_full; t < d; ++t) kt[t * kKt + j0 + i] = kj[i][t];
  }
  prefetch(nk_full, nk - nk_full);
  for (int j = nk_full; j < nk; ++j) {
    const float* kj = c.k + rows[i0 + j] * c.kv_stride + hk * d;
    for (int t = 0; t < d; ++t) kt[t * kKt + j] = kj[t];
  }
  const int padded = (nk + kW - 1) / kW * kW;
  for (int t = 0; t < d; ++t) std::fill(kt + t * kKt + nk, kt + t * kKt + padded, 0.0f);
}

// s[nr][kBK] = scores of the nr (a multiple of kR) rows of qs against the first n_vectors * kW keys
// of kt; a block of keys stays in L1 across the row groups.
inline void tile_scores(const float* qs, int nr, int d, const float* kt, int n_vectors, float* s) {
  vector_blocks(n_vectors, [&]<int NV>(int j0) {
    for (int r0 = 0; r0 < nr; r0 += kR) score_block<NV>(qs + r0 * d, d, kt + j0, s + r0 * kBK + j0);
  });
}

// The largest of a row's first nk scores, after setting its entries [nk, n) to -inf so that whole
// vectors (n a multiple of kW) can be read from here on.
inline float padded_row_max(float* si, int nk, int n) {
  std::fill(si + nk, si + n, -std::numeric_limits<float>::infinity());
  vf m = splat(-std::numeric_limits<float>::infinity());
  for (int j = 0; j < n; j += kW) m = simd::vmax(load(si + j), m);
  return simd::hmax(m);
}

// One (query tile, head): rows [qa, qb) of the query set against the keys of rows, by key tiles of at
// most kBK keys with an online softmax. Per tile: K transposed into a local buffer, the scores of all
// rows, their softmax update, then P V over the keys that some row of the tile gives a non-zero weight,
// their V rows packed (so a key that every row of the tile masks is never read: its V may be anything;
// one that some row sees is weighed 0 by the others, so its V must be finite, as computed rows are).
// About 600 KiB of stack (tiles for head dimensions up to 256).
void attend_tile(const TileCtx& c, const AttnParams& p, int64_t qa, int64_t qb, const KeyRows& rows,
                 int64_t hq, int64_t hk, void* out, DType out_dtype) {
  const int d = c.d;
  const int dp = (d + kW - 1) / kW * kW;
  const int nq = static_cast<int>(qb - qa);
  const int nr = (nq + kR - 1) / kR * kR;     // rows rounded up to whole micro-kernels (the rest are 0)
  alignas(64) float qs[kBQ * kMaxD];          // scaled queries [kBQ][d]
  alignas(64) float acc[kBQ * kMaxDP];        // [kBQ][dp]
  alignas(64) float kt[kMaxD * kKt];          // K tile transposed [d][kKt]
  alignas(64) float vp[kBK * (kMaxDP + kW)];  // V tile packed [kBK][dp + kW]
  alignas(64) float s[kBQ * kBK];             // scores, then probabilities [kBQ][kBK]
  float m[kBQ], l[kBQ], alpha[kBQ];
  int keys[kBK];
  const auto [qmin, qmax] = load_queries(c, p.q_pos, qa, nq, nr, hq, qs);
  for (int i = 0; i < nr; ++i) {
    m[i] = -std::numeric_limits<float>::infinity();
    l[i] = 0.0f;
    std::fill(acc + i * dp, acc + (i + 1) * dp, 0.0f);
  }
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  for (int64_t i0 = 0; i0 < rows.n; i0 += kBK) {
    const int nk = static_cast<int>(std::min<int64_t>(kBK, rows.n - i0));
    const TileMask tm = tile_mask(p, rows, i0, nk, qmin, qmax);  // masks per element only where needed
    if (tm == TileMask::Skip) continue;
    const bool mask_elems = tm == TileMask::PerElement;
    const int nkv = (nk + kW - 1) / kW;  // key vectors
    load_keys(c, rows, i0, nk, hk, true, kt);
    tile_scores(qs, nr, d, kt, nkv, s);
    for (int i = 0; i < nr; ++i) {
      float* si = s + i * kBK;
      alpha[i] = 1.0f;
      if (i >= nq) {  // padding rows: weigh nothing
        std::fill(si, si + nk, 0.0f);
        continue;
      }
      if (mask_elems) {
        const int32_t qp = p.q_pos[qa + i];
        for (int j = 0; j < nk; ++j) {
          if (!visible(p.mask, p.block_size, qp, p.k_pos[rows[i0 + j]], p.window)) si[j] = kNegInf;
        }
      }
      const float rowmax = padded_row_max(si, nk, nkv * kW);
      if (rowmax == kNegInf) {  // every key of the tile masked
        std::fill(si, si + nkv * kW, 0.0f);
        continue;
      }
      const float mnew = std::max(m[i], rowmax);
      alpha[i] = m[i] == kNegInf ? 0.0f : exp_neg(m[i] - mnew);
      vf vsum{};
      for (int j = 0; j < nkv * kW; j += kW) {
        const vf e = exp_neg(load(si + j) - mnew);  // masked entries (-inf) give 0
        store(si + j, e);
        vsum += e;
      }
      l[i] = l[i] * alpha[i] + simd::hsum(vsum);
      m[i] = mnew;
    }
    // The keys some row weighs (all of them, unless masks or underflow zero a whole column).
    // Probabilities are >= 0: a key is used iff its column max is > 0. Every row's entries past nk are
    // 0 by now, so whole vectors are read.
    alignas(64) float colmax[kBK];
    std::fill(colmax, colmax + nkv * kW, 0.0f);
    for (int i = 0; i < nq; ++i) {
      const float* si = s + i * kBK;
      for (int j = 0; j < nkv * kW; j += kW) store(colmax + j, simd::vmax(load(si + j), load(colmax + j)));
    }
    int n_keys = 0;
    for (int j = 0; j < nk; ++j) {
      keys[n_keys] = j;
      n_keys += colmax[j] > 0.0f ? 1 : 0;
    }
    // The used V rows, packed (and padded to whole vectors) at a stride that spreads them over the L1
    // sets, like the K tile's; a block of head dimensions stays in L1 across the row groups.
    const int vstride = dp + kW;
    for (int jj = 0; jj < n_keys; ++jj) {
      const int j = keys[jj];
      const float* vj = c.v + rows[i0 + j] * c.kv_stride + hk * d;
      std::copy(vj, vj + d, vp + j * vstride);
      std::fill(vp + j * vstride + d, vp + j * vstride + dp, 0.0f);
    }
    vector_blocks(dp / kW, [&]<int NV>(int t0) {
      for (int r0 = 0; r0 < nr; r0 += kR)
        pv_block<NV>(acc + r0 * dp + t0, dp, alpha + r0, s + r0 * kBK, vp + t0, vstride, keys, n_keys);
    });
  }
  for (int i = 0; i < nq; ++i) {
    const float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
    const int64_t off = (qa + i) * c.q_stride + hq * d;
    const float* ai = acc + i * dp;
    if (out_dtype == DType::F32) {
      float* o = static_cast<float*>(out) + off;
      for (int t = 0; t < d; ++t) o[t] = ai[t] * inv;
    } else {
      auto* o = static_cast<uint16_t*>(out) + off;
      for (int t = 0; t < d; ++t) o[t] = f32_to_bf16(ai[t] * inv);
    }
  }
}

// Importance of every key block for query rows [r0, r1) of head hq (kv head hk), added into imp: for
// the query block of q_block rows that row r belongs to (counted from r0), imp[((r - r0) / q_block) *
// n_kb + key / block] gets the sum over its rows of softmax_j(scores) summed over the keys of each key
// block. Two passes over the keys (row max and sum, then the probabilities), so only one key tile of
// scores exists at a time; up to kBQ rows (several query blocks) share each transposed K tile.
void block_importance(const TileCtx& c, int64_t r0, int64_t r1, int64_t n_keys, int64_t hq, int64_t hk,
                      int64_t q_block, int64_t block, int64_t n_kb, double* imp) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const int d = c.d;
  const KeyRows rows{0, n_keys, nullptr};
  alignas(64) float qs[kBQ * kMaxD];
  alignas(64) float kt[kMaxD * kKt];
  alignas(64) float s[kBQ * kBK];
  alignas(64) float col[kBK];
  float m[kBQ], l[kBQ];
  for (int64_t a = r0; a < r1; a += kBQ) {
    const int nq = static_cast<int>(std::min<int64_t>(kBQ, r1 - a));
    const int nr = (nq + kR - 1) / kR * kR;
    load_queries(c, nullptr, a, nq, nr, hq, qs);
    for (int i = 0; i < nq; ++i) {
      m[i] = kNegInf;
      l[i] = 0.0f;
    }
    for (int pass = 0; pass < 2; ++pass) {
      for (int64_t k0 = 0; k0 < n_keys; k0 += kBK) {
        const int nk = static_cast<int>(std::min<int64_t>(kBK, n_keys - k0));
        const int nkv = (nk + kW - 1) / kW;
        load_keys(c, rows, k0, nk, hk, false, kt);
        tile_scores(qs, nr, d, kt, nkv, s);
        if (pass == 0) {
          for (int i = 0; i < nq; ++i) {
            float* si = s + i * kBK;
            const float mnew = std::max(m[i], padded_row_max(si, nk, nkv * kW));
            vf vsum{};
            for (int j = 0; j < nkv * kW; j += kW) vsum += exp_neg(load(si + j) - mnew);
            l[i] = (m[i] == kNegInf ? 0.0f : l[i] * exp_neg(m[i] - mnew)) + simd::hsum(vsum);
            m[i] = mnew;
          }
          continue;
        }
        for (int i0 = 0; i0 < nq;) {  // the rows of one query block at a time
          const int64_t qblock = (a + i0 - r0) / q_block;
          const int i1 = static_cast<int>(std::min<int64_t>(nq, r0 + (qblock + 1) * q_block - a));
          std::fill(col, col + nkv * kW, 0.0f);
          for (int i = i0; i < i1; ++i) {
            const float* si = s + i * kBK;
            const float mi = m[i], inv = 1.0f / l[i];
            for (int j = 0; j < nkv * kW; j += kW)
              store(col + j, load(col + j) + exp_neg(load(si + j) - mi) * inv);
          }
          double* dst = imp + qblock * n_kb;
          for (int j = 0; j < nk; ++j) dst[(k0 + j) / block] += col[j];
          i0 = i1;
        }
      }
    }
  }
}

}  // namespace

// Block-sparse attention of one sequence: query tiles never cross a query block (at most kBQ rows of
// one), so each visits exactly the keys of its query block's kept key blocks, gathered into full key
// tiles; a dropped (query block, key block) pair costs nothing. A row's block is that of its row index
// in the sequence, or, with the pattern's strides given (AttnParams::sparse_q_blocks: a KV-cache step
// computing some positions of the canvas the pattern was built for), that of its position (q_pos /
// k_pos, each ascending).
void attend_sparse(const TileCtx& c, const AttnParams& p, int64_t qa, int64_t qb, int64_t ka, int64_t kb,
                   int n_heads, int group, AttendTileFn tile, Tensor& out) {
  const int64_t bs = p.sparse_block;
  const bool by_position = p.sparse_q_blocks > 0;
  const int64_t n_qb = by_position ? p.sparse_q_blocks : (qb - qa + bs - 1) / bs;  // the pattern's strides
  const int64_t n_kb = by_position ? p.sparse_k_blocks : (kb - ka + bs - 1) / bs;
  auto q_at = [&](int64_t i) -> int64_t { return by_position ? p.q_pos[i] : i - qa; };
  auto k_at = [&](int64_t r) -> int64_t { return by_position ? p.k_pos[r] : r - ka; };
  struct QTile {
    int64_t a, end, block;
  };
  std::vector<QTile> tiles;
  for (int64_t a = qa; a < qb;) {
    const int64_t blk = q_at(a) / bs;
    TESSERA_CHECK(blk < n_qb && (a == qa || q_at(a) > q_at(a - 1)),
                  "attention: sparse query positions must ascend inside the pattern's canvas");
    int64_t e = a + 1;
    while (e < qb && e - a < kBQ && q_at(e) / bs == blk) ++e;
    tiles.push_back({a, e, blk});
    a = e;
  }
  std::vector<int64_t> key_from(static_cast<size_t>(n_kb) + 1, kb);  // first key row of each key block
  for (int64_t r = kb - 1; r >= ka; --r) {
    const int64_t blk = k_at(r) / bs;
    TESSERA_CHECK(blk < n_kb && (r == ka || k_at(r) > k_at(r - 1)),
                  "attention: sparse key positions must ascend inside the pattern's canvas");
    for (int64_t j = blk; j >= 0 && key_from[static_cast<size_t>(j)] > r; --j)
      key_from[static_cast<size_t>(j)] = r;
  }
  const auto ntiles = static_cast<int64_t>(tiles.size());
#pragma omp parallel
  {
    std::vector<int32_t> list;
#pragma omp for collapse(2) schedule(dynamic, 1)
    for (int h = 0; h < n_heads; ++h) {
      for (int64_t t = 0; t < ntiles; ++t) {
        const QTile& q = tiles[static_cast<size_t>(t)];
        const uint8_t* kept = p.block_mask + (h * n_qb + q.block) * n_kb;
        list.clear();
        for (int64_t j = 0; j < n_kb; ++j) {
          if (kept[j] == 0) continue;
          for (int64_t r = key_from[static_cast<size_t>(j)]; r < key_from[static_cast<size_t>(j) + 1]; ++r)
            list.push_back(static_cast<int32_t>(r));
        }
        tile(c, p, q.a, q.end, KeyRows{ka, static_cast<int64_t>(list.size()), list.data()}, h, h / group,
             out.data, out.dtype);
      }
    }
  }
}

// Heads wider than the tile kernels' kMaxD (Gemma 4's global layers: 512), f32, one query row at a time:
// its scores over the visible keys in a row buffer, then the softmax-weighted sum of V. Dense only (the
// checks refuse a sparse pattern with a window; SparseD's models have narrower heads).
void attend_wide(const TileCtx& c, const AttnParams& p, int64_t qa, int64_t qb, int64_t ka, int64_t kb,
                 int n_heads, int group, Tensor& out) {
  TESSERA_CHECK(p.block_mask == nullptr, "attention: heads wider than 256 have no sparse kernel");
  const int d = c.d;
#pragma omp parallel
  {
    std::vector<float> sc(static_cast<size_t>(std::max<int64_t>(kb - ka, 1)));
    std::vector<float> acc(static_cast<size_t>(d));
#pragma omp for collapse(2) schedule(dynamic, 8)
    for (int h = 0; h < n_heads; ++h) {
      for (int64_t i = qa; i < qb; ++i) {
        const float* qi = c.q + i * c.q_stride + static_cast<int64_t>(h) * d;
        const int64_t hk = h / group;
        float mx = -std::numeric_limits<float>::infinity();
        for (int64_t j = ka; j < kb; ++j) {
          float& sj = sc[static_cast<size_t>(j - ka)];
          if (p.mask != MaskKind::None && !visible(p.mask, p.block_size, p.q_pos[i], p.k_pos[j], p.window)) {
            sj = -std::numeric_limits<float>::infinity();
            continue;
          }
          const float* kj = c.k + j * c.kv_stride + hk * d;
          float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
          for (int t = 0; t < d; ++t) dot += qi[t] * kj[t];
          sj = dot * c.scale;
          mx = std::max(mx, sj);
        }
        std::fill(acc.begin(), acc.end(), 0.0f);
        float sum = 0.0f;
        if (mx != -std::numeric_limits<float>::infinity()) {
          for (int64_t j = ka; j < kb; ++j) {
            const float e = std::exp(sc[static_cast<size_t>(j - ka)] - mx);
            if (e == 0.0f) continue;
            sum += e;
            const float* vj = c.v + j * c.kv_stride + hk * d;
#pragma omp simd
            for (int t = 0; t < d; ++t) acc[static_cast<size_t>(t)] += e * vj[t];
          }
        }
        const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
        const int64_t off = i * c.q_stride + static_cast<int64_t>(h) * d;
        for (int t = 0; t < d; ++t) {
          const float o = acc[static_cast<size_t>(t)] * inv;
          if (out.dtype == DType::F32)
            out.as<float>()[off + t] = o;
          else
            out.as<uint16_t>()[off + t] = f32_to_bf16(o);
        }
      }
    }
  }
}

namespace {
// Query rows per dense tile of a sequence of n rows: the bf16 kernel takes kBQ2 rows where that still
// leaves four tiles per thread.
int64_t dense_tile_rows(int64_t n, int n_heads, bool bf16) {
  const int64_t big = (n + kBQ2 - 1) / kBQ2;
  return bf16 && big * n_heads >= 4 * omp_get_max_threads() ? kBQ2 : kBQ;
}
}  // namespace

bool attention_stages_kv(const AttnParams& p, int n_heads, int head_dim, bool bf16, int stage_min_tiles) {
  if (!bf16 || p.kv_scratch == nullptr || head_dim > kMaxD || head_dim % 16 != 0) return false;
  for (int s = 0; s < p.n_seqs; ++s) {  // block-sparse query tiles hold at most one query block
    const int64_t n = p.cu_q[s + 1] - p.cu_q[s];
    const int64_t rows =
        p.block_mask != nullptr ? std::min<int64_t>(p.sparse_block, kBQ) : dense_tile_rows(n, n_heads, bf16);
    if ((n + rows - 1) / rows >= std::max(stage_min_tiles, 2)) return true;
  }
  return false;
}

void attention(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, int n_heads, int n_kv_heads,
               int head_dim, const AttnParams& p, bool bf16, int stage_min_tiles) {
  check_attention(q, k, v, out, n_heads, n_kv_heads, head_dim, p, Device::CPU);
  TESSERA_CHECK(!bf16 || bf16_attention_supported(), "attention: this CPU has no AVX-512 BF16");
  const AttendTileFn tile = bf16 ? attend_tile_bf16 : attend_tile;
  static_assert(kMaxD >= 256, "the tile kernels run head_dim up to 256; attend_wide the wider ones");
  TileCtx c{
      q.as<const float>(), k.as<const float>(), v.as<const float>(), q.cols(), k.cols(), head_dim, p.scale};
  if (attention_stages_kv(p, n_heads, head_dim, bf16, stage_min_tiles))
    stage_kv_bf16(c, k.rows(), n_kv_heads, p.kv_scratch);
  const int group = n_heads / n_kv_heads;
  for (int s = 0; s < p.n_seqs; ++s) {
    const int64_t qa = p.cu_q[s], qb = p.cu_q[s + 1], kb = p.cu_k[s + 1];
    int64_t ka = p.cu_k[s];
    if (p.window > 0 && qb > qa) {  // keys before the window of the sequence's first query: none sees them
      int32_t q0 = p.q_pos[qa];
      for (int64_t i = qa; i < qb; ++i) q0 = std::min(q0, p.q_pos[i]);
      const int64_t from = static_cast<int64_t>(q0) - (p.window - 1);
      while (ka < kb && p.k_pos[ka] < from) ++ka;  // keys ascend by position
    }
    if (head_dim > kMaxD) {
      attend_wide(c, p, qa, qb, ka, kb, n_heads, group, out);
      continue;
    }
    if (p.block_mask == nullptr) {
      const int64_t rows = dense_tile_rows(qb - qa, n_heads, bf16);
      const int64_t ntiles = (qb - qa + rows - 1) / rows;
#pragma omp parallel for collapse(2) schedule(dynamic, 1)
      for (int h = 0; h < n_heads; ++h) {
        for (int64_t t = 0; t < ntiles; ++t) {
          const int64_t a = qa + t * rows;
          tile(c, p, a, std::min(a + rows, qb), KeyRows{ka, kb - ka, nullptr}, h, h / group, out.data,
               out.dtype);
        }
      }
      continue;
    }
    attend_sparse(c, p, qa, qb, ka, kb, n_heads, group, tile, out);
  }
}

namespace {

// The n_keep best key blocks of [a, b) by importance (ties to the lower block) set to 1 in row.
void keep_best(const double* imp, int64_t a, int64_t b, int64_t n_keep, std::vector<int64_t>& order,
               uint8_t* row) {
  const auto first = order.begin(), mid = first + n_keep, last = first + (b - a);
  for (int64_t i = a; i < b; ++i) order[static_cast<size_t>(i - a)] = i;
  std::partial_sort(first, mid, last, [&](int64_t x, int64_t y) {
    const double ix = imp[x], iy = imp[y];
    return ix > iy || (ix == iy && x < y);
  });
  for (auto it = first; it != mid; ++it) row[*it] = 1;
}

// Block-causal selection (SparseSelectParams::attn_block): per head and query block present in the rows,
// the importance of its rows over the keys each sees (a run of rows of one attention block at a time,
// so the mask is a shorter key prefix), written into the pattern row of its position's block.
void select_block_causal(const TileCtx& c, const SparseSelectParams& p, int64_t Mq, int64_t Mk, int n_heads,
                         int group, BlockImportanceFn importance, uint8_t* mask) {
  const int64_t B = p.block, AB = p.attn_block, n_kb = (Mk + B - 1) / B;
  const int64_t g = p.n_prompt_keys / B;
  const int64_t keep_pre = sparse_keep(g, p.rho), keep_gen = sparse_keep(n_kb - g, p.rho);
  std::vector<int64_t> starts;  // first row of each query block present
  for (int64_t r = 0; r < Mq; ++r) {
    TESSERA_CHECK(r == 0 || p.q_pos[r] > p.q_pos[r - 1], "sparse_select: query positions must ascend");
    TESSERA_CHECK(p.q_pos[r] / B < p.n_qb, "sparse_select: a query position lies outside the pattern");
    if (r == 0 || p.q_pos[r] / B != p.q_pos[r - 1] / B) starts.push_back(r);
  }
  starts.push_back(Mq);
  const auto n_groups = static_cast<int64_t>(starts.size()) - 1;
#pragma omp parallel
  {
    std::vector<double> imp(static_cast<size_t>(n_kb));
    std::vector<int64_t> order(static_cast<size_t>(n_kb));
#pragma omp for collapse(2) schedule(dynamic, 1)
    for (int h = 0; h < n_heads; ++h) {
      for (int64_t t = 0; t < n_groups; ++t) {
        const int64_t r0 = starts[static_cast<size_t>(t)], r1 = starts[static_cast<size_t>(t) + 1];
        std::fill(imp.begin(), imp.end(), 0.0);
        for (int64_t a = r0; a < r1;) {  // rows of one attention block: keys [0, its end)
          const int64_t ab = p.q_pos[a] / AB;
          int64_t e = a + 1;
          while (e < r1 && p.q_pos[e] / AB == ab) ++e;
          const int64_t keys = std::min(Mk, (ab + 1) * AB);
          importance(c, a, e, keys, h, h / group, e - a, B, n_kb, imp.data());
          a = e;
        }
        uint8_t* row = mask + (h * p.n_qb + p.q_pos[r0] / B) * p.n_kb;
        std::fill(row, row + p.n_kb, uint8_t{0});
        keep_best(imp.data(), 0, g, keep_pre, order, row);
        keep_best(imp.data(), g, n_kb, keep_gen, order, row);
      }
    }
  }
}

}  // namespace

void sparse_select(const Tensor& q, const Tensor& k, int n_heads, int n_kv_heads, int head_dim,
                   const SparseSelectParams& p, uint8_t* mask, bool bf16) {
  check_sparse_select(q, k, n_heads, n_kv_heads, head_dim, p);
  TESSERA_CHECK(!bf16 || bf16_attention_supported(), "sparse_select: this CPU has no AVX-512 BF16");
  const BlockImportanceFn importance = bf16 ? block_importance_bf16 : block_importance;
  const TileCtx c{q.as<const float>(), k.as<const float>(), nullptr, q.cols(), k.cols(), head_dim, p.scale};
  if (p.attn_block > 0) {
    select_block_causal(c, p, q.rows(), k.rows(), n_heads, n_heads / n_kv_heads, importance, mask);
    return;
  }
  const int64_t B = p.block, Mq = q.rows(), Mk = k.rows();
  const int64_t n_qb = (Mq + B - 1) / B, n_kb = (Mk + B - 1) / B;
  const int64_t g = p.n_prompt_keys / B;
  const int64_t keep_pre = sparse_keep(g, p.rho), keep_gen = sparse_keep(n_kb - g, p.rho);
  const int group = n_heads / n_kv_heads;
  // Query tiles of whole query blocks (as many as fit in kBQ rows; one block when B > kBQ), so that
  // several blocks share each transposed K tile.
  const int64_t per_tile = std::max<int64_t>(1, kBQ / B), n_tiles = (n_qb + per_tile - 1) / per_tile;
#pragma omp parallel
  {
    std::vector<double> imp(static_cast<size_t>(per_tile * n_kb));
    std::vector<int64_t> order(static_cast<size_t>(n_kb));
#pragma omp for collapse(2) schedule(dynamic, 1)
    for (int h = 0; h < n_heads; ++h) {
      for (int64_t t = 0; t < n_tiles; ++t) {
        const int64_t qb0 = t * per_tile, qb1 = std::min(n_qb, qb0 + per_tile);
        std::fill(imp.begin(), imp.end(), 0.0);
        importance(c, qb0 * B, std::min(qb1 * B, Mq), Mk, h, h / group, B, B, n_kb, imp.data());
        for (int64_t qb = qb0; qb < qb1; ++qb) {
          const double* bimp = imp.data() + (qb - qb0) * n_kb;
          uint8_t* row = mask + (h * n_qb + qb) * n_kb;
          std::fill(row, row + n_kb, uint8_t{0});
          keep_best(bimp, 0, g, keep_pre, order, row);
          keep_best(bimp, g, n_kb, keep_gen, order, row);
        }
      }
    }
  }
}

}  // namespace tessera::cpu
