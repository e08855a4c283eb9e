// ggml tensor types as GGUF files store them, and their conversion to f32. Quantized types are
// arrays of fixed-size blocks (block values in block_bytes bytes); a row of n values is n / block
// blocks. Dequantization follows ggml's definitions bit for bit (tests compare with ggml's own
// dequantize on vectors ggml quantized: tests/unit/gguf_quant_test.cpp).
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace tessera {

// The numbers are GGUF's (ggml_type).
enum class GgmlType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  IQ2_XXS = 16,
  IQ2_XS = 17,
  IQ3_XXS = 18,
  IQ1_S = 19,
  IQ4_NL = 20,
  IQ3_S = 21,
  IQ2_S = 22,
  IQ4_XS = 23,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  IQ1_M = 29,
  BF16 = 30,
  TQ1_0 = 34,
  TQ2_0 = 35,
  MXFP4 = 39,
  NVFP4 = 40,  // newer ggml types: named (for error messages and sizes), not converted
  Q1_0 = 41,
  Q2_0 = 42,
};

struct GgmlTypeInfo {
  const char* name;    // ggml's name: "f32", "q4_K", ...
  int64_t block;       // values per block (1 for plain types)
  size_t block_bytes;  // bytes per block
  bool dequantizable;  // ggml_dequantize converts it
};

// The type with this number, or nullptr for a number that names no ggml type.
const GgmlTypeInfo* ggml_type_info(uint32_t type);
inline const GgmlTypeInfo* ggml_type_info(GgmlType t) {
  return ggml_type_info(static_cast<uint32_t>(t));
}

// Bytes of n values (n a multiple of the type's block; checked, throws tessera::Error otherwise).
size_t ggml_bytes(GgmlType t, int64_t n);

// Converts n values (a multiple of the block) of type t at src to f32 at dst. Throws tessera::Error
// naming the type for a type it cannot convert. Single-threaded; callers split large tensors.
void ggml_dequantize(GgmlType t, const void* src, float* dst, int64_t n);

// Converts one row of n values of type t to `to` (F32, or BF16: the f32 values rounded to nearest
// even as f32_to_bf16 does); the f32 values are exactly ggml_dequantize's. With `simd` (the default),
// builds with AVX-512 take a vector path for q8_0, q4_0, q4_K, q5_K and q6_K (1.6x to 5x the scalar
// rate); `simd = false` forces the scalar path (tests compare the two).
void ggml_dequantize_row(GgmlType t, const void* src, int64_t n, DType to, void* dst, bool simd = true);

}  // namespace tessera
