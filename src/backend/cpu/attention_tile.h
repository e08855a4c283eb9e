// What the CPU attention drivers (attention.cpp) share with their tile kernels: the f32 kernel
// (attention.cpp, the reference) and the bf16 one (attention_bf16.cpp: bf16 operands, f32 accumulation,
// AVX-512 BF16, chosen at run time).
#pragma once
#include <algorithm>
#include <cstdint>
#include <limits>
#include <utility>

#include "backend/backend.h"

namespace tessera::cpu {

constexpr int kBQ = 128;  // query rows per tile
constexpr int kBK = 128;  // keys per tile
constexpr int kMaxD = 256;
// The bf16 kernel's dense query tiles may hold up to twice kBQ rows: each K / V row it gathers then
// serves twice the rows (those gathers, rows a page apart, are what it waits for most).
constexpr int kBQ2 = 2 * kBQ;

// window (AttnParams::window) applies to causal masks here; a bidirectional window is a key range, which
// the driver cuts (attention.cpp).
inline bool visible(MaskKind mask, int block, int32_t qp, int32_t kp, int window = 0) {
  switch (mask) {
    case MaskKind::None:
      return true;
    case MaskKind::Causal:
      return kp <= qp && (window == 0 || qp - kp < window);
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
  // K and V rounded to bf16 once per call, head-major (stage_kv_bf16), or nullptr: the bf16 tiles read
  // their keys and value pairs there instead of gathering and rounding k's and v's f32 rows per tile.
  // k16: [n_kv_heads][n_kv][d / 2] bf16 pairs; v16: [n_kv_heads][n_kv / 2][d], lane t of pair row i the
  // pair (v[2i][t], v[2i + 1][t]) (an odd last row is not staged).
  const uint32_t* k16 = nullptr;
  const uint32_t* v16 = nullptr;
  int64_t n_kv = 0;
  int n_kv_heads = 0;
};

// The keys one (query tile, head) visits, in order: the rows [ka, ka + n), or (block-sparse) the n rows
// of list, the concatenated key blocks that the tile's query block keeps.
struct KeyRows {
  int64_t ka = 0, n = 0;
  const int32_t* list = nullptr;
  int64_t operator[](int64_t i) const { return list != nullptr ? list[i] : ka + i; }
};

// The smallest and largest of the positions q_pos[qa, qa + nq) (a tile's queries); without positions
// (no mask) the empty span {INT32_MAX, INT32_MIN}.
inline std::pair<int32_t, int32_t> position_span(const int32_t* q_pos, int64_t qa, int nq) {
  int32_t qmin = std::numeric_limits<int32_t>::max(), qmax = std::numeric_limits<int32_t>::min();
  for (int i = 0; q_pos != nullptr && i < nq; ++i) {
    qmin = std::min(qmin, q_pos[qa + i]);
    qmax = std::max(qmax, q_pos[qa + i]);
  }
  return {qmin, qmax};
}

// How one key tile meets query positions [qmin, qmax] under the mask. Visibility is monotone in both
// positions, so a tile whose first key the last query cannot see is skipped, one whose last key the
// first query sees is wholly visible, and only the rest need the mask per element.
enum class TileMask { Skip, Whole, PerElement };
inline TileMask tile_mask(const AttnParams& p, const KeyRows& rows, int64_t i0, int nk, int32_t qmin,
                          int32_t qmax) {
  if (p.mask == MaskKind::None) return TileMask::Whole;
  int32_t kmin = std::numeric_limits<int32_t>::max(), kmax = std::numeric_limits<int32_t>::min();
  for (int j = 0; j < nk; ++j) {
    kmin = std::min(kmin, p.k_pos[rows[i0 + j]]);
    kmax = std::max(kmax, p.k_pos[rows[i0 + j]]);
  }
  if (p.mask == MaskKind::Causal && p.window > 0) {  // visible iff q - window < k <= q
    if (kmin > qmax || kmax <= qmin - p.window) return TileMask::Skip;
    return kmax <= qmin && kmin > qmax - p.window ? TileMask::Whole : TileMask::PerElement;
  }
  if (!visible(p.mask, p.block_size, qmax, kmin)) return TileMask::Skip;
  return visible(p.mask, p.block_size, qmin, kmax) ? TileMask::Whole : TileMask::PerElement;
}

// One (query tile, head): rows [qa, qb) of the query set (at most kBQ; the bf16 kernel's kBQ2) against
// the keys of rows, written
// to out (f32 or bf16) at the rows' head columns.
using AttendTileFn = void (*)(const TileCtx& c, const AttnParams& p, int64_t qa, int64_t qb,
                              const KeyRows& rows, int64_t hq, int64_t hk, void* out, DType out_dtype);
// Importance of every key block for query rows [r0, r1) (see block_importance in attention.cpp).
using BlockImportanceFn = void (*)(const TileCtx& c, int64_t r0, int64_t r1, int64_t n_keys, int64_t hq,
                                   int64_t hk, int64_t q_block, int64_t block, int64_t n_kb, double* imp);

// The bf16 kernels (attention_bf16.cpp): run them only where bf16_attention_supported().
bool bf16_attention_supported();
void attend_tile_bf16(const TileCtx& c, const AttnParams& p, int64_t qa, int64_t qb, const KeyRows& rows,
                      int64_t hq, int64_t hk, void* out, DType out_dtype);
void block_importance_bf16(const TileCtx& c, int64_t r0, int64_t r1, int64_t n_keys, int64_t hq, int64_t hk,
                           int64_t q_block, int64_t block, int64_t n_kb, double* imp);
// Stages k's and v's first n_kv rows in bf16 into scratch (attn_kv_scratch_bytes(n_kv, kv width) bytes)
// and points c.k16 / c.v16 there, for head dims that are a multiple of 16 up to kMaxD (the driver decides:
// attention_stages_kv). One parallel region. The tiles' results are the same bits either way.
void stage_kv_bf16(TileCtx& c, int64_t n_kv, int n_kv_heads, void* scratch);

}  // namespace tessera::cpu
