// ggml tensor types: the type table and dequantization to f32, written from the block layouts of
// ggml (ggml/src/ggml-common.h) and matching ggml's dequantize_row_* bit for bit. All multi-byte
// fields are little-endian; "f16" fields are IEEE half precision scales read with f16_to_f32.
//
// Bit-exactness: each formula keeps ggml's association ((d * sc) * q, not d * (sc * q)). Every
// product that feeds an addition (q4_1, q5_1, q2_K, q4_K, q5_K) is exact in f32: an f16 scale has 11
// significant bits, those sub-block scales at most 6 and the quants at most 5, so (d * sc) * q fits
// in 22 bits. Hence a compiler fusing d * q - m into an FMA (GCC does under -march=native) cannot
// change a result, and ggml's separately rounded arithmetic (its CPU-generic build has no FMA) is
// matched. The products that can round (q6_K's (d * sc) * q) feed no addition.
#include "core/ggml_quant.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <string>
#if defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>
#define TESSERA_DQ_AVX512 1
// GCC 12 reports its own _mm512_undefined_* placeholders inside the conversion intrinsics as
// "may be used uninitialized" (a known false positive).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include "core/dtype.h"
#include "core/error.h"

namespace tessera {
namespace {

constexpr int64_t QK = 32;     // values per block of the "legacy" types (q4_0 ... q8_0, iq4_nl, mxfp4)
constexpr int64_t QK_K = 256;  // values per super-block of the k-quants, iq4_xs and the other iq types

// Indexed by the ggml type number; numbers ggml retired (4, 5, 31-33, 36-38) have no name.
constexpr std::array<GgmlTypeInfo, 43> kTypes = [] {
  std::array<GgmlTypeInfo, 43> t{};
  auto set = [&](GgmlType id, const char* name, int64_t block, size_t bytes, bool dq) {
    t[static_cast<uint32_t>(id)] = GgmlTypeInfo{name, block, bytes, dq};
  };
  set(GgmlType::F32, "f32", 1, 4, true);
  set(GgmlType::F16, "f16", 1, 2, true);
  set(GgmlType::Q4_0, "q4_0", QK, 18, true);
  set(GgmlType::Q4_1, "q4_1", QK, 20, true);
  set(GgmlType::Q5_0, "q5_0", QK, 22, true);
  set(GgmlType::Q5_1, "q5_1", QK, 24, true);
  set(GgmlType::Q8_0, "q8_0", QK, 34, true);
  set(GgmlType::Q8_1, "q8_1", QK, 36, false);
  set(GgmlType::Q2_K, "q2_K", QK_K, 84, true);
  set(GgmlType::Q3_K, "q3_K", QK_K, 110, true);
  set(GgmlType::Q4_K, "q4_K", QK_K, 144, true);
  set(GgmlType::Q5_K, "q5_K", QK_K, 176, true);
  set(GgmlType::Q6_K, "q6_K", QK_K, 210, true);
  set(GgmlType::Q8_K, "q8_K", QK_K, 292, false);
  set(GgmlType::IQ2_XXS, "iq2_xxs", QK_K, 66, false);
  set(GgmlType::IQ2_XS, "iq2_xs", QK_K, 74, false);
  set(GgmlType::IQ3_XXS, "iq3_xxs", QK_K, 98, false);
  set(GgmlType::IQ1_S, "iq1_s", QK_K, 50, false);
  set(GgmlType::IQ4_NL, "iq4_nl", QK, 18, true);
  set(GgmlType::IQ3_S, "iq3_s", QK_K, 110, false);
  set(GgmlType::IQ2_S, "iq2_s", QK_K, 82, false);
  set(GgmlType::IQ4_XS, "iq4_xs", QK_K, 136, true);
  set(GgmlType::I8, "i8", 1, 1, false);
  set(GgmlType::I16, "i16", 1, 2, false);
  set(GgmlType::I32, "i32", 1, 4, false);
  set(GgmlType::I64, "i64", 1, 8, false);
  set(GgmlType::F64, "f64", 1, 8, false);
  set(GgmlType::IQ1_M, "iq1_m", QK_K, 56, false);
  set(GgmlType::BF16, "bf16", 1, 2, true);
  set(GgmlType::TQ1_0, "tq1_0", QK_K, 54, false);
  set(GgmlType::TQ2_0, "tq2_0", QK_K, 66, false);
  set(GgmlType::MXFP4, "mxfp4", QK, 17, true);
  set(GgmlType::NVFP4, "nvfp4", 64, 36, false);
  set(GgmlType::Q1_0, "q1_0", 128, 18, false);
  set(GgmlType::Q2_0, "q2_0", 64, 18, false);
  return t;
}();

inline float half_at(const uint8_t* p) {
  return f16_to_f32(static_cast<uint16_t>(p[0] | (p[1] << 8)));
}

// Non-linear 4-bit codebooks (ggml's kvalues_iq4nl, and kvalues_mxfp4 = the E2M1 values doubled).
constexpr int8_t kIq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
constexpr int8_t kFp4x2[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// The 32-value types pack value j (j < 16) in the low nibble of qs[j] and value j + 16 in its high
// nibble. The 5-bit types add a u32 qh whose bit j is the fifth bit of value j.

// q4_0, 18 bytes: f16 d | qs[16].  y = (q - 8) * d
void block_q4_0(const uint8_t* b, float* y) {
  const float d = half_at(b);
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>((b[2 + j] & 15) - 8) * d;
    y[j + 16] = static_cast<float>((b[2 + j] >> 4) - 8) * d;
  }
}

// q4_1, 20 bytes: f16 d | f16 m | qs[16].  y = q * d + m
void block_q4_1(const uint8_t* b, float* y) {
  const float d = half_at(b), m = half_at(b + 2);
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>(b[4 + j] & 15) * d + m;
    y[j + 16] = static_cast<float>(b[4 + j] >> 4) * d + m;
  }
}

inline uint32_t u32_at(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 | static_cast<uint32_t>(p[2]) << 16 |
         static_cast<uint32_t>(p[3]) << 24;
}

// q5_0, 22 bytes: f16 d | u32 qh | qs[16].  y = (q - 16) * d
void block_q5_0(const uint8_t* b, float* y) {
  const float d = half_at(b);
  const uint32_t qh = u32_at(b + 2);
  for (int j = 0; j < 16; ++j) {
    const int lo = (b[6 + j] & 15) | ((qh >> j) & 1) << 4;
    const int hi = (b[6 + j] >> 4) | ((qh >> (j + 16)) & 1) << 4;
    y[j] = static_cast<float>(lo - 16) * d;
    y[j + 16] = static_cast<float>(hi - 16) * d;
  }
}

// q5_1, 24 bytes: f16 d | f16 m | u32 qh | qs[16].  y = q * d + m
void block_q5_1(const uint8_t* b, float* y) {
  const float d = half_at(b), m = half_at(b + 2);
  const uint32_t qh = u32_at(b + 4);
  for (int j = 0; j < 16; ++j) {
    const int lo = (b[8 + j] & 15) | ((qh >> j) & 1) << 4;
    const int hi = (b[8 + j] >> 4) | ((qh >> (j + 16)) & 1) << 4;
    y[j] = static_cast<float>(lo) * d + m;
    y[j + 16] = static_cast<float>(hi) * d + m;
  }
}

// q8_0, 34 bytes: f16 d | int8 qs[32].  y = q * d
void block_q8_0(const uint8_t* b, float* y) {
  const float d = half_at(b);
  for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(static_cast<int8_t>(b[2 + j])) * d;
}

// iq4_nl, 18 bytes: f16 d | qs[16] (nibble layout of q4_0).  y = d * kIq4nl[q]
void block_iq4_nl(const uint8_t* b, float* y) {
  const float d = half_at(b);
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>(kIq4nl[b[2 + j] & 15]);
    y[j + 16] = d * static_cast<float>(kIq4nl[b[2 + j] >> 4]);
  }
}

// mxfp4, 17 bytes: u8 e (E8M0 exponent) | qs[16] (nibble layout of q4_0), each nibble an E2M1 value.
// ggml scales the doubled E2M1 codes by 2^(e-128) = 2^(e-127) / 2, built directly as float bits
// (e = 0 and 1 give the subnormals 2^-128 and 2^-127).  y = kFp4x2[q] * d
void block_mxfp4(const uint8_t* b, float* y) {
  const uint32_t e = b[0];
  const uint32_t bits = e < 2 ? 0x00200000u << e : (e - 1) << 23;
  float d;
  std::memcpy(&d, &bits, 4);
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>(kFp4x2[b[1 + j] & 15]) * d;
    y[j + 16] = static_cast<float>(kFp4x2[b[1 + j] >> 4]) * d;
  }
}

// The 2- and 3-bit k-quants walk a super-block as 2 halves of 128 values. Half h owns 32 bytes of
// qs; its 4 bit planes (shift 0, 2, 4, 6) each give 2 sub-blocks of 16: q[l] >> shift for l < 16,
// then q[16 + l] >> shift. Sub-block index = 8h + 2*plane (+1 for the second 16).

// q2_K, 84 bytes: scales[16] (low nibble: scale, high nibble: min) | qs[64] | f16 d | f16 dmin.
// y = (d * sc) * q - (dmin * m), q in 0..3
void block_q2_K(const uint8_t* b, float* y) {
  const uint8_t* sc = b;
  const float d = half_at(b + 80), dmin = half_at(b + 82);
  for (int h = 0; h < 2; ++h) {
    const uint8_t* q = b + 16 + 32 * h;
    for (int plane = 0; plane < 4; ++plane) {
      for (int k = 0; k < 2; ++k) {
        const uint8_t s = sc[8 * h + 2 * plane + k];
        const float dl = d * static_cast<float>(s & 15), ml = dmin * static_cast<float>(s >> 4);
        for (int l = 0; l < 16; ++l) *y++ = dl * static_cast<float>((q[16 * k + l] >> (2 * plane)) & 3) - ml;
      }
    }
  }
}

// q3_K, 110 bytes: hmask[32] | qs[64] (low 2 bits) | scales[12] | f16 d.
// Value bit 2 is stored inverted: a CLEAR bit in hmask subtracts 4, so q = low2 - (bit ? 0 : 4) in
// -4..3. The bit of value l of the sub-block pair (h, plane) is bit (4h + plane) of hmask[16k + l].
// The 16 six-bit scales: low 4 bits in the nibbles of scales[0..7] (scale i < 8: low nibble of byte
// i; i >= 8: high nibble of byte i - 8), high 2 bits in scales[8 + i % 4] at bit 2 * (i / 4).
// y = (d * (s - 32)) * q
void block_q3_K(const uint8_t* b, float* y) {
  const uint8_t* hm = b;
  const uint8_t* sb = b + 96;
  const float d = half_at(b + 108);
  int s[16];
  for (int i = 0; i < 16; ++i) {
    const int lo = i < 8 ? sb[i] & 15 : sb[i - 8] >> 4;
    s[i] = (lo | ((sb[8 + i % 4] >> (2 * (i / 4))) & 3) << 4) - 32;
  }
  for (int h = 0; h < 2; ++h) {
    const uint8_t* q = b + 32 + 32 * h;
    for (int plane = 0; plane < 4; ++plane) {
      const int hbit = 4 * h + plane;
      for (int k = 0; k < 2; ++k) {
        const float dl = d * static_cast<float>(s[8 * h + 2 * plane + k]);
        for (int l = 0; l < 16; ++l) {
          const int v = ((q[16 * k + l] >> (2 * plane)) & 3) - (((hm[16 * k + l] >> hbit) & 1) ? 0 : 4);
          *y++ = dl * static_cast<float>(v);
        }
      }
    }
  }
}

// q4_K and q5_K: 8 sub-blocks of 32, each with a 6-bit scale and a 6-bit min packed in 12 bytes:
// for j < 4, scale = s[j] & 63 and min = s[j + 4] & 63; for j >= 4, the low 4 bits are the nibbles
// of s[j + 4] (scale low, min high) and the top 2 bits are the top bits of s[j - 4] (scale) and
// s[j] (min).
void scale_min_k4(int j, const uint8_t* s, int& sc, int& m) {
  if (j < 4) {
    sc = s[j] & 63;
    m = s[j + 4] & 63;
  } else {
    sc = (s[j + 4] & 15) | (s[j - 4] >> 6) << 4;
    m = (s[j + 4] >> 4) | (s[j] >> 6) << 4;
  }
}

// q4_K, 144 bytes: f16 d | f16 dmin | scales[12] | qs[128]. Chunk c of 64 values uses qs[32c..32c+32]:
// sub-block 2c the low nibbles, sub-block 2c + 1 the high nibbles.  y = (d * sc) * q - (dmin * m)
// q5_K, 176 bytes: the same with qh[32] before qs: the fifth bit of value l of sub-block 2c (2c + 1)
// is bit 2c (2c + 1) of qh[l].
template <bool kFive>
void block_q45_K(const uint8_t* b, float* y) {
  const float d = half_at(b), dmin = half_at(b + 2);
  const uint8_t* sb = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* qs = b + (kFive ? 48 : 16);
  for (int c = 0; c < 4; ++c, qs += 32) {
    for (int k = 0; k < 2; ++k) {
      int sc, m;
      scale_min_k4(2 * c + k, sb, sc, m);
      const float dl = d * static_cast<float>(sc), ml = dmin * static_cast<float>(m);
      for (int l = 0; l < 32; ++l) {
        int q = k == 0 ? qs[l] & 15 : qs[l] >> 4;
        if constexpr (kFive) q += ((qh[l] >> (2 * c + k)) & 1) << 4;
        *y++ = dl * static_cast<float>(q) - ml;
      }
    }
  }
}

// q6_K, 210 bytes: ql[128] (low 4 bits) | qh[64] (high 2 bits) | int8 scales[16] | f16 d.
// Half h (128 values) uses ql[64h..64h+64], qh[32h..32h+32], scales[8h..8h+8]. For l < 32 the byte
// qh[l] holds the high bits of the four values l, l+32, l+64, l+96 (bits 0-1, 2-3, 4-5, 6-7); their
// low bits are the low nibbles of ql[l], ql[l+32], then the high nibbles of ql[l], ql[l+32]. Value
// l + 32i has scale scales[l/16 + 2i].  y = (d * sc) * (q - 32)
void block_q6_K(const uint8_t* b, float* y) {
  const float d = half_at(b + 208);
  for (int h = 0; h < 2; ++h, y += 128) {
    const uint8_t* ql = b + 64 * h;
    const uint8_t* qh = b + 128 + 32 * h;
    const auto* sc = reinterpret_cast<const int8_t*>(b + 192 + 8 * h);
    for (int l = 0; l < 32; ++l) {
      const int low[4] = {ql[l] & 15, ql[l + 32] & 15, ql[l] >> 4, ql[l + 32] >> 4};
      for (int i = 0; i < 4; ++i) {
        const int q = (low[i] | ((qh[l] >> (2 * i)) & 3) << 4) - 32;
        y[l + 32 * i] = d * static_cast<float>(sc[l / 16 + 2 * i]) * static_cast<float>(q);
      }
    }
  }
}

// iq4_xs, 136 bytes: f16 d | u16 scales_h | scales_l[4] | qs[128]. 8 sub-blocks of 32 with 6-bit
// scales: low 4 bits in nibble (ib % 2) of scales_l[ib / 2], high 2 bits at bit 2*ib of scales_h.
// Sub-block ib uses qs[16ib..16ib+16] in the q4_0 nibble layout.  y = (d * (ls - 32)) * kIq4nl[q]
void block_iq4_xs(const uint8_t* b, float* y) {
  const float d = half_at(b);
  const unsigned sh = b[2] | b[3] << 8;
  for (int ib = 0; ib < 8; ++ib, y += 32) {
    const int ls = ((b[4 + ib / 2] >> (4 * (ib % 2))) & 15) | ((sh >> (2 * ib)) & 3) << 4;
    const float dl = d * static_cast<float>(ls - 32);
    const uint8_t* qs = b + 8 + 16 * ib;
    for (int j = 0; j < 16; ++j) {
      y[j] = dl * static_cast<float>(kIq4nl[qs[j] & 15]);
      y[j + 16] = dl * static_cast<float>(kIq4nl[qs[j] >> 4]);
    }
  }
}

#ifdef TESSERA_DQ_AVX512
// AVX-512 row converters: the f32 arithmetic of the block_* functions above in the same order (so
// bit-identical; GgufQuant.RowConvertersMatchScalar checks), stored as f32 or rounded to bf16 as
// f32_to_bf16 rounds (nearest even, NaN kept quiet).
template <bool kBf16>
inline void store16(void* dst, int64_t at, __m512 x) {
  if constexpr (kBf16) {
    const __m512i u = _mm512_castps_si512(x);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb)), 16);
    const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(dst) + at),
                        _mm512_cvtepi32_epi16(r));
  } else {
    _mm512_storeu_ps(static_cast<float*>(dst) + at, x);
  }
}
inline __m512 u8_ps(__m128i v) {
  return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(v));
}
inline __m512 i8_ps(__m128i v) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v));
}
inline __m128i load16(const uint8_t* p) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
}
inline __m128i low_nibbles(__m128i v) {
  return _mm_and_si128(v, _mm_set1_epi8(15));
}
inline __m128i high_nibbles(__m128i v) {
  return _mm_and_si128(_mm_srli_epi16(v, 4), _mm_set1_epi8(15));
}

template <bool kBf16>
void row_q8_0(const uint8_t* s, int64_t nb, void* dst) {
  for (int64_t i = 0; i < nb; ++i, s += 34) {
    const __m512 d = _mm512_set1_ps(half_at(s));
    store16<kBf16>(dst, 32 * i, _mm512_mul_ps(i8_ps(load16(s + 2)), d));
    store16<kBf16>(dst, 32 * i + 16, _mm512_mul_ps(i8_ps(load16(s + 18)), d));
  }
}

template <bool kBf16>
void row_q4_0(const uint8_t* s, int64_t nb, void* dst) {
  const __m128i eight = _mm_set1_epi8(8);
  for (int64_t i = 0; i < nb; ++i, s += 18) {
    const __m512 d = _mm512_set1_ps(half_at(s));
    const __m128i q = load16(s + 2);
    store16<kBf16>(dst, 32 * i, _mm512_mul_ps(i8_ps(_mm_sub_epi8(low_nibbles(q), eight)), d));
    store16<kBf16>(dst, 32 * i + 16, _mm512_mul_ps(i8_ps(_mm_sub_epi8(high_nibbles(q), eight)), d));
  }
}

template <bool kFive, bool kBf16>
void row_q45_K(const uint8_t* b, int64_t nb, void* dst) {
  for (int64_t i = 0; i < nb; ++i, b += kFive ? 176 : 144) {
    const float d = half_at(b), dmin = half_at(b + 2);
    const uint8_t* qh = b + 16;
    const uint8_t* qs = b + (kFive ? 48 : 16);
    int64_t at = 256 * i;
    for (int c = 0; c < 4; ++c, qs += 32) {
      for (int k = 0; k < 2; ++k, at += 32) {
        int sc, m;
        scale_min_k4(2 * c + k, b + 4, sc, m);
        const __m512 dl = _mm512_set1_ps(d * static_cast<float>(sc));
        const __m512 ml = _mm512_set1_ps(dmin * static_cast<float>(m));
        for (int h = 0; h < 2; ++h) {
          const __m128i raw = load16(qs + 16 * h);
          __m128i q = k == 0 ? low_nibbles(raw) : high_nibbles(raw);
          if constexpr (kFive) {  // bit 2c + k of qh[l] is the fifth bit (16)
            const __m128i bit = _mm_set1_epi8(static_cast<char>(1 << (2 * c + k)));
            const __m128i set = _mm_cmpeq_epi8(_mm_and_si128(load16(qh + 16 * h), bit), bit);
            q = _mm_or_si128(q, _mm_and_si128(set, _mm_set1_epi8(16)));
          }
          store16<kBf16>(dst, at + 16 * h, _mm512_sub_ps(_mm512_mul_ps(dl, u8_ps(q)), ml));
        }
      }
    }
  }
}

template <bool kBf16>
void row_q6_K(const uint8_t* b, int64_t nb, void* dst) {
  const __m128i three = _mm_set1_epi8(3), off = _mm_set1_epi8(32);
  for (int64_t i = 0; i < nb; ++i, b += 210) {
    const float d = half_at(b + 208);
    for (int h = 0; h < 2; ++h) {
      const uint8_t* ql = b + 64 * h;
      const uint8_t* qh = b + 128 + 32 * h;
      const auto* sc = reinterpret_cast<const int8_t*>(b + 192 + 8 * h);
      const int64_t at = 256 * i + 128 * h;
      for (int l = 0; l < 32; l += 16) {
        const __m128i a = load16(ql + l), c = load16(ql + l + 32), hi = load16(qh + l);
        const __m128i low[4] = {low_nibbles(a), low_nibbles(c), high_nibbles(a), high_nibbles(c)};
        for (int j = 0; j < 4; ++j) {
          const __m128i top = _mm_and_si128(_mm_srli_epi16(hi, 2 * j), three);
          const __m128i q = _mm_sub_epi8(_mm_or_si128(low[j], _mm_slli_epi16(top, 4)), off);
          const __m512 s = _mm512_set1_ps(d * static_cast<float>(sc[l / 16 + 2 * j]));
          store16<kBf16>(dst, at + l + 32 * j, _mm512_mul_ps(s, i8_ps(q)));
        }
      }
    }
  }
}

using RowFn = void (*)(const uint8_t*, int64_t, void*);

template <bool kBf16>
RowFn row_fn(GgmlType t) {
  switch (t) {
    case GgmlType::Q8_0:
      return row_q8_0<kBf16>;
    case GgmlType::Q4_0:
      return row_q4_0<kBf16>;
    case GgmlType::Q4_K:
      return row_q45_K<false, kBf16>;
    case GgmlType::Q5_K:
      return row_q45_K<true, kBf16>;
    case GgmlType::Q6_K:
      return row_q6_K<kBf16>;
    default:
      return nullptr;
  }
}
#endif

using BlockFn = void (*)(const uint8_t*, float*);

BlockFn block_fn(GgmlType t) {
  switch (t) {
    case GgmlType::Q4_0:
      return block_q4_0;
    case GgmlType::Q4_1:
      return block_q4_1;
    case GgmlType::Q5_0:
      return block_q5_0;
    case GgmlType::Q5_1:
      return block_q5_1;
    case GgmlType::Q8_0:
      return block_q8_0;
    case GgmlType::Q2_K:
      return block_q2_K;
    case GgmlType::Q3_K:
      return block_q3_K;
    case GgmlType::Q4_K:
      return block_q45_K<false>;
    case GgmlType::Q5_K:
      return block_q45_K<true>;
    case GgmlType::Q6_K:
      return block_q6_K;
    case GgmlType::IQ4_NL:
      return block_iq4_nl;
    case GgmlType::IQ4_XS:
      return block_iq4_xs;
    case GgmlType::MXFP4:
      return block_mxfp4;
    default:
      return nullptr;
  }
}

[[noreturn]] void fail_unsupported(GgmlType t) {
  const auto* info = ggml_type_info(t);
  std::string supported = "f32, f16, bf16";  // then the quantized types in ggml's order
  for (const auto& e : kTypes) {
    if (e.name && e.dequantizable && e.block > 1) supported += ", " + std::string(e.name);
  }
  const std::string name = info ? info->name : "number " + std::to_string(static_cast<uint32_t>(t));
  fail("GGUF tensor type " + name + " cannot be loaded by tessera (supported: " + supported +
       "); re-quantize the model to one of these");
}

}  // namespace

const GgmlTypeInfo* ggml_type_info(uint32_t type) {
  return type < kTypes.size() && kTypes[type].name ? &kTypes[type] : nullptr;
}

size_t ggml_bytes(GgmlType t, int64_t n) {
  const auto* info = ggml_type_info(t);
  if (!info) fail("unknown GGUF tensor type number " + std::to_string(static_cast<uint32_t>(t)));
  TESSERA_CHECK(n > 0 && n % info->block == 0,
                "a " + std::string(info->name) + " tensor (row) must hold a positive multiple of " +
                    std::to_string(info->block) + " values, not " + std::to_string(n));
  return static_cast<size_t>(n / info->block) * info->block_bytes;
}

void ggml_dequantize(GgmlType t, const void* src, float* dst, int64_t n) {
  const auto* info = ggml_type_info(t);
  if (!info || !info->dequantizable) fail_unsupported(t);
  ggml_bytes(t, n);  // checks n
  const auto* s = static_cast<const uint8_t*>(src);
  switch (t) {
    case GgmlType::F32:
      std::memcpy(dst, s, static_cast<size_t>(n) * 4);
      return;
    case GgmlType::F16:
      for (int64_t i = 0; i < n; ++i)
        dst[i] = f16_to_f32(static_cast<uint16_t>(s[2 * i] | s[2 * i + 1] << 8));
      return;
    case GgmlType::BF16:
      for (int64_t i = 0; i < n; ++i)
        dst[i] = bf16_to_f32(static_cast<uint16_t>(s[2 * i] | s[2 * i + 1] << 8));
      return;
    default:
      break;
  }
  const BlockFn fn = block_fn(t);
  for (int64_t i = 0, nb = n / info->block; i < nb; ++i) fn(s + i * info->block_bytes, dst + i * info->block);
}

void ggml_dequantize_row(GgmlType t, const void* src, int64_t n, DType to, void* dst, bool simd) {
  TESSERA_CHECK(to == DType::F32 || to == DType::BF16, "ggml_dequantize_row: converts to f32 or bf16");
  const auto* info = ggml_type_info(t);
  if (!info || !info->dequantizable) fail_unsupported(t);
  ggml_bytes(t, n);  // checks n
#ifdef TESSERA_DQ_AVX512
  if (simd) {
    if (const RowFn fn = to == DType::BF16 ? row_fn<true>(t) : row_fn<false>(t)) {
      fn(static_cast<const uint8_t*>(src), n / info->block, dst);
      return;
    }
  }
#endif
  if (to == DType::F32) {
    ggml_dequantize(t, src, static_cast<float*>(dst), n);
    return;
  }
  // Through an f32 buffer on the stack (1024 values: a multiple of every block size; no allocation).
  constexpr int64_t kStep = 1024;
  float f[kStep];
  const size_t step_bytes = ggml_bytes(t, kStep);
  for (int64_t i = 0; i < n; i += kStep) {
    const int64_t k = std::min(kStep, n - i);
    ggml_dequantize(t, static_cast<const char*>(src) + static_cast<size_t>(i / kStep) * step_bytes, f, k);
    convert_from_f32(f, static_cast<uint16_t*>(dst) + i, DType::BF16, static_cast<size_t>(k));
  }
}

}  // namespace tessera
