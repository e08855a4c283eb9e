// ggml/GGUF dequantization (core/ggml_quant.h): bit-exact against ggml's own dequantization of blocks ggml
// quantized (tests/data/gguf/quant_vectors.bin, written by tools/gguf/make_quant_vectors.py from the
// real libggml-base), blocks built by hand with values computed by hand, the f32/f16/bf16 pass-through,
// the type table against ggml's, and the errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/ggml_quant.h"
#include "test_util.h"

namespace tessera {
namespace {

struct VectorType {
  uint32_t type, block, block_bytes;
  std::string name;
};
struct VectorRecord {
  uint32_t type, kind, n;  // kind 0: quantized from `input` by ggml; 1: random block bytes
  std::vector<uint8_t> data;
  std::vector<float> ggml;  // ggml's dequantization of data
};
struct Vectors {
  std::vector<VectorType> types;
  std::vector<float> input;
  std::vector<VectorRecord> records;
};

// Reads the format documented in tools/gguf/make_quant_vectors.py (little-endian, as is this host).
Vectors read_vectors() {
  const auto path = test::source_dir() / "tests/data/gguf/quant_vectors.bin";
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error("cannot open " + path.string());
  auto u32 = [&] {
    uint32_t v = 0;
    f.read(reinterpret_cast<char*>(&v), 4);
    return v;
  };
  auto floats = [&](size_t n) {
    std::vector<float> v(n);
    f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(n * 4));
    return v;
  };
  char magic[4];
  f.read(magic, 4);
  TESSERA_CHECK(std::memcmp(magic, "TQV1", 4) == 0, "bad magic in " + path.string());
  Vectors v;
  const uint32_t n_types = u32(), n_input = u32(), n_records = u32();
  for (uint32_t i = 0; i < n_types; ++i) {
    VectorType t{u32(), u32(), u32(), ""};
    char name[17] = {};
    f.read(name, 16);
    t.name = name;
    v.types.push_back(t);
  }
  v.input = floats(n_input);
  for (uint32_t i = 0; i < n_records; ++i) {
    VectorRecord r{u32(), u32(), u32(), {}, {}};
    r.data.resize(u32());
    f.read(reinterpret_cast<char*>(r.data.data()), static_cast<std::streamsize>(r.data.size()));
    r.ggml = floats(r.n);
    v.records.push_back(std::move(r));
  }
  TESSERA_CHECK(f.good() && f.peek() == EOF, "truncated or overlong " + path.string());
  return v;
}

const char* name_of(uint32_t t) {
  const auto* info = ggml_type_info(t);
  return info ? info->name : "?";
}

uint32_t bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

void put_f16(uint8_t* p, uint16_t h) {
  p[0] = static_cast<uint8_t>(h & 0xff);
  p[1] = static_cast<uint8_t>(h >> 8);
}

// Pseudo-random small integers for the hand-built quants (so that no two sub-blocks or bit planes hold
// the same pattern, which would hide a swap).
int mix(int i, int mod) {
  return static_cast<int>(((static_cast<uint32_t>(i) + 1u) * 2654435761u >> 16) % static_cast<uint32_t>(mod));
}

std::vector<float> dequantize(GgmlType t, const std::vector<uint8_t>& block, int64_t n) {
  std::vector<float> y(static_cast<size_t>(n), std::nanf(""));
  ggml_dequantize(t, block.data(), y.data(), n);
  return y;
}

TEST(GgufQuant, MatchesGgmlBitForBit) {
  const Vectors v = read_vectors();
  std::map<uint32_t, int> seen;
  for (const auto& r : v.records) {
    SCOPED_TRACE(std::string(name_of(r.type)) + (r.kind == 0 ? " quantized by ggml" : " random bytes"));
    ASSERT_EQ(ggml_bytes(static_cast<GgmlType>(r.type), r.n), r.data.size());
    std::vector<float> y(r.n, std::nanf(""));
    ggml_dequantize(static_cast<GgmlType>(r.type), r.data.data(), y.data(), r.n);
    size_t bad = 0, first = r.n;
    for (size_t i = 0; i < r.n; ++i) {
      if (bits(y[i]) != bits(r.ggml[i])) {
        if (first == r.n) first = i;
        ++bad;
      }
    }
    EXPECT_EQ(bad, 0u) << "first mismatch at value " << first << ": tessera "
                       << (first < r.n ? y[first] : 0.0f) << ", ggml "
                       << (first < r.n ? r.ggml[first] : 0.0f);
    ++seen[r.type];
  }
  // Every type tessera converts, apart from f32 (a copy), has its vectors.
  for (uint32_t t = 0; t < 64; ++t) {
    const auto* info = ggml_type_info(t);
    if (info && info->dequantizable && t != 0) {
      EXPECT_EQ(seen[t], 2) << info->name << " has no vectors";
    }
  }
}

// The values ggml quantized come back close to the input (a check of the vectors themselves: the right
// input, type and layout); bounds on the relative rms error per row of 256, about 1.5x ggml's.
TEST(GgufQuant, QuantizationErrorIsSmall) {
  const std::map<std::string, double> bound = {
      {"f16", 0.001},   {"bf16", 0.003},  {"q8_0", 0.02}, {"q6_K", 0.035}, {"q5_0", 0.06},
      {"q5_1", 0.1},    {"q5_K", 0.06},   {"q4_0", 0.12}, {"q4_1", 0.14},  {"q4_K", 0.1},
      {"iq4_nl", 0.11}, {"iq4_xs", 0.12}, {"q3_K", 0.23}, {"mxfp4", 0.27}, {"q2_K", 0.63}};
  const Vectors v = read_vectors();
  const size_t row = 256;
  ASSERT_EQ(v.input.size() % row, 0u);
  int checked = 0;
  for (const auto& r : v.records) {
    if (r.kind != 0) continue;
    ASSERT_EQ(r.n, v.input.size());
    std::vector<float> y(r.n);
    ggml_dequantize(static_cast<GgmlType>(r.type), r.data.data(), y.data(), r.n);
    ASSERT_TRUE(bound.count(name_of(r.type))) << name_of(r.type);
    for (size_t r0 = 0; r0 < r.n; r0 += row) {
      double err = 0, ref = 0;
      for (size_t i = r0; i < r0 + row; ++i) {
        err += (double(y[i]) - v.input[i]) * (double(y[i]) - v.input[i]);
        ref += double(v.input[i]) * v.input[i];
      }
      EXPECT_LT(std::sqrt(err / ref), bound.at(name_of(r.type))) << name_of(r.type) << " row " << r0 / row;
    }
    ++checked;
  }
  EXPECT_EQ(checked, static_cast<int>(bound.size()));
}

TEST(GgufQuant, TypeTableMatchesGgml) {
  const Vectors v = read_vectors();
  std::map<uint32_t, VectorType> ggml;
  for (const auto& t : v.types) ggml[t.type] = t;
  ASSERT_GE(ggml.size(), 30u);
  for (uint32_t t = 0; t < 64; ++t) {
    const auto* info = ggml_type_info(t);
    if (!ggml.count(t)) {
      EXPECT_EQ(info, nullptr) << "type " << t << " is no ggml type";
      continue;
    }
    ASSERT_NE(info, nullptr) << "ggml type " << t << " (" << ggml[t].name << ") is missing";
    EXPECT_STREQ(info->name, ggml[t].name.c_str());
    EXPECT_EQ(info->block, ggml[t].block) << info->name;
    EXPECT_EQ(info->block_bytes, ggml[t].block_bytes) << info->name;
  }
  EXPECT_EQ(ggml_type_info(999), nullptr);
  EXPECT_EQ(ggml_type_info(GgmlType::Q4_K)->block, 256);
}

// q8_0: f16 d = 0.5 (0x3800), qs = 3 * (j - 16).  y = 1.5 * (j - 16)
TEST(GgufQuant, HandBuiltQ8_0) {
  std::vector<uint8_t> b(34);
  put_f16(b.data(), 0x3800);
  for (int j = 0; j < 32; ++j) b[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(3 * (j - 16)));
  const auto y = dequantize(GgmlType::Q8_0, b, 32);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(y[j], 1.5f * static_cast<float>(j - 16)) << j;
}

// q4_0: f16 d = -2 (0xC000); byte j has low nibble j (value j) and high nibble 15 - j (value j + 16).
TEST(GgufQuant, HandBuiltQ4_0) {
  std::vector<uint8_t> b(18);
  put_f16(b.data(), 0xC000);
  for (int j = 0; j < 16; ++j) b[2 + j] = static_cast<uint8_t>(j | (15 - j) << 4);
  const auto y = dequantize(GgmlType::Q4_0, b, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], -2.0f * static_cast<float>(j - 8)) << j;
    EXPECT_EQ(y[j + 16], -2.0f * static_cast<float>(7 - j)) << j + 16;
  }
}

// q4_K: d = 0.5, dmin = 0.25, 8 sub-blocks of 32 with 6-bit scales sc and mins m (values >= 16 in the
// last four exercise the top bits kept in bytes 0-7), quant q = (l + 3s) % 16 for value l of
// sub-block s.  y = 0.5 * sc[s] * q - 0.25 * m[s], all exact in f32.
TEST(GgufQuant, HandBuiltQ4_K) {
  const int sc[8] = {1, 2, 63, 17, 10, 33, 48, 63}, m[8] = {0, 5, 63, 7, 40, 1, 32, 17};
  std::vector<uint8_t> b(144);
  put_f16(b.data(), 0x3800);
  put_f16(b.data() + 2, 0x3400);
  uint8_t* s = b.data() + 4;
  for (int j = 0; j < 4; ++j) {
    s[j] = static_cast<uint8_t>(sc[j] | (sc[j + 4] >> 4) << 6);
    s[j + 4] = static_cast<uint8_t>(m[j] | (m[j + 4] >> 4) << 6);
    s[j + 8] = static_cast<uint8_t>((sc[j + 4] & 15) | (m[j + 4] & 15) << 4);
  }
  auto q = [](int sub, int l) { return (l + 3 * sub) % 16; };
  for (int c = 0; c < 4; ++c)  // 64 values per 32 bytes: sub-block 2c low nibbles, 2c + 1 high
    for (int l = 0; l < 32; ++l)
      b[16 + 32 * c + l] = static_cast<uint8_t>(q(2 * c, l) | q(2 * c + 1, l) << 4);
  const auto y = dequantize(GgmlType::Q4_K, b, 256);
  for (int i = 0; i < 256; ++i) {
    const int sub = i / 32;
    EXPECT_EQ(y[i], 0.5f * static_cast<float>(sc[sub] * q(sub, i % 32)) - 0.25f * static_cast<float>(m[sub]))
        << "value " << i;
  }
}

// q3_K: d = 0.5, 16 sub-blocks of 16 with 6-bit scales s (used as s - 32), pseudo-random
// quants q in -4..3. Value i
// (h = i / 128, plane = i % 128 / 32, k = i % 32 / 16, l = i % 16) keeps q & 3 in bits 2*plane of
// qs[32h + 16k + l] and "q >= 0" (the bit is set when 4 is NOT subtracted) in bit 4h + plane of
// hmask[16k + l].  y = 0.5 * (s[i / 16] - 32) * q
TEST(GgufQuant, HandBuiltQ3_K) {
  std::vector<uint8_t> b(110);
  auto scale = [](int i) { return (5 * i + 7) % 64; };
  auto q = [](int i) { return mix(i, 8) - 4; };
  for (int i = 0; i < 256; ++i) {
    const int h = i / 128, plane = i % 128 / 32, k = i % 32 / 16, l = i % 16;
    b[32 + 32 * h + 16 * k + l] |= static_cast<uint8_t>((q(i) & 3) << (2 * plane));
    if (q(i) >= 0) b[16 * k + l] |= static_cast<uint8_t>(1 << (4 * h + plane));
  }
  uint8_t* s = b.data() + 96;
  for (int i = 0; i < 16; ++i) {
    s[i % 8] |= static_cast<uint8_t>((scale(i) & 15) << (i < 8 ? 0 : 4));
    s[8 + i % 4] |= static_cast<uint8_t>((scale(i) >> 4) << (2 * (i / 4)));
  }
  put_f16(b.data() + 108, 0x3800);
  const auto y = dequantize(GgmlType::Q3_K, b, 256);
  for (int i = 0; i < 256; ++i)
    EXPECT_EQ(y[i], 0.5f * static_cast<float>((scale(i / 16) - 32) * q(i))) << "value " << i;
}

// q6_K: d = 0.125, int8 scales sc[s] = (s odd ? -1 : 1) * (s + 1) for the 16 sub-blocks of 16,
// pseudo-random quants q(i) in -32..31 stored as q + 32: value i (h = i / 128, g = i % 128 / 32, l = i % 32)
// has its low 4 bits in ql[64h + l + 32 * (g % 2)] (low nibble for g < 2, high for g >= 2) and its top
// 2 bits at bit 2g of qh[32h + l].  y = 0.125 * sc[i / 16] * q
TEST(GgufQuant, HandBuiltQ6_K) {
  std::vector<uint8_t> b(210);
  auto sc = [](int s) { return (s % 2 ? -1 : 1) * (s + 1); };
  auto q = [](int i) { return mix(i, 64) - 32; };
  for (int i = 0; i < 256; ++i) {
    const int h = i / 128, g = i % 128 / 32, l = i % 32, u = q(i) + 32;
    b[64 * h + l + 32 * (g % 2)] |= static_cast<uint8_t>((u & 15) << (g < 2 ? 0 : 4));
    b[128 + 32 * h + l] |= static_cast<uint8_t>((u >> 4) << (2 * g));
  }
  for (int s = 0; s < 16; ++s) b[192 + s] = static_cast<uint8_t>(static_cast<int8_t>(sc(s)));
  put_f16(b.data() + 208, 0x3000);
  const auto y = dequantize(GgmlType::Q6_K, b, 256);
  for (int i = 0; i < 256; ++i)
    EXPECT_EQ(y[i], 0.125f * static_cast<float>(sc(i / 16) * q(i))) << "value " << i;
}

TEST(GgufQuant, FloatTypesPassThrough) {
  const std::vector<uint16_t> h = {0x3C00, 0xC000, 0x7BFF, 0x0001, 0x8000, 0x7C00, 0x3555};
  const std::vector<float> hf = {1.0f,  -2.0f,    65504.0f,       std::ldexp(1.0f, -24),
                                 -0.0f, INFINITY, 0.333251953125f};
  std::vector<float> y(h.size());
  ggml_dequantize(GgmlType::F16, h.data(), y.data(), static_cast<int64_t>(h.size()));
  for (size_t i = 0; i < h.size(); ++i) EXPECT_EQ(bits(y[i]), bits(hf[i])) << "f16 " << i;

  const std::vector<uint16_t> bf = {0x3F80, 0xC0A0, 0x7F80, 0x0001, 0x4049};
  const std::vector<float> bff = {1.0f, -5.0f, INFINITY, std::ldexp(1.0f, -133), 3.140625f};
  y.resize(bf.size());
  ggml_dequantize(GgmlType::BF16, bf.data(), y.data(), static_cast<int64_t>(bf.size()));
  for (size_t i = 0; i < bf.size(); ++i) EXPECT_EQ(bits(y[i]), bits(bff[i])) << "bf16 " << i;

  const std::vector<float> f = {1.5f, -0.0f, std::nanf("7"), 1e-40f};
  y.resize(f.size());
  ggml_dequantize(GgmlType::F32, f.data(), y.data(), static_cast<int64_t>(f.size()));
  EXPECT_EQ(std::memcmp(y.data(), f.data(), f.size() * 4), 0);
  EXPECT_EQ(ggml_bytes(GgmlType::F32, 3), 12u);
  EXPECT_EQ(ggml_bytes(GgmlType::BF16, 3), 6u);
}

TEST(GgufQuant, Errors) {
  EXPECT_EQ(ggml_bytes(GgmlType::Q4_0, 64), 36u);
  EXPECT_EQ(ggml_bytes(GgmlType::Q4_K, 512), 288u);
  EXPECT_EQ(ggml_bytes(GgmlType::IQ2_XXS, 256), 66u);  // sizes are known for every type
  test::expect_error([] { ggml_bytes(GgmlType::Q4_0, 33); }, "q4_0");
  test::expect_error([] { ggml_bytes(GgmlType::Q4_K, 128); }, "multiple of 256");
  test::expect_error([] { ggml_bytes(GgmlType::Q8_0, 0); }, "positive multiple of 32");
  test::expect_error([] { ggml_bytes(static_cast<GgmlType>(4), 32); }, "unknown GGUF tensor type number 4");
  std::vector<uint8_t> src(1024);
  std::vector<float> dst(256);
  test::expect_error([&] { ggml_dequantize(GgmlType::Q8_0, src.data(), dst.data(), 48); }, "multiple of 32");
  test::expect_error(
      [&] { ggml_dequantize(GgmlType::IQ2_XXS, src.data(), dst.data(), 256); },
      "GGUF tensor type iq2_xxs cannot be loaded by tessera (supported: f32, f16, bf16, q4_0, q4_1");
  test::expect_error([&] { ggml_dequantize(GgmlType::IQ2_XXS, src.data(), dst.data(), 256); },
                     "mxfp4); re-quantize the model to one of these");
  for (auto t : {GgmlType::Q8_1, GgmlType::Q8_K, GgmlType::IQ3_S, GgmlType::IQ1_M, GgmlType::TQ2_0,
                 GgmlType::I32, GgmlType::F64, GgmlType::NVFP4}) {
    const std::string name = ggml_type_info(t)->name;
    EXPECT_FALSE(ggml_type_info(t)->dequantizable) << name;
    test::expect_error([&] { ggml_dequantize(t, src.data(), dst.data(), 256); }, "type " + name + " cannot");
  }
  test::expect_error([&] { ggml_dequantize(static_cast<GgmlType>(999), src.data(), dst.data(), 256); },
                     "GGUF tensor type number 999 cannot be loaded");
  EXPECT_EQ(ggml_type_info(999), nullptr);
}

}  // namespace
}  // namespace tessera
