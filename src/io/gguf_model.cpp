#include "io/gguf_model.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace tessera {

bool split_layer(const std::string& name, std::string_view stem, int64_t& layer, std::string& rest) {
  if (name.size() <= stem.size() || name.compare(0, stem.size(), stem) != 0) return false;
  const size_t dot = name.find('.', stem.size());
  if (dot == std::string::npos || dot == stem.size()) return false;
  layer = 0;
  for (size_t i = stem.size(); i < dot; ++i) {
    if (name[i] < '0' || name[i] > '9' || layer > 1000000) return false;
    layer = layer * 10 + (name[i] - '0');
  }
  rest = name.substr(dot + 1);
  return true;
}
namespace fs = std::filesystem;

namespace {

struct ArchInfo {
  const char* arch;
  Family family;
};
constexpr ArchInfo kArchs[] = {
    {"llada", Family::LLaDA}, {"dream", Family::Dream}, {"llada-moe", Family::LLaDAMoE}};

Family family_of(const GgufFile& g, const std::string& arch) {
  for (const ArchInfo& a : kArchs)
    if (arch == a.arch) return a.family;
  fail(g.path().string() + ": GGUF architecture '" + arch +
       "' is not a diffusion LM tessera loads (supported: llada, dream, llada-moe)");
}

// Hugging Face name of a GGUF tensor name's per-layer suffix (after "blk.N."), by family; "" if the
// family has no such tensor. Experts (ffn_*_exps) are split separately.
struct SuffixMap {
  const char *gguf, *llada, *hf;  // hf: the Llama-style names of Dream and LLaDA-MoE
};
constexpr SuffixMap kSuffixes[] = {
    {"attn_norm.weight", "attn_norm.weight", "input_layernorm.weight"},
    {"attn_q.weight", "q_proj.weight", "self_attn.q_proj.weight"},
    {"attn_k.weight", "k_proj.weight", "self_attn.k_proj.weight"},
    {"attn_v.weight", "v_proj.weight", "self_attn.v_proj.weight"},
    {"attn_q.bias", "q_proj.bias", "self_attn.q_proj.bias"},
    {"attn_k.bias", "k_proj.bias", "self_attn.k_proj.bias"},
    {"attn_v.bias", "v_proj.bias", "self_attn.v_proj.bias"},
    {"attn_output.weight", "attn_out.weight", "self_attn.o_proj.weight"},
    {"attn_q_norm.weight", "", "self_attn.q_norm.weight"},
    {"attn_k_norm.weight", "", "self_attn.k_norm.weight"},
    {"ffn_norm.weight", "ff_norm.weight", "post_attention_layernorm.weight"},
    {"ffn_gate.weight", "ff_proj.weight", "mlp.gate_proj.weight"},
    {"ffn_up.weight", "up_proj.weight", "mlp.up_proj.weight"},
    {"ffn_down.weight", "ff_out.weight", "mlp.down_proj.weight"},
    {"ffn_gate_inp.weight", "", "mlp.gate.weight"},
    {"ffn_gate_shexp.weight", "", "shared_expert.gate_proj.weight"},
    {"ffn_up_shexp.weight", "", "shared_expert.up_proj.weight"},
    {"ffn_down_shexp.weight", "", "shared_expert.down_proj.weight"},
};

std::string hf_layer_suffix(Family f, const std::string& s) {
  for (const SuffixMap& m : kSuffixes)
    if (s == m.gguf) return f == Family::LLaDA ? m.llada : m.hf;
  return "";
}

std::string hf_global(Family f, const std::string& name) {
  const bool llada = f == Family::LLaDA;
  if (name == "token_embd.weight")
    return llada ? "model.transformer.wte.weight" : "model.embed_tokens.weight";
  if (name == "output_norm.weight") return llada ? "model.transformer.ln_f.weight" : "model.norm.weight";
  if (name == "output.weight") return llada ? "model.transformer.ff_out.weight" : "lm_head.weight";
  return "";
}

std::string hf_layer_prefix(Family f, int64_t l) {
  return (f == Family::LLaDA ? "model.transformer.blocks." : "model.layers.") + std::to_string(l) + ".";
}

// The GGUF name of a tensor tessera names `hf` (the inverse of the mapping above), for messages;
// "" when there is none.
std::string gguf_name_of(Family f, const std::string& hf) {
  for (const char* g : {"token_embd.weight", "output_norm.weight", "output.weight"})
    if (hf_global(f, g) == hf) return g;
  const std::string prefix = hf_layer_prefix(f, 0);
  int64_t l = 0;
  std::string rest;
  if (!split_layer(hf, std::string_view(prefix).substr(0, prefix.size() - 2), l, rest)) return "";
  const std::string layer = std::to_string(l);
  if (rest.rfind("mlp.experts.", 0) == 0) {  // mlp.experts.E.gate_proj.weight
    const size_t e_end = rest.find('.', 12);
    if (e_end == std::string::npos) return "";
    const std::string proj = rest.substr(e_end + 1, rest.find('_', e_end + 1) - e_end - 1);
    return "blk." + layer + ".ffn_" + proj + "_exps.weight (expert " + rest.substr(12, e_end - 12) + ")";
  }
  for (const SuffixMap& m : kSuffixes)
    if (rest == (f == Family::LLaDA ? m.llada : m.hf)) return "blk." + layer + "." + m.gguf;
  return "";
}

DType plain_dtype(GgmlType t) {
  return t == GgmlType::F32 ? DType::F32 : t == GgmlType::F16 ? DType::F16 : DType::BF16;
}
bool is_plain(GgmlType t) {
  return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16;
}

// Converts a quantized tensor (of a type tessera reads) to `to` (f32 or bf16), in parallel over rows.
void dequantize_into(const GgufTensor& t, void* dst, DType to) {
  const int64_t row = t.ne[0], rows = t.numel() / row;
  const size_t row_bytes = ggml_bytes(t.type, row);
  const size_t out_row = static_cast<size_t>(row) * dtype_size(to);
  std::string err;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    try {
      ggml_dequantize_row(t.type, t.data + static_cast<size_t>(r) * row_bytes, row, to,
                          static_cast<char*>(dst) + static_cast<size_t>(r) * out_row);
    } catch (const std::exception& e) {
#pragma omp critical
      err = e.what();
    }
  }
  if (!err.empty()) fail(err);
}

}  // namespace

ModelConfig gguf_config(const GgufFile& g) {
  const std::string where = g.path().string();
  const std::string arch = g.require_string("general.architecture");
  ModelConfig c;
  c.family = family_of(g, arch);
  c.model_type = arch;
  const std::string a = arch + ".";
  auto positive = [&](const std::string& key, int64_t v) {
    if (v <= 0) fail(where + ": GGUF metadata '" + key + "' must be positive, got " + std::to_string(v));
    return v;
  };
  c.n_layers = positive(a + "block_count", g.require_int(a + "block_count"));
  c.hidden = positive(a + "embedding_length", g.require_int(a + "embedding_length"));
  c.n_heads = positive(a + "attention.head_count", g.require_int(a + "attention.head_count"));
  c.n_kv_heads = positive(a + "attention.head_count_kv", g.get_int(a + "attention.head_count_kv", c.n_heads));
  if (c.n_heads % c.n_kv_heads != 0) fail(where + ": the head count is not a multiple of the KV head count");
  if (!g.find(a + "attention.key_length") && c.hidden % c.n_heads != 0)
    fail(where + ": the embedding length is not a multiple of the head count (and there is no key_length)");
  c.head_dim =
      positive(a + "attention.key_length", g.get_int(a + "attention.key_length", c.hidden / c.n_heads));
  if (g.get_int(a + "attention.value_length", c.head_dim) != c.head_dim)
    fail(where + ": attention.value_length differs from key_length (not supported)");
  c.max_positions = positive(a + "context_length", g.require_int(a + "context_length"));
  c.rope_theta = static_cast<float>(g.get_float(a + "rope.freq_base", 10000.0));
  c.rms_eps = static_cast<float>(g.get_float(a + "attention.layer_norm_rms_epsilon", -1.0));
  if (!(c.rms_eps > 0))
    fail(where + ": GGUF metadata '" + a + "attention.layer_norm_rms_epsilon' is missing");
  c.rotary_dim = g.get_int(a + "rope.dimension_count", c.head_dim);
  if (c.rotary_dim <= 0 || c.rotary_dim > c.head_dim || c.rotary_dim % 2 != 0)
    fail(where + ": rope.dimension_count " + std::to_string(c.rotary_dim) + " must be even and at most " +
         std::to_string(c.head_dim));
  const std::string scaling = g.get_string(a + "rope.scaling.type", "none");
  if (scaling != "none")
    fail(where + ": RoPE scaling '" + scaling + "' (" + a + "rope.scaling.type) is not supported");
  if (g.get_bool(a + "attention.causal", false))
    fail(where + ": " + a + "attention.causal is true; tessera runs these models bidirectionally");

  const GgufTensor* embd = g.find_tensor("token_embd.weight");
  if (embd == nullptr) fail(where + ": tensor 'token_embd.weight' is missing");
  if (embd->ne.size() != 2 || embd->ne[0] != c.hidden)
    fail(where + ": token_embd.weight does not have rows of embedding_length " + std::to_string(c.hidden));
  c.vocab = embd->ne[1];
  c.tie_embeddings = g.find_tensor("output.weight") == nullptr;
  c.qkv_bias = g.find_tensor("blk.0.attn_q.bias") != nullptr;
  c.qk_norm = g.find_tensor("blk.0.attn_q_norm.weight") != nullptr;
  // Dream's converter writes no shift key: Dream predicts position i from hidden row i-1.
  c.logit_shift = g.get_bool("diffusion.shift_logits", c.family == Family::Dream);
  c.rope_interleaved = c.family == Family::LLaDA;

  if (c.family == Family::LLaDAMoE) {
    MoeConfig& m = c.moe;
    m.n_experts = positive(a + "expert_count", g.require_int(a + "expert_count"));
    m.top_k = positive(a + "expert_used_count", g.require_int(a + "expert_used_count"));
    if (m.top_k > m.n_experts) fail(where + ": expert_used_count exceeds expert_count");
    m.score = RouterScore::Softmax;
    m.norm_topk = g.get_bool(a + "expert_weights_norm", false);
    m.routed_scale = static_cast<float>(g.get_float(a + "expert_weights_scale", 1.0));
    if (g.get_int(a + "expert_gating_func", 1) != 1)
      fail(where + ": " + a + "expert_gating_func is not softmax (the only router LLaDA-MoE has)");
    m.moe_layer.assign(static_cast<size_t>(c.n_layers), 1);
    for (int64_t l = 0; l < c.n_layers; ++l) {
      const std::string b = "blk." + std::to_string(l) + ".";
      const GgufTensor* gate = g.find_tensor(b + "ffn_gate_exps.weight");
      if (gate == nullptr) {
        m.moe_layer[static_cast<size_t>(l)] = 0;
        const GgufTensor* dense = g.find_tensor(b + "ffn_gate.weight");
        if (dense == nullptr)
          fail(where + ": layer " + std::to_string(l) + " has neither experts nor an FFN");
        c.intermediate = dense->ne.size() == 2 ? dense->ne[1] : 0;
        continue;
      }
      if (gate->ne.size() != 3 || gate->ne[2] != m.n_experts)
        fail(where + ": " + gate->name + " does not stack expert_count experts");
      m.expert_inter = gate->ne[1];
      if (const GgufTensor* sh = g.find_tensor(b + "ffn_gate_shexp.weight")) {
        m.n_shared = 1;
        m.shared_inter = sh->ne.size() == 2 ? sh->ne[1] : 0;
      }
    }
    const int64_t declared = g.get_int(a + "expert_feed_forward_length", m.expert_inter);
    if (declared != m.expert_inter)
      fail(where + ": expert_feed_forward_length " + std::to_string(declared) +
           " contradicts the expert tensors");
  } else {
    c.intermediate = positive(a + "feed_forward_length", g.require_int(a + "feed_forward_length"));
  }

  auto token = [&](const char* key) { return static_cast<int32_t>(g.get_int(key, -1)); };
  c.mask_id = token("tokenizer.ggml.mask_token_id");
  c.eos_id = token("tokenizer.ggml.eos_token_id");
  c.bos_id = token("tokenizer.ggml.bos_token_id");
  c.pad_id = token("tokenizer.ggml.padding_token_id");
  if (c.pad_id < 0) c.pad_id = c.eos_id;
  if (c.mask_id < 0) {
    // Older conversions name no mask id: the family's mask token in the vocabulary.
    if (const GgufValue* toks = g.find("tokenizer.ggml.tokens")) {
      const char* want = c.family == Family::LLaDA ? "<|mdm_mask|>" : "<|mask|>";
      const auto it = std::find(toks->strs.begin(), toks->strs.end(), want);
      if (it != toks->strs.end()) c.mask_id = static_cast<int32_t>(it - toks->strs.begin());
    }
  }
  if (c.mask_id < 0)
    fail(where + ": the GGUF names no mask token (tokenizer.ggml.mask_token_id) and its vocabulary has none");
  for (int32_t id : {c.mask_id, c.eos_id, c.bos_id, c.pad_id})
    if (id >= c.vocab)
      fail(where + ": special token id " + std::to_string(id) + " is outside the vocabulary");
  return c;
}

size_t gguf_loaded_bytes(const GgufFile& g, DType dequant_to) {
  size_t n = 0;
  for (const GgufTensor& t : g.tensors())
    n += is_plain(t.type) ? t.bytes : static_cast<size_t>(t.numel()) * dtype_size(dequant_to);
  return n;
}

Checkpoint gguf_checkpoint(std::shared_ptr<const GgufFile> g, const ModelConfig& c, DType dequant_to,
                           bool keep_quantized) {
  TESSERA_CHECK(dequant_to == DType::F32 || dequant_to == DType::BF16,
                "gguf_checkpoint: dequantize to f32 or bf16");
  const fs::path& path = g->path();
  Checkpoint ck;
  ck.set_source(path);
  ck.set_source_names([f = c.family](const std::string& hf) { return gguf_name_of(f, hf); });
  ck.keep(g);
  const std::string file = path.filename().string();
  // The bytes of `t` as tessera reads them: a view (plain types) or a converted copy (quantized).
  auto materialize = [&](const GgufTensor& t) {
    StTensor st;
    st.file = file;
    if (is_plain(t.type)) {
      st.dtype = plain_dtype(t.type);
      st.data = t.data;
      st.bytes = t.bytes;
      return st;
    }
    const GgmlTypeInfo* ti = ggml_type_info(t.type);
    if (!ti->dequantizable) ggml_dequantize(t.type, t.data, nullptr, ti->block);  // throws naming the type
    if (keep_quantized) {
      st.dtype = DType::BF16;
      st.quant = static_cast<int16_t>(t.type);
      st.data = t.data;
      st.bytes = t.bytes;
      return st;
    }
    st.dtype = dequant_to;
    st.bytes = static_cast<size_t>(t.numel()) * dtype_size(dequant_to);
    std::shared_ptr<char[]> buf(new char[st.bytes]);
    dequantize_into(t, buf.get(), dequant_to);
    st.data = buf.get();
    ck.keep(buf);
    return st;
  };
  auto add = [&](const std::string& name, const GgufTensor& t) {
    StTensor st = materialize(t);
    st.name = name;
    st.shape = t.shape();
    ck.add(std::move(st));
  };
  for (const GgufTensor& t : g->tensors()) {
    int64_t l = 0;
    std::string rest;
    if (const std::string global = hf_global(c.family, t.name); !global.empty()) {
      add(global, t);
    } else if (split_layer(t.name, "blk.", l, rest) && l < c.n_layers) {
      const std::string b = hf_layer_prefix(c.family, l);
      if (rest == "ffn_gate_exps.weight" || rest == "ffn_up_exps.weight" || rest == "ffn_down_exps.weight") {
        // Stacked experts [E, rows, cols]: expert e is the e-th contiguous [rows, cols] slice.
        if (t.ne.size() != 3) fail(path.string() + ": " + t.name + " is not a 3-D stack of experts");
        const std::string proj = rest.substr(4, rest.find('_', 4) - 4) + "_proj";
        const StTensor all = materialize(t);  // converted (or viewed) once, sliced below
        const size_t per = all.bytes / static_cast<size_t>(t.ne[2]);
        for (int64_t e = 0; e < t.ne[2]; ++e) {
          StTensor st = all;
          st.name = b + "mlp.experts." + std::to_string(e) + "." + proj + ".weight";
          st.shape = {t.ne[1], t.ne[0]};
          st.data = static_cast<const char*>(all.data) + static_cast<size_t>(e) * per;
          st.bytes = per;
          ck.add(std::move(st));
        }
      } else if (const std::string hf = hf_layer_suffix(c.family, rest); !hf.empty()) {
        add(b + hf, t);
      }
      // Other tensors (e.g. rope_freqs) are not used by the family and stay unread.
    }
  }
  return ck;
}

}  // namespace tessera
