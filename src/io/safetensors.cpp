#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace tessera {
namespace fs = std::filesystem;
using json = nlohmann::json;

MappedFile::MappedFile(const fs::path& p) {
  const int fd = ::open(p.c_str(), O_RDONLY);
  if (fd < 0) fail("cannot open " + p.string() + ": " + std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    ::close(fd);
    fail("cannot stat " + p.string());
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* m = mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      ::close(fd);
      fail("cannot mmap " + p.string() + ": " + std::strerror(errno));
    }
    data_ = static_cast<const char*>(m);
  }
  ::close(fd);
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) munmap(const_cast<char*>(data_), size_);
}

namespace {

DType parse_dtype(const std::string& s, const std::string& tensor, const std::string& file) {
  if (s == "BF16") return DType::BF16;
  if (s == "F16") return DType::F16;
  if (s == "F32") return DType::F32;
  fail(file + ": tensor '" + tensor + "' has dtype " + s +
       ", which tessera does not load (supported: BF16, F16, F32)");
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

}  // namespace

void Checkpoint::add_file(const fs::path& p) {
  auto mf = std::make_unique<MappedFile>(p);
  const std::string fname = p.filename().string();
  if (mf->size() < 8) fail(fname + ": truncated safetensors file (" + std::to_string(mf->size()) + " bytes)");
  uint64_t hlen = 0;
  std::memcpy(&hlen, mf->data(), 8);
  if (hlen > mf->size() - 8) {
    fail(fname + ": header length " + std::to_string(hlen) + " exceeds the file size " +
         std::to_string(mf->size()) + " (truncated or not a safetensors file)");
  }
  json h;
  try {
    h = json::parse(mf->data() + 8, mf->data() + 8 + hlen);
  } catch (const std::exception& e) {
    fail(fname + ": the safetensors header is not valid JSON: " + e.what());
  }
  if (!h.is_object()) fail(fname + ": the safetensors header is not a JSON object");
  const size_t data_start = 8 + hlen;
  const size_t data_size = mf->size() - data_start;
  for (auto it = h.begin(); it != h.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const json& t = it.value();
    StTensor st;
    st.name = it.key();
    st.file = fname;
    if (!t.is_object() || !t.contains("dtype") || !t.contains("shape") || !t.contains("data_offsets")) {
      fail(fname + ": tensor '" + st.name + "' lacks dtype, shape or data_offsets");
    }
    st.dtype = parse_dtype(t["dtype"].get<std::string>(), st.name, fname);
    for (const auto& d : t["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0)
        fail(fname + ": tensor '" + st.name + "' has a bad shape");
      st.shape.push_back(d.get<int64_t>());
    }
    const auto& off = t["data_offsets"];
    if (!off.is_array() || off.size() != 2) fail(fname + ": tensor '" + st.name + "' has bad data_offsets");
    const auto b = off[0].get<uint64_t>(), e = off[1].get<uint64_t>();
    const size_t want = static_cast<size_t>(st.numel()) * dtype_size(st.dtype);
    if (e < b || e - b != want) {
      fail(fname + ": tensor '" + st.name + "' " + shape_str(st.shape) + " " +
           std::string(dtype_name(st.dtype)) + " needs " + std::to_string(want) +
           " bytes but its data_offsets span " + std::to_string(e - b));
    }
    if (e > data_size) {
      fail(fname + ": tensor '" + st.name + "' ends at byte " + std::to_string(e) +
           " but the file holds only " + std::to_string(data_size) + " data bytes (truncated?)");
    }
    const char* at = mf->data() + data_start + b;
    if (reinterpret_cast<uintptr_t>(at) % dtype_size(st.dtype) != 0) {
      // The format aligns nothing: a tensor that does not start at a multiple of its element size (a
      // bf16 tensor of odd length before it, a header not padded) is copied to aligned memory, since
      // its values are read in place otherwise.
      auto copy = std::make_shared<std::vector<uint64_t>>((want + 7) / 8);
      std::memcpy(copy->data(), at, want);
      at = reinterpret_cast<const char*>(copy->data());
      owners_.push_back(std::move(copy));
    }
    st.data = at;
    st.bytes = want;
    if (tensors_.count(st.name)) fail(fname + ": tensor '" + st.name + "' appears in two files");
    tensors_.emplace(st.name, std::move(st));
  }
  files_.push_back(std::move(mf));
}

Checkpoint Checkpoint::open(const fs::path& dir) {
  Checkpoint c;
  c.dir_ = dir;
  if (!fs::is_directory(dir)) fail("model directory " + dir.string() + " does not exist");
  const fs::path index = dir / "model.safetensors.index.json";
  if (fs::exists(index)) {
    json j;
    try {
      std::ifstream f(index);
      j = json::parse(f);
    } catch (const std::exception& e) {
      fail(index.string() + ": not valid JSON: " + e.what());
    }
    if (!j.contains("weight_map") || !j["weight_map"].is_object()) {
      fail(index.string() + ": missing the 'weight_map' object");
    }
    std::map<std::string, std::vector<std::string>> by_file;
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      // Shards are files of the directory: a name with a path (absolute, "..") is refused.
      const std::string file = it.value().is_string() ? it.value().get<std::string>() : "";
      if (file.empty() || file.find('/') != std::string::npos || file == "..")
        fail(index.string() + ": the shard of tensor '" + it.key() + "' is not a file name of the directory");
      by_file[file].push_back(it.key());
    }
    for (const auto& [file, names] : by_file) {
      if (!fs::exists(dir / file)) fail(index.string() + " lists shard " + file + ", which is missing");
      c.add_file(dir / file);
      for (const auto& n : names) {
        if (!c.tensors_.count(n)) fail(index.string() + ": tensor '" + n + "' is not in " + file);
      }
    }
  } else {
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(dir)) {
      if (e.path().extension() == ".safetensors") files.push_back(e.path());
    }
    std::sort(files.begin(), files.end());
    if (files.empty()) fail("no .safetensors files in " + dir.string());
    for (const auto& f : files) c.add_file(f);
  }
  return c;
}

void Checkpoint::add(StTensor t) {
  const std::string name = t.name;
  if (!tensors_.emplace(name, std::move(t)).second)
    fail(dir_.string() + ": tensor '" + name + "' appears twice");
}

const StTensor* Checkpoint::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

std::string Checkpoint::quoted(const std::string& name) const {
  const std::string src = source_name_ ? source_name_(name) : std::string();
  return src.empty() || src == name ? "'" + name + "'" : "'" + src + "' (" + name + ")";
}

const StTensor& Checkpoint::get(const std::string& name, const std::vector<int64_t>& shape) const {
  const StTensor* t = find(name);
  if (t == nullptr) fail("checkpoint " + dir_.string() + ": tensor " + quoted(name) + " is missing");
  if (t->shape != shape) {
    fail(t->file + ": tensor " + quoted(name) + " has shape " + shape_str(t->shape) +
         " but the model's config implies " + shape_str(shape));
  }
  return *t;
}

size_t Checkpoint::total_bytes() const {
  size_t n = 0;
  for (const auto& [k, t] : tensors_) n += t.bytes;
  return n;
}

void write_safetensors(const fs::path& path, const std::vector<StWrite>& tensors) {
  json h = json::object();
  h["__metadata__"] = {{"format", "pt"}};
  size_t off = 0;
  for (const auto& t : tensors) {
    size_t n = dtype_size(t.dtype);
    for (int64_t d : t.shape) n *= static_cast<size_t>(d);
    const char* dt = t.dtype == DType::BF16 ? "BF16" : t.dtype == DType::F16 ? "F16" : "F32";
    h[t.name] = {{"dtype", dt}, {"shape", t.shape}, {"data_offsets", {off, off + n}}};
    off += n;
  }
  std::string hs = h.dump();
  while (hs.size() % 8 != 0) hs.push_back(' ');
  std::ofstream f(path, std::ios::binary);
  if (!f) fail("cannot write " + path.string());
  const uint64_t hl = hs.size();
  f.write(reinterpret_cast<const char*>(&hl), 8);
  f.write(hs.data(), static_cast<std::streamsize>(hs.size()));
  for (const auto& t : tensors) {
    size_t n = dtype_size(t.dtype);
    for (int64_t d : t.shape) n *= static_cast<size_t>(d);
    f.write(static_cast<const char*>(t.data), static_cast<std::streamsize>(n));
  }
  if (!f) fail("error writing " + path.string());
}

}  // namespace tessera
