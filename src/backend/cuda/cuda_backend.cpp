// CudaBackend: device memory, one stream, GEMMs through cuBLASLt (bf16 operands, f32 accumulation),
// attention through cuDNN where it takes the case (cudnn_attention.h), hand-written kernels for
// everything the libraries cannot do (attention masks, SparseD, sampling, MoE).
// Nothing here allocates device memory after construction except alloc_weights and cuDNN's workspace
// (grown while a new attention shape's graph is built): every op works in the planned workspace and
// the buffers made once here (cuBLASLt's workspace, the mask-only logits' gather tile). Quantized GGUF
// weights (cuda_keeps_quantized) stay quantized: lt_gemm_quant dequantizes them a tile of rows at a time
// into one tile buffer, allocated when the Model loads (reserve_quant_tile: the largest tile of its
// weights, counted in its weight bytes; grown at a GEMM only for a weight the Model did not announce).
#include <cublasLt.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <tuple>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cudnn_attention.h"
#include "backend/op_checks.h"

namespace tessera {
namespace {

using cuda::check;

void check_lt(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS) {
    fail(std::string("cublasLt: ") + what + " failed (status " + std::to_string(static_cast<int>(st)) + ")");
  }
}

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::F32:
      return CUDA_R_32F;
    case DType::BF16:
      return CUDA_R_16BF;
    case DType::F16:
      return CUDA_R_16F;
    case DType::I32:
      break;
  }
  fail("gemm (cuda): unsupported dtype");
}

// One cached cuBLASLt matmul: C[M,N] (col-major view: N x M) = W (N x K) * A^T.
struct LtPlan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

class CudaBackend final : public Backend {
 public:
  CudaBackend() {
    check(cudaSetDevice(0), "select device 0");
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "create stream");
    check_lt(cublasLtCreate(&lt_), "create handle");
    check(cudaMalloc(&lt_ws_, kLtWorkspace), "cuBLASLt workspace");
    check(cudaMalloc(&gather_tile_, kGatherTile), "mask-only logits tile");
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, 0), "device properties");
    name_ = std::string("cuda (") + prop.name + ")";
    // TESSERA_CUDNN=0 keeps attention on tessera's kernels (A/B runs); TESSERA_GATHER_GEMM=fused runs
    // the mask-only logits on the fused gather-GEMM kernel instead of gather tiles + cuBLASLt.
    const char* env = std::getenv("TESSERA_CUDNN");
    if (env == nullptr || std::string(env) != "0") {
      std::string why;
      cudnn_ = cuda::CudnnAttention::open(stream_, &why);
      if (cudnn_ == nullptr) {
        std::fprintf(stderr, "note: cuDNN attention is off: %s; attention runs on tessera's kernels\n",
                     why.c_str());
      } else {
        name_ += ", " + cudnn_->version();
      }
    }
    const char* gg = std::getenv("TESSERA_GATHER_GEMM");
    fused_logits_ = gg != nullptr && std::string(gg) == "fused";
  }
  ~CudaBackend() override {
    cudaStreamSynchronize(stream_);
    for (auto& [k, p] : plans_) {
      cublasLtMatrixLayoutDestroy(p.a);
      cublasLtMatrixLayoutDestroy(p.b);
      cublasLtMatrixLayoutDestroy(p.c);
      cublasLtMatmulDescDestroy(p.op);
    }
    for (auto& g : graphs_)
      if (g.exec != nullptr) cudaGraphExecDestroy(g.exec);
    cudnn_.reset();
    cublasLtDestroy(lt_);
    cudaFree(lt_ws_);
    cudaFree(gather_tile_);
    if (qtile_ != nullptr) cudaFree(qtile_);
    cudaStreamDestroy(stream_);
  }
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  Device device() const override { return Device::CUDA; }
  bool stages_attention_kv(DType act) const override { return act == DType::BF16; }
  std::string name() const override { return name_; }
  void* native_stream() override { return stream_; }

  void* alloc_weights(size_t bytes) override {
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, bytes == 0 ? 256 : bytes);
    if (e != cudaSuccess) {
      fail("cuda: out of device memory allocating " + std::to_string(bytes >> 20) +
           " MiB of weights: " + cudaGetErrorString(e));
    }
    return p;
  }
  void free_weights(void* p) override { cudaFree(p); }
  void copy_to_device(void* dst, const void* src, size_t n) override {
    check(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, stream_), "copy to device");
  }
  void copy_to_host(void* dst, const void* src, size_t n) override {
    check(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, stream_), "copy to host");
    synchronize();
  }
  void copy_on_device(void* dst, const void* src, size_t n) override {
    check(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, stream_), "copy on device");
  }
  void synchronize() override { check(cudaStreamSynchronize(stream_), "stream synchronize"); }

  void embed(const Tensor& tokens, const Tensor& table, Tensor& out) override {
    if (table.quantized()) {
      cuda::embed_quant(tokens, table, out, stream_);  // ggml blocks: the rows read are dequantized
      return;
    }
    cuda::embed(tokens, table, out, stream_);
  }
  void rmsnorm(const Tensor& x, const Tensor& w, float eps, Tensor& y) override {
    cuda::rmsnorm(x, w, eps, y, stream_);
  }
  void gemm(const Tensor& a, const Tensor& w, const Tensor* bias, Tensor& c, bool acc) override;
  void gather_gemm(const Tensor& a, const Tensor& rows, const Tensor& w, Tensor& c) override;
  // The fused gather-GEMM kernel (rows of `a` read by index into shared memory).
  void gather_gemm_fused(const Tensor& a, const Tensor& rows, const Tensor& w, Tensor& c) {
    cuda::MmaProblem p;
    p.a = a.data;
    p.a_dtype = a.dtype;
    p.lda = a.cols();
    p.a_rows = rows.as<const int32_t>();
    p.w = w.data;
    p.w_dtype = w.dtype;
    p.c = c.data;
    p.c_dtype = c.dtype;
    p.ldc = c.cols();
    p.m = rows.numel();
    p.n = w.rows();
    p.k = a.cols();
    cuda::mma_gemm(p, stream_);
  }
  void rope(Tensor& x, const Tensor& pos, int hd, const RopeParams& p) override {
    cuda::rope(x, pos, hd, p, stream_);
  }
  void attention(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, int nh, int nkv, int hd,
                 const AttnParams& p) override {
    if (cudnn_ != nullptr && cudnn_->attention(q, k, v, out, nh, nkv, hd, p)) return;
    cuda::attention(q, k, v, out, nh, nkv, hd, p, stream_);
  }
  void sparse_select(const Tensor& q, const Tensor& k, int nh, int nkv, int hd, const SparseSelectParams& p,
                     uint8_t* mask) override {
    cuda::sparse_select(q, k, nh, nkv, hd, p, mask, stream_);
  }
  void swiglu(const Tensor& g, const Tensor& u, Tensor& out) override { cuda::swiglu(g, u, out, stream_); }
  void scatter_rows(const Tensor& src, const Tensor& rows, Tensor& dst) override {
    cuda::scatter_rows(src, rows, dst, stream_);
  }
  void convert(const Tensor& src, Tensor& dst) override { cuda::convert(src, dst, stream_); }
  void gather_rows(const Tensor& src, const Tensor& rows, Tensor& dst) override {
    cuda::gather_rows(src, rows, dst, stream_);
  }
  void sample_rows(const Tensor& logits, const Tensor& keys, const SampleParams& p, Tensor& tok,
                   Tensor& conf) override {
    cuda::sample_rows(logits, keys, p, tok, conf, stream_);
  }
  void token_logprob(const Tensor& logits, const Tensor& target, Tensor& lp) override {
    cuda::token_logprob(logits, target, lp, stream_);
  }
  void top_logprobs(const Tensor& logits, const Tensor& token, Tensor& chosen, Tensor& ids,
                    Tensor& lp) override {
    cuda::top_logprobs(logits, token, chosen, ids, lp, stream_);
  }
  void moe_route(const Tensor& logits, const MoeRouteParams& p, Tensor& ids, Tensor& weights) override {
    cuda::moe_route(logits, p, ids, weights, stream_);
  }
  void moe_ffn(const Tensor& x, const Tensor& ids, const Tensor& weights, const MoeExperts& e,
               Tensor& scratch, Tensor& out) override {
    TESSERA_CHECK(e.quant[0] < 0 && e.quant[1] < 0 && e.quant[2] < 0,
                  "moe_ffn (cuda): quantized experts are dequantized at load on CUDA");
    cuda::moe_ffn(x, ids, weights, e, scratch, out, stream_);
  }
  void rmsnorm_ex(const Tensor& x, const Tensor* w, int64_t group, float eps, bool acc, Tensor& y) override {
    cuda::rmsnorm_ex(x, w, group, eps, acc, y, stream_);
  }
  void geglu(const Tensor& g, const Tensor& u, Tensor& out) override { cuda::geglu(g, u, out, stream_); }
  void scale(Tensor& x, float f) override { cuda::scale(x, f, false, stream_); }
  void softcap(Tensor& x, float cap) override { cuda::scale(x, cap, true, stream_); }
  void canvas_sample(const Tensor& logits, const Tensor& keys, const SampleParams& p, Tensor& tok, Tensor& am,
                     Tensor& ent) override {
    cuda::canvas_sample(logits, keys, p, tok, am, ent, stream_);
  }
  // softmax(L / T) into probs (the table's dtype), then out = scale * probs * table on cuBLASLt.
  void soft_embed(const Tensor& logits, const Tensor& table, float temperature, float scale, Tensor& probs,
                  Tensor& out) override {
    check_soft_embed(logits, table, temperature, probs, out);
    const int64_t R = logits.rows(), V = logits.cols(), H = table.cols();
    if (R == 0) return;
    Tensor pr(probs.data, probs.dtype, {R, V}, Device::CUDA);
    cuda::softmax_rows(logits, temperature, pr, stream_);
    lt_matmul(R, H, V, pr.data, pr.dtype, table.data, table.dtype, out.data, DType::F32, nullptr, false, 0,
              true, scale);
  }
  int64_t device_free_bytes() const override {
    size_t free = 0, total = 0;
    check(cudaMemGetInfo(&free, &total), "memory info");
    return static_cast<int64_t>(free);
  }
  int64_t attention_library_calls() const override { return cudnn_ != nullptr ? cudnn_->calls() : 0; }
  int64_t attention_library_plans() const override { return cudnn_ != nullptr ? cudnn_->graphs_built() : 0; }
  bool can_capture() const override { return true; }
  void capture_begin() override {
    check(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "begin graph capture");
  }
  int64_t capture_end() override {
    cudaGraph_t graph = nullptr;
    cudaError_t e = cudaStreamEndCapture(stream_, &graph);
    cudaGraphExec_t exec = nullptr;
    size_t nodes = 0;
    if (e == cudaSuccess) e = cudaGraphGetNodes(graph, nullptr, &nodes);
    if (e == cudaSuccess) e = cudaGraphInstantiate(&exec, graph, 0);
    if (graph != nullptr) cudaGraphDestroy(graph);
    if (e != cudaSuccess) {
      cudaGetLastError();  // a failed capture is not sticky: clear it for the eager rerun
      return -1;
    }
    for (size_t i = 0; i < graphs_.size(); ++i) {  // a released slot first
      if (graphs_[i].exec == nullptr) {
        graphs_[i] = {exec, static_cast<int64_t>(nodes)};
        return static_cast<int64_t>(i);
      }
    }
    graphs_.push_back({exec, static_cast<int64_t>(nodes)});
    return static_cast<int64_t>(graphs_.size()) - 1;
  }
  void replay(int64_t h) override {
    check(cudaGraphLaunch(graphs_.at(static_cast<size_t>(h)).exec, stream_), "graph launch");
  }
  int64_t graph_nodes(int64_t h) const override { return graphs_.at(static_cast<size_t>(h)).nodes; }
  uint64_t recording_epoch() const override { return epoch_ + (cudnn_ != nullptr ? cudnn_->epoch() : 0); }
  void release_graph(int64_t h) override {
    auto& g = graphs_.at(static_cast<size_t>(h));
    if (g.exec != nullptr) cudaGraphExecDestroy(g.exec);
    g.exec = nullptr;
  }
  void reserve_quant_tile(size_t bytes) override { quant_tile(bytes); }
  int64_t device_total_bytes() const override {
    size_t free = 0, total = 0;
    check(cudaMemGetInfo(&free, &total), "memory info");
    return static_cast<int64_t>(total);
  }

 private:
  static constexpr size_t kLtWorkspace = size_t{32} << 20;
  // The mask-only logits gather their rows of the hidden state into this bf16 tile, then cuBLASLt
  // multiplies the tile by the LM head: 8 MiB (1024 rows of 4096), a fixed bound like the CPU's tile.
  static constexpr size_t kGatherTile = size_t{8} << 20;
  // m, n, k, the a / w / c dtypes, bias, accumulate, then c's leading dimension, the operands' common
  // alignment in bytes (<= 256; cuBLASLt assumes 256 unless told) and whether w is [K, N] (not transposed).
  using Key = std::tuple<int64_t, int64_t, int64_t, int, int, int, bool, bool, int64_t, int, bool>;
  const LtPlan& plan(const Key& key);
  // c[M, N] (=|+=) a[M, K] * w[N, K]^T (+ bias) through cuBLASLt; all pointers device memory, rows
  // contiguous (leading dimensions K, K and N; ldc > 0: c's rows are ldc elements apart, c a column
  // block of a wider matrix).
  // w_kn: w is [K, N] row-major (c = alpha * a * w, soft_embed's probabilities times the embedding).
  void lt_matmul(int64_t m, int64_t n, int64_t k, const void* a, DType at, const void* w, DType wt, void* c,
                 DType ct, const void* bias, bool acc, int64_t ldc = 0, bool w_kn = false,
                 float alpha = 1.0f);
  // c[i, j] (=|+=) a[i, :] . w[j, :] (+ bias[j]) for i < m, j < N = w.rows(), with w quantized
  // (cuda_keeps_quantized) and a [m, K] contiguous of w.dtype (the compute dtype, bf16 or f32); c's rows
  // are ldc elements apart (ldc >= N; c_dtype f32 or bf16; acc needs f32); bias f32 [N] or nullptr. The
  // weight is dequantized to w.dtype quant_tile_rows(N, K, w.dtype) rows at a time into the tile buffer
  // and each tile multiplied into its columns of c by lt_matmul: the GEMM of the dequantized weight
  // (dequantized exactly as the CPU does), never converted whole. gemm() calls it with ldc = N; the
  // mask-only logits of a quantized LM head call it per gathered tile of rows.
  void lt_gemm_quant(const void* a, int64_t m, const Tensor& w, const float* bias, void* c, DType c_dtype,
                     int64_t ldc, bool acc);
  // The quantized-weight tile: at least `bytes` (allocated at first use, grown when a larger one is needed).
  void* quant_tile(size_t bytes);

  cudaStream_t stream_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  void* lt_ws_ = nullptr;
  std::map<Key, LtPlan> plans_;
  std::string name_;
  void* gather_tile_ = nullptr;
  void* qtile_ = nullptr;  // the quantized-weight tile (lt_gemm_quant)
  size_t qtile_bytes_ = 0;
  bool fused_logits_ = false;
  uint64_t epoch_ = 0;  // releases of memory recorded steps may use (recording_epoch)
  std::unique_ptr<cuda::CudnnAttention> cudnn_;
  struct Recorded {
    cudaGraphExec_t exec;
    int64_t nodes;
  };
  std::vector<Recorded> graphs_;  // handles index it; a released slot is reused
};

const LtPlan& CudaBackend::plan(const Key& key) {
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second;
  const auto [m, n, k, at, wt, ct, bias, acc, ldc, align, w_kn] = key;
  LtPlan p;
  check_lt(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "matmul descriptor");
  const cublasOperation_t ta = w_kn ? CUBLAS_OP_N : CUBLAS_OP_T, tb = CUBLAS_OP_N;
  check_lt(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)), "transa");
  check_lt(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)), "transb");
  if (bias) {
    const cublasLtEpilogue_t ep = CUBLASLT_EPILOGUE_BIAS;
    check_lt(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof(ep)),
             "epilogue");
    const cudaDataType_t bt = CUDA_R_32F;
    check_lt(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof(bt)),
             "bias dtype");
  }
  // W [N, K] row-major is column-major K x N (transposed by the op); W [K, N] is column-major N x K.
  check_lt(w_kn ? cublasLtMatrixLayoutCreate(&p.a, cuda_type(static_cast<DType>(wt)),
                                             static_cast<uint64_t>(n), static_cast<uint64_t>(k), n)
                : cublasLtMatrixLayoutCreate(&p.a, cuda_type(static_cast<DType>(wt)),
                                             static_cast<uint64_t>(k), static_cast<uint64_t>(n), k),
           "layout W");
  check_lt(cublasLtMatrixLayoutCreate(&p.b, cuda_type(static_cast<DType>(at)), static_cast<uint64_t>(k),
                                      static_cast<uint64_t>(m), k),
           "layout A");
  check_lt(cublasLtMatrixLayoutCreate(&p.c, cuda_type(static_cast<DType>(ct)), static_cast<uint64_t>(n),
                                      static_cast<uint64_t>(m), ldc),
           "layout C");
  cublasLtMatmulPreference_t pref = nullptr;
  check_lt(cublasLtMatmulPreferenceCreate(&pref), "preference");
  const size_t ws = kLtWorkspace;
  check_lt(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)),
      "workspace preference");
  if (align < 256) {  // operands less aligned than cuBLASLt's default assumption
    const auto al = static_cast<uint32_t>(align);
    for (const auto attr :
         {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
          CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
      check_lt(cublasLtMatmulPreferenceSetAttribute(pref, attr, &al, sizeof(al)), "alignment preference");
  }
  cublasLtMatmulHeuristicResult_t res{};
  int found = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(lt_, p.op, p.a, p.b, p.c, p.c, pref, 1, &res, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
    fail("gemm (cuda): cuBLASLt has no algorithm for M=" + std::to_string(m) + " N=" + std::to_string(n) +
         " K=" + std::to_string(k) + " with these dtypes" + (acc ? " (accumulate)" : "") +
         (bias ? " (bias)" : ""));
  }
  p.algo = res.algo;
  return plans_.emplace(key, p).first->second;
}

void CudaBackend::lt_matmul(int64_t m, int64_t n, int64_t k, const void* a, DType at, const void* w, DType wt,
                            void* c, DType ct, const void* bias, bool acc, int64_t ldc, bool w_kn,
                            float alpha) {
  if (m == 0) return;
  // The largest power of two (<= 256) dividing every operand's address.
  const uintptr_t addr = reinterpret_cast<uintptr_t>(a) | reinterpret_cast<uintptr_t>(w) |
                         reinterpret_cast<uintptr_t>(c) | uintptr_t{256};
  const int align = static_cast<int>(addr & (~addr + 1));
  const Key key{m,
                n,
                k,
                static_cast<int>(at),
                static_cast<int>(wt),
                static_cast<int>(ct),
                bias != nullptr,
                acc,
                ldc > 0 ? ldc : n,
                align,
                w_kn};
  const LtPlan& p = plan(key);
  if (bias != nullptr) {
    check_lt(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)),
             "bias pointer");
  }
  const float beta = acc ? 1.0f : 0.0f;
  check_lt(cublasLtMatmul(lt_, p.op, &alpha, w, p.a, a, p.b, &beta, c, p.c, c, p.c, &p.algo, lt_ws_,
                          kLtWorkspace, stream_),
           "matmul");
}

void CudaBackend::gemm(const Tensor& a, const Tensor& w, const Tensor* bias, Tensor& c, bool acc) {
  check_gemm(a, w, bias, c, acc, Device::CUDA);
  TESSERA_CHECK(
      bias == nullptr || c.dtype == DType::F32,
      "gemm (cuda): a bias needs an f32 output (cuBLASLt's bias epilogue takes the output's dtype)");
  if (w.quantized()) {
    lt_gemm_quant(a.data, a.rows(), w, bias != nullptr ? bias->as<const float>() : nullptr, c.data, c.dtype,
                  c.cols(), acc);
    return;
  }
  lt_matmul(a.rows(), w.rows(), a.cols(), a.data, a.dtype, w.data, w.dtype, c.data, c.dtype,
            bias != nullptr ? bias->data : nullptr, acc);
}

void* CudaBackend::quant_tile(size_t bytes) {
  if (bytes <= qtile_bytes_) return qtile_;
  if (qtile_ != nullptr) {
    synchronize();  // the GEMMs queued on the smaller tile finish first
    cudaFree(qtile_);
    ++epoch_;  // recorded steps read the old tile
    qtile_ = nullptr;
    qtile_bytes_ = 0;
  }
  const cudaError_t e = cudaMalloc(&qtile_, bytes);
  if (e != cudaSuccess) {
    qtile_ = nullptr;
    fail("cuda: out of device memory allocating the " + std::to_string(bytes >> 20) +
         " MiB tile of quantized GEMM weights: " + cudaGetErrorString(e));
  }
  qtile_bytes_ = bytes;
  return qtile_;
}

void CudaBackend::lt_gemm_quant(const void* a, int64_t m, const Tensor& w, const float* bias, void* c,
                                DType c_dtype, int64_t ldc, bool acc) {
  const int64_t n = w.rows(), k = w.cols();
  if (m == 0) return;
  const GgmlTypeInfo* info = ggml_type_info(static_cast<uint32_t>(w.quant));
  TESSERA_CHECK(w.quantized() && cuda_keeps_quantized(w.quant),
                std::string("gemm (cuda): ggml type ") + (info != nullptr ? info->name : "?") +
                    " is converted at load on CUDA (kept quantized: q8_0, q4_0, q4_K, q5_K, q6_K)");
  TESSERA_CHECK(ldc >= n, "gemm (cuda): ldc below the weight's rows");
  const int64_t nt = quant_tile_rows(n, k, w.dtype);
  void* tile = quant_tile(quant_tile_bytes(n, k, w.dtype));
  const size_t cs = dtype_size(c_dtype);
  for (int64_t n0 = 0; n0 < n; n0 += nt) {
    const int64_t nb = std::min(nt, n - n0);
    cuda::dequantize_rows(w, n0, nb, w.dtype, tile, stream_);
    lt_matmul(m, nb, k, a, w.dtype, tile, w.dtype, static_cast<char*>(c) + static_cast<size_t>(n0) * cs,
              c_dtype, bias != nullptr ? bias + n0 : nullptr, acc, ldc);
  }
}

// Mask-only logits as bounded gather tiles + cuBLASLt: at most kGatherTile bytes of the selected rows
// are gathered (bf16) at a time and multiplied at cuBLASLt's rate, which the fused kernel reaches only
// a third of on Hopper (docs/PERF.md, CUDA section). Other dtypes take the fused kernel.
void CudaBackend::gather_gemm(const Tensor& a, const Tensor& rows, const Tensor& w, Tensor& c) {
  check_gather_gemm(a, rows, w, c, Device::CUDA);
  const int64_t m = rows.numel(), k = a.cols(), n = w.rows();
  if (m == 0) return;
  // A quantized LM head always takes the tiles (each gathered tile times the weight's dequantized
  // tiles); a bf16 one unless the fused kernel was asked for; f32 takes the fused kernel.
  const size_t row_bytes = static_cast<size_t>(k) * dtype_size(a.dtype);
  const bool tiles = w.quantized() || (!fused_logits_ && a.dtype == DType::BF16 && w.dtype == DType::BF16);
  if (!tiles || row_bytes > kGatherTile) {
    TESSERA_CHECK(!w.quantized(), "gather_gemm (cuda): hidden size too large");
    gather_gemm_fused(a, rows, w, c);
    return;
  }
  const int64_t tile = static_cast<int64_t>(kGatherTile / row_bytes);
  const size_t c_row = static_cast<size_t>(n) * dtype_size(c.dtype);
  for (int64_t r0 = 0; r0 < m; r0 += tile) {
    const int64_t nt = std::min(tile, m - r0);
    const Tensor idx(rows.as<int32_t>() + r0, DType::I32, {nt}, Device::CUDA);
    Tensor buf(gather_tile_, a.dtype, {nt, k}, Device::CUDA);
    cuda::gather_rows(a, idx, buf, stream_);
    void* c_tile = static_cast<char*>(c.data) + r0 * c_row;
    if (w.quantized()) {
      lt_gemm_quant(gather_tile_, nt, w, nullptr, c_tile, c.dtype, n, false);
    } else {
      lt_matmul(nt, n, k, gather_tile_, a.dtype, w.data, w.dtype, c_tile, c.dtype, nullptr, false);
    }
  }
}

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(std::string* why_not) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    if (why_not != nullptr) {
      *why_not = std::string("no CUDA device is available (") +
                 (e != cudaSuccess ? cudaGetErrorString(e) : "no devices") + ")";
    }
    return nullptr;
  }
  return std::make_unique<CudaBackend>();
}

}  // namespace tessera
