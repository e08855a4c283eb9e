// Attention tiles on bf16 operands with f32 accumulation, for the drivers of attention.cpp, on CPUs with
// AVX-512 BF16 (vdpbf16ps: two bf16 products added into each f32 lane). Compiled with function-level
// target attributes, so a build for any x86-64 carries it and attention.cpp calls it only where
// bf16_attention_supported() (checked at run time).
//
// Layout, chosen so that neither operand of either product needs a transposition per key tile:
// - scores are computed transposed, S^T = K Q^T: the query tile is packed once per (tile, head) as
//   qq[t/2][row] (the pair q[row][t], q[row][t+1] in one 32-bit lane; rows across lanes), and each key
//   row is simply rounded to bf16 (kk[key][t/2]), one pair broadcast per product. The softmax then runs
//   down the keys with the query rows in lanes: row max, exp and sums are lane-wise, never horizontal.
// - P V: the probabilities of key pairs (2j, 2j+1) are interleaved per row (pp[j/2][row]) and broadcast;
//   V rows of the same key pair are interleaved per head dimension (vv[j/2][t]): dimensions in lanes.
// q (scaled), k, v and the probabilities are rounded to bf16 (round to nearest even); scores, the
// softmax and P V accumulate in f32. Masks, tile skipping and the rule that a key no row of the tile
// weighs is never read are those of the f32 kernel (attention.cpp).
#include <algorithm>
#include <cstring>
#include <limits>

#include "backend/cpu/attention_tile.h"
#include "core/error.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define TESSERA_BF16_KERNEL 1
// GCC 12 reports its own _mm512_undefined_* placeholders inside the intrinsics as "may be used
// uninitialized" (a known false positive; as in core/ggml_quant.cpp).
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#endif

namespace tessera::cpu {

#if defined(TESSERA_BF16_KERNEL)
#define TGT __attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))

namespace {

constexpr int kMaxD2 = kMaxD / 2;
// Row stride of the tiles with rows across lanes: kBQ2 plus one vector, so that walking down the keys
// (the softmax, P V's broadcasts) does not put every row in the same few L1 sets (as 512-byte strides do).
constexpr int kQS = kBQ2 + 16;
constexpr int kR = 4;   // key rows (scores) or query rows (P V) per micro-kernel
constexpr int kNV = 4;  // vectors of 16 lanes per micro-kernel row
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

TGT inline __mmask16 lanes(int n) {
  return n >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << std::max(n, 0)) - 1u);
}

// exp(x) for x <= 0 with the f32 kernel's polynomial (attention.cpp exp_neg): exactly 0 below 2^-126,
// NaN taken as -100.
TGT inline __m512 exp_neg16(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-100.0f));  // the second operand where x is NaN
  const __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f));
  const __m512 fl = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(t, fl);
  __m512 p = _mm512_set1_ps(1.5353362e-4f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3398874e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504109e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022651e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  const __m512i e = _mm512_max_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(fl), _mm512_set1_epi32(127)),
                                     _mm512_setzero_si512());
  return _mm512_mul_ps(p, _mm512_castsi512_ps(_mm512_slli_epi32(e, 23)));
}

// Lane i: the bf16 pair (a[i], b[i]), a in the low half.
TGT inline __m512i interleave_bf16(__m512 a, __m512 b) {
  alignas(64) static const uint16_t kIdx[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
                                                8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i x = (__m512i)_mm512_cvtne2ps_pbh(b, a);  // words 0..15: a, 16..31: b
  return _mm512_permutexvar_epi16(_mm512_load_si512(kIdx), x);
}

// n (<= 32) floats of src times scale, rounded to 16 bf16 pairs (zeros past n).
TGT inline __m512i row_pairs(const float* src, int n, float scale) {
  const __m512 s = _mm512_set1_ps(scale);
  const __m512 lo = _mm512_mul_ps(_mm512_maskz_loadu_ps(lanes(n), src), s);
  const __m512 hi = _mm512_mul_ps(_mm512_maskz_loadu_ps(lanes(n - 16), src + 16), s);
  return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
}

struct Bf16Tile {
  alignas(64) uint32_t qq[kMaxD2 * kQS];            // queries: [d/2][kQS] bf16 pairs, rows in lanes
  alignas(64) uint32_t kk[kBK * kMaxD2];            // keys: [kBK][ks] bf16 pairs
  alignas(64) float st[(kBK + kR) * kQS];           // scores, transposed: [key][row]
  alignas(64) uint32_t pp[kBK / 2 * kQS];           // probabilities of key pairs: [key / 2][row]
  alignas(64) uint32_t vv[kBK / 2 * (kMaxD + 16)];  // values of key pairs: [key / 2][vs]
  alignas(64) float acc[kBQ2 * (kMaxD + 16)];       // [row][vs]
  alignas(64) float m[kBQ2], l[kBQ2], alpha[kBQ2];  // per row
  int d2 = 0, ks = 0, dp = 0,
      vs = 0;  // pairs per row; kk's row stride; padded head dim; vv's and acc's stride
  int nv = 0;  // query vectors (16 rows each)
};

// Query rows [qa, qa + nq) of head hq, scaled, into t.qq (rows nq .. 16 * nv zero).
TGT void pack_queries(const TileCtx& c, int64_t qa, int nq, int64_t hq, Bf16Tile& t) {
  alignas(64) uint32_t tmp[16];
  for (int i = 0; i < t.nv * 16; ++i) {
    if (i >= nq) {
      for (int j = 0; j < t.d2; ++j) t.qq[j * kQS + i] = 0;
      continue;
    }
    const float* src = c.q + (qa + i) * c.q_stride + hq * c.d;
    for (int t0 = 0; t0 < c.d; t0 += 32) {
      _mm512_store_si512(tmp, row_pairs(src + t0, c.d - t0, c.scale));
      const int n = std::min(16, t.d2 - t0 / 2);
      for (int j = 0; j < n; ++j) t.qq[(t0 / 2 + j) * kQS + i] = tmp[j];
    }
  }
}

// Keys [i0, i0 + nk) of rows, kv head hk, rounded into t.kk (rows up to a multiple of kR zero); the K
// rows of the next 16 keys are prefetched (rows a page or more apart defeat the hardware prefetcher), and
// with prefetch_v these keys' V rows, read after the scores.
TGT void pack_keys(const TileCtx& c, const KeyRows& rows, int64_t i0, int nk, int64_t hk, bool prefetch_v,
                   Bf16Tile& t) {
  for (int j = 0; j < nk; ++j) {
    if (prefetch_v) {
      const float* pv = c.v + rows[i0 + j] * c.kv_stride + hk * c.d;
      for (int x = 0; x < c.d; x += 16) __builtin_prefetch(pv + x);
    }
    if (i0 + j + 16 < rows.n) {
      const float* pf = c.k + rows[i0 + j + 16] * c.kv_stride + hk * c.d;
      for (int x = 0; x < c.d; x += 16) __builtin_prefetch(pf + x);
    }
    const float* src = c.k + rows[i0 + j] * c.kv_stride + hk * c.d;
    for (int t0 = 0; t0 < c.d; t0 += 32)
      _mm512_storeu_si512(t.kk + j * t.ks + t0 / 2, row_pairs(src + t0, c.d - t0, 1.0f));
  }
  const int nk4 = (nk + kR - 1) / kR * kR;
  std::fill(t.kk + nk * t.ks, t.kk + nk4 * t.ks, 0u);
}

// The bf16 pairs of keys [i0, i0 + nk) of rows, kv head hk, and their row stride: with staged keys
// (c.k16), a pointer into them where the rows are consecutive (the scores of the rounding up to kR rows,
// read past them, are never used, so only the staging's end needs care), else copied from them into
// t.kk; without, pack_keys (prefetch_v: its prefetch of the keys' V rows).
TGT const uint32_t* tile_keys(const TileCtx& c, const KeyRows& rows, int64_t i0, int nk, int64_t hk,
                              bool prefetch_v, Bf16Tile& t, int& ks) {
  const int nk4 = (nk + kR - 1) / kR * kR;
  ks = t.ks;
  if (c.k16 == nullptr) {
    pack_keys(c, rows, i0, nk, hk, prefetch_v, t);
    return t.kk;
  }
  const int d2 = c.d / 2;
  const uint32_t* base = c.k16 + hk * c.n_kv * d2;
  const int64_t r0 = rows[i0];
  if (rows[i0 + nk - 1] - r0 == nk - 1 && hk * c.n_kv + r0 + nk4 <= c.n_kv_heads * c.n_kv) {
    ks = d2;
    return base + r0 * d2;
  }
  for (int j = 0; j < nk; ++j) std::memcpy(t.kk + j * t.ks, base + rows[i0 + j] * d2, sizeof(uint32_t) * d2);
  std::fill(t.kk + nk * t.ks, t.kk + nk4 * t.ks, 0u);
  return t.kk;
}

// st[key][row] for KR keys (from kk) and NV vectors of rows (from qq).
template <int KR, int NV>
TGT inline void score_block(const uint32_t* qq, const uint32_t* kk, int ks, int d2, float* st) {
  __m512 acc[KR][NV];
  for (int r = 0; r < KR; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
  for (int j = 0; j < d2; ++j) {
    __m512i q[NV];
    for (int v = 0; v < NV; ++v) q[v] = _mm512_load_si512(qq + j * kQS + v * 16);
    for (int r = 0; r < KR; ++r) {
      const __m512i kb = _mm512_set1_epi32(static_cast<int>(kk[r * ks + j]));
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], (__m512bh)q[v], (__m512bh)kb);
    }
  }
  for (int r = 0; r < KR; ++r)
    for (int v = 0; v < NV; ++v) _mm512_store_ps(st + r * kQS + v * 16, acc[r][v]);
}

// Scores of every query vector against the first nk keys (rounded up to kR) of kk (row stride ks) into
// t.st; a group of query vectors stays in L1 while the keys stream past it.
template <int NV>
TGT inline void score_group(Bf16Tile& t, int v0, int nk4, const uint32_t* kk, int ks) {
  for (int j0 = 0; j0 < nk4; j0 += kR)
    score_block<kR, NV>(t.qq + v0 * 16, kk + j0 * ks, ks, t.d2, t.st + j0 * kQS + v0 * 16);
}
TGT void tile_scores(Bf16Tile& t, int nk, const uint32_t* kk, int ks) {
  const int nk4 = (nk + kR - 1) / kR * kR;
  int v0 = 0;
  for (; v0 + kNV <= t.nv; v0 += kNV) score_group<kNV>(t, v0, nk4, kk, ks);
  switch (t.nv - v0) {
    case 3:
      score_group<3>(t, v0, nk4, kk, ks);
      break;
    case 2:
      score_group<2>(t, v0, nk4, kk, ks);
      break;
    case 1:
      score_group<1>(t, v0, nk4, kk, ks);
      break;
    default:
      break;
  }
}

// acc[r][...] = acc * alpha[r] + sum over the listed key pairs x of pp[pairs[x]][r] . vrows[x][off + ...],
// for KR rows and NV vectors of head dimensions.
template <int NV>
TGT inline void pv_block(float* acc, int dp, const float* alpha, const uint32_t* pp,
                         const uint32_t* const* vrows, int off, const int* pairs, int n_pairs) {
  __m512 a[kR][NV];
  for (int r = 0; r < kR; ++r)
    for (int w = 0; w < NV; ++w)
      a[r][w] = _mm512_mul_ps(_mm512_load_ps(acc + r * dp + w * 16), _mm512_set1_ps(alpha[r]));
  for (int x = 0; x < n_pairs; ++x) {
    const int j = pairs[x];
    __m512i v[NV];
    for (int w = 0; w < NV; ++w) v[w] = _mm512_loadu_si512(vrows[x] + off + w * 16);
    for (int r = 0; r < kR; ++r) {
      const __m512i pb = _mm512_set1_epi32(static_cast<int>(pp[j * kQS + r]));
      for (int w = 0; w < NV; ++w) a[r][w] = _mm512_dpbf16_ps(a[r][w], (__m512bh)pb, (__m512bh)v[w]);
    }
  }
  for (int r = 0; r < kR; ++r)
    for (int w = 0; w < NV; ++w) _mm512_store_ps(acc + r * dp + w * 16, a[r][w]);
}
template <int NV>
TGT inline void pv_group(Bf16Tile& t, int w0, int nr, const uint32_t* const* vrows, const int* pairs,
                         int n_pairs) {
  for (int r0 = 0; r0 < nr; r0 += kR)
    pv_block<NV>(t.acc + r0 * t.vs + w0 * 16, t.vs, t.alpha + r0, t.pp + r0, vrows, w0 * 16, pairs, n_pairs);
}
TGT void tile_pv(Bf16Tile& t, int nr, const uint32_t* const* vrows, const int* pairs, int n_pairs) {
  const int nw = t.dp / 16;
  int w0 = 0;
  for (; w0 + kNV <= nw; w0 += kNV) pv_group<kNV>(t, w0, nr, vrows, pairs, n_pairs);
  switch (nw - w0) {
    case 3:
      pv_group<3>(t, w0, nr, vrows, pairs, n_pairs);
      break;
    case 2:
      pv_group<2>(t, w0, nr, vrows, pairs, n_pairs);
      break;
    case 1:
      pv_group<1>(t, w0, nr, vrows, pairs, n_pairs);
      break;
    default:
      break;
  }
}

TGT void init_tile(const TileCtx& c, int nq, Bf16Tile& t) {
  t.d2 = (c.d + 1) / 2;
  t.ks = (c.d + 31) / 32 * 16;
  t.dp = (c.d + 15) / 16 * 16;
  t.vs = t.dp + 16;
  t.nv = (nq + 15) / 16;
}

// Lanes of V row r, head hk, dimensions [t0, t0 + 16) as bf16 in the low half of each 32-bit lane: from
// the staged pair rows (base: the head's), or for an odd last row (past them) rounded from v.
TGT inline __m512i staged_half(const TileCtx& c, const uint32_t* base, int64_t np, int64_t r, int64_t hk,
                               int t0) {
  if (r / 2 < np) {
    const __m512i x = _mm512_loadu_si512(base + r / 2 * c.d + t0);
    return r % 2 == 0 ? _mm512_and_si512(x, _mm512_set1_epi32(0xffff)) : _mm512_srli_epi32(x, 16);
  }
  const __m512 f = _mm512_loadu_ps(c.v + r * c.kv_stride + hk * c.d + t0);
  return _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(f));
}

// The V pair row of keys rows[i] and rows[i + 1], interleaved per dimension, the half of a key not used
// (u0 / u1 false) zero: with staged values (c.v16), a pointer into them where the two keys are both used
// and one staged pair, else built into dst from the staged rows' halves; without, rounded into dst from
// v's f32 rows (dp: the padded head dim).
TGT const uint32_t* value_pair(const TileCtx& c, const KeyRows& rows, int64_t i, bool u0, bool u1, int64_t hk,
                               uint32_t* dst, int dp) {
  if (c.v16 != nullptr) {
    const int64_t np = c.n_kv / 2, r0 = rows[i], r1 = u1 ? rows[i + 1] : -1;
    const uint32_t* base = c.v16 + hk * np * c.d;
    if (u0 && u1 && r0 % 2 == 0 && r1 == r0 + 1 && r0 / 2 < np) return base + r0 / 2 * c.d;
    const __m512i zero = _mm512_setzero_si512();
    for (int t0 = 0; t0 < c.d; t0 += 16) {
      const __m512i lo = u0 ? staged_half(c, base, np, r0, hk, t0) : zero;
      const __m512i hi = u1 ? staged_half(c, base, np, r1, hk, t0) : zero;
      _mm512_store_si512(dst + t0, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
    }
    return dst;
  }
  const __m512 zero = _mm512_setzero_ps();
  const float* v0 = u0 ? c.v + rows[i] * c.kv_stride + hk * c.d : nullptr;
  const float* v1 = u1 ? c.v + rows[i + 1] * c.kv_stride + hk * c.d : nullptr;
  for (int t0 = 0; t0 < dp; t0 += 16) {
    const __mmask16 m = lanes(c.d - t0);
    const __m512 a = v0 != nullptr ? _mm512_maskz_loadu_ps(m, v0 + t0) : zero;
    const __m512 b = v1 != nullptr ? _mm512_maskz_loadu_ps(m, v1 + t0) : zero;
    _mm512_store_si512(dst + t0, interleave_bf16(a, b));
  }
  return dst;
}

TGT void attend_tile_impl(const TileCtx& c, const AttnParams& p, int64_t qa, int64_t qb, const KeyRows& rows,
                          int64_t hq, int64_t hk, void* out, DType out_dtype) {
  Bf16Tile t;  // about 770 KiB of stack (the f32 kernel's tiles: 600 KiB)
  const int nq = static_cast<int>(qb - qa);
  const int nr = (nq + kR - 1) / kR * kR;
  init_tile(c, nq, t);
  pack_queries(c, qa, nq, hq, t);
  const auto [qmin, qmax] = position_span(p.q_pos, qa, nq);
  for (int i = 0; i < t.nv * 16; ++i) {
    t.m[i] = kNegInf;
    t.l[i] = 0.0f;
  }
  std::fill(t.acc, t.acc + nr * t.vs, 0.0f);
  const __m512 ninf = _mm512_set1_ps(kNegInf), zero = _mm512_setzero_ps();
  int pairs[kBK / 2];
  const uint32_t* vrows[kBK / 2];
  for (int64_t i0 = 0; i0 < rows.n; i0 += kBK) {
    const int nk = static_cast<int>(std::min<int64_t>(kBK, rows.n - i0));
    const TileMask tm = tile_mask(p, rows, i0, nk, qmin, qmax);  // as in the f32 kernel
    if (tm == TileMask::Skip) continue;
    const bool mask_elems = tm == TileMask::PerElement;
    int ks = 0;
    const uint32_t* kk = tile_keys(c, rows, i0, nk, hk, true, t, ks);
    tile_scores(t, nk, kk, ks);
    if (mask_elems) {
      for (int j = 0; j < nk; ++j) {
        const int32_t kp = p.k_pos[rows[i0 + j]];
        for (int i = 0; i < nq; ++i)
          if (!visible(p.mask, p.block_size, p.q_pos[qa + i], kp, p.window)) t.st[j * kQS + i] = kNegInf;
      }
    }
    // Online softmax down the keys, 16 rows at a time, the probabilities of each key pair interleaved
    // into t.pp as they are made. A key is used iff some row of the tile gives it a weight > 0: in a
    // tile no mask cuts, every key (an unused one would be weighed 0, and its V is a computed row).
    uint8_t used[kBK + 2];
    std::fill(used, used + nk + 2, static_cast<uint8_t>(mask_elems ? 0 : 1));
    used[nk] = used[nk + 1] = 0;
    const int nk2 = (nk + 1) / 2;
    for (int v = 0; v < t.nv; ++v) {
      const __mmask16 real = lanes(nq - v * 16);
      const float* sv = t.st + v * 16;
      __m512 mx = ninf;
      for (int j = 0; j < nk; ++j) mx = _mm512_max_ps(_mm512_load_ps(sv + j * kQS), mx);
      const __m512 m = _mm512_load_ps(t.m + v * 16), mnew = _mm512_max_ps(m, mx);
      const __m512 msub = _mm512_mask_mov_ps(mnew, _mm512_cmp_ps_mask(mnew, ninf, _CMP_EQ_OQ), zero);
      const __m512 alpha = exp_neg16(_mm512_sub_ps(m, msub));
      __m512 sum = zero;
      for (int jp = 0; jp < nk2; ++jp) {
        const int j = 2 * jp;
        const __m512 e0 = exp_neg16(_mm512_sub_ps(_mm512_load_ps(sv + j * kQS), msub));
        const __m512 e1 =
            j + 1 < nk ? exp_neg16(_mm512_sub_ps(_mm512_load_ps(sv + (j + 1) * kQS), msub)) : zero;
        sum = _mm512_add_ps(sum, _mm512_add_ps(e0, e1));
        _mm512_store_si512(t.pp + jp * kQS + v * 16, interleave_bf16(e0, e1));
        if (mask_elems) {
          used[j] |= _mm512_mask_cmp_ps_mask(real, e0, zero, _CMP_GT_OQ) != 0 ? 1 : 0;
          used[j + 1] |= _mm512_mask_cmp_ps_mask(real, e1, zero, _CMP_GT_OQ) != 0 ? 1 : 0;
        }
      }
      _mm512_store_ps(t.l + v * 16, _mm512_fmadd_ps(_mm512_load_ps(t.l + v * 16), alpha, sum));
      _mm512_store_ps(t.m + v * 16, mnew);
      _mm512_store_ps(t.alpha + v * 16, alpha);
    }
    // The used key pairs' V rows (an unused key's V is never read: zeros stand in), interleaved by pairs.
    int n_pairs = 0;
    for (int jp = 0; jp < nk2; ++jp) {
      if ((used[2 * jp] | used[2 * jp + 1]) == 0) continue;
      vrows[n_pairs] = value_pair(c, rows, i0 + 2 * jp, used[2 * jp] != 0, used[2 * jp + 1] != 0, hk,
                                  t.vv + jp * t.vs, t.dp);
      pairs[n_pairs++] = jp;
    }
    tile_pv(t, nr, vrows, pairs, n_pairs);
  }
  for (int i = 0; i < nq; ++i) {
    const float inv = t.l[i] > 0.0f ? 1.0f / t.l[i] : 0.0f;
    const int64_t off = (qa + i) * c.q_stride + hq * c.d;
    const float* ai = t.acc + i * t.vs;
    if (out_dtype == DType::F32) {
      float* o = static_cast<float*>(out) + off;
      for (int x = 0; x < c.d; ++x) o[x] = ai[x] * inv;
    } else {
      auto* o = static_cast<uint16_t*>(out) + off;
      for (int x = 0; x < c.d; ++x) o[x] = f32_to_bf16(ai[x] * inv);
    }
  }
}

// block_importance (attention.cpp) on bf16 scores: two passes over the keys (row max and sum, then
// the probabilities), the probabilities of one query block's rows summed lane-wise over the keys of a
// key block and reduced across lanes once per (query block, key block, vector).
TGT void block_importance_impl(const TileCtx& c, int64_t r0, int64_t r1, int64_t n_keys, int64_t hq,
                               int64_t hk, int64_t q_block, int64_t block, int64_t n_kb, double* imp) {
  Bf16Tile t;
  const KeyRows rows{0, n_keys, nullptr};
  const __m512 ninf = _mm512_set1_ps(kNegInf), zero = _mm512_setzero_ps();
  struct Segment {
    int v;
    __mmask16 lanes;
    int64_t qblock;
  };
  Segment segs[2 * kBQ];
  for (int64_t a = r0; a < r1; a += kBQ) {
    const int nq = static_cast<int>(std::min<int64_t>(kBQ, r1 - a));
    init_tile(c, nq, t);
    pack_queries(c, a, nq, hq, t);
    for (int i = 0; i < t.nv * 16; ++i) {
      t.m[i] = kNegInf;
      t.l[i] = 0.0f;
    }
    int n_segs = 0;  // the rows of each query block, split by vector
    for (int i0 = 0; i0 < nq;) {
      const int64_t qblock = (a + i0 - r0) / q_block;
      const int i1 = static_cast<int>(std::min<int64_t>(nq, r0 + (qblock + 1) * q_block - a));
      for (int v = i0 / 16; v * 16 < i1; ++v) {
        const int lo = std::max(i0, v * 16) - v * 16, hi = std::min(i1, v * 16 + 16) - v * 16;
        segs[n_segs++] = {v, static_cast<__mmask16>(lanes(hi) & ~lanes(lo)), qblock};
      }
      i0 = i1;
    }
    for (int pass = 0; pass < 2; ++pass) {
      for (int64_t k0 = 0; k0 < n_keys; k0 += kBK) {
        const int nk = static_cast<int>(std::min<int64_t>(kBK, n_keys - k0));
        int ks = 0;
        const uint32_t* kk = tile_keys(c, rows, k0, nk, hk, false, t, ks);
        tile_scores(t, nk, kk, ks);
        if (pass == 0) {
          for (int v = 0; v < t.nv; ++v) {
            const float* sv = t.st + v * 16;
            __m512 mx = ninf;
            for (int j = 0; j < nk; ++j) mx = _mm512_max_ps(_mm512_load_ps(sv + j * kQS), mx);
            const __m512 m = _mm512_load_ps(t.m + v * 16), mnew = _mm512_max_ps(m, mx);
            const __m512 msub = _mm512_mask_mov_ps(mnew, _mm512_cmp_ps_mask(mnew, ninf, _CMP_EQ_OQ), zero);
            __m512 sum = zero;
            for (int j = 0; j < nk; ++j)
              sum = _mm512_add_ps(sum, exp_neg16(_mm512_sub_ps(_mm512_load_ps(sv + j * kQS), msub)));
            const __m512 l = _mm512_load_ps(t.l + v * 16);
            _mm512_store_ps(t.l + v * 16, _mm512_fmadd_ps(l, exp_neg16(_mm512_sub_ps(m, msub)), sum));
            _mm512_store_ps(t.m + v * 16, mnew);
          }
          continue;
        }
        for (int s = 0; s < n_segs; ++s) {
          const Segment& g = segs[s];
          const float* sv = t.st + g.v * 16;
          const __m512 m = _mm512_load_ps(t.m + g.v * 16);
          const __m512 inv = _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_load_ps(t.l + g.v * 16));
          double* dst = imp + g.qblock * n_kb;
          for (int j = 0; j < nk;) {  // the keys of one key block at a time
            const int64_t kb = (k0 + j) / block;
            const int j1 = static_cast<int>(std::min<int64_t>(nk, (kb + 1) * block - k0));
            __m512 col = zero;
            for (; j < j1; ++j)
              col = _mm512_fmadd_ps(exp_neg16(_mm512_sub_ps(_mm512_load_ps(sv + j * kQS), m)), inv, col);
            dst[kb] += _mm512_mask_reduce_add_ps(g.lanes, col);
          }
        }
      }
    }
  }
}

// Rows [r0, r1) (r0 even) of kv head h into the staging: their keys' pairs, and the value pairs that
// start in them.
TGT void stage_rows(const TileCtx& c, int64_t n_kv, int h, int64_t r0, int64_t r1, uint32_t* k16,
                    uint32_t* v16) {
  const int d2 = c.d / 2;
  for (int64_t r = r0; r < r1; ++r) {
    const float* src = c.k + r * c.kv_stride + h * c.d;
    uint32_t* dst = k16 + (h * n_kv + r) * d2;
    for (int t0 = 0; t0 < c.d; t0 += 32)
      _mm512_mask_storeu_epi32(dst + t0 / 2, lanes(d2 - t0 / 2), row_pairs(src + t0, c.d - t0, 1.0f));
  }
  const int64_t np = n_kv / 2;
  for (int64_t pr = r0 / 2; pr < std::min(r1 / 2, np); ++pr) {
    const float* a = c.v + 2 * pr * c.kv_stride + h * c.d;
    const float* b = a + c.kv_stride;
    uint32_t* dst = v16 + (h * np + pr) * c.d;
    for (int t0 = 0; t0 < c.d; t0 += 16)
      _mm512_storeu_si512(dst + t0, interleave_bf16(_mm512_loadu_ps(a + t0), _mm512_loadu_ps(b + t0)));
  }
}

}  // namespace

bool bf16_attention_supported() {
  static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                         __builtin_cpu_supports("avx512bf16");
  return ok;
}
void attend_tile_bf16(const TileCtx& c, const AttnParams& p, int64_t qa, int64_t qb, const KeyRows& rows,
                      int64_t hq, int64_t hk, void* out, DType out_dtype) {
  attend_tile_impl(c, p, qa, qb, rows, hq, hk, out, out_dtype);
}
void block_importance_bf16(const TileCtx& c, int64_t r0, int64_t r1, int64_t n_keys, int64_t hq, int64_t hk,
                           int64_t q_block, int64_t block, int64_t n_kb, double* imp) {
  block_importance_impl(c, r0, r1, n_keys, hq, hk, q_block, block, n_kb, imp);
}

void stage_kv_bf16(TileCtx& c, int64_t n_kv, int n_kv_heads, void* scratch) {
  auto* k16 = static_cast<uint32_t*>(scratch);
  uint32_t* v16 = k16 + n_kv * n_kv_heads * (c.d / 2);
  constexpr int64_t kRows = 64;  // even: a block's value pairs start in it
  const int64_t blocks = (n_kv + kRows - 1) / kRows;
#pragma omp parallel for collapse(2) schedule(static)
  for (int h = 0; h < n_kv_heads; ++h)
    for (int64_t b = 0; b < blocks; ++b)
      stage_rows(c, n_kv, h, b * kRows, std::min(n_kv, (b + 1) * kRows), k16, v16);
  c.k16 = k16;
  c.v16 = v16;
  c.n_kv = n_kv;
  c.n_kv_heads = n_kv_heads;
}

#else  // not x86-64: the f32 kernel only

bool bf16_attention_supported() {
  return false;
}
void attend_tile_bf16(const TileCtx&, const AttnParams&, int64_t, int64_t, const KeyRows&, int64_t, int64_t,
                      void*, DType) {
  fail("attention: the bf16 kernel needs an x86-64 CPU with AVX-512 BF16");
}
void block_importance_bf16(const TileCtx&, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                           int64_t, double*) {
  fail("sparse_select: the bf16 kernel needs an x86-64 CPU with AVX-512 BF16");
}
void stage_kv_bf16(TileCtx&, int64_t, int, void*) {
  fail("attention: the bf16 kernel needs an x86-64 CPU with AVX-512 BF16");
}

#endif

}  // namespace tessera::cpu
