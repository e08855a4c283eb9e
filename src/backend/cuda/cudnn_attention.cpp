// CudnnAttention: one cudnn-frontend SDPA graph per attention shape, executed on the backend's
// stream. K and V are staged in bf16 in the planned AttnParams::kv_scratch, Q in the output buffer;
// cuDNN writes O into AttnParams::q_scratch (q's own buffer in the engine), which is then copied to the
// output. Layouts are tessera's: row-major [rows, heads * dim],
// so every tensor is (batch, heads, rows, dim) with strides (., dim, heads * dim, 1); packed
// sequences use cuDNN's ragged offsets (THD) with the padding mask.
#include "backend/cuda/cudnn_attention.h"

#include <cudnn_frontend.h>
#include <dlfcn.h>

#include <cstring>
#include <list>
#include <map>
#include <tuple>
#include <unordered_map>

#include "backend/cuda/cuda_common.h"
#include "backend/op_checks.h"

// The handle of libcudnn that cudnn-frontend's dynamic loading resolves every cudnn* symbol through.
namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;
}

namespace tessera::cuda {
namespace {

namespace fe = cudnn_frontend;

constexpr int64_t kQ = 1, kK = 2, kV = 3, kO = 4, kSeqQ = 5, kSeqKv = 6, kOffQ = 7, kOffKv = 8;
constexpr int kMaxPacked = 1024;  // sequences a packed call may hold (the ragged metadata buffer)

struct Shape {
  int64_t b, hq, hk, d, sq, skv;  // packed: sq / skv are the totals (an upper bound of every sequence)
  bool ragged;
  uint32_t scale_bits;
  auto tie() const { return std::tie(b, hq, hk, d, sq, skv, ragged, scale_bits); }
  bool operator<(const Shape& o) const { return tie() < o.tie(); }
};

struct Entry {
  std::shared_ptr<fe::graph::Graph> graph;  // nullptr: cuDNN refused this shape
  std::list<Shape>::iterator lru;
};

std::string fe_message(fe::error_t e) {
  std::string m = e.get_message();
  return m.empty() ? "error " + std::to_string(static_cast<int>(e.get_code())) : m;
}

class Impl final : public CudnnAttention {
 public:
  Impl(cudnnHandle_t h, cudaStream_t s, int sm_major, int64_t version)
      : handle_(h), stream_(s), sm_major_(sm_major), version_(version) {
    check(cudaMalloc(&meta_, static_cast<size_t>(4 * kMaxPacked + 2) * sizeof(int32_t)), "cuDNN metadata");
  }
  ~Impl() override {
    cudaStreamSynchronize(stream_);
    graphs_.clear();
    cudaFree(workspace_);
    cudaFree(meta_);
    fe::detail::destroy_handle(handle_);
  }
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  std::string version() const override {
    return "cuDNN " + std::to_string(version_ / 10000) + "." + std::to_string(version_ / 100 % 100) + "." +
           std::to_string(version_ % 100);
  }
  int64_t calls() const override { return calls_; }
  int64_t graphs_built() const override { return built_; }
  uint64_t epoch() const override { return epoch_; }

  bool attention(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, int n_heads, int n_kv_heads,
                 int head_dim, const AttnParams& p) override {
    check_attention(q, k, v, out, n_heads, n_kv_heads, head_dim, p, Device::CUDA);
    if (p.mask != MaskKind::None || p.block_mask != nullptr || p.window > 0 || out.dtype != DType::BF16 ||
        p.q_scratch == nullptr || p.kv_scratch == nullptr || head_dim % 8 != 0 || head_dim > 128 ||
        q.rows() == 0 || k.rows() == 0 || p.n_seqs < 1 || p.n_seqs > kMaxPacked) {
      return false;
    }
    const bool ragged = p.n_seqs > 1;
    if (ragged && sm_major_ < 9) return false;  // THD layouts need Hopper
    const int64_t q_elems = q.numel(), kv_elems = k.numel();
    if (ragged && std::max(q_elems, kv_elems) > INT32_MAX) return false;  // i32 ragged offsets
    Shape sh{p.n_seqs, n_heads, n_kv_heads, head_dim, q.rows(), k.rows(), ragged, 0};
    std::memcpy(&sh.scale_bits, &p.scale, sizeof(float));
    fe::graph::Graph* g = graph(sh);
    if (g == nullptr) return false;

    // bf16 Q staged in `out`, O written to q_scratch (possibly q's own buffer, read by then), then
    // copied to `out`: no memory beyond the kernel's own staging of K and V.
    auto* q16 = static_cast<uint16_t*>(out.data);
    auto* k16 = static_cast<uint16_t*>(p.kv_scratch);
    auto* v16 = k16 + kv_elems;
    to_bf16(q.as<const float>(), q16, q_elems, stream_);
    to_bf16(k.as<const float>(), k16, kv_elems, stream_);
    to_bf16(v.as<const float>(), v16, kv_elems, stream_);
    std::unordered_map<int64_t, void*> pack{{kQ, q16}, {kK, k16}, {kV, v16}, {kO, p.q_scratch}};
    if (ragged) {
      const int n = p.n_seqs;
      ragged_meta(p.cu_q, p.cu_k, n, q.cols(), k.cols(), meta_, stream_);
      pack[kSeqQ] = meta_;
      pack[kSeqKv] = meta_ + n;
      pack[kOffQ] = meta_ + 2 * n;
      pack[kOffKv] = meta_ + 3 * n + 1;
    }
    fe::error_t e = g->execute(handle_, pack, workspace_);
    if (!e.is_good()) fail("cuDNN attention: execute failed: " + fe_message(e));
    check(cudaMemcpyAsync(out.data, p.q_scratch, static_cast<size_t>(q_elems) * 2, cudaMemcpyDeviceToDevice,
                          stream_),
          "cuDNN attention: output copy");
    ++calls_;
    return true;
  }

 private:
  // The graph of this shape, built on first use; nullptr when cuDNN does not take it.
  fe::graph::Graph* graph(const Shape& sh) {
    auto it = graphs_.find(sh);
    if (it != graphs_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second.lru);
      return it->second.graph.get();
    }
    std::string why;
    std::shared_ptr<fe::graph::Graph> g;
    try {
      g = build(sh, &why);
    } catch (const std::exception& e) {  // the frontend throws where a symbol or a library is missing
      why = e.what();
    }
    if (g == nullptr && !warned_) {
      warned_ = true;
      std::fprintf(stderr, "note: cuDNN attention does not take a shape (%s); tessera's kernel runs it\n",
                   why.c_str());
    }
    if (static_cast<int>(lru_.size()) >= kMaxGraphs) {  // drop the least recently used
      graphs_.erase(lru_.back());
      lru_.pop_back();
      ++epoch_;
    }
    lru_.push_front(sh);
    Entry& en = graphs_[sh];
    en.graph = std::move(g);
    en.lru = lru_.begin();
    return en.graph.get();
  }

  std::shared_ptr<fe::graph::Graph> build(const Shape& sh, std::string* why) {
    auto g = std::make_shared<fe::graph::Graph>();
    g->set_io_data_type(fe::DataType_t::BFLOAT16)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    const int64_t b = sh.b, d = sh.d;
    auto i32 = [&](const char* name, int64_t uid, int64_t n) {
      return g->tensor(fe::graph::Tensor_attributes()
                           .set_name(name)
                           .set_uid(uid)
                           .set_dim({n, 1, 1, 1})
                           .set_stride({1, 1, 1, 1})
                           .set_data_type(fe::DataType_t::INT32));
    };
    // (batch, heads, rows, dim) over row-major [rows, heads * dim].
    auto qkv = [&](const char* name, int64_t uid, int64_t h, int64_t s) {
      return fe::graph::Tensor_attributes()
          .set_name(name)
          .set_uid(uid)
          .set_dim({b, h, s, d})
          .set_stride({s * h * d, d, h * d, 1});
    };
    auto qa = qkv("Q", kQ, sh.hq, sh.sq);
    auto ka = qkv("K", kK, sh.hk, sh.skv);
    auto va = qkv("V", kV, sh.hk, sh.skv);
    std::shared_ptr<fe::graph::Tensor_attributes> off_q, off_kv;
    if (sh.ragged) {
      off_q = i32("off_q", kOffQ, b + 1);
      off_kv = i32("off_kv", kOffKv, b + 1);
      qa.set_ragged_offset(off_q);
      ka.set_ragged_offset(off_kv);
      va.set_ragged_offset(off_kv);
    }
    auto Q = g->tensor(qa), K = g->tensor(ka), V = g->tensor(va);
    float scale = 0.0f;
    std::memcpy(&scale, &sh.scale_bits, sizeof(float));
    auto opt = fe::graph::SDPA_attributes().set_name("sdpa").set_generate_stats(false).set_attn_scale(scale);
    if (sh.ragged) {
      opt.set_padding_mask(true)
          .set_seq_len_q(i32("seq_q", kSeqQ, b))
          .set_seq_len_kv(i32("seq_kv", kSeqKv, b));
    }
    auto [O, stats] = g->sdpa(Q, K, V, opt);
    (void)stats;
    O->set_output(true)
        .set_uid(kO)
        .set_dim({b, sh.hq, sh.sq, d})
        .set_stride({sh.sq * sh.hq * d, d, sh.hq * d, 1});
    if (sh.ragged) O->set_ragged_offset(off_q);
    fe::error_t e = g->build(handle_, {fe::HeurMode_t::A});
    if (!e.is_good()) {
      *why = "b " + std::to_string(b) + ", heads " + std::to_string(sh.hq) + "/" + std::to_string(sh.hk) +
             ", dim " + std::to_string(d) + ", rows " + std::to_string(sh.sq) + " x " +
             std::to_string(sh.skv) + ": " + fe_message(e);
      return nullptr;
    }
    int64_t ws = 0;
    e = g->get_workspace_size(ws);
    if (!e.is_good()) {
      *why = "workspace size: " + fe_message(e);
      return nullptr;
    }
    if (ws > ws_bytes_) {  // grows only while graphs are built (a request's first steps)
      check(cudaStreamSynchronize(stream_), "cuDNN workspace");
      cudaFree(workspace_);
      ++epoch_;
      workspace_ = nullptr;
      check(cudaMalloc(&workspace_, static_cast<size_t>(ws)), "cuDNN workspace");
      ws_bytes_ = ws;
    }
    ++built_;
    return g;
  }

  cudnnHandle_t handle_;
  cudaStream_t stream_;
  int sm_major_;
  int64_t version_;
  int32_t* meta_ = nullptr;
  void* workspace_ = nullptr;
  int64_t ws_bytes_ = 0;
  std::map<Shape, Entry> graphs_;
  std::list<Shape> lru_;
  int64_t calls_ = 0, built_ = 0;
  uint64_t epoch_ = 0;
  bool warned_ = false;
};

}  // namespace

std::unique_ptr<CudnnAttention> CudnnAttention::open(cudaStream_t stream, std::string* why_not) {
  auto no = [&](const std::string& why) {
    if (why_not != nullptr) *why_not = why;
    return std::unique_ptr<CudnnAttention>();
  };
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) return no("no device properties");
  if (prop.major < 8) return no("cuDNN's fused attention needs sm_80 or later");
  if (fe::cudnn_dlhandle == nullptr) {
    dlerror();
    void* h = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_GLOBAL);
    if (h == nullptr) {
      const char* err = dlerror();
      return no(std::string("libcudnn.so.9 was not found (") + (err != nullptr ? err : "dlopen failed") +
                ")");
    }
    fe::cudnn_dlhandle = h;
  }
  using VersionFn = size_t (*)();
  auto ver = reinterpret_cast<VersionFn>(dlsym(fe::cudnn_dlhandle, "cudnnGetVersion"));
  if (ver == nullptr) return no("libcudnn.so.9 has no cudnnGetVersion");
  const auto version = static_cast<int64_t>(ver());
  if (version < 90000) return no("cuDNN " + std::to_string(version) + " is older than 9.0");
  try {
    cudnnHandle_t h = nullptr;
    if (fe::detail::create_handle(&h) != CUDNN_STATUS_SUCCESS) return no("cudnnCreate failed");
    if (fe::detail::set_stream(h, stream) != CUDNN_STATUS_SUCCESS) {
      fe::detail::destroy_handle(h);
      return no("cudnnSetStream failed");
    }
    return std::make_unique<Impl>(h, stream, prop.major, version);
  } catch (const std::exception& e) {  // the frontend's loader throws on a missing symbol
    return no(e.what());
  }
}

}  // namespace tessera::cuda
