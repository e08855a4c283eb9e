// What the CPU attention drivers (attention.cpp) share with their tile kernels: the f32 kernel
// (attention.cpp, the reference) and the bf16 one (attention_bf16.cpp: bf16 operands, f32 accumulation,
// AVX-512 BF16, chosen at run time).
#pragma once
#include <cstdint>

#include "backend/backend.h"

namespace tessera::cpu {

constexpr int kBQ = 128;  // query rows per tile
constexpr int kBK = 128;  // keys per tile
constexpr int kMaxD = 256;
// The bf16 kernel's dense query tiles may hold up to twice kBQ rows: each K / V row it gathers then
// serves twice the rows (those gathers, rows a page apart, are what it waits for most).
constexpr int kBQ2 = 2 * kBQ;

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
};

// The keys one (query tile, head) visits, in order: the rows [ka, ka + n), or (block-sparse) the n rows
// of list, the concatenated key blocks that the tile's query block keeps.
struct KeyRows {
  int64_t ka = 0, n = 0;
  const int32_t* list = nullptr;
  int64_t operator[](int64_t i) const { return list != nullptr ? list[i] : ka + i; }
};

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

}  // namespace tessera::cpu
