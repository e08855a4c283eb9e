// Quantized (GGUF) weights on the GPU: rows of ggml blocks dequantized to bf16 or f32, for the tiles of
// a quantized GEMM (CudaBackend::lt_gemm) and for embedding rows read by token id. The f32 values are
// those of core/ggml_quant.cpp (ggml's dequantize_row_* bit for bit): the same association of every
// product, each operation rounded on its own (__fmul_rn / __fsub_rn: nvcc may not fuse them into an
// FMA), and bf16 outputs rounded to nearest even as f32_to_bf16 does.
#include <cstdint>
#include <string>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/op_checks.h"
#include "core/error.h"

namespace tessera::cuda {
namespace {

// One thread dequantizes one chunk of 32 consecutive values of a row (every supported block holds
// whole chunks: 32 values for q8_0 / q4_0, 8 chunks of a 256-value super-block for the k-quants).
constexpr int kChunk = 32;

__device__ __forceinline__ float half_at(const uint8_t* p) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(p[0] | (p[1] << 8))));
}

// q8_0, 34 bytes: f16 d | int8 qs[32].  y = q * d
__device__ __forceinline__ void chunk_q8_0(const uint8_t* b, float* y) {
  const float d = half_at(b);
#pragma unroll
  for (int j = 0; j < 32; ++j) y[j] = __fmul_rn(static_cast<float>(static_cast<int8_t>(b[2 + j])), d);
}

// q4_0, 18 bytes: f16 d | qs[16].  y = (q - 8) * d, value j + 16 in the high nibble of qs[j]
__device__ __forceinline__ void chunk_q4_0(const uint8_t* b, float* y) {
  const float d = half_at(b);
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    y[j] = __fmul_rn(static_cast<float>((b[2 + j] & 15) - 8), d);
    y[j + 16] = __fmul_rn(static_cast<float>((b[2 + j] >> 4) - 8), d);
  }
}

// The 6-bit scale and min of sub-block j of q4_K / q5_K (ggml's get_scale_min_k4).
__device__ __forceinline__ void scale_min_k4(int j, const uint8_t* s, int& sc, int& m) {
  if (j < 4) {
    sc = s[j] & 63;
    m = s[j + 4] & 63;
  } else {
    sc = (s[j + 4] & 15) | (s[j - 4] >> 6) << 4;
    m = (s[j + 4] >> 4) | (s[j] >> 6) << 4;
  }
}

// q4_K (144 bytes: f16 d | f16 dmin | scales[12] | qs[128]) and q5_K (176 bytes: qh[32] before qs),
// sub-block s = 2c + k of a super-block.  y = (d * sc) * q - (dmin * m)
template <bool kFive>
__device__ __forceinline__ void chunk_q45_K(const uint8_t* b, int s, float* y) {
  const float d = half_at(b), dmin = half_at(b + 2);
  const int c = s >> 1, k = s & 1;
  int sc, m;
  scale_min_k4(s, b + 4, sc, m);
  const float dl = __fmul_rn(d, static_cast<float>(sc)), ml = __fmul_rn(dmin, static_cast<float>(m));
  const uint8_t* qh = b + 16;
  const uint8_t* qs = b + (kFive ? 48 : 16) + 32 * c;
#pragma unroll
  for (int l = 0; l < 32; ++l) {
    int q = k == 0 ? qs[l] & 15 : qs[l] >> 4;
    if constexpr (kFive) q += ((qh[l] >> s) & 1) << 4;
    y[l] = __fsub_rn(__fmul_rn(dl, static_cast<float>(q)), ml);
  }
}

// q6_K, 210 bytes: ql[128] | qh[64] | int8 scales[16] | f16 d. Chunk s = 4h + i holds the values
// 128h + 32i + l (l < 32): low 4 bits from ql[64h + l (+32 for odd i)] (low nibble for i < 2), high 2
// bits at bit 2i of qh[32h + l], scale scales[8h + l / 16 + 2i].  y = (d * sc) * (q - 32)
__device__ __forceinline__ void chunk_q6_K(const uint8_t* b, int s, float* y) {
  const float d = half_at(b + 208);
  const int h = s >> 2, i = s & 3;
  const uint8_t* ql = b + 64 * h + (i & 1) * 32;
  const uint8_t* qh = b + 128 + 32 * h;
  const auto* sc = reinterpret_cast<const int8_t*>(b + 192 + 8 * h);
  const float d0 = __fmul_rn(d, static_cast<float>(sc[2 * i])),
              d1 = __fmul_rn(d, static_cast<float>(sc[2 * i + 1]));
#pragma unroll
  for (int l = 0; l < 32; ++l) {
    const int low = i < 2 ? ql[l] & 15 : ql[l] >> 4;
    const int q = (low | ((qh[l] >> (2 * i)) & 3) << 4) - 32;
    y[l] = __fmul_rn(l < 16 ? d0 : d1, static_cast<float>(q));
  }
}

template <GgmlType T>
struct Layout;
template <>
struct Layout<GgmlType::Q8_0> {
  static constexpr int kValues = 32, kBytes = 34;
};
template <>
struct Layout<GgmlType::Q4_0> {
  static constexpr int kValues = 32, kBytes = 18;
};
template <>
struct Layout<GgmlType::Q4_K> {
  static constexpr int kValues = 256, kBytes = 144;
};
template <>
struct Layout<GgmlType::Q5_K> {
  static constexpr int kValues = 256, kBytes = 176;
};
template <>
struct Layout<GgmlType::Q6_K> {
  static constexpr int kValues = 256, kBytes = 210;
};

template <GgmlType T>
__device__ __forceinline__ void dequant_chunk(const uint8_t* block, int s, float* y) {
  if constexpr (T == GgmlType::Q8_0) {
    chunk_q8_0(block, y);
  } else if constexpr (T == GgmlType::Q4_0) {
    chunk_q4_0(block, y);
  } else if constexpr (T == GgmlType::Q4_K) {
    chunk_q45_K<false>(block, s, y);
  } else if constexpr (T == GgmlType::Q5_K) {
    chunk_q45_K<true>(block, s, y);
  } else {
    chunk_q6_K(block, s, y);
  }
}

// dst[i, :] = the row src_row(i) of the quantized [v, k] weight w, for i < n: src_row(i) = ids[i] when
// ids is given (an embedding lookup; an id outside [0, v) writes NaN, as the plain embed kernel does),
// else r0 + i. One thread per chunk of 32 values; 16-byte stores (dst rows are k * 2 or k * 4 bytes,
// k a multiple of 32, and dst 16-byte aligned).
template <GgmlType T, bool kBf16>
__global__ void dequant_rows_kernel(const uint8_t* w, int64_t row_bytes, const int32_t* ids, int64_t r0,
                                    int64_t n, int64_t v, int64_t k, void* dst) {
  using L = Layout<T>;
  constexpr int kPerBlock = L::kValues / kChunk;
  const int64_t chunks = k / kChunk;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n * chunks) return;
  const int64_t i = idx / chunks, ch = idx % chunks;
  const int64_t src = ids != nullptr ? static_cast<int64_t>(ids[i]) : r0 + i;
  float y[kChunk];
  if (src >= 0 && src < v) {
    const uint8_t* block = w + src * row_bytes + (ch / kPerBlock) * L::kBytes;
    dequant_chunk<T>(block, static_cast<int>(ch % kPerBlock), y);
  } else {
#pragma unroll
    for (int j = 0; j < kChunk; ++j) y[j] = __int_as_float(0x7fc00000);
  }
  if constexpr (kBf16) {
    auto* out = reinterpret_cast<uint4*>(static_cast<__nv_bfloat16*>(dst) + i * k + ch * kChunk);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      uint32_t u[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const __nv_bfloat162 pair = __floats2bfloat162_rn(y[8 * q + 2 * j], y[8 * q + 2 * j + 1]);
        u[j] = static_cast<uint32_t>(__bfloat16_as_ushort(pair.x)) |
               static_cast<uint32_t>(__bfloat16_as_ushort(pair.y)) << 16;
      }
      out[q] = make_uint4(u[0], u[1], u[2], u[3]);
    }
  } else {
    auto* out = reinterpret_cast<float4*>(static_cast<float*>(dst) + i * k + ch * kChunk);
#pragma unroll
    for (int q = 0; q < 8; ++q) out[q] = make_float4(y[4 * q], y[4 * q + 1], y[4 * q + 2], y[4 * q + 3]);
  }
}

template <GgmlType T>
void launch_type(const uint8_t* w, int64_t row_bytes, const int32_t* ids, int64_t r0, int64_t n, int64_t v,
                 int64_t k, DType to, void* dst, cudaStream_t s) {
  const int64_t threads = n * (k / kChunk);
  const auto blocks = static_cast<unsigned>(ceil_div(threads, 256));
  if (to == DType::BF16) {
    dequant_rows_kernel<T, true><<<blocks, 256, 0, s>>>(w, row_bytes, ids, r0, n, v, k, dst);
  } else {
    dequant_rows_kernel<T, false><<<blocks, 256, 0, s>>>(w, row_bytes, ids, r0, n, v, k, dst);
  }
}

void launch(const Tensor& w, const int32_t* ids, int64_t r0, int64_t n, DType to, void* dst, cudaStream_t s,
            const char* what) {
  TESSERA_CHECK(w.quantized() && cuda_keeps_quantized(w.quant),
                std::string(what) + " (cuda): ggml type " +
                    (w.quantized() && ggml_type_info(static_cast<uint32_t>(w.quant))
                         ? ggml_type_info(static_cast<uint32_t>(w.quant))->name
                         : "(none)") +
                    " is not computed quantized on CUDA (q8_0, q4_0, q4_K, q5_K, q6_K are)");
  TESSERA_CHECK(to == DType::BF16 || to == DType::F32,
                std::string(what) + " (cuda): dequantizes to bf16 or f32");
  TESSERA_CHECK(reinterpret_cast<uintptr_t>(dst) % 16 == 0,
                std::string(what) + " (cuda): output not 16-byte aligned");
  if (n <= 0) return;
  const auto* p = static_cast<const uint8_t*>(w.data);
  const auto rb = static_cast<int64_t>(w.row_bytes());
  const int64_t v = w.rows(), k = w.cols();
  switch (static_cast<GgmlType>(w.quant)) {
    case GgmlType::Q8_0:
      launch_type<GgmlType::Q8_0>(p, rb, ids, r0, n, v, k, to, dst, s);
      break;
    case GgmlType::Q4_0:
      launch_type<GgmlType::Q4_0>(p, rb, ids, r0, n, v, k, to, dst, s);
      break;
    case GgmlType::Q4_K:
      launch_type<GgmlType::Q4_K>(p, rb, ids, r0, n, v, k, to, dst, s);
      break;
    case GgmlType::Q5_K:
      launch_type<GgmlType::Q5_K>(p, rb, ids, r0, n, v, k, to, dst, s);
      break;
    default:
      launch_type<GgmlType::Q6_K>(p, rb, ids, r0, n, v, k, to, dst, s);
      break;
  }
  check_launch(what);
}

}  // namespace

void dequantize_rows(const Tensor& w, int64_t r0, int64_t n, DType to, void* dst, cudaStream_t s) {
  TESSERA_CHECK(r0 >= 0 && n >= 0 && r0 + n <= w.rows(), "dequantize_rows (cuda): rows outside the weight");
  launch(w, nullptr, r0, n, to, dst, s, "dequantize_rows");
}

void embed_quant(const Tensor& tokens, const Tensor& table, Tensor& out, cudaStream_t s) {
  check_embed(tokens, table, out);
  launch(table, tokens.as<const int32_t>(), 0, tokens.numel(), out.dtype, out.data, s, "embed");
}

}  // namespace tessera::cuda
