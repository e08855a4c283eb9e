#include "backend/cpu/gemm.h"

#include <omp.h>

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
  bool nn = false;      // w stored [K, N] (gemm_nn) instead of [N, K]
  bool serial = false;  // made for one thread: run on a slot inside a parallel region (gemm_in_slot)
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
        static_cast<size_t>(k.nn) << 14 | static_cast<size_t>(k.serial) << 15);
    return h;
  }
};

// Memory objects bound to a primitive's arguments; a call only swaps their data handles.
struct Bound {
  dnnl::memory a, w, c, bias, scratch;
  std::vector<dnnl_exec_arg_t> args;  // C API argument list: execute() then allocates nothing here
};

// A cached matmul: one Bound for the calling thread, or (a serial key) one per slot.
struct Entry {
  dnnl::matmul prim;
  dnnl::memory::desc a_md, w_md, c_md, b_md, s_md;
  bool bias = false;
  std::vector<Bound> bound;
};

// A thread's own stream, scratchpad, dequantized panel and workspace (gemm_in_slot).
struct Slot {
  dnnl::stream strm;
  std::vector<char> scratch, panel, workspace;
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
  std::vector<Slot> slots;

  Bound bind(const Entry& e) const {
    Bound b;
    b.a = dnnl::memory(e.a_md, eng, DNNL_MEMORY_NONE);
    b.w = dnnl::memory(e.w_md, eng, DNNL_MEMORY_NONE);
    b.c = dnnl::memory(e.c_md, eng, DNNL_MEMORY_NONE);
    b.args.push_back({DNNL_ARG_SRC, b.a.get()});
    b.args.push_back({DNNL_ARG_WEIGHTS, b.w.get()});
    b.args.push_back({DNNL_ARG_DST, b.c.get()});
    if (e.bias) {
      b.bias = dnnl::memory(e.b_md, eng, DNNL_MEMORY_NONE);
      b.args.push_back({DNNL_ARG_BIAS, b.bias.get()});
    }
    b.scratch = dnnl::memory(e.s_md, eng, DNNL_MEMORY_NONE);
    b.args.push_back({DNNL_ARG_SCRATCHPAD, b.scratch.get()});
    return b;
  }

  // A serial entry: bound once per slot, every slot's scratchpad large enough for it.
  void fit_slots(Entry& e) {
    const size_t need = e.s_md.get_size();
    for (Slot& s : slots)
      if (need > s.scratch.size()) s.scratch.resize(need);
    while (e.bound.size() < slots.size()) e.bound.push_back(bind(e));
  }

  Entry& get(const Key& key) {
    auto it = cache.find(key);
    if (it != cache.end()) {
      lru.splice(lru.begin(), lru, it->second);  // relinks the node: no allocation
      Entry& e = it->second->second;
      if (key.serial) fit_slots(e);
      return e;
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
    // oneDNN sizes a primitive's work split by the threads there are when it is made, and runs a call
    // inside a parallel region on one thread: a serial key's primitive is made for one.
    const int threads = omp_get_max_threads();
    if (key.serial) omp_set_num_threads(1);
    Entry e;
    e.a_md = a_md;
    e.w_md = w_md;
    e.c_md = c_md;
    e.bias = key.bias;
    dnnl::matmul::primitive_desc pd;
    try {
      if (key.bias) {
        e.b_md = dnnl::memory::desc(dims{1, key.n}, dnnl::memory::data_type::f32, dims{key.n, 1});
        pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, w_md, e.b_md, c_md), attr, eng);
      } else {
        pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, w_md, c_md), attr, eng);
      }
      e.prim = dnnl::matmul(pd);
    } catch (...) {
      if (key.serial) omp_set_num_threads(threads);
      throw;
    }
    if (key.serial) omp_set_num_threads(threads);
    e.s_md = pd.scratchpad_desc();
    if (key.serial) {
      fit_slots(e);
    } else {
      if (e.s_md.get_size() > scratch.size()) scratch.resize(e.s_md.get_size());
      e.bound.push_back(bind(e));
    }
    ++created;
    if (cache.size() >= kMaxPrimitives) {
      cache.erase(lru.back().first);
      lru.pop_back();
    }
    lru.emplace_front(key, std::move(e));
    cache.emplace(key, lru.begin());
    return lru.front().second;
  }

  static void execute(const dnnl::matmul& prim, Bound& b, dnnl::stream& s, const void* a, const void* w,
                      const void* bias, void* c, void* scratch) {
    b.a.set_data_handle(const_cast<void*>(a));
    b.w.set_data_handle(const_cast<void*>(w));
    b.c.set_data_handle(c);
    if (bias != nullptr) b.bias.set_data_handle(const_cast<void*>(bias));
    b.scratch.set_data_handle(scratch);
    if (dnnl_primitive_execute(prim.get(), s.get(), static_cast<int>(b.args.size()), b.args.data()) !=
        dnnl_success) {
      fail("gemm: oneDNN matmul failed");
    }
    s.wait();
  }

  void run(const Key& key, const void* a, const void* w, const void* bias, void* c) {
    Entry& e = get(key);
    execute(e.prim, e.bound[0], strm, a, w, key.bias ? bias : nullptr, c, scratch.data());
  }

  // On slot s inside a parallel region: a lookup that changes nothing (threads look up concurrently).
  void run_in_slot(int s, const Key& key, const void* a, const void* w, void* c) {
    const auto it = cache.find(key);
    if (it == cache.end() || static_cast<size_t>(s) >= it->second->second.bound.size())
      fail("gemm_in_slot: a " + std::to_string(key.m) + " x " + std::to_string(key.n) + " x " +
           std::to_string(key.k) + " GEMM was not prepared (prepare_serial) for slot " + std::to_string(s));
    Entry& e = it->second->second;
    Slot& sl = slots[static_cast<size_t>(s)];
    execute(e.prim, e.bound[static_cast<size_t>(s)], sl.strm, a, w, nullptr, c, sl.scratch.data());
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
  return dequantize_into(w, n0, nb, to, impl_->panel, true);
}

const void* GemmEngine::dequantize_into(const Tensor& w, int64_t n0, int64_t nb, DType to,
                                        std::vector<char>& panel, bool parallel) {
  const int64_t k = w.cols();
  const size_t out_row = static_cast<size_t>(k) * dtype_size(to), in_row = w.row_bytes();
  const size_t bytes = static_cast<size_t>(nb) * out_row;
  if (panel.size() < bytes) panel.resize(bytes);
  char* dst = panel.data();
  const auto* src = static_cast<const char*>(w.data) + static_cast<size_t>(n0) * in_row;
  const auto type = static_cast<GgmlType>(w.quant);
  auto row = [&](int64_t r) {
    ggml_dequantize_row(type, src + static_cast<size_t>(r) * in_row, k, to,
                        dst + static_cast<size_t>(r) * out_row);
  };
  if (parallel && nb * k > 65536) {
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

void GemmEngine::prepare_slots(int n, size_t workspace_bytes) {
  TESSERA_CHECK(n >= 1 && !omp_in_parallel(), "prepare_slots: at least one slot, outside a parallel region");
  while (impl_->slots.size() < static_cast<size_t>(n))
    impl_->slots.push_back(Slot{dnnl::stream(impl_->eng), {}, {}, {}});
  for (Slot& s : impl_->slots)
    if (s.workspace.size() < workspace_bytes) s.workspace.resize(workspace_bytes);
}

void* GemmEngine::slot_workspace(int slot) {
  return impl_->slots.at(static_cast<size_t>(slot)).workspace.data();
}

void GemmEngine::prepare_serial(int64_t m, int64_t n, int64_t k, DType a, DType c, bool quantized) {
  TESSERA_CHECK(!impl_->slots.empty() && !omp_in_parallel(),
                "prepare_serial: prepare_slots first, outside a parallel region");
  Key key{m, n, k, k, n, a, a, c, false, false};
  key.serial = true;
  if (!quantized) {
    impl_->get(key);
    return;
  }
  const int64_t np = panel_rows(n, k, a);
  key.n = np;
  impl_->get(key);
  if (n % np != 0) {
    key.n = n % np;
    impl_->get(key);
  }
  const size_t bytes = static_cast<size_t>(np * k) * dtype_size(a);
  for (Slot& s : impl_->slots)
    if (s.panel.size() < bytes) s.panel.resize(bytes);
}

void GemmEngine::gemm_in_slot(int slot, const Tensor& a, const Tensor& w, Tensor& c) {
  check_gemm(a, w, nullptr, c, false, Device::CPU);
  TESSERA_CHECK(slot >= 0 && static_cast<size_t>(slot) < impl_->slots.size(),
                "gemm_in_slot: slot " + std::to_string(slot) + " was not prepared");
  const int64_t m = a.rows(), k = a.cols(), n = w.rows();
  if (m == 0) return;
  Key key{m, n, k, k, n, a.dtype, w.dtype, c.dtype, false, false};
  key.serial = true;
  if (!w.quantized()) {
    impl_->run_in_slot(slot, key, a.data, w.data, c.data);
    return;
  }
  key.w = a.dtype;
  const int64_t np = panel_rows(n, k, a.dtype);
  const size_t cs = dtype_size(c.dtype);
  for (int64_t n0 = 0; n0 < n; n0 += np) {
    const int64_t nb = std::min(np, n - n0);
    const void* p = dequantize_into(w, n0, nb, a.dtype, impl_->slots[static_cast<size_t>(slot)].panel, false);
    key.n = nb;
    impl_->run_in_slot(slot, key, a.data, p, static_cast<char*>(c.data) + static_cast<size_t>(n0) * cs);
  }
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
