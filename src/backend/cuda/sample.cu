// Unmasking on the device: one block per logits row turns [V] f32 logits into (token, confidence)
// exactly as the CPU reference (backend/cpu/sample.cpp) defines it; logits never leave the GPU.
// Filters (Dream top_p / top_k) find their cut value by a bitwise binary search over the ordered
// bit patterns of the row's values (32 counting passes, no sort, no scratch memory).
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/op_checks.h"

namespace tessera::cuda {
namespace {

constexpr int kT = 512;

struct Row {
  const float* L;
  int64_t V;
  int64_t suppress;
  float t;
  bool scale;
  __device__ float operator()(int64_t v) const {
    if (v == suppress) return -INFINITY;
    return scale ? L[v] / t : L[v];
  }
};

// Monotone map float -> uint32 (larger float, larger key).
__device__ __forceinline__ uint32_t fkey(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float fval(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

struct Top2 {
  float m1, m2;
  int64_t arg;
};
struct Top2Op {
  __device__ Top2 operator()(const Top2& a, const Top2& b) const {
    Top2 r;
    if (b.m1 > a.m1 || (b.m1 == a.m1 && b.arg >= 0 && (a.arg < 0 || b.arg < a.arg))) {
      r.m1 = b.m1;
      r.arg = b.arg;
    } else {
      r.m1 = a.m1;
      r.arg = a.arg;
    }
    r.m2 = fmaxf(fminf(a.m1, b.m1), fmaxf(a.m2, b.m2));
    return r;
  }
};
struct ArgMaxD {
  double v;
  int64_t i;
};
struct ArgMaxDOp {
  __device__ ArgMaxD operator()(const ArgMaxD& a, const ArgMaxD& b) const {
    if (b.i < 0) return a;
    if (a.i < 0) return b;
    if (b.v > a.v || (b.v == a.v && b.i < a.i)) return b;
    return a;
  }
};

struct MinOp {
  __device__ int64_t operator()(int64_t a, int64_t b) const { return a < b ? a : b; }
};
struct MaxOp {
  __device__ int64_t operator()(int64_t a, int64_t b) const { return a > b ? a : b; }
};

union SampleSmem {
  cub::BlockReduce<double, kT>::TempStorage rd;
  cub::BlockReduce<int64_t, kT>::TempStorage ri;
  cub::BlockReduce<Top2, kT>::TempStorage r2;
  cub::BlockReduce<ArgMaxD, kT>::TempStorage ra;
  cub::BlockScan<double, kT>::TempStorage scan;
};

// Block-wide sum (result broadcast to every thread).
__device__ double block_sum(SampleSmem& sm, double v, double* bc) {
  const double s = cub::BlockReduce<double, kT>(sm.rd).Sum(v);
  if (threadIdx.x == 0) *bc = s;
  __syncthreads();
  const double r = *bc;
  __syncthreads();
  return r;
}
// Block-wide best (value, index) by ArgMaxDOp (larger value, ties to the lower index; i < 0: none),
// broadcast to every thread.
__device__ ArgMaxD block_argmax(SampleSmem& sm, ArgMaxD v, ArgMaxD* bc) {
  const ArgMaxD b = cub::BlockReduce<ArgMaxD, kT>(sm.ra).Reduce(v, ArgMaxDOp());
  if (threadIdx.x == 0) *bc = b;
  __syncthreads();
  const ArgMaxD r = *bc;
  __syncthreads();
  return r;
}
__device__ int64_t block_count(SampleSmem& sm, int64_t v, int64_t* bc) {
  const int64_t s = cub::BlockReduce<int64_t, kT>(sm.ri).Sum(v);
  if (threadIdx.x == 0) *bc = s;
  __syncthreads();
  const int64_t r = *bc;
  __syncthreads();
  return r;
}

__global__ void __launch_bounds__(kT) sample_kernel(const float* logits, int64_t V, const int32_t* keys,
                                                    SampleParams p, int32_t* tok, float* conf) {
  __shared__ SampleSmem sm;
  __shared__ double bc_d;
  __shared__ int64_t bc_i;
  __shared__ Top2 bc_t;
  const int64_t r = blockIdx.x;
  const uint64_t key = static_cast<uint64_t>(static_cast<int64_t>(keys[r]));
  Row x{logits + r * V, V, (p.suppress_token >= 0 && p.suppress_token < V) ? p.suppress_token : -1, 1.0f,
        false};
  if (!p.gumbel && p.temperature > 0.0f) {
    x.scale = true;
    x.t = p.temperature;
  }
  float cut = -INFINITY;
  if (!p.gumbel && (p.top_p < 1.0f || (p.top_k > 0 && p.top_k < V))) {
    // Row maximum and normaliser over everything (top_p masses are relative to the whole row).
    float m = -INFINITY;
    for (int64_t v = threadIdx.x; v < V; v += kT) m = fmaxf(m, x(v));
    Top2 t0{m, -INFINITY, 0};
    const Top2 mm = cub::BlockReduce<Top2, kT>(sm.r2).Reduce(t0, Top2Op());
    if (threadIdx.x == 0) bc_t = mm;
    __syncthreads();
    const float rowmax = bc_t.m1;
    __syncthreads();
    if (p.top_p < 1.0f && rowmax != -INFINITY) {
      double z = 0.0;
      for (int64_t v = threadIdx.x; v < V; v += kT) z += exp(static_cast<double>(x(v)) - rowmax);
      z = block_sum(sm, z, &bc_d);
      // Largest key K whose mass(x >= K) exceeds top_p: K is the cut value itself.
      uint32_t K = 0;
      for (int bit = 31; bit >= 0; --bit) {
        const uint32_t cand = K | (1u << bit);
        double mass = 0.0;
        for (int64_t v = threadIdx.x; v < V; v += kT) {
          const float a = x(v);
          if (fkey(a) >= cand) mass += exp(static_cast<double>(a) - rowmax);
        }
        mass = block_sum(sm, mass, &bc_d) / z;
        if (mass > p.top_p) K = cand;
      }
      cut = K == 0 ? -INFINITY : fval(K);  // K == 0: the whole row is <= top_p (rounding): keep all
    }
    if (p.top_k > 0 && p.top_k < V) {
      // k-th largest value: largest K with count(x >= K) >= top_k.
      uint32_t K = 0;
      for (int bit = 31; bit >= 0; --bit) {
        const uint32_t cand = K | (1u << bit);
        int64_t n = 0;
        for (int64_t v = threadIdx.x; v < V; v += kT) n += fkey(x(v)) >= cand ? 1 : 0;
        if (block_count(sm, n, &bc_i) >= p.top_k) K = cand;
      }
      cut = fmaxf(cut, fval(K));
    }
  }
  // Statistics over the kept tokens.
  Top2 st{-INFINITY, -INFINITY, -1};
  for (int64_t v = threadIdx.x; v < V; v += kT) {
    const float a = x(v);
    if (a == -INFINITY || a < cut) continue;
    if (a > st.m1) {
      st.m2 = st.m1;
      st.m1 = a;
      st.arg = v;
    } else if (a > st.m2) {
      st.m2 = a;
    }
  }
  const Top2 s = cub::BlockReduce<Top2, kT>(sm.r2).Reduce(st, Top2Op());
  if (threadIdx.x == 0) bc_t = s;
  __syncthreads();
  const Top2 S = bc_t;
  __syncthreads();
  if (S.arg < 0) {
    if (threadIdx.x == 0) {
      tok[r] = 0;
      conf[r] = 0.0f;
    }
    return;
  }
  double z = 0.0;
  for (int64_t v = threadIdx.x; v < V; v += kT) {
    const float a = x(v);
    if (a == -INFINITY || a < cut) continue;
    z += exp(static_cast<double>(a) - S.m1);
  }
  z = block_sum(sm, z, &bc_d);

  int64_t x0 = S.arg;
  if (p.temperature > 0.0f) {
    if (p.gumbel) {
      ArgMaxD best{-INFINITY, -1};
      const double t = p.temperature;
      for (int64_t v = threadIdx.x; v < V; v += kT) {
        const float a = x(v);
        if (a == -INFINITY) continue;
        const double u = rng_uniform_dev(p.seed, key, static_cast<uint64_t>(v));
        const double g = static_cast<double>(a) - t * log(-log(u));
        if (g > best.v || best.i < 0) best = ArgMaxD{g, v};
      }
      const ArgMaxD b = cub::BlockReduce<ArgMaxD, kT>(sm.ra).Reduce(best, ArgMaxDOp());
      if (threadIdx.x == 0) bc_i = b.i;
      __syncthreads();
      x0 = bc_i;
      __syncthreads();
    } else {
      // Inverse CDF in ascending vocabulary order: the first v whose running mass exceeds target.
      const double target = rng_uniform_dev(p.seed, key, static_cast<uint64_t>(V)) * z;
      double before = 0.0;
      int64_t found = -1, last = -1;
      for (int64_t v0 = 0; v0 < V && found < 0; v0 += kT) {
        const int64_t v = v0 + threadIdx.x;
        double e = 0.0;
        if (v < V) {
          const float a = x(v);
          if (a != -INFINITY && a >= cut) {
            e = exp(static_cast<double>(a) - S.m1);
            last = v;
          }
        }
        double incl;
        double total;
        cub::BlockScan<double, kT>(sm.scan).InclusiveSum(e, incl, total);
        __syncthreads();
        const int64_t mine = (e > 0.0 && before + incl > target) ? v : INT64_MAX;
        const int64_t first = cub::BlockReduce<int64_t, kT>(sm.ri).Reduce(mine, MinOp());
        if (threadIdx.x == 0) bc_i = first;
        __syncthreads();
        if (bc_i != INT64_MAX) found = bc_i;
        __syncthreads();
        before += total;
      }
      if (found < 0) {  // rounding at the very end of the CDF: the last kept token
        const int64_t l = cub::BlockReduce<int64_t, kT>(sm.ri).Reduce(last, MaxOp());
        if (threadIdx.x == 0) bc_i = l;
        __syncthreads();
        found = bc_i;
        __syncthreads();
      }
      x0 = found;
    }
  }
  float c = 0.0f;
  switch (p.conf) {
    case ConfKind::Prob:
      c = static_cast<float>(exp(static_cast<double>(x(x0)) - S.m1) / z);
      break;
    case ConfKind::Margin: {
      const double p2 = S.m2 == -INFINITY ? 0.0 : exp(static_cast<double>(S.m2) - S.m1) / z;
      c = static_cast<float>(1.0 / z - p2);
      break;
    }
    case ConfKind::NegEntropy: {
      double h = 0.0;
      for (int64_t v = threadIdx.x; v < V; v += kT) {
        const float a = x(v);
        if (a == -INFINITY || a < cut) continue;
        const double pv = exp(static_cast<double>(a) - S.m1) / z;
        h += pv * log(pv + 1e-10);
      }
      c = static_cast<float>(block_sum(sm, h, &bc_d));
      break;
    }
    case ConfKind::Random:
      c = static_cast<float>(rng_uniform_dev(p.seed, key, static_cast<uint64_t>(V) + 1));
      break;
  }
  if (threadIdx.x == 0) {
    tok[r] = static_cast<int32_t>(x0);
    conf[r] = c;
  }
}

__global__ void __launch_bounds__(kT)
    logprob_kernel(const float* logits, int64_t V, const int32_t* target, float* out) {
  __shared__ SampleSmem sm;
  __shared__ double bc_d;
  __shared__ Top2 bc_t;
  const int64_t r = blockIdx.x;
  const float* row = logits + r * V;
  float m = -INFINITY;
  for (int64_t v = threadIdx.x; v < V; v += kT) m = fmaxf(m, row[v]);
  const Top2 mm = cub::BlockReduce<Top2, kT>(sm.r2).Reduce(Top2{m, -INFINITY, 0}, Top2Op());
  if (threadIdx.x == 0) bc_t = mm;
  __syncthreads();
  const float mx = bc_t.m1;
  __syncthreads();
  double z = 0.0;
  for (int64_t v = threadIdx.x; v < V; v += kT) z += exp(static_cast<double>(row[v]) - mx);
  z = block_sum(sm, z, &bc_d);
  if (threadIdx.x == 0) {
    const int64_t t = target[r];
    out[r] = (t < 0 || t >= V) ? __int_as_float(0x7fc00000)
                               : static_cast<float>(static_cast<double>(row[t]) - mx - log(z));
  }
}

// One block per row: K passes of a block-wide argmax, each over the values ordered after the previous
// pick (value descending, then id ascending), so ties go to the lower id as on the CPU. K <= 20 passes
// over a row that stays in L2; the log-probabilities are those of logprob_kernel.
__global__ void __launch_bounds__(kT)
    top_logprobs_kernel(const float* logits, int64_t V, int K, const int32_t* token, float* chosen,
                        int32_t* ids, float* lps) {
  __shared__ SampleSmem sm;
  __shared__ double bc_d;
  __shared__ ArgMaxD bc_a;
  const int64_t r = blockIdx.x;
  const float* row = logits + r * V;
  double mx = 0.0, log_z = 0.0;
  double prev_v = INFINITY;
  int64_t prev_i = -1;
  for (int k = 0; k < K; ++k) {
    ArgMaxD best{-INFINITY, -1};
    if (k == 0 || prev_i >= 0) {
      for (int64_t v = threadIdx.x; v < V; v += kT) {
        const double x = row[v];
        if (isnan(x) || !(x < prev_v || (x == prev_v && v > prev_i))) continue;
        if (best.i < 0 || x > best.v) best = ArgMaxD{x, v};  // ascending v: ties keep the lower id
      }
    }
    best = cub::BlockReduce<ArgMaxD, kT>(sm.ra).Reduce(best, ArgMaxDOp());
    if (threadIdx.x == 0) bc_a = best;
    __syncthreads();
    best = bc_a;
    __syncthreads();
    if (k == 0) {  // the row maximum (NaN ignored, as fmaxf does in logprob_kernel), then log(z)
      mx = best.i >= 0 ? best.v : -INFINITY;
      double z = 0.0;
      for (int64_t v = threadIdx.x; v < V; v += kT) z += exp(static_cast<double>(row[v]) - mx);
      log_z = log(block_sum(sm, z, &bc_d));
      if (threadIdx.x == 0) {
        const int64_t t = token[r];
        chosen[r] = (t < 0 || t >= V) ? __int_as_float(0x7fc00000)
                                      : static_cast<float>(static_cast<double>(row[t]) - mx - log_z);
      }
    }
    if (threadIdx.x == 0) {
      ids[r * K + k] = best.i >= 0 ? static_cast<int32_t>(best.i) : -1;
      lps[r * K + k] = best.i >= 0 ? static_cast<float>(best.v - mx - log_z) : __int_as_float(0x7fc00000);
    }
    prev_v = best.v;
    prev_i = best.i;
  }
}

// Uniform-noise diffusion's sampler statistics (Backend::canvas_sample), one block per row: the argmax; the
// Gumbel-max sample at T drawn only where a token can still win (L_v + 37.5 T below the argmax's own
// perturbed value: -log(-log U) <= 37.43 for every U of the RNG, so the skip is exact, as on the CPU, whose
// counter RNG in f64 this draws: both backends sample the same tokens); the entropy of softmax(L / T) in f64.
__global__ void __launch_bounds__(kT)
    canvas_sample_kernel(const float* logits, int64_t V, const int32_t* keys, double T, uint64_t seed,
                         int32_t* token, int32_t* argmax, float* entropy) {
  __shared__ SampleSmem sm;
  __shared__ double bc_d;
  __shared__ ArgMaxD bc_a;
  const int64_t r = blockIdx.x;
  const float* L = logits + r * V;
  const auto key = static_cast<uint64_t>(static_cast<uint32_t>(keys[r]));
  ArgMaxD best{-INFINITY, -1};  // each thread's first index wins its ties; a row of -inf takes index 0
  for (int64_t v = threadIdx.x; v < V; v += kT)
    if (L[v] > best.v || best.i < 0) best = ArgMaxD{L[v], v};
  best = block_argmax(sm, best, &bc_a);
  const int64_t best_i = best.i >= 0 ? best.i : 0;
  auto gumbel = [&](int64_t v) {
    return static_cast<double>(L[v]) - T * log(-log(rng_uniform_dev(seed, key, static_cast<uint64_t>(v))));
  };
  const double bar = gumbel(best_i), reach = 37.5 * T;
  ArgMaxD g{-INFINITY, -1};
  for (int64_t v = threadIdx.x; v < V; v += kT) {
    if (static_cast<double>(L[v]) + reach < bar) continue;
    const double gv = gumbel(v);
    if (gv > g.v || g.i < 0) g = ArgMaxD{gv, v};
  }
  g = block_argmax(sm, g, &bc_a);
  const double mx = L[best_i];
  double z = 0.0, pz = 0.0;
  for (int64_t v = threadIdx.x; v < V; v += kT) {
    const double zi = (static_cast<double>(L[v]) - mx) / T;
    const double e = exp(zi);
    z += e;
    pz += e * zi;
  }
  z = block_sum(sm, z, &bc_d);
  pz = block_sum(sm, pz, &bc_d);
  if (threadIdx.x == 0) {
    token[r] = static_cast<int32_t>(g.i >= 0 ? g.i : best_i);
    argmax[r] = static_cast<int32_t>(best_i);
    entropy[r] = static_cast<float>(log(z) - pz / z);
  }
}

// soft_embed's first half, one block per row: probs[r, :] = softmax(L / T) (max in f32, the sum in f64, each
// value in f32) in the table's dtype, as the CPU kernel.
__global__ void __launch_bounds__(kT)
    softmax_rows_kernel(const float* logits, int64_t V, float inv_t, void* probs, bool bf16) {
  __shared__ SampleSmem sm;
  __shared__ double bc_d;
  __shared__ ArgMaxD bc_a;
  const int64_t r = blockIdx.x;
  const float* L = logits + r * V;
  ArgMaxD m{-INFINITY, -1};
  for (int64_t v = threadIdx.x; v < V; v += kT)
    if (L[v] * inv_t > m.v || m.i < 0) m = ArgMaxD{L[v] * inv_t, v};
  const auto mx = static_cast<float>(block_argmax(sm, m, &bc_a).v);
  double sum = 0.0;
  for (int64_t v = threadIdx.x; v < V; v += kT) sum += exp(static_cast<double>(L[v] * inv_t - mx));
  sum = block_sum(sm, sum, &bc_d);
  const auto inv = static_cast<float>(1.0 / sum);
  for (int64_t v = threadIdx.x; v < V; v += kT) {
    const float pv = expf(L[v] * inv_t - mx) * inv;
    if (bf16)
      static_cast<__nv_bfloat16*>(probs)[r * V + v] = float_to_bf16(pv);
    else
      static_cast<float*>(probs)[r * V + v] = pv;
  }
}

}  // namespace

void canvas_sample(const Tensor& logits, const Tensor& row_keys, const SampleParams& p, Tensor& token,
                   Tensor& argmax, Tensor& entropy, cudaStream_t s) {
  check_canvas_sample(logits, row_keys, p, token, argmax, entropy);
  const int64_t R = logits.rows();
  if (R == 0) return;
  canvas_sample_kernel<<<static_cast<unsigned>(R), kT, 0, s>>>(
      logits.as<const float>(), logits.cols(), row_keys.as<const int32_t>(),
      static_cast<double>(p.temperature), p.seed, token.as<int32_t>(), argmax.as<int32_t>(),
      entropy.as<float>());
  check_launch("canvas_sample");
}

void softmax_rows(const Tensor& logits, float temperature, Tensor& probs, cudaStream_t s) {
  const int64_t R = logits.rows();
  if (R == 0) return;
  softmax_rows_kernel<<<static_cast<unsigned>(R), kT, 0, s>>>(
      logits.as<const float>(), logits.cols(), 1.0f / temperature, probs.data, probs.dtype == DType::BF16);
  check_launch("soft_embed (softmax)");
}

void sample_rows(const Tensor& logits, const Tensor& row_keys, const SampleParams& p, Tensor& token,
                 Tensor& conf, cudaStream_t s) {
  check_sample_rows(logits, row_keys, token, conf);
  const int64_t R = logits.rows(), V = logits.cols();
  if (R == 0) return;
  sample_kernel<<<static_cast<unsigned>(R), kT, 0, s>>>(
      logits.as<const float>(), V, row_keys.as<const int32_t>(), p, token.as<int32_t>(), conf.as<float>());
  check_launch("sample_rows");
}

void token_logprob(const Tensor& logits, const Tensor& target, Tensor& logprob, cudaStream_t s) {
  check_token_logprob(logits, target, logprob);
  const int64_t R = logits.rows(), V = logits.cols();
  if (R == 0) return;
  logprob_kernel<<<static_cast<unsigned>(R), kT, 0, s>>>(logits.as<const float>(), V,
                                                         target.as<const int32_t>(), logprob.as<float>());
  check_launch("token_logprob");
}

void top_logprobs(const Tensor& logits, const Tensor& token, Tensor& chosen, Tensor& ids, Tensor& lp,
                  cudaStream_t s) {
  const int64_t R = logits.rows(), V = logits.cols(), K = check_top_logprobs(logits, token, chosen, ids, lp);
  if (R == 0) return;
  top_logprobs_kernel<<<static_cast<unsigned>(R), kT, 0, s>>>(
      logits.as<const float>(), V, static_cast<int>(K), token.as<const int32_t>(), chosen.as<float>(),
      ids.as<int32_t>(), lp.as<float>());
  check_launch("top_logprobs");
}

}  // namespace tessera::cuda
