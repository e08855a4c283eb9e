// A non-owning view of a contiguous row-major tensor (host or device memory).
#pragma once
#include <array>
#include <cstdint>
#include <initializer_list>

#include "core/dtype.h"
#include "core/ggml_quant.h"

namespace tessera {

enum class Device : uint8_t { CPU, CUDA };

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::F32;
  Device device = Device::CPU;
  int ndim = 0;
  std::array<int64_t, 4> shape{};
  // Weights kept in a ggml block format (a quantized GGUF tensor, CPU backend only): the GgmlType of
  // the blocks at `data`, each row of cols() values being whole blocks; the values compute as `dtype`
  // (the dtype GEMMs dequantize them to). -1 for every plain tensor.
  int16_t quant = -1;

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
  bool quantized() const { return quant >= 0; }
  size_t nbytes() const {
    if (quantized()) return static_cast<size_t>(rows()) * row_bytes();
    return static_cast<size_t>(numel()) * dtype_size(dtype);
  }
  // Bytes of one row (of cols() values).
  size_t row_bytes() const {
    if (quantized()) return ggml_bytes(static_cast<GgmlType>(quant), cols());
    return static_cast<size_t>(cols()) * dtype_size(dtype);
  }
  // Rows [row0, row0 + n) of this tensor (rows of any storage, ggml blocks included, are contiguous).
  Tensor row_view(int64_t row0, int64_t n) const {
    Tensor v = *this;
    v.data = static_cast<char*>(data) + static_cast<size_t>(row0) * row_bytes();
    v.shape[0] = n;
    return v;
  }
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
