// Portable SIMD for the CPU kernels: GCC/clang vector extensions at the width of the build's ISA
// (AVX-512: 16 floats, AVX: 8, otherwise 4), so one source is AVX-512, AVX2 or SSE code. Vectors stay
// inside inline functions (never passed across a call the compiler does not inline).
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>

namespace tessera::cpu::simd {

#if defined(__AVX512F__)
constexpr int kW = 16;
#elif defined(__AVX__)
constexpr int kW = 8;
#else
constexpr int kW = 4;
#endif
using vf = float __attribute__((vector_size(kW * sizeof(float))));
using vi = int32_t __attribute__((vector_size(kW * sizeof(int32_t))));
using vu = uint32_t __attribute__((vector_size(kW * sizeof(uint32_t))));

inline vf load(const float* p) {
  vf x;
  std::memcpy(&x, p, sizeof x);
  return x;
}
inline void store(float* p, const vf& x) {
  std::memcpy(p, &x, sizeof x);
}
inline vf splat(float x) {
  return vf{} + x;
}
// Lane-wise m ? a : b for a mask m from a comparison (all bits set or clear).
inline vf select(const vi& m, const vf& a, const vf& b) {
  return (vf)(((vi)a & m) | ((vi)b & ~m));
}
inline vf vmax(const vf& a, const vf& b) {
  return select(a > b, a, b);
}  // b where either is NaN

inline float hmax(const vf& x) {
  float m = x[0];
  for (int i = 1; i < kW; ++i) m = std::max(m, x[i]);
  return m;
}
inline float hsum(const vf& x) {
  float s = 0.0f;
  for (int i = 0; i < kW; ++i) s += x[i];
  return s;
}

// Transposes the kW x kW matrix held in r (r[i][j] becomes r[j][i]) in log2(kW) stages of two-input
// shuffles: stage h pairs rows i and i + h and interleaves their chunks of h lanes (low halves of each
// 2h-lane chunk into row i, high halves into row i + h), for h = kW/2, ..., 1.
namespace detail {
constexpr int interleave_index(int h, bool hi, int i) {
  const int base = i / (2 * h) * (2 * h) + (hi ? h : 0), r = i % (2 * h);
  return r < h ? base + r : kW + base + r - h;
}
template <int H, bool Hi, int... I>
inline vf interleave(const vf& a, const vf& b, std::integer_sequence<int, I...>) {
  return __builtin_shufflevector(a, b, interleave_index(H, Hi, I)...);
}
template <int H>
inline void transpose_stage(vf (&r)[kW]) {
  using lanes = std::make_integer_sequence<int, kW>;
  for (int i = 0; i < kW; ++i) {
    if ((i & H) != 0) continue;
    const vf lo = interleave<H, false>(r[i], r[i + H], lanes{}),
             hi = interleave<H, true>(r[i], r[i + H], lanes{});
    r[i] = lo;
    r[i + H] = hi;
  }
  if constexpr (H > 1) transpose_stage<H / 2>(r);
}
}  // namespace detail
inline void transpose(vf (&r)[kW]) {
  detail::transpose_stage<kW / 2>(r);
}

// kW bf16 values widened to f32, and f32 rounded to bf16 (nearest, ties to even; NaN stays a quiet
// NaN), lane for lane as bf16_to_f32 / f32_to_bf16 in core/dtype.h.
inline vf load_bf16(const uint16_t* p) {
  vu u;
  for (int i = 0; i < kW; ++i) u[i] = p[i];
  return (vf)(u << 16);
}
inline vu bf16_bits(const vf& x) {
  const vu u = (vu)x;
  const vi nan = (vi)((u & 0x7fffffffu) > 0x7f800000u);
  const vu rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return (vu)(((vi)((u >> 16) | 0x40u) & nan) | ((vi)rounded & ~nan));
}
inline void store_bf16(uint16_t* p, const vf& x) {
  const vu b = bf16_bits(x);
  for (int i = 0; i < kW; ++i) p[i] = static_cast<uint16_t>(b[i]);
}
inline vf round_bf16(const vf& x) {
  return (vf)(bf16_bits(x) << 16);
}

// floor(t) for |t| < 2^31, as floats (returned) and as integers (n): truncation toward 0, less one
// where it rounded up (t < 0).
inline vf floor_parts(const vf& t, vi& n) {
  const vi ti = __builtin_convertvector(t, vi);
  const vf tt = __builtin_convertvector(ti, vf);
  const vi below = tt > t;  // -1 where truncation rounded up
  n = ti + below;
  return tt + __builtin_convertvector(below, vf);
}

// e^x for every float x, within 2 ulp of the exact value: Cephes' expf (x = n ln2 + r, |r| <= ln2 / 2,
// a degree-6 polynomial for e^r). Above 88.72 it is +inf, below -87.33 it is 0 (results that would be
// subnormal are flushed), and NaN stays NaN.
inline vf exp(const vf& x0) {
  const vf hi = splat(88.72283935546875f), lo = splat(-87.33654022216797f);
  vf x = select(x0 > hi, hi, x0);
  x = select(x < lo, lo, x);
  const vf fx = x * 1.44269504088896341f + 0.5f;
  vi n_i;
  const vf n = floor_parts(fx, n_i);
  x = x - n * 0.693359375f;
  x = x - n * -2.12194440e-4f;
  vf y = splat(1.9875691500e-4f);
  y = y * x + 1.3981999507e-3f;
  y = y * x + 8.3334519073e-3f;
  y = y * x + 4.1665795894e-2f;
  y = y * x + 1.6666665459e-1f;
  y = y * x + 5.0000001201e-1f;
  y = y * (x * x) + x + 1.0f;
  // 2^n in two halves, so that n = 128 (x near the top of the range) does not overflow the exponent.
  const vi h = n_i >> 1;
  const vf s1 = (vf)((h + 127) << 23), s2 = (vf)((n_i - h + 127) << 23);
  vf r = y * s1 * s2;
  r = select(x0 > hi, splat(__builtin_inff()), r);
  r = select(x0 < lo, splat(0.0f), r);
  return select(x0 != x0, x0, r);
}

}  // namespace tessera::cpu::simd
