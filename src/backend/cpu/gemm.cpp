#include "backend/cpu/gemm.h"

#include <algorithm>
#include <cstring>
#include <list>
#include <oneapi/dnnl/dnnl.hpp>
#include <unordered_map>
#include <vector>

#include "backend/op_checks.h"
#include "core/error.h"

namespace tessera::cpu {
namespace {

dnnl::memory::data_type dnnl_type(DType t) {
  switch (t) {
    case DType::F32:
      return dnnl::memory::data_type::f32;
    case DType::BF16:
      return dnnl::memory::data_type::bf16;
    case DType::F16:
      return dnnl::memory::data_type::f16;
    case DType::I32:
      return dnnl::memory::data_type::s32;
  }
  return dnnl::memory::data_type::undef;
}

struct Key {
  int64_t m, n, k, lda, ldc;
  DType a, w, c;
  bool bias, acc;
  bool nn = false;  // w stored [K, N] (gemm_nn) instead of [N, K]
  bool operator==(const Key&) const = default;
};
struct KeyHash {
  size_t operator()(const Key& k) const {
    size_t h = std::hash<int64_t>()(k.m);
    auto mix = [&h](size_t v) { h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2); };
    mix(std::hash<int64_t>()(k.n));
    mix(std::hash<int64_t>()(k.k));
    mix(std::hash<int64_t>()(k.lda));
    mix(std::hash<int64_t>()(k.ldc));
    mix(static_cast<size_t>(k.a) | static_cast<size_t>(k.w) << 4 | static_cast<size_t>(k.c) << 8 |
        static_cast<size_t>(k.bias) << 12 | static_cast<size_t>(k.acc) << 13 |
        static_cast<size_t>(k.nn) << 14);
    return h;
  }
};

// A cached matmul with its memory objects; execute() only swaps data handles.
struct Entry {
  dnnl::matmul prim;
  dnnl::memory a, w, c, bias, scratch;
  std::vector<dnnl_exec_arg_t> args;  // C API argument list: execute() then allocates nothing here
};

}  // namespace

struct GemmEngine::Impl {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream strm{eng};
  // Least recently used first out past kMaxPrimitives: a server's requests of every canvas length make
  // new shapes without end (each primitive holds ~80 KiB of JIT code and descriptors).
  std::list<std::pair<Key, Entry>> lru;  // most recently used first
  std::unordered_map<Key, std::list<std::pair<Key, Entry>>::iterator, KeyHash> cache;
  int64_t created = 0;
  std::vector<char> scratch;  // shared by all primitives (one stream, run in order)
  std::vector<char> tile;     // gather tile
  std::vector<char> panel;    // dequantized weight panel (quantized weights)
  std::vector<dnnl::memory*> scratch_users;

  Entry& get(const Key& key) {
    auto it = cache.find(key);
    if (it != cache.end()) {
      lru.splice(lru.begin(), lru, it->second);  // relinks the node: no allocation
      return it->second->second;
    }
    using dims = dnnl::memory::dims;
    const dnnl::memory::desc a_md(dims{key.m, key.k}, dnnl_type(key.a), dims{key.lda, 1});
    const dnnl::memory::desc w_md(dims{key.k, key.n}, dnnl_type(key.w),
                                  key.nn ? dims{key.n, 1} : dims{1, key.k});
    const dnnl::memory::desc c_md(dims{key.m, key.n}, dnnl_type(key.c), dims{key.ldc, 1});
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    if (key.acc) {
      dnnl::post_ops po;
      po.append_sum(1.0f);
      attr.set_post_ops(po);
    }
    dnnl::matmul::primitive_desc pd;
    if (key.bias) {
      const dnnl::memory::desc b_md(dims{1, key.n}, dnnl::memory::data_type::f32, dims{key.n, 1});
      pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, w_md, b_md, c_md), attr, eng);
    } else {
      pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, w_md, c_md), attr, eng);
    }
    Entry e;
    e.prim = dnnl::matmul(pd);
    e.a = dnnl::memory(a_md, eng, DNNL_MEMORY_NONE);
    e.w = dnnl::memory(w_md, eng, DNNL_MEMORY_NONE);
    e.c = dnnl::memory(c_md, eng, DNNL_MEMORY_NONE);
    e.args.push_back({DNNL_ARG_SRC, e.a.get()});
    e.args.push_back({DNNL_ARG_WEIGHTS, e.w.get()});
    e.args.push_back({DNNL_ARG_DST, e.c.get()});
    if (key.bias) {
      e.bias = dnnl::memory(dnnl::memory::desc(dims{1, key.n}, dnnl::memory::data_type::f32, dims{key.n, 1}),
                            eng, DNNL_MEMORY_NONE);
      e.args.push_back({DNNL_ARG_BIAS, e.bias.get()});
    }
    const size_t need = pd.scratchpad_desc().get_size();
    if (need > scratch.size()) scratch.resize(need);
    e.scratch = dnnl::memory(pd.scratchpad_desc(), eng, DNNL_MEMORY_NONE);
    e.args.push_back({DNNL_ARG_SCRATCHPAD, e.scratch.get()});
    ++created;
    if (cache.size() >= kMaxPrimitives) {
      cache.erase(lru.back().first);
      lru.pop_back();
    }
    lru.emplace_front(key, std::move(e));
    cache.emplace(key, lru.begin());
    return lru.front().second;
  }

  void run(const Key& key, const void* a, const void* w, const void* bias, void* c) {
    Entry& e = get(key);
    e.a.set_data_handle(const_cast<void*>(a));
    e.w.set_data_handle(const_cast<void*>(w));
    e.c.set_data_handle(c);
    if (key.bias) e.bias.set_data_handle(const_cast<void*>(bias));
    e.scratch.set_data_handle(scratch.data());
    if (dnnl_primitive_execute(e.prim.get(), strm.get(), static_cast<int>(e.args.size()), e.args.data()) !=
        dnnl_success) {
      fail("gemm: oneDNN matmul failed");
    }
    strm.wait();
  }
};

GemmEngine::GemmEngine() : impl_(std::make_unique<Impl>()) {}
GemmEngine::~GemmEngine() = default;

int64_t GemmEngine::primitives_created() const {
  return impl_->created;
}
size_t GemmEngine::primitives_held() const {
  return impl_->cache.size();
}

void GemmEngine::gemm(const Tensor& a, const Tensor& w, const Tensor* bias, Tensor& c, bool accumulate) {
  check_gemm(a, w, bias, c, accumulate, Device::CPU);
  const int64_t m = a.rows(), k = a.cols(), n = w.rows();
  if (m == 0) return;
  if (w.quantized()) {
    const int64_t np = panel_rows(n, k, a.dtype);
    const size_t cs = dtype_size(c.dtype);
    for (int64_t n0 = 0; n0 < n; n0 += np) {
      const int64_t nb = std::min(np, n - n0);
      const void* p = dequantize_panel(w, n0, nb, a.dtype);
      const Key key{m, nb, k, k, n, a.dtype, a.dtype, c.dtype, bias != nullptr, accumulate};
      impl_->run(key, a.data, p, bias != nullptr ? bias->as<const float>() + n0 : nullptr,
                 static_cast<char*>(c.data) + static_cast<size_t>(n0) * cs);
    }
    return;
  }
  const Key key{m, n, k, k, n, a.dtype, w.dtype, c.dtype, bias != nullptr, accumulate};
  impl_->run(key, a.data, w.data, bias != nullptr ? bias->data : nullptr, c.data);
}

void GemmEngine::gemm_nn(const Tensor& a, const Tensor& b, Tensor& c) {
  TESSERA_CHECK(a.cols() == b.rows() && c.rows() == a.rows() && c.cols() == b.cols(),
                "gemm_nn: shapes do not match");
  TESSERA_CHECK(a.dtype == b.dtype && !b.quantized() && c.dtype == DType::F32,
                "gemm_nn: a and b of one plain dtype, c f32 expected");
  const int64_t m = a.rows(), k = a.cols(), n = b.cols();
  if (m == 0) return;
  Key key{m, n, k, k, n, a.dtype, b.dtype, c.dtype, false, false};
  key.nn = true;
  impl_->run(key, a.data, b.data, nullptr, c.data);
}

int64_t GemmEngine::panel_rows(int64_t n, int64_t k, DType a) {
  const int64_t rows = static_cast<int64_t>(kPanelBytes / (static_cast<size_t>(k) * dtype_size(a))) / 64 * 64;
  return std::min(n, std::max<int64_t>(64, rows));
}

const void* GemmEngine::dequantize_panel(const Tensor& w, int64_t n0, int64_t nb, DType to) {
  const int64_t k = w.cols();
  const size_t out_row = static_cast<size_t>(k) * dtype_size(to), in_row = w.row_bytes();
  const size_t bytes = static_cast<size_t>(nb) * out_row;
  if (impl_->panel.size() < bytes) impl_->panel.resize(bytes);
  char* dst = impl_->panel.data();
  const auto* src = static_cast<const char*>(w.data) + static_cast<size_t>(n0) * in_row;
  const auto type = static_cast<GgmlType>(w.quant);
  auto row = [&](int64_t r) {
    ggml_dequantize_row(type, src + static_cast<size_t>(r) * in_row, k, to,
                        dst + static_cast<size_t>(r) * out_row);
  };
  if (nb * k > 65536) {
#pragma omp parallel for
    for (int64_t r = 0; r < nb; ++r) row(r);
  } else {  // small panels (MoE experts): no parallel region (libgomp allocates a team even for one thread)
    for (int64_t r = 0; r < nb; ++r) row(r);
  }
  return dst;
}

void GemmEngine::prepare(int64_t m, int64_t n, int64_t k, DType a, DType c, bool quantized) {
  if (!quantized) {
    impl_->get(Key{m, n, k, k, n, a, a, c, false, false});
    return;
  }
  const int64_t np = panel_rows(n, k, a);
  impl_->get(Key{m, np, k, k, n, a, a, c, false, false});
  if (n % np != 0) impl_->get(Key{m, n % np, k, k, n, a, a, c, false, false});
  const size_t bytes = static_cast<size_t>(np * k) * dtype_size(a);
  if (impl_->panel.size() < bytes) impl_->panel.resize(bytes);
}

void GemmEngine::gather_gemm(const Tensor& a, const Tensor& rows, const Tensor& w, Tensor& c) {
  check_gather_gemm(a, rows, w, c, Device::CPU);
  const int64_t n_rows = rows.numel(), k = a.cols(), n = w.rows();
  if (n_rows == 0) return;
  const size_t es = dtype_size(a.dtype), cs = dtype_size(c.dtype);
  const size_t tile_bytes = static_cast<size_t>(kGatherTile * k) * es;
  if (impl_->tile.size() < tile_bytes) impl_->tile.resize(tile_bytes);
  const auto* idx = rows.as<const int32_t>();
  const auto* src = static_cast<const char*>(a.data);
  char* t = impl_->tile.data();
  auto gather = [&](int64_t r0, int64_t tr) {
#pragma omp parallel for if (tr * k > 65536)
    for (int64_t i = 0; i < tr; ++i) {
      const int64_t r = idx[r0 + i];
      std::memcpy(t + static_cast<size_t>(i * k) * es, src + static_cast<size_t>(r * k) * es,
                  static_cast<size_t>(k) * es);
    }
  };
  // Plain weights: one GEMM per tile over all of w. Quantized weights: panels of w dequantized once
  // each (the larger gather panels: the tiles of selected rows are re-gathered once per panel).
  const int64_t np = !w.quantized() ? n
                     : n_rows <= kGatherTile
                         ? panel_rows(n, k, a.dtype)
                         : std::min(n, std::max(panel_rows(n, k, a.dtype), kGatherPanelRows));
  int64_t gathered = -1;  // first row of the tile now in the buffer
  for (int64_t n0 = 0; n0 < n; n0 += np) {
    const int64_t nb = std::min(np, n - n0);
    const void* wp = w.quantized() ? dequantize_panel(w, n0, nb, a.dtype) : w.data;
    for (int64_t r0 = 0; r0 < n_rows; r0 += kGatherTile) {
      const int64_t tr = std::min(kGatherTile, n_rows - r0);
      if (gathered != r0) gather(r0, tr);
      gathered = r0;
      const Key key{tr, nb, k, k, n, a.dtype, a.dtype, c.dtype, false, false};
      impl_->run(key, t, wp, nullptr, static_cast<char*>(c.data) + static_cast<size_t>(r0 * n + n0) * cs);
    }
  }
}

}  // namespace tessera::cpu
