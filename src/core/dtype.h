// Element types and bf16/f16 conversion helpers.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace tessera {

enum class DType : uint8_t { F32, BF16, F16, I32 };

inline size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32:
      return 4;
    case DType::BF16:
      return 2;
    case DType::F16:
      return 2;
    case DType::I32:
      return 4;
  }
  return 0;
}

std::string_view dtype_name(DType t);

// Round-to-nearest-even f32 -> bf16 (NaN kept quiet).
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// Rounds an f32 value through bf16 and back.
inline float round_bf16(float f) {
  return bf16_to_f32(f32_to_bf16(f));
}

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// Converts n elements of `src` (type `from`) to f32.
void convert_to_f32(const void* src, DType from, float* dst, size_t n);
// Converts n f32 values to `to` (F32, BF16 or F16).
void convert_from_f32(const float* src, void* dst, DType to, size_t n);

}  // namespace tessera
