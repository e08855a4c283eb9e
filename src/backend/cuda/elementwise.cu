// Row-wise CUDA kernels: embedding lookup, RMSNorm (fused with the bf16 casts), RoPE, SwiGLU, row scatter.
// Semantics match the CPU kernels in backend/cpu/elementwise.cpp (their reference).
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/op_checks.h"

namespace tessera::cuda {
namespace {

int dtype_code(DType t) {
  return t == DType::F32 ? 0 : (t == DType::BF16 ? 1 : 2);
}

// One block per row. Out-of-range ids write NaN (the engine validates ids before a step; NaN makes
// a bypass visible instead of reading outside the table).
__global__ void embed_kernel(const int32_t* ids, const void* table, int tdt, int64_t v, int64_t d, void* out,
                             bool out_bf16) {
  const int64_t r = blockIdx.x;
  const int32_t id = ids[r];
  const bool ok = id >= 0 && id < v;
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
    const float x = ok ? load_any(table, tdt, static_cast<int64_t>(id) * d + c) : __int_as_float(0x7fc00000);
    if (out_bf16) {
      static_cast<__nv_bfloat16*>(out)[r * d + c] = float_to_bf16(x);
    } else {
      static_cast<float*>(out)[r * d + c] = x;
    }
  }
}

// One block of kRowThreads per row for wide rows (a model's hidden size; float4 words, 16-byte aligned,
// width a multiple of 4): the warp-per-row kernel above leaves most of the memory system idle there
// (ncu: 51 us for 1024 x 4096 on an H100, whose 24 MB move in about 8 us at the copy rate).
constexpr int kRowThreads = 256;
__global__ void rmsnorm_row_kernel(const float* x, const void* w, int wdt, int64_t group, float eps, void* y,
                                   bool y_bf16) {
  const int64_t r = blockIdx.x;
  const auto* xr = reinterpret_cast<const float4*>(x + r * group);
  const int64_t n4 = group / 4;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < n4; i += kRowThreads) {
    const float4 v = xr[i];
    ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
  }
  __shared__ float part[kRowThreads / 32];
  ss = warp_sum(ss);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = ss;
  __syncthreads();
  if (threadIdx.x < 32) {
    ss = warp_sum(threadIdx.x < kRowThreads / 32 ? part[threadIdx.x] : 0.0f);
    if (threadIdx.x == 0) part[0] = ss;
  }
  __syncthreads();
  const float inv = 1.0f / sqrtf(part[0] / static_cast<float>(group) + eps);
  for (int64_t i = threadIdx.x; i < n4; i += kRowThreads) {
    const float4 v = xr[i];
    const float w0 = load_any(w, wdt, 4 * i), w1 = load_any(w, wdt, 4 * i + 1),
                w2 = load_any(w, wdt, 4 * i + 2), w3 = load_any(w, wdt, 4 * i + 3);
    if (y_bf16) {
      auto* o = reinterpret_cast<__nv_bfloat162*>(static_cast<__nv_bfloat16*>(y) + r * group + 4 * i);
      o[0] = __floats2bfloat162_rn(round_bf16_dev(v.x * inv) * w0, round_bf16_dev(v.y * inv) * w1);
      o[1] = __floats2bfloat162_rn(round_bf16_dev(v.z * inv) * w2, round_bf16_dev(v.w * inv) * w3);
    } else {
      reinterpret_cast<float4*>(static_cast<float*>(y) + r * group)[i] =
          make_float4(v.x * inv * w0, v.y * inv * w1, v.z * inv * w2, v.w * inv * w3);
    }
  }
}

// A rope op's per-pair inverse frequencies (rope_inv_freq, computed on the host: the same f32 values
// as the CPU backend's) and scales, passed by value.
struct RopeTable {
  float inv_freq[256];
  float attn_factor, pos_beta;
  int pos_orig;
};

__device__ __forceinline__ float rope_row_scale(const RopeTable& t, int32_t pos) {
  if (t.pos_beta <= 0.0f) return 1.0f;
  return 1.0f + t.pos_beta * logf(1.0f + static_cast<float>(pos / t.pos_orig));
}

// One block per row: the row's cos / sin are computed once into shared memory (the same arithmetic as
// one thread per pair did for every head), then the block rotates every head's pairs.
__global__ void rope_row_kernel(float* x, const int32_t* pos, int64_t heads, int head_dim, int half,
                                int offset, const RopeTable t, bool neox) {
  extern __shared__ float cs_sn[];  // [half] cos, then [half] sin
  const int64_t r = blockIdx.x;
  const float p = static_cast<float>(pos[r]);
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    sincosf(p * t.inv_freq[i], &cs_sn[half + i], &cs_sn[i]);
    cs_sn[i] *= t.attn_factor;
    cs_sn[half + i] *= t.attn_factor;
  }
  __syncthreads();
  float* row = x + r * heads * head_dim;
  for (int64_t idx = threadIdx.x; idx < heads * half; idx += blockDim.x) {
    const int i = static_cast<int>(idx % half);
    float* v = row + (idx / half) * head_dim;
    const float cs = cs_sn[i], sn = cs_sn[half + i];
    if (neox) {
      const float x0 = v[i], x1 = v[i + offset];
      v[i] = x0 * cs - x1 * sn;
      v[i + offset] = x1 * cs + x0 * sn;
    } else {
      const float2 xv = reinterpret_cast<const float2*>(v)[i];
      reinterpret_cast<float2*>(v)[i] = make_float2(xv.x * cs - xv.y * sn, xv.y * cs + xv.x * sn);
    }
  }
  const float scale = rope_row_scale(t, pos[r]);
  if (scale != 1.0f) {  // the Llama-4 scale of every dim, after the rotation
    __syncthreads();
    for (int64_t idx = threadIdx.x; idx < heads * head_dim; idx += blockDim.x) row[idx] *= scale;
  }
}

// One thread per (row, head, rotary pair). Pairs (i, i + offset) (offset = half, or RopeParams::pair_offset)
// or (2i, 2i + 1).
__global__ void rope_kernel(float* x, const int32_t* pos, int64_t rows, int64_t heads, int head_dim, int half,
                            int offset, const RopeTable t, bool neox) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t total = rows * heads * half;
  if (idx >= total) return;
  const int i = static_cast<int>(idx % half);
  const int64_t h = (idx / half) % heads;
  const int64_t r = idx / (static_cast<int64_t>(half) * heads);
  const float ang = static_cast<float>(pos[r]) * t.inv_freq[i];
  float sn, cs;
  sincosf(ang, &sn, &cs);
  cs *= t.attn_factor;
  sn *= t.attn_factor;
  float* v = x + r * heads * head_dim + h * head_dim;
  const int a = neox ? i : 2 * i;
  const int b = neox ? i + offset : 2 * i + 1;
  const float x0 = v[a], x1 = v[b];
  v[a] = x0 * cs - x1 * sn;
  v[b] = x1 * cs + x0 * sn;
}

// The Llama-4 position scale: one thread per element of the rows (after the rotation).
__global__ void rope_scale_kernel(float* x, const int32_t* pos, int64_t rows, int64_t width,
                                  const RopeTable t) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= rows * width) return;
  x[idx] *= rope_row_scale(t, pos[idx / width]);
}

__global__ void swiglu_f32_kernel(const float* g, const float* u, float* o, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) o[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

// Two elements per thread (bf16x2); silu(g) is rounded to bf16 before the multiply (HF bf16).
__global__ void swiglu_bf16_kernel(const __nv_bfloat16* g, const __nv_bfloat16* u, __nv_bfloat16* o,
                                   int64_t n) {
  const int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * 2;
  if (i + 1 < n) {
    const __nv_bfloat162 gv = *reinterpret_cast<const __nv_bfloat162*>(g + i);
    const __nv_bfloat162 uv = *reinterpret_cast<const __nv_bfloat162*>(u + i);
    const float g0 = __low2float(gv), g1 = __high2float(gv);
    const float s0 = round_bf16_dev(g0 / (1.0f + expf(-g0))), s1 = round_bf16_dev(g1 / (1.0f + expf(-g1)));
    *reinterpret_cast<__nv_bfloat162*>(o + i) =
        __floats2bfloat162_rn(s0 * __low2float(uv), s1 * __high2float(uv));
  } else if (i < n) {
    const float g0 = bf16_to_float(g[i]);
    o[i] = float_to_bf16(round_bf16_dev(g0 / (1.0f + expf(-g0))) * bf16_to_float(u[i]));
  }
}

// One block per source row, 16-byte words when the row allows it (rows are 4-byte multiples).
__global__ void scatter_rows_kernel(const char* src, const int32_t* rows, char* dst, int64_t dst_rows,
                                    int64_t row_bytes, bool vec16) {
  const int64_t r = blockIdx.x;
  const int32_t d = rows[r];
  if (d < 0 || d >= dst_rows) return;
  const char* s = src + r * row_bytes;
  char* o = dst + static_cast<int64_t>(d) * row_bytes;
  if (vec16) {
    for (int64_t i = threadIdx.x; i < row_bytes / 16; i += blockDim.x)
      reinterpret_cast<int4*>(o)[i] = reinterpret_cast<const int4*>(s)[i];
  } else {
    for (int64_t i = threadIdx.x; i < row_bytes / 4; i += blockDim.x)
      reinterpret_cast<int32_t*>(o)[i] = reinterpret_cast<const int32_t*>(s)[i];
  }
}

// f32 rows rounded into bf16 rows of the destination; one block per source row.
__global__ void scatter_rows_bf16_kernel(const float* src, const int32_t* rows, __nv_bfloat16* dst,
                                         int64_t dst_rows, int64_t cols) {
  const int64_t r = blockIdx.x;
  const int32_t d = rows[r];
  if (d < 0 || d >= dst_rows) return;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    dst[static_cast<int64_t>(d) * cols + c] = float_to_bf16(src[r * cols + c]);
}

// One block per destination row: dst[r] = src[rows[r]], 16-byte words when the rows allow it.
__global__ void gather_rows_kernel(const char* src, const int32_t* rows, char* dst, int64_t src_rows,
                                   int64_t row_bytes, bool vec16) {
  const int64_t r = blockIdx.x;
  const int32_t g = rows[r];
  if (g < 0 || g >= src_rows) return;
  const char* s = src + static_cast<int64_t>(g) * row_bytes;
  char* o = dst + r * row_bytes;
  if (vec16) {
    for (int64_t i = threadIdx.x; i < row_bytes / 16; i += blockDim.x)
      reinterpret_cast<int4*>(o)[i] = reinterpret_cast<const int4*>(s)[i];
  } else {
    for (int64_t i = threadIdx.x; i < row_bytes / 4; i += blockDim.x)
      reinterpret_cast<int32_t*>(o)[i] = reinterpret_cast<const int32_t*>(s)[i];
  }
}

// bf16 rows of the source widened into f32 rows of the destination; one block per destination row.
__global__ void gather_rows_f32_kernel(const __nv_bfloat16* src, const int32_t* rows, float* dst,
                                       int64_t src_rows, int64_t cols) {
  const int64_t r = blockIdx.x;
  const int32_t g = rows[r];
  if (g < 0 || g >= src_rows) return;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    dst[r * cols + c] = bf16_to_float(src[static_cast<int64_t>(g) * cols + c]);
}

__global__ void convert_kernel(const void* src, int sdt, void* dst, bool dst_bf16, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float v = load_any(src, sdt, i);
  if (dst_bf16) {
    static_cast<__nv_bfloat16*>(dst)[i] = float_to_bf16(v);
  } else {
    static_cast<float*>(dst)[i] = v;
  }
}

}  // namespace

void embed(const Tensor& tokens, const Tensor& table, Tensor& out, cudaStream_t s) {
  check_embed(tokens, table, out);
  const int64_t n = tokens.numel(), d = table.cols();
  if (n == 0) return;
  embed_kernel<<<static_cast<unsigned>(n), 256, 0, s>>>(tokens.as<const int32_t>(), table.data,
                                                        dtype_code(table.dtype), table.rows(), d, out.data,
                                                        out.dtype == DType::BF16);
  check_launch("embed");
}

void rmsnorm(const Tensor& x, const Tensor& w, float eps, Tensor& y, cudaStream_t s) {
  check_rmsnorm(x, w, y);
  const int64_t group = w.numel();
  const int64_t n_groups = x.numel() / group;
  if (n_groups == 0) return;
  const bool out_aligned = y.dtype == DType::BF16 ? reinterpret_cast<uintptr_t>(y.data) % 8 == 0
                                                  : reinterpret_cast<uintptr_t>(y.data) % 16 == 0;
  if (group >= 1024 && group % 4 == 0 && reinterpret_cast<uintptr_t>(x.data) % 16 == 0 && out_aligned) {
    rmsnorm_row_kernel<<<static_cast<unsigned>(n_groups), kRowThreads, 0, s>>>(
        x.as<const float>(), w.data, dtype_code(w.dtype), group, eps, y.data, y.dtype == DType::BF16);
    check_launch("rmsnorm");
  } else {  // a warp per group (qk-norm's heads), or a block per unaligned wide row: rmsnorm_ex's kernels
    rmsnorm_ex(x, &w, group, eps, false, y, s);
  }
}

void rope(Tensor& x, const Tensor& positions, int head_dim, const RopeParams& p, cudaStream_t s) {
  check_rope(x, positions, head_dim, p);
  const int64_t rows = x.rows(), heads = x.cols() / head_dim;
  const int half = p.rotary_dim / 2;
  const int offset = p.pair_offset > 0 ? p.pair_offset : half;  // proportional RoPE: (i, i + head_dim / 2)
  TESSERA_CHECK(half <= 256, "rope: at most 512 rotated dims per head on CUDA");
  const int64_t total = rows * heads * half;
  if (total == 0) return;
  RopeTable t{};
  for (int i = 0; i < half; ++i) t.inv_freq[i] = rope_inv_freq(p, i);
  t.attn_factor = p.attn_factor;
  t.pos_beta = p.pos_beta > 0.0f && p.pos_orig > 0 ? p.pos_beta : 0.0f;
  t.pos_orig = p.pos_orig;
  // A block per row where the rows are many and float2 pairs stay aligned (interleaved pairs); the
  // thread-per-pair kernel for the rest (a handful of rows fills no more of the GPU either way).
  if (rows >= 64 && (p.neox || (head_dim % 2 == 0 && reinterpret_cast<uintptr_t>(x.data) % 8 == 0))) {
    rope_row_kernel<<<static_cast<unsigned>(rows), 256, static_cast<size_t>(2 * half) * sizeof(float), s>>>(
        x.as<float>(), positions.as<const int32_t>(), heads, head_dim, half, offset, t, p.neox);
  } else {
    rope_kernel<<<static_cast<unsigned>(ceil_div(total, 256)), 256, 0, s>>>(
        x.as<float>(), positions.as<const int32_t>(), rows, heads, head_dim, half, offset, t, p.neox);
    if (t.pos_beta > 0.0f)
      rope_scale_kernel<<<static_cast<unsigned>(ceil_div(rows * x.cols(), 256)), 256, 0, s>>>(
          x.as<float>(), positions.as<const int32_t>(), rows, x.cols(), t);
  }
  check_launch("rope");
}

void swiglu(const Tensor& gate, const Tensor& up, Tensor& out, cudaStream_t s) {
  check_swiglu(gate, up, out);
  const int64_t n = gate.numel();
  if (n == 0) return;
  if (gate.dtype == DType::F32) {
    swiglu_f32_kernel<<<static_cast<unsigned>(ceil_div(n, 256)), 256, 0, s>>>(
        gate.as<const float>(), up.as<const float>(), out.as<float>(), n);
  } else {
    swiglu_bf16_kernel<<<static_cast<unsigned>(ceil_div(ceil_div(n, 2), 256)), 256, 0, s>>>(
        gate.as<const __nv_bfloat16>(), up.as<const __nv_bfloat16>(), out.as<__nv_bfloat16>(), n);
  }
  check_launch("swiglu");
}

void scatter_rows(const Tensor& src, const Tensor& rows, Tensor& dst, cudaStream_t s) {
  check_scatter_rows(src, rows, dst);
  const bool round = src.dtype == DType::F32 && dst.dtype == DType::BF16;
  if (src.rows() == 0 || src.cols() == 0) return;
  if (round) {
    scatter_rows_bf16_kernel<<<static_cast<unsigned>(src.rows()), 128, 0, s>>>(
        src.as<const float>(), rows.as<const int32_t>(), dst.as<__nv_bfloat16>(), dst.rows(), src.cols());
    check_launch("scatter_rows");
    return;
  }
  const int64_t row_bytes = src.cols() * static_cast<int64_t>(dtype_size(src.dtype));
  TESSERA_CHECK(row_bytes % 4 == 0, "scatter_rows: rows must be a multiple of 4 bytes");
  const bool vec16 = row_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(src.data) % 16 == 0 &&
                     reinterpret_cast<uintptr_t>(dst.data) % 16 == 0;
  scatter_rows_kernel<<<static_cast<unsigned>(src.rows()), 128, 0, s>>>(
      static_cast<const char*>(src.data), rows.as<const int32_t>(), static_cast<char*>(dst.data), dst.rows(),
      row_bytes, vec16);
  check_launch("scatter_rows");
}

void convert(const Tensor& src, Tensor& dst, cudaStream_t s) {
  check_convert(src, dst);
  TESSERA_CHECK((src.dtype == DType::F32 || src.dtype == DType::BF16) &&
                    (dst.dtype == DType::F32 || dst.dtype == DType::BF16),
                "convert: only f32 and bf16");
  const int64_t n = src.numel();
  if (n == 0) return;
  convert_kernel<<<static_cast<unsigned>(ceil_div(n, 256)), 256, 0, s>>>(
      src.data, dtype_code(src.dtype), dst.data, dst.dtype == DType::BF16, n);
  check_launch("convert");
}

void gather_rows(const Tensor& src, const Tensor& rows, Tensor& dst, cudaStream_t s) {
  check_gather_rows(src, rows, dst);
  const bool widen = src.dtype == DType::BF16 && dst.dtype == DType::F32;
  if (dst.rows() == 0 || dst.cols() == 0) return;
  if (widen) {
    gather_rows_f32_kernel<<<static_cast<unsigned>(dst.rows()), 128, 0, s>>>(
        src.as<const __nv_bfloat16>(), rows.as<const int32_t>(), dst.as<float>(), src.rows(), dst.cols());
    check_launch("gather_rows");
    return;
  }
  const int64_t row_bytes = dst.cols() * static_cast<int64_t>(dtype_size(dst.dtype));
  TESSERA_CHECK(row_bytes % 4 == 0, "gather_rows: rows must be a multiple of 4 bytes");
  const bool vec16 = row_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(src.data) % 16 == 0 &&
                     reinterpret_cast<uintptr_t>(dst.data) % 16 == 0;
  gather_rows_kernel<<<static_cast<unsigned>(dst.rows()), 128, 0, s>>>(
      static_cast<const char*>(src.data), rows.as<const int32_t>(), static_cast<char*>(dst.data), src.rows(),
      row_bytes, vec16);
  check_launch("gather_rows");
}

}  // namespace tessera::cuda
