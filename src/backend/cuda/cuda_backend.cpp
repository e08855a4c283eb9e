// CudaBackend: device memory, one stream, GEMMs through cuBLASLt (bf16 operands, f32 accumulation),
// hand-written kernels for everything cuBLAS cannot do (gather-GEMM, attention, sampling, MoE).
// Nothing here allocates device memory after construction except alloc_weights: every op works in
// the planned workspace and the cuBLASLt workspace made once here.
#include <cublasLt.h>

#include <map>
#include <tuple>

#include "backend/backend.h"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_kernels.h"
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
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, 0), "device properties");
    name_ = std::string("cuda (") + prop.name + ")";
  }
  ~CudaBackend() override {
    cudaStreamSynchronize(stream_);
    for (auto& [k, p] : plans_) {
      cublasLtMatrixLayoutDestroy(p.a);
      cublasLtMatrixLayoutDestroy(p.b);
      cublasLtMatrixLayoutDestroy(p.c);
      cublasLtMatmulDescDestroy(p.op);
    }
    cublasLtDestroy(lt_);
    cudaFree(lt_ws_);
    cudaStreamDestroy(stream_);
  }
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  Device device() const override { return Device::CUDA; }
  std::string name() const override { return name_; }

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
    TESSERA_CHECK(!table.quantized(), "embed (cuda): quantized tables are dequantized at load on CUDA");
    cuda::embed(tokens, table, out, stream_);
  }
  void rmsnorm(const Tensor& x, const Tensor& w, float eps, Tensor& y) override {
    cuda::rmsnorm(x, w, eps, y, stream_);
  }
  void gemm(const Tensor& a, const Tensor& w, const Tensor* bias, Tensor& c, bool acc) override;
  void gather_gemm(const Tensor& a, const Tensor& rows, const Tensor& w, Tensor& c) override {
    check_gather_gemm(a, rows, w, c, Device::CUDA);
    TESSERA_CHECK(!w.quantized(), "gather_gemm (cuda): quantized weights are dequantized at load on CUDA");
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
  void rope(Tensor& x, const Tensor& pos, int hd, int rot, float theta, bool neox) override {
    cuda::rope(x, pos, hd, rot, theta, neox, stream_);
  }
  void attention(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, int nh, int nkv, int hd,
                 const AttnParams& p) override {
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
  int64_t device_free_bytes() const override {
    size_t free = 0, total = 0;
    check(cudaMemGetInfo(&free, &total), "memory info");
    return static_cast<int64_t>(free);
  }
  int64_t device_total_bytes() const override {
    size_t free = 0, total = 0;
    check(cudaMemGetInfo(&free, &total), "memory info");
    return static_cast<int64_t>(total);
  }

 private:
  static constexpr size_t kLtWorkspace = size_t{32} << 20;
  using Key = std::tuple<int64_t, int64_t, int64_t, int, int, int, bool, bool>;
  const LtPlan& plan(const Key& key);

  cudaStream_t stream_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  void* lt_ws_ = nullptr;
  std::map<Key, LtPlan> plans_;
  std::string name_;
};

const LtPlan& CudaBackend::plan(const Key& key) {
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second;
  const auto [m, n, k, at, wt, ct, bias, acc] = key;
  LtPlan p;
  check_lt(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "matmul descriptor");
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
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
  check_lt(cublasLtMatrixLayoutCreate(&p.a, cuda_type(static_cast<DType>(wt)), static_cast<uint64_t>(k),
                                      static_cast<uint64_t>(n), k),
           "layout W");
  check_lt(cublasLtMatrixLayoutCreate(&p.b, cuda_type(static_cast<DType>(at)), static_cast<uint64_t>(k),
                                      static_cast<uint64_t>(m), k),
           "layout A");
  check_lt(cublasLtMatrixLayoutCreate(&p.c, cuda_type(static_cast<DType>(ct)), static_cast<uint64_t>(n),
                                      static_cast<uint64_t>(m), n),
           "layout C");
  cublasLtMatmulPreference_t pref = nullptr;
  check_lt(cublasLtMatmulPreferenceCreate(&pref), "preference");
  const size_t ws = kLtWorkspace;
  check_lt(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)),
      "workspace preference");
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

void CudaBackend::gemm(const Tensor& a, const Tensor& w, const Tensor* bias, Tensor& c, bool acc) {
  check_gemm(a, w, bias, c, acc, Device::CUDA);
  TESSERA_CHECK(!w.quantized(), "gemm (cuda): quantized (GGUF) weights are dequantized at load on CUDA");
  const int64_t m = a.rows(), k = a.cols(), n = w.rows();
  if (m == 0) return;
  const Key key{m,
                n,
                k,
                static_cast<int>(a.dtype),
                static_cast<int>(w.dtype),
                static_cast<int>(c.dtype),
                bias != nullptr,
                acc};
  const LtPlan& p = plan(key);
  if (bias != nullptr) {
    const void* bp = bias->data;
    check_lt(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, sizeof(bp)),
             "bias pointer");
  }
  const float alpha = 1.0f, beta = acc ? 1.0f : 0.0f;
  check_lt(cublasLtMatmul(lt_, p.op, &alpha, w.data, p.a, a.data, p.b, &beta, c.data, p.c, c.data, p.c,
                          &p.algo, lt_ws_, kLtWorkspace, stream_),
           "matmul");
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
