// The safetensors reader (io/safetensors.h): the format aligns nothing, so a tensor that does not start
// at a multiple of its element size is copied to aligned memory (its values are read in place otherwise;
// a misaligned load is undefined behaviour, which the fuzzers' sanitizers report).
#include "io/safetensors.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "test_util.h"

namespace tessera {
namespace {

TEST(Safetensors, MisalignedTensorsAreCopiedToAlignedMemory) {
  const auto dir = test::temp_dir("st_align");
  // "a" (3 bf16, 6 bytes) first: "b" (f32) starts at data byte 6, "c" (bf16) at byte 14.
  const std::vector<uint16_t> a = {0x3f80, 0x4000, 0x4040};
  const std::vector<float> b = {1.5f, -2.25f};
  const std::vector<uint16_t> c = {0x4080};
  write_safetensors(dir / "model.safetensors", {{"a", DType::BF16, {3}, a.data()},
                                                {"b", DType::F32, {2}, b.data()},
                                                {"c", DType::BF16, {1}, c.data()}});
  const Checkpoint ck = Checkpoint::open(dir);
  const StTensor& tb = ck.get("b", {2});
  EXPECT_EQ(reinterpret_cast<uintptr_t>(tb.data) % 4, 0u);
  std::vector<float> got(2);
  std::memcpy(got.data(), tb.data, 8);
  EXPECT_EQ(got, b);
  const StTensor& ta = ck.get("a", {3});
  EXPECT_EQ(std::memcmp(ta.data, a.data(), 6), 0);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(ck.get("c", {1}).data) % 2, 0u);
  EXPECT_EQ(*static_cast<const uint16_t*>(ck.get("c", {1}).data), 0x4080);
}

}  // namespace
}  // namespace tessera
