// Mixture-of-experts on the GPU: routing (one warp per token) and the expert FFN over the selected
// experts only: the (token, slot) pairs are bucketed by expert on the device, then three grouped
// GEMMs (gate, up: rows of x gathered by index inside the GEMM; down) run one launch each over all
// experts, and a combine kernel adds the weighted expert outputs to the residual in a fixed order
// (deterministic). Group sizes never leave the device.
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/op_checks.h"

namespace tessera::cuda {
namespace {

constexpr int kMaxPerLane = 16;  // up to 512 experts

struct RouteArgs {
  const float* logits;
  int64_t rows;
  int E, k;
  MoeRouteParams p;
  int32_t* ids;
  float* w;
  int64_t row0 = 0;             // first row routed (rows row0 .. row0 + rows - 1)
  const float* core = nullptr;  // DES: route inside the experts with core[e] != 0 (no groups)
};

// One warp per row; lane l owns experts l, l + 32, ...
__global__ void route_kernel(const RouteArgs a) {
  const int64_t rr = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (rr >= a.rows) return;
  const int64_t r = a.row0 + rr;
  const float* L = a.logits + r * a.E;
  float s[kMaxPerLane], b[kMaxPerLane];
  const int per = (a.E + 31) / 32;
  float mx = -INFINITY;
  for (int i = 0; i < per; ++i) {
    const int e = lane + 32 * i;
    s[i] = e < a.E ? L[e] : -INFINITY;
    mx = fmaxf(mx, s[i]);
  }
  if (a.p.score == MoeScore::Softmax) {
    mx = warp_max(mx);
    float sum = 0.0f;
    for (int i = 0; i < per; ++i) {
      s[i] = lane + 32 * i < a.E ? expf(s[i] - mx) : 0.0f;
      sum += s[i];
    }
    sum = warp_sum(sum);
    for (int i = 0; i < per; ++i) s[i] /= sum;
  } else {
    for (int i = 0; i < per; ++i) s[i] = lane + 32 * i < a.E ? 1.0f / (1.0f + expf(-s[i])) : 0.0f;
  }
  for (int i = 0; i < per; ++i) {
    const int e = lane + 32 * i;
    b[i] = e < a.E ? s[i] + (a.p.expert_bias != nullptr ? a.p.expert_bias[e] : 0.0f) : -INFINITY;
  }
  if (a.core != nullptr) {
    for (int i = 0; i < per; ++i) {
      const int e = lane + 32 * i;
      if (e < a.E && a.core[e] == 0.0f) b[i] = -INFINITY;
    }
  }
  // Grouped selection: keep the topk_group groups with the highest sum of their top-2 scores.
  if (a.p.n_group > 1 && a.core == nullptr) {
    const int gsize = a.E / a.p.n_group;
    unsigned long long kept = 0;  // bit g set: group g kept (n_group <= 64)
    for (int round = 0; round < a.p.topk_group; ++round) {
      float best = -INFINITY;
      int best_g = -1;
      for (int g = 0; g < a.p.n_group; ++g) {
        if (kept >> g & 1ull) continue;
        // top-2 of group g across the warp
        float t1 = -INFINITY, t2 = -INFINITY;
        for (int i = 0; i < per; ++i) {
          const int e = lane + 32 * i;
          if (e < a.E && e / gsize == g) {
            if (b[i] > t1) {
              t2 = t1;
              t1 = b[i];
            } else if (b[i] > t2) {
              t2 = b[i];
            }
          }
        }
        for (int o = 16; o > 0; o >>= 1) {
          const float u1 = __shfl_xor_sync(0xffffffffu, t1, o), u2 = __shfl_xor_sync(0xffffffffu, t2, o);
          const float n1 = fmaxf(t1, u1), n2 = fmaxf(fminf(t1, u1), fmaxf(t2, u2));
          t1 = n1;
          t2 = n2;
        }
        const float score = t1 + t2;
        if (score > best) {
          best = score;
          best_g = g;
        }
      }
      if (best_g >= 0) kept |= 1ull << best_g;
    }
    for (int i = 0; i < per; ++i) {
      const int e = lane + 32 * i;
      if (e < a.E && !(kept >> (e / gsize) & 1ull)) b[i] = -INFINITY;
    }
  }
  // top-k by biased score, ties to the lower expert index.
  float wsum = 0.0f;
  float wk[32];
  int ek[32];
  for (int j = 0; j < a.k; ++j) {
    float best = -INFINITY;
    int best_e = INT_MAX;
    for (int i = 0; i < per; ++i) {
      const int e = lane + 32 * i;
      if (e < a.E && (b[i] > best || (b[i] == best && e < best_e))) {
        best = b[i];
        best_e = e;
      }
    }
    for (int o = 16; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, o);
      const int oe = __shfl_xor_sync(0xffffffffu, best_e, o);
      if (ob > best || (ob == best && oe < best_e)) {
        best = ob;
        best_e = oe;
      }
    }
    // The owner lane removes it and publishes its unbiased score.
    float sw = 0.0f;
    for (int i = 0; i < per; ++i) {
      if (lane + 32 * i == best_e) {
        sw = s[i];
        b[i] = -INFINITY;
      }
    }
    sw = warp_sum(sw);  // exactly one lane contributes
    wk[j] = sw;
    ek[j] = best_e;
    wsum += sw;
  }
  if (lane == 0) {
    for (int j = 0; j < a.k; ++j) {
      float w = wk[j];
      if (a.p.norm_topk) w = w / (wsum + 1e-20f);
      a.ids[r * a.k + j] = ek[j];
      w *= a.p.scale;
      if (a.p.expert_scale != nullptr) w *= a.p.expert_scale[ek[j]];  // Gemma 4's per-expert scales
      a.w[r * a.k + j] = w;
    }
  }
}

// DES votes (MoeShare): one warp walks the voting rows in order (deterministic sums); per row the
// scores of its routed experts are recomputed from the logits, and lane j < top_k adds expert ids[j]
// (distinct within a row).
__global__ void des_vote_kernel(const float* logits, int E, int k, MoeRouteParams p, const int32_t* ids,
                                int64_t lo, int64_t hi, int seq_k, float* state) {
  const int lane = threadIdx.x;
  const int per = (E + 31) / 32;
  for (int64_t r = lo; r < hi; ++r) {
    const float* L = logits + r * E;
    float mx = -INFINITY, sum = 0.0f;
    if (p.score == MoeScore::Softmax) {
      for (int i = 0; i < per; ++i) {
        const int e = lane + 32 * i;
        if (e < E) mx = fmaxf(mx, L[e]);
      }
      mx = warp_max(mx);
      for (int i = 0; i < per; ++i) {
        const int e = lane + 32 * i;
        if (e < E) sum += expf(L[e] - mx);
      }
      sum = warp_sum(sum);
    }
    if (lane < k) {
      const int e = ids[r * k + lane];
      const float s = p.score == MoeScore::Softmax ? expf(L[e] - mx) / sum : 1.0f / (1.0f + expf(-L[e]));
      state[e] += s;
      if (lane < max(1, seq_k)) state[E + e] += 1.0f;  // the first expert always: marks a vote
    }
    __syncwarp();
  }
}

// The coreset (MoeShare) from the votes: one block, thread e per expert (E <= 512).
__global__ void des_core_kernel(int E, DesMode mode, int m_core, int top_k, float* state) {
  const int e = threadIdx.x;
  const float* V = state;
  const float* seq = state + E;
  float* core = state + 4 * E;
  const bool valid = e < E;
  const bool any = __syncthreads_or(valid && seq[e] > 0.0f) != 0;
  bool in = valid && (!any || mode == DesMode::Off || (mode == DesMode::Seq && seq[e] > 0.0f));
  if (any && mode == DesMode::Vote && valid && V[e] > 0.0f) {
    int rank = 0;  // experts ahead of e by (votes descending, lower id)
    for (int o = 0; o < E; ++o) rank += (V[o] > V[e] || (V[o] == V[e] && o < e)) ? 1 : 0;
    in = rank < m_core;
  }
  const int n = __syncthreads_count(in);
  if (valid) core[e] = in ? 1.0f : 0.0f;
  __syncthreads();
  if (n < top_k && valid && !in) {  // fill: the best experts outside C by (votes, lower id)
    int rank = 0;
    for (int o = 0; o < E; ++o) rank += (core[o] == 0.0f && (V[o] > V[e] || (V[o] == V[e] && o < e))) ? 1 : 0;
    in = rank < top_k - n;
  }
  __syncthreads();
  if (valid) core[e] = in ? 1.0f : 0.0f;
}

// hit / hit_vote flags of the routed (row, slot) pairs (benign races: every writer stores 1).
__global__ void des_hit_kernel(const int32_t* ids, int64_t pairs, int k, int E, int64_t vote_lo,
                               int64_t vote_hi, float* state) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= pairs) return;
  const int e = ids[i];
  const int64_t r = i / k;
  state[2 * E + e] = 1.0f;
  if (r >= vote_lo && r < vote_hi) state[3 * E + e] = 1.0f;
}

struct Layout {
  int32_t* offsets;     // [E + 1]
  int32_t* cursor;      // [E]
  int32_t* pair_token;  // [P]: token row of sorted pair position
  int32_t* pair_pos;    // [P]: sorted position of pair (m, j)
  void* gate;           // [P, F] act
  void* up;             // [P, F] act
  float* y;             // [P, D] f32
};

size_t align256(size_t v) {
  return (v + 255) / 256 * 256;
}

Layout carve(void* base, int64_t P, const MoeExperts& e) {
  auto* p = static_cast<char*>(base);
  Layout l{};
  size_t at = 0;
  auto take = [&](size_t bytes) {
    char* q = p + at;
    at += align256(bytes);
    return q;
  };
  const size_t es = dtype_size(e.dtype);
  l.offsets = reinterpret_cast<int32_t*>(take(static_cast<size_t>(e.n_experts + 1) * 4));
  l.cursor = reinterpret_cast<int32_t*>(take(static_cast<size_t>(e.n_experts) * 4));
  l.pair_token = reinterpret_cast<int32_t*>(take(static_cast<size_t>(P) * 4));
  l.pair_pos = reinterpret_cast<int32_t*>(take(static_cast<size_t>(P) * 4));
  l.gate = take(static_cast<size_t>(P * e.inter) * es);
  l.up = take(static_cast<size_t>(P * e.inter) * es);
  l.y = reinterpret_cast<float*>(take(static_cast<size_t>(P * e.hidden) * 4));
  return l;
}
size_t carve_bytes(int64_t P, const MoeExperts& e) {
  const size_t es = dtype_size(e.dtype);
  return align256(static_cast<size_t>(e.n_experts + 1) * 4) + align256(static_cast<size_t>(e.n_experts) * 4) +
         2 * align256(static_cast<size_t>(P) * 4) + 2 * align256(static_cast<size_t>(P * e.inter) * es) +
         align256(static_cast<size_t>(P * e.hidden) * 4);
}

// Pairs routed to experts [lo, hi) (this rank's: expert parallelism; else every expert) are bucketed;
// the others are skipped (another rank's expert, or an id out of range).
__global__ void count_kernel(const int32_t* ids, int64_t P, int lo, int hi, int32_t* counts) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < P) {
    const int e = ids[i];
    if (e >= lo && e < hi) atomicAdd(&counts[e], 1);
  }
}
// counts (in offsets[0..E)) -> exclusive offsets [E + 1]; cursor = 0. One thread: E is small.
__global__ void scan_kernel(int32_t* offsets, int32_t* cursor, int E) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  int32_t run = 0;
  for (int e = 0; e < E; ++e) {
    const int32_t c = offsets[e];
    offsets[e] = run;
    cursor[e] = 0;
    run += c;
  }
  offsets[E] = run;
}
__global__ void scatter_kernel(const int32_t* ids, int64_t P, int k, int lo, int hi, const int32_t* offsets,
                               int32_t* cursor, int32_t* pair_token, int32_t* pair_pos) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= P) return;
  const int e = ids[i];
  if (e < lo || e >= hi) {
    pair_pos[i] = -1;
    return;
  }
  const int32_t pos = offsets[e] + atomicAdd(&cursor[e], 1);
  pair_token[pos] = static_cast<int32_t>(i / k);
  pair_pos[i] = pos;
}
// out[m, c] (+)= sum_j w[m, j] * y[pair_pos[m, j], c], j in order (overwrite: = instead of +=).
__global__ void combine_kernel(const float* y, const int32_t* pair_pos, const float* w, int64_t M, int k,
                               int64_t D, float* out, bool overwrite) {
  const int64_t m = blockIdx.x;
  for (int64_t c = threadIdx.x; c < D; c += blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j < k; ++j) {
      const int32_t pos = pair_pos[m * k + j];
      if (pos >= 0) acc = fmaf(w[m * k + j], y[static_cast<int64_t>(pos) * D + c], acc);
    }
    if (overwrite)
      out[m * D + c] = acc;
    else
      out[m * D + c] += acc;
  }
}

}  // namespace

void moe_route(const Tensor& logits, const MoeRouteParams& p, Tensor& ids, Tensor& weights, cudaStream_t s) {
  // One warp per row: 32 lanes of kMaxPerLane experts, top_k of at most 32, at most 64 groups.
  check_moe_route(logits, p, ids, weights, MoeRouteLimits{32 * kMaxPerLane, 32, 64});
  const int64_t M = logits.rows();
  const int E = static_cast<int>(logits.cols());
  if (M == 0) return;
  RouteArgs a{logits.as<const float>(), M, E, p.top_k, p, ids.as<int32_t>(), weights.as<float>()};
  route_kernel<<<static_cast<unsigned>(ceil_div(M, 8)), 256, 0, s>>>(a);
  check_launch("moe_route");
  if (p.share == nullptr) return;
  const MoeShare& sh = *p.share;
  if (sh.vote && sh.vote_hi > sh.vote_lo) {
    des_vote_kernel<<<1, 32, 0, s>>>(a.logits, E, p.top_k, p, a.ids, sh.vote_lo, sh.vote_hi, sh.k, sh.state);
    check_launch("moe_route (DES votes)");
  }
  if (!sh.apply) return;
  des_core_kernel<<<1, static_cast<unsigned>(ceil_div(E, 32) * 32), 0, s>>>(E, sh.mode, sh.m_core, p.top_k,
                                                                            sh.state);
  check_launch("moe_route (DES coreset)");
  if (sh.mode != DesMode::Off && sh.share_hi > sh.share_lo) {
    a.row0 = sh.share_lo;
    a.rows = sh.share_hi - sh.share_lo;
    a.core = sh.state + 4 * E;
    route_kernel<<<static_cast<unsigned>(ceil_div(a.rows, 8)), 256, 0, s>>>(a);
    check_launch("moe_route (DES routing)");
  }
  const int64_t pairs = M * p.top_k;
  des_hit_kernel<<<static_cast<unsigned>(ceil_div(pairs, 256)), 256, 0, s>>>(
      a.ids, pairs, p.top_k, E, sh.vote_lo, sh.vote_hi, sh.state);
  check_launch("moe_route (DES hits)");
}

void moe_ffn(const Tensor& x, const Tensor& ids, const Tensor& weights, const MoeExperts& e, Tensor& scratch,
             Tensor& out, cudaStream_t s) {
  check_moe_ffn(x, ids, weights, e, scratch, out);
  const int64_t M = x.rows();
  if (M == 0) return;
  const int k = static_cast<int>(ids.numel() / M);
  const int64_t P = M * k;
  TESSERA_CHECK(scratch.nbytes() >= carve_bytes(P, e), "moe_ffn: scratch buffer too small");
  const Layout l = carve(scratch.data, P, e);
  const int E = e.n_experts;
  // Expert parallelism: only this rank's experts get rows, so the grouped GEMMs never read the other
  // experts' table entries (null: their weights were not kept); the sorted rows past the local pairs are
  // left as they are and never read (the combine skips the other ranks' pairs).
  const int lo = e.local_hi > 0 ? e.local_lo : 0, hi = e.local_hi > 0 ? e.local_hi : E;
  check(cudaMemsetAsync(l.offsets, 0, static_cast<size_t>(E + 1) * 4, s), "moe_ffn: clear counts");
  const auto pb = static_cast<unsigned>(ceil_div(P, 256));
  count_kernel<<<pb, 256, 0, s>>>(ids.as<const int32_t>(), P, lo, hi, l.offsets);
  scan_kernel<<<1, 32, 0, s>>>(l.offsets, l.cursor, E);
  scatter_kernel<<<pb, 256, 0, s>>>(ids.as<const int32_t>(), P, k, lo, hi, l.offsets, l.cursor, l.pair_token,
                                    l.pair_pos);
  check_launch("moe_ffn: bucketing");
  MmaProblem g;
  g.a = x.data;
  g.a_dtype = x.dtype;
  g.lda = e.hidden;
  g.a_rows = l.pair_token;
  g.w_table = e.table;
  g.w_dtype = e.dtype;
  g.group_offsets = l.offsets;
  g.groups = E;
  g.c = l.gate;
  g.c_dtype = e.dtype;
  g.ldc = e.inter;
  g.m = P;
  g.n = e.inter;
  g.k = e.hidden;
  mma_gemm(g, s);
  MmaProblem u = g;
  u.w_table = e.table + E;
  u.c = l.up;
  mma_gemm(u, s);
  Tensor gt(l.gate, e.dtype, {P, e.inter}, Device::CUDA);
  Tensor ut(l.up, e.dtype, {P, e.inter}, Device::CUDA);
  if (e.gelu)
    geglu(gt, ut, gt, s);
  else
    swiglu(gt, ut, gt, s);
  MmaProblem d;
  d.a = l.gate;
  d.a_dtype = e.dtype;
  d.lda = e.inter;
  d.w_table = e.table + 2 * E;
  d.w_dtype = e.dtype;
  d.group_offsets = l.offsets;
  d.groups = E;
  d.c = l.y;
  d.c_dtype = DType::F32;
  d.ldc = e.hidden;
  d.m = P;
  d.n = e.hidden;
  d.k = e.inter;
  mma_gemm(d, s);
  combine_kernel<<<static_cast<unsigned>(M), 256, 0, s>>>(l.y, l.pair_pos, weights.as<const float>(), M, k,
                                                          e.hidden, out.as<float>(), e.overwrite);
  check_launch("moe_ffn: combine");
}

}  // namespace tessera::cuda
