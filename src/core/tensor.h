// A non-owning view of a contiguous row-major tensor (host or device memory).
#pragma once
#include <array>
#include <cstdint>
#include <initializer_list>

#include "core/dtype.h"

namespace tessera {

enum class Device : uint8_t { CPU, CUDA };

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::F32;
  Device device = Device::CPU;
  int ndim = 0;
  std::array<int64_t, 4> shape{};

  Tensor() = default;
  Tensor(void* p, DType t, std::initializer_list<int64_t> dims, Device dev = Device::CPU)
      : data(p), dtype(t), device(dev) {
    for (int64_t d : dims) shape[static_cast<size_t>(ndim++)] = d;
  }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= shape[static_cast<size_t>(i)];
    return n;
  }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  int64_t dim(int i) const { return shape[static_cast<size_t>(i < 0 ? ndim + i : i)]; }
  // Rows = product of all but the last dim; cols = last dim.
  int64_t rows() const { return ndim == 0 ? 1 : numel() / shape[static_cast<size_t>(ndim - 1)]; }
  int64_t cols() const { return ndim == 0 ? 1 : shape[static_cast<size_t>(ndim - 1)]; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data);
  }
};

}  // namespace tessera
