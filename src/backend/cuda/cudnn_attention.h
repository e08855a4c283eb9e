// Attention through cuDNN's fused scaled-dot-product attention (the flash kernels PyTorch uses on
// Hopper), built with NVIDIA's cudnn-frontend and loaded at run time (libcudnn.so.9): internal to the
// CUDA backend. The cases cuDNN takes: no mask (bidirectional), no block-sparse pattern, GQA, a query
// subset against a key set, one sequence or several packed ones (ragged offsets, Hopper and later),
// head dims that are multiples of 8 up to 128, bf16 output, with AttnParams::kv_scratch and q_scratch.
// Everything else (causal / block-causal masks, SparseD, f32 outputs) stays on tessera's kernels.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>

#include "backend/backend.h"

namespace tessera::cuda {

class CudnnAttention {
 public:
  // Loads cuDNN (libcudnn.so.9 on the library path) and makes a handle on `stream`; nullptr with the
  // reason in *why_not when the library is absent, too old, or the GPU is older than sm_80.
  static std::unique_ptr<CudnnAttention> open(cudaStream_t stream, std::string* why_not);
  virtual ~CudnnAttention() = default;
  // "cuDNN 9.x.y" of the loaded library.
  virtual std::string version() const = 0;
  // Runs the attention when cuDNN takes this case and returns true; false (nothing written) when it
  // does not, and the caller runs its own kernel. A graph is built per shape and kept (at most
  // kMaxGraphs, least recently used first out); a shape cuDNN refuses is remembered as refused.
  virtual bool attention(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, int n_heads,
                         int n_kv_heads, int head_dim, const AttnParams& p) = 0;
  // Calls that cuDNN ran, and graphs built so far (bench reports).
  virtual int64_t calls() const = 0;
  virtual int64_t graphs_built() const = 0;
  // Counts the times a graph or the workspace was released (an evicted graph, a workspace that grew):
  // recorded steps that ran them must not be replayed (Backend::recording_epoch).
  virtual uint64_t epoch() const = 0;
  static constexpr int kMaxGraphs = 64;
};

// Kernels the cuDNN path needs (cudnn_stage.cu): f32 -> bf16 (round to nearest even) of n values,
// and the per-sequence lengths and ragged element offsets of packed sequences from cu_q / cu_k:
// meta = [seq_q (n), seq_kv (n), off_q (n + 1), off_kv (n + 1)] i32, off = cu * stride.
void to_bf16(const float* src, void* dst, int64_t n, cudaStream_t s);
void ragged_meta(const int32_t* cu_q, const int32_t* cu_k, int n_seqs, int64_t q_stride, int64_t kv_stride,
                 int32_t* meta, cudaStream_t s);

}  // namespace tessera::cuda
