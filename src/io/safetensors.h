// Hugging Face safetensors: mmap'd files, single or sharded (model.safetensors.index.json).
// Every header is validated: dtype known, offsets inside the file and consistent with the shape.
#pragma once
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace tessera {

struct StTensor {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t bytes = 0;
  std::string file;  // file name (for error messages)
  // >= 0: a quantized GGUF tensor kept in its ggml blocks (a GgmlType; `dtype` is then meaningless
  // and `bytes` the blocks' size); see Tensor::quant.
  int16_t quant = -1;
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

class MappedFile {
 public:
  explicit MappedFile(const std::filesystem::path& p);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const char* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  const char* data_ = nullptr;
  size_t size_ = 0;
};

class Checkpoint {
 public:
  // Opens DIR/model.safetensors.index.json if present, else every DIR/*.safetensors.
  static Checkpoint open(const std::filesystem::path& dir);
  const StTensor* find(const std::string& name) const;
  // The tensor, with its shape checked; a clear error names the tensor and the file otherwise.
  const StTensor& get(const std::string& name, const std::vector<int64_t>& shape) const;
  const std::map<std::string, StTensor>& tensors() const { return tensors_; }
  size_t total_bytes() const;
  // Adds a tensor whose bytes stay valid while the checkpoint lives (see keep()); a name present
  // twice throws.
  void add(StTensor t);
  // Keeps `owner` (a mapped file, converted bytes) alive as long as the checkpoint.
  void keep(std::shared_ptr<const void> owner) { owners_.push_back(std::move(owner)); }
  void set_source(const std::filesystem::path& p) { dir_ = p; }
  // How the source names a tensor that tessera names `name` (GGUF: "blk.0.attn_q.weight" for
  // "model.layers.0.self_attn.q_proj.weight"), for error messages; "" = the same name.
  void set_source_names(std::function<std::string(const std::string&)> f) { source_name_ = std::move(f); }

 private:
  void add_file(const std::filesystem::path& p);
  std::vector<std::unique_ptr<MappedFile>> files_;
  std::vector<std::shared_ptr<const void>> owners_;
  std::map<std::string, StTensor> tensors_;
  std::filesystem::path dir_;
  std::function<std::string(const std::string&)> source_name_;
  std::string quoted(const std::string& name) const;
};

// Writes a single safetensors file (used by the converter and the tests).
struct StWrite {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  const void* data;
};
void write_safetensors(const std::filesystem::path& path, const std::vector<StWrite>& tensors);

}  // namespace tessera
