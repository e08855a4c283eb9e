// Helpers of the CUDA tests: a fixture that skips without a GPU, device buffers poisoned before
// every run (so unwritten outputs fail), and comparison against the CPU backend.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "engine/engine.h"
#include "test_util.h"

namespace tessera::test {

// An Engine on the GPU (an 8 GiB workspace reservation: the tests' models are tiny).
inline EngineOptions cuda_engine_options(Precision p = Precision::Auto) {
  EngineOptions o;
  o.device = "cuda";
  o.precision = p;
  o.reserve_bytes = size_t{8} << 30;
  return o;
}

class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    gpu = make_cuda_backend(&why);
    if (!gpu) GTEST_SKIP() << "no GPU: " << why;
    cpu = make_cpu_backend();
  }
  std::unique_ptr<Backend> gpu, cpu;
};

// A device buffer of the CUDA backend and its host mirror.
struct DevBuf {
  Backend* b = nullptr;
  void* p = nullptr;
  size_t bytes = 0;
  DevBuf(Backend& be, size_t n) : b(&be), bytes(n) { p = b->alloc_weights(n); }
  ~DevBuf() { b->free_weights(p); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  template <typename T>
  void upload(const std::vector<T>& v) {
    b->copy_to_device(p, v.data(), v.size() * sizeof(T));
  }
  // 0xFF bytes: NaN for f32 and bf16, -1 for i32.
  void poison() {
    std::vector<unsigned char> f(bytes, 0xFF);
    b->copy_to_device(p, f.data(), bytes);
  }
  template <typename T>
  std::vector<T> download(size_t n) const {
    std::vector<T> v(n);
    b->copy_to_host(v.data(), p, n * sizeof(T));
    return v;
  }
  Tensor view(DType t, std::initializer_list<int64_t> dims) const { return Tensor(p, t, dims, Device::CUDA); }
};

inline std::vector<uint16_t> to_bf16(const std::vector<float>& f) {
  std::vector<uint16_t> v(f.size());
  for (size_t i = 0; i < f.size(); ++i) v[i] = f32_to_bf16(f[i]);
  return v;
}
inline std::vector<float> from_bf16(const std::vector<uint16_t>& h) {
  std::vector<float> v(h.size());
  for (size_t i = 0; i < h.size(); ++i) v[i] = bf16_to_f32(h[i]);
  return v;
}
inline size_t count_nan(const std::vector<float>& v) {
  size_t n = 0;
  for (float x : v) n += std::isnan(x) ? 1 : 0;
  return n;
}

// Parameterised test names by case index (the parameters are plain structs).
struct CaseIndexName {
  template <typename T>
  std::string operator()(const ::testing::TestParamInfo<T>& info) const {
    return "case" + std::to_string(info.index);
  }
};
inline constexpr CaseIndexName case_index_name{};

// Every element written (no NaN left from the poison) and the relative error within the bound.
#define EXPECT_CLOSE_TO_CPU(gpu_vals, cpu_vals, bound)                                                       \
  do {                                                                                                       \
    ASSERT_EQ((gpu_vals).size(), (cpu_vals).size());                                                         \
    EXPECT_EQ(::tessera::test::count_nan(gpu_vals), 0u) << "unwritten or NaN outputs";                       \
    const double err_ = ::tessera::test::rel_error((gpu_vals).data(), (cpu_vals).data(), (gpu_vals).size()); \
    EXPECT_LE(err_, (bound));                                                                                \
  } while (0)

}  // namespace tessera::test
