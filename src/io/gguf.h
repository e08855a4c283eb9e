// GGUF files (llama.cpp's single-file model format, versions 2 and 3): the metadata key/values and
// the tensor directory, read from an mmap'd file. Every count, length, type and offset is checked
// against the file before use, so a truncated or malformed file fails with a message that names the
// file and what is wrong, never a crash.
#pragma once
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/ggml_quant.h"
#include "io/safetensors.h"

namespace tessera {

// One metadata value. Scalars keep their GGUF type; integers are widened to int64 (uint64 values
// above INT64_MAX are refused), floats to double. Arrays hold their elements in `strs` (string
// arrays) or `ints` / `floats` (numeric arrays; bool arrays as ints).
struct GgufValue {
  enum Type : uint32_t {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    String = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
  };
  Type type = U8;
  Type elem = U8;  // element type of an Array
  int64_t i = 0;
  double f = 0.0;
  std::string s;
  std::vector<std::string> strs;
  std::vector<int64_t> ints;
  std::vector<double> floats;
  bool is_int() const { return type <= I32 || type == U64 || type == I64 || type == Bool; }
  bool is_float() const { return type == F32 || type == F64; }
  size_t size() const { return strs.size() + ints.size() + floats.size(); }
};
const char* gguf_value_type_name(uint32_t t);

struct GgufTensor {
  std::string name;
  std::vector<int64_t> ne;  // ggml order: ne[0] is the contiguous dimension
  GgmlType type = GgmlType::F32;
  const uint8_t* data = nullptr;
  size_t bytes = 0;
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : ne) n *= d;
    return n;
  }
  // The shape in row-major order (the reverse of ne), as Hugging Face writes it.
  std::vector<int64_t> shape() const { return {ne.rbegin(), ne.rend()}; }
};

class GgufFile {
 public:
  // Maps and parses the file. Throws tessera::Error (naming the file and the fault) for anything
  // that is not a well-formed little-endian GGUF v2 / v3 file.
  static std::shared_ptr<const GgufFile> open(const std::filesystem::path& path);

  const std::filesystem::path& path() const { return path_; }
  uint32_t version() const { return version_; }
  const std::map<std::string, GgufValue>& metadata() const { return kv_; }
  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  const GgufValue* find(const std::string& key) const;
  const GgufTensor* find_tensor(const std::string& name) const;

  // Typed getters: the value of `key`, converted; a missing key gives `dflt` (the required
  // versions throw naming the key), a key of the wrong type always throws.
  std::string get_string(const std::string& key, const std::string& dflt) const;
  std::string require_string(const std::string& key) const;
  int64_t get_int(const std::string& key, int64_t dflt) const;
  int64_t require_int(const std::string& key) const;
  double get_float(const std::string& key, double dflt) const;
  bool get_bool(const std::string& key, bool dflt) const;

 private:
  GgufFile() = default;
  std::filesystem::path path_;
  std::unique_ptr<MappedFile> file_;
  uint32_t version_ = 0;
  std::map<std::string, GgufValue> kv_;
  std::vector<GgufTensor> tensors_;
  std::map<std::string, size_t> tensor_index_;
};

// True when `path` names a GGUF file (a regular file starting with the magic "GGUF").
bool is_gguf_file(const std::filesystem::path& path);

// Writes a GGUF v3 file (tests and tools): metadata in the given order, tensors aligned to 32 bytes.
// Tensor data must already be in the tensor's type (raw blocks for quantized types).
struct GgufWriteTensor {
  std::string name;
  std::vector<int64_t> ne;  // ggml order
  GgmlType type = GgmlType::F32;
  std::vector<uint8_t> data;
};
void write_gguf(const std::filesystem::path& path, const std::vector<std::pair<std::string, GgufValue>>& kv,
                const std::vector<GgufWriteTensor>& tensors);

}  // namespace tessera
