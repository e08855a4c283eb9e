// GEMM on the CPU through oneDNN matmul (bf16 x bf16 -> f32/bf16 with the brgemm AVX-512 BF16
// kernels; f32 x f32). Primitives are cached per shape and their scratchpads share one buffer, so
// after warm-up a GEMM allocates nothing.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/tensor.h"

namespace tessera::cpu {

class GemmEngine {
 public:
  GemmEngine();
  ~GemmEngine();
  GemmEngine(const GemmEngine&) = delete;
  GemmEngine& operator=(const GemmEngine&) = delete;

  // c[M,N] (=|+=) a[M,K] * w[N,K]^T (+ bias[N] f32). a and w share one dtype (f32 or bf16). A
  // quantized w (Tensor::quant) is dequantized to a's dtype panel by panel (kPanelBytes of rows at a
  // time, into one per-engine buffer) and each panel multiplied as a plain weight: the result is that
  // of the dequantized weight, while the weight stays quantized in memory.
  void gemm(const Tensor& a, const Tensor& w, const Tensor* bias, Tensor& c, bool accumulate);
  // c[i,:] = a[rows[i],:] * w^T. Rows are read by index in bounded tiles of kGatherTile rows that
  // are packed into a fixed per-engine tile buffer (cache-sized), never a copy of all selected rows.
  void gather_gemm(const Tensor& a, const Tensor& rows, const Tensor& w, Tensor& c);
  // c[M,N] = a[M,K] * b[K,N] (b not transposed: an embedding table read as [V, H] by soft embeddings); a
  // and b of one dtype, f32 or bf16, not quantized; c f32.
  void gemm_nn(const Tensor& a, const Tensor& b, Tensor& c);
  static constexpr int64_t kGatherTile = 256;
  // Dequantized panels of 16 MiB: wide enough that oneDNN runs each at the rate of the whole GEMM
  // (4 MiB panels cost up to 60% more at 250 rows; one panel costs only the dequantization).
  static constexpr size_t kPanelBytes = size_t{16} << 20;
  static constexpr int64_t kGatherPanelRows = 2048;  // quantized gather_gemm: few panels, few re-gathers
  // Creates (and caches) the primitive(s) of c[m,n] = a[m,k] w[n,k]^T ahead of use, so that a later
  // gemm() of that shape allocates nothing (the MoE FFN warms every row-count bucket it may use).
  void prepare(int64_t m, int64_t n, int64_t k, DType a, DType c, bool quantized = false);
  // The cache holds at most kMaxPrimitives shapes, the least recently used going first (far more than
  // one forward uses, MoE buckets included: a step's shapes stay cached). primitives_created() counts
  // every primitive made (a steady generation makes none per step except its LM head's last gather
  // tile, whose row count is the step's masked-row count: see docs/PERF.md, issue #34).
  static constexpr size_t kMaxPrimitives = 512;

  // Independent GEMMs shared out among the threads of one OpenMP parallel region (the MoE FFN's
  // experts, each on one thread). Outside the region: prepare_slots(n, bytes) gives n slots (one per
  // thread: a stream, a scratchpad, memory objects and `bytes` of workspace of its own), and
  // prepare_serial() makes a shape's primitive for one thread. Inside it, thread s calls
  // gemm_in_slot(s, ...): c = a w^T (w plain or quantized, as gemm() without bias), computed on the
  // calling thread alone; it makes nothing and fails on a shape not prepared.
  void prepare_slots(int n, size_t workspace_bytes);
  void* slot_workspace(int slot);
  void prepare_serial(int64_t m, int64_t n, int64_t k, DType a, DType c, bool quantized = false);
  void gemm_in_slot(int slot, const Tensor& a, const Tensor& w, Tensor& c);
  int64_t primitives_created() const;
  size_t primitives_held() const;

 private:
  // Rows of w per dequantized panel for a GEMM of n x k weights computed in dtype a.
  static int64_t panel_rows(int64_t n, int64_t k, DType a);
  // Rows [n0, n0 + nb) of the quantized w converted to `to` in the panel buffer.
  const void* dequantize_panel(const Tensor& w, int64_t n0, int64_t nb, DType to);
  const void* dequantize_into(const Tensor& w, int64_t n0, int64_t nb, DType to, std::vector<char>& panel,
                              bool parallel);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera::cpu
