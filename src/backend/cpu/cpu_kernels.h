// CPU kernels behind CpuBackend (one file per op family). Each is also the reference for the CUDA
// backend's tests.
#pragma once
#include <array>
#include <vector>

#include "backend/backend.h"

namespace tessera::cpu {

class GemmEngine;  // oneDNN matmul primitives, cached per shape (gemm.cpp)

void embed(const Tensor& tokens, const Tensor& table, Tensor& out);
void rmsnorm(const Tensor& x, const Tensor& w, float eps, Tensor& y);
// The cosines and sines rope computed for one positions array and one set of frequencies, kept between
// calls (q and k of every layer rotate by the same positions): recomputed only when either changes.
struct RopeTable {
  std::vector<int32_t> pos;
  std::vector<float> inv_freq, cs, sn;  // cs, sn: [rows, rotary_dim / 2]
  float attn_factor = 0.0f;
};
void rope(Tensor& x, const Tensor& positions, int head_dim, const RopeParams& p, RopeTable* table = nullptr);
void swiglu(const Tensor& gate, const Tensor& up, Tensor& out);
// swiglu and geglu on the calling thread alone (inside a parallel region: the MoE FFN's items).
void swiglu_serial(const Tensor& gate, const Tensor& up, Tensor& out);
void geglu_serial(const Tensor& gate, const Tensor& up, Tensor& out);
// Uniform-noise diffusion (Backend: rmsnorm_ex, geglu, scale, softcap; canvas_sample and soft_embed are
// in uniform_ops.cpp).
void rmsnorm_ex(const Tensor& x, const Tensor* w, int64_t group, float eps, bool accumulate, Tensor& y);
void geglu(const Tensor& gate, const Tensor& up, Tensor& out);
void scale(Tensor& x, float s);
void softcap(Tensor& x, float cap);
void canvas_sample(const Tensor& logits, const Tensor& row_keys, const SampleParams& p, Tensor& token,
                   Tensor& argmax, Tensor& entropy);
void soft_embed(GemmEngine& gemm, const Tensor& logits, const Tensor& table, float temperature, float scale,
                Tensor& probs, Tensor& out);
void scatter_rows(const Tensor& src, const Tensor& rows, Tensor& dst);
void convert(const Tensor& src, Tensor& dst);
void gather_rows(const Tensor& src, const Tensor& rows, Tensor& dst);
// bf16: the tiles run on bf16 operands with f32 accumulation (AVX-512 BF16; attention_bf16.cpp), else
// in f32 (the reference). With p.kv_scratch, the bf16 kernel rounds K and V once into it (head-major)
// where some sequence has at least stage_min_tiles query tiles per head (each tile would gather and
// round its keys again; below that, measured, the staging costs more than it saves): the same bits.
constexpr int kStageMinTiles = 8;
// Whether that call stages K and V (head dims a multiple of 16 up to 256 only).
bool attention_stages_kv(const AttnParams& p, int n_heads, int head_dim, bool bf16,
                         int stage_min_tiles = kStageMinTiles);
void attention(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, int n_heads, int n_kv_heads,
               int head_dim, const AttnParams& p, bool bf16 = false, int stage_min_tiles = kStageMinTiles);
void sparse_select(const Tensor& q, const Tensor& k, int n_heads, int n_kv_heads, int head_dim,
                   const SparseSelectParams& p, uint8_t* mask, bool bf16 = false);
void moe_route(const Tensor& logits, const MoeRouteParams& p, Tensor& ids, Tensor& weights);
// The MoE FFN's state in a backend: its schedule and its list of (expert, first row, rows) items, kept
// between calls so that a steady call allocates nothing.
struct MoeState {
  CpuMoe schedule = CpuMoe::Auto;
  std::vector<std::array<int64_t, 3>> items;
};
CpuMoe resolve_cpu_moe(CpuMoe choice);  // Auto, with TESSERA_CPU_MOE applied
void moe_ffn(GemmEngine& gemm, MoeState& state, const Tensor& x, const Tensor& ids, const Tensor& weights,
             const MoeExperts& e, Tensor& scratch, Tensor& out);

}  // namespace tessera::cpu
