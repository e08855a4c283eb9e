// Tiled (flash-style) attention on the CPU: online softmax over key tiles, never the L x L matrix.
// Packed sequences, GQA, query subset vs key set by absolute positions, causal / block-causal.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

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

// exp(x) for x <= 0 (and -inf -> 0), vectorisable: 2^(x log2 e) with a degree-6 polynomial for
// the fraction (relative error < 2e-7 on the range attention uses).
inline float exp_neg(float x) {
  x = std::max(x, -87.0f);
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
  for (int64_t k0 = ka; k0 < kb; k0 += kBK) {
    const int nk = static_cast<int>(std::min<int64_t>(kBK, kb - k0));
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
      if (rowmax == -std::numeric_limits<float>::infinity()) continue;
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
