// CpuBackend: host memory, oneDNN GEMMs, OpenMP kernels.
#include <cstdlib>
#include <cstring>
#include <string>

#include "backend/backend.h"
#include "backend/cpu/attention_tile.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/gemm.h"
#include "core/error.h"

namespace tessera {
namespace {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const CpuBackendOptions& o)
      : bf16_attention_(resolve_cpu_attention(o.attention) == CpuAttention::BF16),
        stage_kv_(bf16_attention_ && resolve_cpu_kv_stage(o.stage_kv)) {
    moe_.schedule = cpu::resolve_cpu_moe(o.moe);
  }
  Device device() const override { return Device::CPU; }
  std::string name() const override { return "cpu"; }
  // The bf16 kernel rounds K and V once per call into the planned scratch (cpu::stage_kv_bf16).
  bool stages_attention_kv(DType act) const override { return stage_kv_ && act == DType::BF16; }

  void* alloc_weights(size_t bytes) override {
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (p == nullptr) fail("cpu: out of memory allocating " + std::to_string(bytes) + " bytes");
    return p;
  }
  void free_weights(void* p) override { std::free(p); }
  void copy_to_device(void* dst, const void* src, size_t n) override { std::memcpy(dst, src, n); }
  void copy_to_host(void* dst, const void* src, size_t n) override { std::memcpy(dst, src, n); }
  void copy_on_device(void* dst, const void* src, size_t n) override { std::memcpy(dst, src, n); }
  void synchronize() override {}
  int64_t gemm_primitives_created() const override { return gemm_.primitives_created(); }

  void embed(const Tensor& tokens, const Tensor& table, Tensor& out) override {
    cpu::embed(tokens, table, out);
  }
  void rmsnorm(const Tensor& x, const Tensor& w, float eps, Tensor& y) override {
    cpu::rmsnorm(x, w, eps, y);
  }
  void gemm(const Tensor& a, const Tensor& w, const Tensor* bias, Tensor& c, bool acc) override {
    gemm_.gemm(a, w, bias, c, acc);
  }
  void gather_gemm(const Tensor& a, const Tensor& rows, const Tensor& w, Tensor& c) override {
    gemm_.gather_gemm(a, rows, w, c);
  }
  void rope(Tensor& x, const Tensor& pos, int hd, const RopeParams& p) override {
    cpu::rope(x, pos, hd, p, &rope_);
  }
  void attention(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, int nh, int nkv, int hd,
                 const AttnParams& p) override {
    cpu::attention(q, k, v, out, nh, nkv, hd, p, bf16_attention_ && p.operands == DType::BF16);
  }
  void sparse_select(const Tensor& q, const Tensor& k, int nh, int nkv, int hd, const SparseSelectParams& p,
                     uint8_t* mask) override {
    cpu::sparse_select(q, k, nh, nkv, hd, p, mask, bf16_attention_ && p.operands == DType::BF16);
  }
  void swiglu(const Tensor& g, const Tensor& u, Tensor& out) override { cpu::swiglu(g, u, out); }
  void scatter_rows(const Tensor& src, const Tensor& rows, Tensor& dst) override {
    cpu::scatter_rows(src, rows, dst);
  }
  void convert(const Tensor& src, Tensor& dst) override { cpu::convert(src, dst); }
  void gather_rows(const Tensor& src, const Tensor& rows, Tensor& dst) override {
    cpu::gather_rows(src, rows, dst);
  }
  void sample_rows(const Tensor& logits, const Tensor& keys, const SampleParams& p, Tensor& tok,
                   Tensor& conf) override {
    cpu_sample_rows(logits, keys, p, tok, conf);
  }
  void token_logprob(const Tensor& logits, const Tensor& target, Tensor& lp) override {
    cpu_token_logprob(logits, target, lp);
  }
  void top_logprobs(const Tensor& logits, const Tensor& token, Tensor& chosen, Tensor& ids,
                    Tensor& lp) override {
    cpu_top_logprobs(logits, token, chosen, ids, lp);
  }
  void moe_route(const Tensor& logits, const MoeRouteParams& p, Tensor& ids, Tensor& weights) override {
    cpu::moe_route(logits, p, ids, weights);
  }
  void moe_ffn(const Tensor& x, const Tensor& ids, const Tensor& weights, const MoeExperts& e,
               Tensor& scratch, Tensor& out) override {
    cpu::moe_ffn(gemm_, moe_, x, ids, weights, e, scratch, out);
  }
  void rmsnorm_ex(const Tensor& x, const Tensor* w, int64_t group, float eps, bool accumulate,
                  Tensor& y) override {
    cpu::rmsnorm_ex(x, w, group, eps, accumulate, y);
  }
  void geglu(const Tensor& g, const Tensor& u, Tensor& out) override { cpu::geglu(g, u, out); }
  void scale(Tensor& x, float s) override { cpu::scale(x, s); }
  void softcap(Tensor& x, float cap) override { cpu::softcap(x, cap); }
  void canvas_sample(const Tensor& logits, const Tensor& keys, const SampleParams& p, Tensor& tok,
                     Tensor& argmax, Tensor& entropy) override {
    cpu::canvas_sample(logits, keys, p, tok, argmax, entropy);
  }
  void soft_embed(const Tensor& logits, const Tensor& table, float t, float s, Tensor& probs,
                  Tensor& out) override {
    cpu::soft_embed(gemm_, logits, table, t, s, probs, out);
  }

 private:
  cpu::GemmEngine gemm_;
  cpu::MoeState moe_;
  cpu::RopeTable rope_;
  bool bf16_attention_;  // attention and sparse_select run the bf16 kernel where the call allows it
  bool stage_kv_;        // bf16 graphs plan the K / V staging buffer (CpuBackendOptions::stage_kv)
};

}  // namespace

CpuAttention resolve_cpu_attention(CpuAttention choice) {
  if (choice == CpuAttention::Auto) {
    const char* env = std::getenv("TESSERA_CPU_ATTN");
    const std::string e = env != nullptr ? env : "";
    if (e == "f32") return CpuAttention::F32;
    if (!e.empty() && e != "bf16" && e != "auto")
      fail("TESSERA_CPU_ATTN='" + e + "': expected f32, bf16 or auto");
    if (e != "bf16") return cpu::bf16_attention_supported() ? CpuAttention::BF16 : CpuAttention::F32;
    choice = CpuAttention::BF16;
  }
  if (choice == CpuAttention::BF16 && !cpu::bf16_attention_supported())
    fail("cpu: bf16 attention needs a CPU with AVX-512 BF16 (avx512_bf16); this one has none: use f32");
  return choice;
}

bool resolve_cpu_kv_stage(bool choice) {
  const char* env = std::getenv("TESSERA_CPU_KV_STAGE");
  const std::string e = env != nullptr ? env : "";
  if (e.empty()) return choice;
  if (e != "0" && e != "1") fail("TESSERA_CPU_KV_STAGE='" + e + "': expected 0 or 1");
  return choice && e == "1";
}

std::unique_ptr<Backend> make_cpu_backend(const CpuBackendOptions& options) {
  return std::make_unique<CpuBackend>(options);
}

}  // namespace tessera
