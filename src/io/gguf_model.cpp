#include "io/gguf_model.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "io/family_files.h"

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

// The GGUF conventions of family f (one that has a GGUF form).
const GgufFormat& format_of(Family f) {
  const auto files = family_files();
  const auto i = static_cast<size_t>(f);
  TESSERA_CHECK(i < files.size() && files[i]->gguf.arch != nullptr,
                std::string("GGUF: the ") + family_name(f) + " family has no GGUF form");
  return files[i]->gguf;
}

// The family name of a GGUF tensor name's per-layer suffix (after "blk.N."); "" if the family has no
// such tensor. Experts (ffn_*_exps) are split separately.
std::string hf_layer_suffix(const GgufFormat& f, const std::string& s) {
  for (const GgufName& m : f.layer_names)
    if (s == m.gguf) return m.hf;
  return "";
}

std::string hf_global(const GgufFormat& f, const std::string& name) {
  if (name == "token_embd.weight") return f.embed;
  if (name == "output_norm.weight") return f.final_norm;
  if (name == "output.weight") return f.lm_head;
  return "";
}

std::string hf_layer_prefix(const GgufFormat& f, int64_t l) {
  return f.layer_prefix + std::to_string(l) + ".";
}

// The GGUF name of a tensor tessera names `hf` (the inverse of the mapping above), for messages;
// "" when there is none.
std::string gguf_name_of(const GgufFormat& f, const std::string& hf) {
  for (const char* g : {"token_embd.weight", "output_norm.weight", "output.weight"})
    if (hf_global(f, g) == hf) return g;
  int64_t l = 0;
  std::string rest;
  if (!split_layer(hf, f.layer_prefix, l, rest)) return "";
  const std::string layer = std::to_string(l);
  if (rest.rfind("mlp.experts.", 0) == 0) {  // mlp.experts.E.gate_proj.weight
    const size_t e_end = rest.find('.', 12);
    if (e_end == std::string::npos) return "";
    const std::string proj = rest.substr(e_end + 1, rest.find('_', e_end + 1) - e_end - 1);
    return "blk." + layer + ".ffn_" + proj + "_exps.weight (expert " + rest.substr(12, e_end - 12) + ")";
  }
  for (const GgufName& m : f.layer_names)
    if (rest == m.hf) return "blk." + layer + "." + m.gguf;
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
  // The family whose GGUF architecture this is.
  const auto families = family_files();
  const GgufFormat* f = nullptr;
  for (size_t i = 0; i < families.size() && f == nullptr; ++i) {
    const GgufFormat& gf = families[i]->gguf;
    if (gf.arch != nullptr && arch == gf.arch) {
      c.family = static_cast<Family>(i);
      f = &gf;
    }
  }
  if (f == nullptr) {
    std::string names;
    for (const FamilyFiles* ff : families) {
      if (ff->gguf.arch == nullptr) continue;
      names += (names.empty() ? "" : ", ") + std::string(ff->gguf.arch);
    }
    fail(where + ": GGUF architecture '" + arch +
         "' is not a diffusion LM tessera loads (supported: " + names + ")");
  }
  c.model_type = arch;
  const std::string a = arch + ".";
  auto positive = [&](const std::string& key, int64_t v) { return gguf_positive(g, key, v); };
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
  if (scaling != "none" && f->read == nullptr)
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
  // diffusion.shift_logits, else the family's default (Dream's converter writes no key; Dream shifts).
  c.logit_shift = g.get_bool("diffusion.shift_logits", f->shift_logits);
  c.rope_interleaved = f->rope_interleaved;

  if (f->ffn != nullptr) {
    f->ffn(g, a, c);
  } else {
    c.intermediate = positive(a + "feed_forward_length", g.require_int(a + "feed_forward_length"));
  }

  if (f->read != nullptr) f->read(g, a, c);

  auto token = [&](const char* key) { return static_cast<int32_t>(g.get_int(key, -1)); };
  c.mask_id = token("tokenizer.ggml.mask_token_id");
  c.eos_id = token("tokenizer.ggml.eos_token_id");
  c.bos_id = token("tokenizer.ggml.bos_token_id");
  c.pad_id = token("tokenizer.ggml.padding_token_id");
  if (c.pad_id < 0) c.pad_id = c.eos_id;
  if (c.mask_id < 0) {
    // Older conversions name no mask id: the family's mask token in the vocabulary.
    if (const GgufValue* toks = g.find("tokenizer.ggml.tokens")) {
      const char* want = f->mask_token;
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

int64_t gguf_positive(const GgufFile& g, const std::string& key, int64_t v) {
  if (v <= 0)
    fail(g.path().string() + ": GGUF metadata '" + key + "' must be positive, got " + std::to_string(v));
  return v;
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
  const GgufFormat& f = format_of(c.family);
  ck.set_source_names([&f](const std::string& hf) { return gguf_name_of(f, hf); });
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
    if (const std::string global = hf_global(f, t.name); !global.empty()) {
      add(global, t);
    } else if (split_layer(t.name, "blk.", l, rest) && l < c.n_layers) {
      const std::string b = hf_layer_prefix(f, l);
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
      } else if (const std::string hf = hf_layer_suffix(f, rest); !hf.empty()) {
        add(b + hf, t);
      }
      // Other tensors (e.g. rope_freqs) are not used by the family and stay unread.
    }
  }
  return ck;
}

}  // namespace tessera
