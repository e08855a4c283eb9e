#include "io/gguf.h"

#include <cstring>
#include <fstream>
#include <limits>

#include "core/error.h"
#include "core/utf8.h"

namespace tessera {
namespace fs = std::filesystem;

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr uint64_t kDefaultAlignment = 32;
constexpr uint64_t kMaxDims = 4;  // GGML_MAX_DIMS

// `s` with control characters and bytes that are not UTF-8 written as \xNN: the names a corrupt file
// holds are quoted in messages.
std::string printable(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8_char_length(s, i);
    const auto c = static_cast<unsigned char>(s[i]);
    if (n > 0 && c >= 0x20 && c != 0x7F) {
      out.append(s, i, n);
      i += n;
    } else {
      static const char* hex = "0123456789abcdef";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
      ++i;
    }
  }
  return out;
}

// Bounds-checked cursor over the mapped bytes; every read names the file on failure.
class Reader {
 public:
  Reader(const uint8_t* p, size_t n, std::string file) : p_(p), n_(n), file_(std::move(file)) {}
  size_t pos() const { return at_; }
  size_t size() const { return n_; }
  [[noreturn]] void bad(const std::string& what) const {
    fail(file_ + ": not a valid GGUF file: " + printable(what) + " (at byte " + std::to_string(at_) + " of " +
         std::to_string(n_) + ")");
  }
  void need(uint64_t bytes, const char* what) const {
    if (bytes > n_ - at_) bad(std::string("truncated while reading ") + what);
  }
  template <class T>
  T read(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, p_ + at_, sizeof(T));
    at_ += sizeof(T);
    return v;
  }
  std::string read_string(const char* what) {
    const uint64_t len = read<uint64_t>(what);
    need(len, what);
    std::string s(reinterpret_cast<const char*>(p_ + at_), static_cast<size_t>(len));
    at_ += static_cast<size_t>(len);
    return s;
  }

 private:
  const uint8_t* p_;
  size_t n_;
  size_t at_ = 0;
  std::string file_;
};

// Bytes of one element of a scalar GGUF value type (0 for String / Array / unknown).
size_t scalar_bytes(uint32_t t) {
  switch (t) {
    case GgufValue::U8:
    case GgufValue::I8:
    case GgufValue::Bool:
      return 1;
    case GgufValue::U16:
    case GgufValue::I16:
      return 2;
    case GgufValue::U32:
    case GgufValue::I32:
    case GgufValue::F32:
      return 4;
    case GgufValue::U64:
    case GgufValue::I64:
    case GgufValue::F64:
      return 8;
    default:
      return 0;
  }
}

// Reads one scalar of type t as int64 (integers, bool) or double (floats).
void read_scalar(Reader& r, uint32_t t, int64_t& i, double& f, const std::string& key) {
  const char* what = "a metadata value";
  switch (t) {
    case GgufValue::U8:
      i = r.read<uint8_t>(what);
      return;
    case GgufValue::I8:
      i = r.read<int8_t>(what);
      return;
    case GgufValue::U16:
      i = r.read<uint16_t>(what);
      return;
    case GgufValue::I16:
      i = r.read<int16_t>(what);
      return;
    case GgufValue::U32:
      i = r.read<uint32_t>(what);
      return;
    case GgufValue::I32:
      i = r.read<int32_t>(what);
      return;
    case GgufValue::U64: {
      const uint64_t u = r.read<uint64_t>(what);
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        r.bad("metadata '" + key + "' holds a uint64 too large for tessera (" + std::to_string(u) + ")");
      i = static_cast<int64_t>(u);
      return;
    }
    case GgufValue::I64:
      i = r.read<int64_t>(what);
      return;
    case GgufValue::Bool: {
      const uint8_t b = r.read<uint8_t>(what);
      if (b > 1) r.bad("metadata '" + key + "' is a bool of value " + std::to_string(b));
      i = b;
      return;
    }
    case GgufValue::F32:
      f = r.read<float>(what);
      return;
    case GgufValue::F64:
      f = r.read<double>(what);
      return;
    default:
      r.bad("metadata '" + key + "' has unknown value type " + std::to_string(t));
  }
}

GgufValue read_value(Reader& r, uint32_t type, const std::string& key) {
  GgufValue v;
  v.type = static_cast<GgufValue::Type>(type);
  if (type == GgufValue::String) {
    v.s = r.read_string("a string value");
  } else if (type == GgufValue::Array) {
    const uint32_t elem = r.read<uint32_t>("an array type");
    const uint64_t n = r.read<uint64_t>("an array length");
    v.elem = static_cast<GgufValue::Type>(elem);
    if (elem == GgufValue::Array) r.bad("metadata '" + key + "' is an array of arrays (not supported)");
    if (elem == GgufValue::String) {
      // Each string takes at least its 8-byte length: bounds the count before reserving.
      r.need(n * 8, "a string array");
      v.strs.reserve(static_cast<size_t>(n));
      for (uint64_t k = 0; k < n; ++k) v.strs.push_back(r.read_string("a string array element"));
    } else {
      const size_t eb = scalar_bytes(elem);
      if (eb == 0) r.bad("metadata '" + key + "' is an array of unknown type " + std::to_string(elem));
      if (n > (r.size() - r.pos()) / eb) r.bad("metadata '" + key + "' array is longer than the file");
      const bool is_float = elem == GgufValue::F32 || elem == GgufValue::F64;
      (is_float ? v.floats.reserve(n) : v.ints.reserve(n));
      for (uint64_t k = 0; k < n; ++k) {
        int64_t i = 0;
        double f = 0;
        read_scalar(r, elem, i, f, key);
        if (is_float)
          v.floats.push_back(f);
        else
          v.ints.push_back(i);
      }
    }
  } else {
    read_scalar(r, type, v.i, v.f, key);
  }
  return v;
}

std::string ne_str(const std::vector<int64_t>& ne) {
  std::string s = "[";
  for (size_t i = 0; i < ne.size(); ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
  return s + "]";
}

}  // namespace

const char* gguf_value_type_name(uint32_t t) {
  static const char* const names[] = {"u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
                                      "bool", "string", "array", "u64", "i64", "f64"};
  return t < std::size(names) ? names[t] : "unknown";
}

bool is_gguf_file(const fs::path& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return false;
  std::ifstream f(path, std::ios::binary);
  char magic[4] = {};
  return f.read(magic, 4) && std::memcmp(magic, "GGUF", 4) == 0;
}

std::shared_ptr<const GgufFile> GgufFile::open(const fs::path& path) {
  std::shared_ptr<GgufFile> g(new GgufFile());
  g->path_ = path;
  g->file_ = std::make_unique<MappedFile>(path);
  const auto* base = reinterpret_cast<const uint8_t*>(g->file_->data());
  Reader r(base, g->file_->size(), path.string());

  const uint32_t magic = r.read<uint32_t>("the magic");
  if (magic != kMagic) r.bad("the file does not start with \"GGUF\"");
  g->version_ = r.read<uint32_t>("the version");
  if (g->version_ == 1) r.bad("GGUF version 1 is obsolete; convert the model again with a current llama.cpp");
  if (g->version_ != 2 && g->version_ != 3) {
    // A big-endian file stores its version byte-swapped.
    if (g->version_ == 0x02000000u || g->version_ == 0x03000000u)
      r.bad("big-endian GGUF files are not supported");
    r.bad("unknown GGUF version " + std::to_string(g->version_));
  }
  const uint64_t n_tensors = r.read<uint64_t>("the tensor count");
  const uint64_t n_kv = r.read<uint64_t>("the metadata count");
  // Every key/value takes at least 12 bytes and every tensor info at least 24.
  if (n_kv > r.size() / 12 || n_tensors > r.size() / 24) r.bad("counts larger than the file");

  for (uint64_t k = 0; k < n_kv; ++k) {
    std::string key = r.read_string("a metadata key");
    if (key.empty()) r.bad("an empty metadata key");
    const uint32_t type = r.read<uint32_t>("a metadata type");
    GgufValue v = read_value(r, type, key);
    if (!g->kv_.emplace(key, std::move(v)).second) r.bad("metadata key '" + key + "' appears twice");
  }

  uint64_t alignment = kDefaultAlignment;
  if (const GgufValue* a = g->find("general.alignment")) {
    if (a->type != GgufValue::U32 && a->type != GgufValue::U64 && a->type != GgufValue::I32)
      r.bad("general.alignment must be an unsigned integer");
    alignment = static_cast<uint64_t>(a->i);
    if (alignment == 0 || (alignment & (alignment - 1)) != 0)
      r.bad("general.alignment " + std::to_string(alignment) + " is not a power of two");
  }

  struct Info {
    std::string name;
    std::vector<int64_t> ne;
    uint32_t type;
    uint64_t offset;
  };
  std::vector<Info> infos;
  infos.reserve(static_cast<size_t>(n_tensors));
  for (uint64_t k = 0; k < n_tensors; ++k) {
    Info t;
    t.name = r.read_string("a tensor name");
    const uint32_t nd = r.read<uint32_t>("a tensor's dimension count");
    if (nd == 0 || nd > kMaxDims)
      r.bad("tensor '" + t.name + "' has " + std::to_string(nd) + " dimensions (1 to 4 allowed)");
    for (uint32_t d = 0; d < nd; ++d) {
      const int64_t e = r.read<int64_t>("a tensor dimension");
      if (e <= 0 || e > (int64_t{1} << 40))
        r.bad("tensor '" + t.name + "' has dimension " + std::to_string(e));
      t.ne.push_back(e);
    }
    t.type = r.read<uint32_t>("a tensor type");
    t.offset = r.read<uint64_t>("a tensor offset");
    infos.push_back(std::move(t));
  }
  // The data section starts at the next multiple of the alignment.
  const uint64_t data_start = (r.pos() + alignment - 1) / alignment * alignment;
  if (data_start > r.size() && !infos.empty()) r.bad("the tensor data section is missing");

  for (Info& t : infos) {
    const GgmlTypeInfo* ti = ggml_type_info(t.type);
    if (ti == nullptr) r.bad("tensor '" + t.name + "' has unknown ggml type " + std::to_string(t.type));
    if (t.ne[0] % ti->block != 0)
      r.bad("tensor '" + t.name + "' " + ne_str(t.ne) + " of type " + ti->name + ": rows of " +
            std::to_string(t.ne[0]) + " are not a multiple of the block of " + std::to_string(ti->block));
    int64_t numel = 1;
    for (int64_t e : t.ne) {
      if (numel > (int64_t{1} << 50) / e) r.bad("tensor '" + t.name + "' is too large");
      numel *= e;
    }
    const uint64_t bytes = static_cast<uint64_t>(numel / ti->block) * ti->block_bytes;
    if (t.offset % alignment != 0)
      r.bad("tensor '" + t.name + "' offset " + std::to_string(t.offset) + " is not aligned to " +
            std::to_string(alignment));
    if (t.offset > r.size() || bytes > r.size() - data_start || data_start + t.offset > r.size() - bytes)
      r.bad("tensor '" + t.name + "' (" + std::to_string(bytes) + " bytes at data offset " +
            std::to_string(t.offset) + ") runs past the end of the file");
    // The values are read in place (mapped memory): each must sit at a multiple of its type's alignment
    // (f32 4, f16 / bf16 2, blocks of an even size 2), which a general.alignment below it need not give.
    const uint64_t natural = ti->block == 1 ? ti->block_bytes : ti->block_bytes % 2 == 0 ? 2 : 1;
    if ((data_start + t.offset) % natural != 0)
      r.bad("tensor '" + t.name + "' of type " + ti->name + " starts at byte " +
            std::to_string(data_start + t.offset) + " of the file, not a multiple of " +
            std::to_string(natural) + " (general.alignment " + std::to_string(alignment) +
            "): its values cannot be read in place");
    GgufTensor gt;
    gt.name = t.name;
    gt.ne = t.ne;
    gt.type = static_cast<GgmlType>(t.type);
    gt.data = base + data_start + t.offset;
    gt.bytes = static_cast<size_t>(bytes);
    if (!g->tensor_index_.emplace(gt.name, g->tensors_.size()).second)
      r.bad("tensor '" + t.name + "' appears twice");
    g->tensors_.push_back(std::move(gt));
  }
  return g;
}

const GgufValue* GgufFile::find(const std::string& key) const {
  const auto it = kv_.find(key);
  return it == kv_.end() ? nullptr : &it->second;
}

const GgufTensor* GgufFile::find_tensor(const std::string& name) const {
  const auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

namespace {
[[noreturn]] void wrong_type(const fs::path& p, const std::string& key, const GgufValue& v,
                             const char* want) {
  fail(p.string() + ": GGUF metadata '" + key + "' is a " + gguf_value_type_name(v.type) + ", expected " +
       want);
}
}  // namespace

std::string GgufFile::get_string(const std::string& key, const std::string& dflt) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return dflt;
  if (v->type != GgufValue::String) wrong_type(path_, key, *v, "a string");
  return v->s;
}

std::string GgufFile::require_string(const std::string& key) const {
  if (find(key) == nullptr) fail(path_.string() + ": GGUF metadata '" + key + "' is missing");
  return get_string(key, "");
}

int64_t GgufFile::get_int(const std::string& key, int64_t dflt) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return dflt;
  if (!v->is_int() || v->type == GgufValue::Bool) wrong_type(path_, key, *v, "an integer");
  return v->i;
}

int64_t GgufFile::require_int(const std::string& key) const {
  if (find(key) == nullptr) fail(path_.string() + ": GGUF metadata '" + key + "' is missing");
  return get_int(key, 0);
}

double GgufFile::get_float(const std::string& key, double dflt) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return dflt;
  if (v->is_float()) return v->f;
  if (v->is_int() && v->type != GgufValue::Bool) return static_cast<double>(v->i);
  wrong_type(path_, key, *v, "a number");
}

bool GgufFile::get_bool(const std::string& key, bool dflt) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return dflt;
  if (v->type != GgufValue::Bool) wrong_type(path_, key, *v, "a bool");
  return v->i != 0;
}

// ---- writer ----

namespace {

class Writer {
 public:
  template <class T>
  void put(T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    buf.insert(buf.end(), p, p + sizeof(T));
  }
  void put_string(const std::string& s) {
    put<uint64_t>(s.size());
    buf.insert(buf.end(), s.begin(), s.end());
  }
  void put_scalar(uint32_t t, int64_t i, double f) {
    switch (t) {
      case GgufValue::U8:
      case GgufValue::Bool:
        return put<uint8_t>(static_cast<uint8_t>(i));
      case GgufValue::I8:
        return put<int8_t>(static_cast<int8_t>(i));
      case GgufValue::U16:
        return put<uint16_t>(static_cast<uint16_t>(i));
      case GgufValue::I16:
        return put<int16_t>(static_cast<int16_t>(i));
      case GgufValue::U32:
        return put<uint32_t>(static_cast<uint32_t>(i));
      case GgufValue::I32:
        return put<int32_t>(static_cast<int32_t>(i));
      case GgufValue::U64:
        return put<uint64_t>(static_cast<uint64_t>(i));
      case GgufValue::I64:
        return put<int64_t>(i);
      case GgufValue::F32:
        return put<float>(static_cast<float>(f));
      case GgufValue::F64:
        return put<double>(f);
      default:
        fail("write_gguf: value type " + std::to_string(t) + " is not a scalar");
    }
  }
  void pad_to(uint64_t alignment) {
    while (buf.size() % alignment != 0) buf.push_back(0);
  }
  std::vector<uint8_t> buf;
};

}  // namespace

void write_gguf(const fs::path& path, const std::vector<std::pair<std::string, GgufValue>>& kv,
                const std::vector<GgufWriteTensor>& tensors) {
  Writer w;
  w.put<uint32_t>(kMagic);
  w.put<uint32_t>(3);
  w.put<uint64_t>(tensors.size());
  w.put<uint64_t>(kv.size());
  for (const auto& [key, v] : kv) {
    w.put_string(key);
    w.put<uint32_t>(v.type);
    if (v.type == GgufValue::String) {
      w.put_string(v.s);
    } else if (v.type == GgufValue::Array) {
      w.put<uint32_t>(v.elem);
      w.put<uint64_t>(v.size());
      for (const std::string& s : v.strs) w.put_string(s);
      for (int64_t i : v.ints) w.put_scalar(v.elem, i, 0.0);
      for (double f : v.floats) w.put_scalar(v.elem, 0, f);
    } else {
      w.put_scalar(v.type, v.i, v.f);
    }
  }
  uint64_t offset = 0;
  std::vector<uint64_t> offsets;
  for (const GgufWriteTensor& t : tensors) {
    w.put_string(t.name);
    w.put<uint32_t>(static_cast<uint32_t>(t.ne.size()));
    for (int64_t e : t.ne) w.put<int64_t>(e);
    w.put<uint32_t>(static_cast<uint32_t>(t.type));
    w.put<uint64_t>(offset);
    offsets.push_back(offset);
    offset += (t.data.size() + kDefaultAlignment - 1) / kDefaultAlignment * kDefaultAlignment;
  }
  w.pad_to(kDefaultAlignment);
  for (const GgufWriteTensor& t : tensors) {
    w.buf.insert(w.buf.end(), t.data.begin(), t.data.end());
    w.pad_to(kDefaultAlignment);
  }
  std::ofstream f(path, std::ios::binary);
  if (!f) fail("cannot write " + path.string());
  f.write(reinterpret_cast<const char*>(w.buf.data()), static_cast<std::streamsize>(w.buf.size()));
  if (!f) fail("cannot write " + path.string());
}

}  // namespace tessera
