// Tiled (flash-style) attention on the CPU: online softmax over key tiles, never the L x L matrix.
// Packed sequences, GQA, query subset vs key set by absolute positions, causal / block-causal.
#include <algorithm>
#include <cmath>
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
    case MaskKind::None: return true;
    case MaskKind::Causal: return kp <= qp;
    case MaskKind::BlockCausal: return kp / block <= qp / block;
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

// One (query tile, head): rows [qa, qb) of the query set against keys [ka, kb).
void attend_tile(const TileCtx& c, const AttnParams& p, int64_t qa, int64_t qb, int64_t ka,
                 int64_t kb, int64_t hq, int64_t hk, void* out, DType out_dtype) {
  const int d = c.d;
  const int nq = static_cast<int>(qb - qa);
  alignas(64) float acc[kBQ][kMaxD];
  alignas(64) float s[kBQ][kBK];
  float m[kBQ], l[kBQ];
  int32_t qmax = std::numeric_limits<int32_t>::min();
  for (int i = 0; i < nq; ++i) {
    m[i] = -std::numeric_limits<float>::infinity();
    l[i] = 0.0f;
    std::fill(acc[i], acc[i] + d, 0.0f);
    qmax = std::max(qmax, p.q_pos[qa + i]);
  }
  for (int64_t k0 = ka; k0 < kb; k0 += kBK) {
    const int nk = static_cast<int>(std::min<int64_t>(kBK, kb - k0));
    if (p.mask != MaskKind::None) {  // skip tiles that no query of this tile can see
      int32_t kmin = std::numeric_limits<int32_t>::max();
      for (int j = 0; j < nk; ++j) kmin = std::min(kmin, p.k_pos[k0 + j]);
      if (!visible(p.mask, p.block_size, qmax, kmin)) continue;
    }
    for (int i = 0; i < nq; ++i) {
      const float* qi = c.q + (qa + i) * c.q_stride + hq * d;
      const int32_t qp = p.q_pos[qa + i];
      float rowmax = -std::numeric_limits<float>::infinity();
      for (int j = 0; j < nk; ++j) {
        const int32_t kp = p.k_pos[k0 + j];
        if (!visible(p.mask, p.block_size, qp, kp)) {
          s[i][j] = -std::numeric_limits<float>::infinity();
          continue;
        }
        const float* kj = c.k + (k0 + j) * c.kv_stride + hk * d;
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int t = 0; t < d; ++t) dot += qi[t] * kj[t];
        s[i][j] = dot * c.scale;
        rowmax = std::max(rowmax, s[i][j]);
      }
      if (rowmax == -std::numeric_limits<float>::infinity()) continue;
      const float mnew = std::max(m[i], rowmax);
      const float alpha = std::exp(m[i] - mnew);  // exp(-inf) = 0 on the first visible tile
      float sum = 0.0f;
      for (int j = 0; j < nk; ++j) {
        const float e = std::exp(s[i][j] - mnew);  // masked entries give 0
        s[i][j] = e;
        sum += e;
      }
      l[i] = l[i] * alpha + sum;
      m[i] = mnew;
      float* ai = acc[i];
#pragma omp simd
      for (int t = 0; t < d; ++t) ai[t] *= alpha;
      for (int j = 0; j < nk; ++j) {
        const float pj = s[i][j];
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

void attention(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, int n_heads,
               int n_kv_heads, int head_dim, const AttnParams& p) {
  TESSERA_CHECK(q.dtype == DType::F32 && k.dtype == DType::F32 && v.dtype == DType::F32,
                "attention (cpu): q, k, v must be f32");
  TESSERA_CHECK(out.dtype == DType::F32 || out.dtype == DType::BF16,
                "attention: output must be f32 or bf16");
  TESSERA_CHECK(head_dim <= kMaxD, "attention: head_dim above 256 is not supported");
  TESSERA_CHECK(n_heads % n_kv_heads == 0, "attention: n_heads must be a multiple of n_kv_heads");
  TESSERA_CHECK(q.cols() == int64_t{n_heads} * head_dim && k.cols() == int64_t{n_kv_heads} * head_dim,
                "attention: q/k widths do not match the head counts");
  TESSERA_CHECK(p.block_mask == nullptr, "attention (cpu): block-sparse patterns are not supported");
  const TileCtx c{q.as<const float>(), k.as<const float>(), v.as<const float>(), q.cols(), k.cols(),
                  head_dim, p.scale};
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
