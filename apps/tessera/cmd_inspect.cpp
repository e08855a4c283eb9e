// tessera inspect DIR|FILE.gguf: family, dimensions, parameters, weight bytes, activation memory estimate.
#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <string>

#include "apps/tessera/cli_parse.h"
#include "apps/tessera/cli_session.h"
#include "apps/tessera/commands.h"
#include "io/config.h"
#include "io/gguf.h"
#include "io/gguf_model.h"
#include "io/safetensors.h"
#include "memory/planner.h"
#include "models/model.h"

namespace tessera::cli {
namespace {

// Experts, routing and which layers are MoE.
void print_moe(const ModelConfig& c) {
  const MoeConfig& m = c.moe;
  int64_t n_moe = 0;
  for (int64_t l = 0; l < c.n_layers; ++l) n_moe += c.is_moe_layer(l) ? 1 : 0;
  std::printf("experts      %lld routed (inter %lld), top-%lld", static_cast<long long>(m.n_experts),
              static_cast<long long>(m.expert_inter), static_cast<long long>(m.top_k));
  if (m.n_shared > 0)
    std::printf(", %lld shared (inter %lld)", static_cast<long long>(m.n_shared),
                static_cast<long long>(m.shared_inter));
  std::printf("; %lld of %lld layers MoE\n", static_cast<long long>(n_moe),
              static_cast<long long>(c.n_layers));
  std::printf("router       %s%s", m.score == RouterScore::Sigmoid ? "sigmoid" : "softmax",
              m.expert_bias ? " + expert bias" : "");
  if (m.n_group > 1)
    std::printf(", %lld groups keep %lld", static_cast<long long>(m.n_group),
                static_cast<long long>(m.topk_group));
  std::printf(", %s, scale %g\n", m.norm_topk ? "top-k renormalised" : "top-k not renormalised",
              static_cast<double>(m.routed_scale));
}

}  // namespace

// Weight bytes of a GGUF are those of the CPU backend, which keeps quantized tensors quantized.
WeightSummary summarize_weights(const std::string& path) {
  WeightSummary w;
  if (is_gguf_file(path)) {
    const auto g = GgufFile::open(path);
    std::map<std::string, int> types;
    size_t f32 = 0;
    for (const GgufTensor& t : g->tensors()) {
      ++types[ggml_type_info(t.type)->name];
      w.file_bytes += t.bytes;
      f32 += t.type == GgmlType::F32 ? t.bytes : 0;
    }
    w.act = auto_compute_dtype(f32, gguf_loaded_bytes(*g, DType::BF16) - f32);  // as Model::load decides
    w.bytes = w.file_bytes;  // on the CPU quantized tensors stay quantized
    if (const size_t converted = gguf_loaded_bytes(*g, w.act); converted != w.file_bytes)
      w.dequantized_bytes = converted;
    for (const GgufTensor& t : g->tensors()) {  // as Model::load binds them on CUDA
      const auto q = static_cast<int16_t>(t.type);
      if (!ggml_type_info(t.type) || ggml_type_info(t.type)->block == 1) {
        w.cuda_bytes += t.bytes;
      } else if (cuda_keeps_quantized(q) && t.ne.size() == 2) {
        w.cuda_bytes += t.bytes;
        if (t.name != "token_embd.weight")
          w.cuda_tile = std::max(w.cuda_tile, quant_tile_bytes(t.ne[1], t.ne[0], w.act));
      } else {
        w.cuda_bytes += static_cast<size_t>(t.numel()) * dtype_size(w.act);
      }
    }
    w.cuda_bytes += w.cuda_tile;
    w.tensors = g->tensors().size();
    for (const auto& [name, n] : types)
      w.file_types += (w.file_types.empty() ? "" : ", ") + name + " x " + std::to_string(n);
    return w;
  }
  const Checkpoint ck = Checkpoint::open(path);
  size_t f32 = 0;
  for (const auto& [n, t] : ck.tensors()) f32 += t.dtype == DType::F32 ? t.bytes : 0;
  w.act = auto_compute_dtype(f32, ck.total_bytes() - f32);
  w.bytes = ck.total_bytes();
  w.tensors = ck.tensors().size();
  return w;
}

void add_inspect(CLI::App& app, Registry& reg) {
  auto* sub = app.add_subcommand("inspect", "Describe a model (directory or GGUF file)");
  struct Args {
    std::string dir;
    int64_t context = 0;
    double mask_ratio = 0.5;
  };
  auto a = std::make_shared<Args>();
  auto* positional = sub->add_option("dir", a->dir, "model directory or .gguf file (or -m, as elsewhere)");
  auto* model = sub->add_option("-m,--model", a->dir,
                                "model directory or .gguf file (default: the bundled default model)");
  positional->excludes(model);
  sub->add_option("--context", a->context, "context for the activation estimate (default: the model's)");
  sub->add_option("--mask-ratio", a->mask_ratio, "fraction of positions that need logits")
      ->check(in_range(0.0, 1.0));
  sub->footer(
      "Examples:\n  tessera inspect -m /models/LLaDA-8B-Instruct --context 4096\n"
      "  tessera inspect LLaDA-8B-Instruct-Q4_K_M.gguf");
  reg.handlers.emplace_back(sub, [a] {
    if (a->dir.empty()) a->dir = default_model_dir();
    const ModelConfig c = load_config(a->dir);
    const WeightSummary ws = summarize_weights(a->dir);
    const DType act = ws.act;
    const int64_t ctx = a->context > 0 ? a->context : c.max_positions;
    const DenseWeights w = shape_only_weights(c, act);
    const graph::GraphTemplate g =
        build_model_graph(c, w, graph_options(c, act, Device::CPU), OutputMode::Sample);
    graph::StepShape s;
    s.n_query = s.n_kv = ctx;
    s.n_logits = std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(ctx) * a->mask_ratio));
    graph::Program p = graph::instantiate(g, s);
    memory::plan(g, p);
    std::printf("model        %s\n", a->dir.c_str());
    const std::string mask = c.is_uniform()     ? ", uniform noise (causal encoder, bidirectional canvases)"
                             : c.causal         ? ", causal"
                             : c.mask_block > 0 ? ", block-causal (blocks of --block-length, default " +
                                                      std::to_string(c.mask_block) + ")"
                                                : ", bidirectional";
    std::printf("family       %s (model_type %s)%s\n", family_name(c.family), c.model_type.c_str(),
                mask.c_str());
    std::printf("layers       %lld\nhidden       %lld\nheads        %lld (kv %lld, head_dim %lld)\n",
                static_cast<long long>(c.n_layers), static_cast<long long>(c.hidden),
                static_cast<long long>(c.n_heads), static_cast<long long>(c.n_kv_heads),
                static_cast<long long>(c.head_dim));
    if (c.qk_norm || c.rotary() != c.head_dim) {
      std::printf("attention    %sRoPE on %lld of %lld dims per head\n", c.qk_norm ? "qk-norm, " : "",
                  static_cast<long long>(c.rotary()), static_cast<long long>(c.head_dim));
    }
    if (c.is_uniform()) {
      const ModelConfig::Uniform& u = c.uniform;
      int64_t global = 0;
      for (const uint8_t kind : u.global_layer) global += kind;
      std::printf(
          "layers kind  %lld sliding (window %lld), %lld global (kv %lld, head_dim %lld, RoPE on %lld dims)\n"
          "canvas       %lld tokens, up to %d steps each, soft-cap %g\n",
          static_cast<long long>(c.n_layers - global), static_cast<long long>(u.window),
          static_cast<long long>(global), static_cast<long long>(u.global_kv_heads),
          static_cast<long long>(u.global_head_dim), static_cast<long long>(u.global_rotary),
          static_cast<long long>(u.canvas), u.steps, static_cast<double>(u.softcap));
    }
    std::printf("ffn          %lld\nvocab        %lld\ncontext      %lld\n",
                static_cast<long long>(c.intermediate), static_cast<long long>(c.vocab),
                static_cast<long long>(c.max_positions));
    if (c.moe.n_experts > 0) print_moe(c);
    std::printf("parameters   %.3f M\n", static_cast<double>(c.param_count()) / 1e6);
    if (c.moe.n_experts > 0)
      std::printf("active       %.3f M per token\n", static_cast<double>(c.active_param_count()) / 1e6);
    std::printf("weights      %s in %zu tensors (compute dtype %s)\n",
                human_bytes(static_cast<double>(ws.bytes)).c_str(), ws.tensors,
                std::string(dtype_name(act)).c_str());
    if (!ws.file_types.empty()) {
      std::printf("gguf         %s; tensor types %s", human_bytes(static_cast<double>(ws.file_bytes)).c_str(),
                  ws.file_types.c_str());
      if (ws.dequantized_bytes > 0) {
        std::printf(" (quantized ones stay quantized on the CPU; %s as %s with --dequantize)",
                    human_bytes(static_cast<double>(ws.dequantized_bytes)).c_str(),
                    std::string(dtype_name(act)).c_str());
      }
      std::printf("\n");
    }
    std::printf("activations  %s planned peak at context %lld, mask ratio %.2f (lower bound %s)\n",
                human_bytes(static_cast<double>(p.peak)).c_str(), static_cast<long long>(ctx), a->mask_ratio,
                human_bytes(static_cast<double>(p.lower_bound)).c_str());
    // --cache prefix|dual keeps K and V of every layer, in the compute dtype, for the whole canvas.
    const double kv =
        static_cast<double>(c.kv_cache_bytes_per_token(static_cast<int64_t>(dtype_size(act))) * ctx);
    std::printf("kv cache     %s at context %lld (--cache prefix|dual: K and V of every layer, %s)\n",
                human_bytes(kv).c_str(), static_cast<long long>(ctx), std::string(dtype_name(act)).c_str());
    return 0;
  });
}

}  // namespace tessera::cli
