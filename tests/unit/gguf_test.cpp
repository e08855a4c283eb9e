// GGUF reader: metadata and tensor directory round trips, every malformed file fails with a clear
// error (never a crash: each truncation of a valid file is tried), the model config of the three
// architectures, expert slicing, quantized tensors converted at load, the vocabulary as a tokenizer.
#include "io/gguf.h"

#include <cstring>
#include <fstream>

#include "core/dtype.h"
#include "core/error.h"
#include "io/gguf_model.h"
#include "io/safetensors.h"
#include "io/tokenizer.h"
#include "test_util.h"

namespace tessera {
namespace {
namespace fs = std::filesystem;
using KV = std::vector<std::pair<std::string, GgufValue>>;

GgufValue str(const std::string& s) {
  GgufValue v;
  v.type = GgufValue::String;
  v.s = s;
  return v;
}
GgufValue num(GgufValue::Type t, int64_t i) {
  GgufValue v;
  v.type = t;
  v.i = i;
  return v;
}
GgufValue real(double f) {
  GgufValue v;
  v.type = GgufValue::F32;
  v.f = f;
  return v;
}
GgufValue strs(std::vector<std::string> s) {
  GgufValue v;
  v.type = GgufValue::Array;
  v.elem = GgufValue::String;
  v.strs = std::move(s);
  return v;
}
GgufValue ints(GgufValue::Type elem, std::vector<int64_t> i) {
  GgufValue v;
  v.type = GgufValue::Array;
  v.elem = elem;
  v.ints = std::move(i);
  return v;
}

GgufWriteTensor f32_tensor(const std::string& name, std::vector<int64_t> ne, uint64_t seed) {
  int64_t n = 1;
  for (int64_t e : ne) n *= e;
  const std::vector<float> f = test::random_floats(static_cast<size_t>(n), seed, 0.5f);
  GgufWriteTensor t{name, std::move(ne), GgmlType::F32, {}};
  t.data.resize(f.size() * 4);
  std::memcpy(t.data.data(), f.data(), t.data.size());
  return t;
}

// Q8_0 blocks of 32 values: an f16 scale and 32 int8 quants; values d * q.
GgufWriteTensor q8_tensor(const std::string& name, std::vector<int64_t> ne, std::vector<float>* values) {
  int64_t n = 1;
  for (int64_t e : ne) n *= e;
  GgufWriteTensor t{name, std::move(ne), GgmlType::Q8_0, {}};
  for (int64_t b = 0; b < n / 32; ++b) {
    const uint16_t d = f32_to_f16(0.0078125f * static_cast<float>(b % 5 + 1));  // exact in f16
    t.data.push_back(static_cast<uint8_t>(d & 0xff));
    t.data.push_back(static_cast<uint8_t>(d >> 8));
    for (int k = 0; k < 32; ++k) {
      const auto q = static_cast<int8_t>((b * 7 + k * 13) % 255 - 127);
      t.data.push_back(static_cast<uint8_t>(q));
      values->push_back(f16_to_f32(d) * static_cast<float>(q));
    }
  }
  return t;
}

// A tiny LLaDA-MoE in the GGUF layout: 2 layers, hidden 32, 4 heads (2 KV), 4 experts of 16, top-2.
struct TinyMoe {
  KV kv;
  std::vector<GgufWriteTensor> tensors;
  std::vector<float> up_exps;  // blk.0.ffn_up_exps values (Q8_0)
};
TinyMoe tiny_moe() {
  TinyMoe m;
  const std::string a = "llada-moe.";
  m.kv = {{"general.architecture", str("llada-moe")},
          {a + "block_count", num(GgufValue::U32, 2)},
          {a + "context_length", num(GgufValue::U32, 256)},
          {a + "embedding_length", num(GgufValue::U32, 32)},
          {a + "feed_forward_length", num(GgufValue::U32, 64)},
          {a + "attention.head_count", num(GgufValue::U32, 4)},
          {a + "attention.head_count_kv", num(GgufValue::U32, 2)},
          {a + "rope.freq_base", real(50000.0)},
          {a + "attention.layer_norm_rms_epsilon", real(1e-6)},
          {a + "expert_count", num(GgufValue::U32, 4)},
          {a + "expert_used_count", num(GgufValue::U32, 2)},
          {a + "expert_feed_forward_length", num(GgufValue::U32, 32)},
          {"tokenizer.ggml.mask_token_id", num(GgufValue::U32, 40)},
          {"tokenizer.ggml.eos_token_id", num(GgufValue::U32, 41)}};
  uint64_t seed = 1;
  m.tensors.push_back(f32_tensor("token_embd.weight", {32, 48}, seed++));
  m.tensors.push_back(f32_tensor("output_norm.weight", {32}, seed++));
  m.tensors.push_back(f32_tensor("output.weight", {32, 48}, seed++));
  for (int l = 0; l < 2; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    for (const char* n : {"attn_norm", "ffn_norm"})
      m.tensors.push_back(f32_tensor(b + n + ".weight", {32}, seed++));
    m.tensors.push_back(f32_tensor(b + "attn_q.weight", {32, 32}, seed++));
    m.tensors.push_back(f32_tensor(b + "attn_k.weight", {32, 16}, seed++));
    m.tensors.push_back(f32_tensor(b + "attn_v.weight", {32, 16}, seed++));
    m.tensors.push_back(f32_tensor(b + "attn_output.weight", {32, 32}, seed++));
    for (const char* n : {"attn_q_norm", "attn_k_norm"})
      m.tensors.push_back(f32_tensor(b + n + ".weight", {8}, seed++));
    m.tensors.push_back(f32_tensor(b + "ffn_gate_inp.weight", {32, 4}, seed++));
    m.tensors.push_back(f32_tensor(b + "ffn_gate_exps.weight", {32, 32, 4}, seed++));
    if (l == 0)
      m.tensors.push_back(q8_tensor(b + "ffn_up_exps.weight", {32, 32, 4}, &m.up_exps));
    else
      m.tensors.push_back(f32_tensor(b + "ffn_up_exps.weight", {32, 32, 4}, seed++));
    m.tensors.push_back(f32_tensor(b + "ffn_down_exps.weight", {32, 32, 4}, seed++));
  }
  return m;
}

fs::path write(const std::string& name, const KV& kv, const std::vector<GgufWriteTensor>& t) {
  const fs::path p = test::temp_dir("gguf_" + name) / name;
  write_gguf(p, kv, t);
  return p;
}

std::vector<uint8_t> read_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}
fs::path write_bytes(const std::string& name, const std::vector<uint8_t>& b) {
  const fs::path p = test::temp_dir("gguf_bytes_" + name) / name;
  std::ofstream(p, std::ios::binary)
      .write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  return p;
}

TEST(Gguf, MetadataAndTensorsRoundTrip) {
  KV kv = {{"general.architecture", str("llada")},
           {"a.u8", num(GgufValue::U8, 200)},
           {"a.i8", num(GgufValue::I8, -100)},
           {"a.u16", num(GgufValue::U16, 60000)},
           {"a.i16", num(GgufValue::I16, -30000)},
           {"a.u32", num(GgufValue::U32, 4000000000)},
           {"a.i32", num(GgufValue::I32, -2000000000)},
           {"a.u64", num(GgufValue::U64, int64_t{1} << 40)},
           {"a.i64", num(GgufValue::I64, -(int64_t{1} << 40))},
           {"a.bool", num(GgufValue::Bool, 1)},
           {"a.f32", real(0.25)},
           {"a.strs", strs({"x", "", "h\xc3\xa9llo"})},
           {"a.ints", ints(GgufValue::I32, {1, -2, 3})}};
  GgufValue f64;
  f64.type = GgufValue::F64;
  f64.f = 1e-300;
  kv.emplace_back("a.f64", f64);
  std::vector<float> q;
  const std::vector<GgufWriteTensor> t = {f32_tensor("w", {8, 3}, 5), q8_tensor("q", {64, 2}, &q)};
  const auto g = GgufFile::open(write("rt.gguf", kv, t));
  EXPECT_EQ(g->version(), 3u);
  EXPECT_EQ(g->get_string("general.architecture", ""), "llada");
  EXPECT_EQ(g->get_int("a.u8", 0), 200);
  EXPECT_EQ(g->get_int("a.i8", 0), -100);
  EXPECT_EQ(g->get_int("a.u16", 0), 60000);
  EXPECT_EQ(g->get_int("a.i16", 0), -30000);
  EXPECT_EQ(g->get_int("a.u32", 0), 4000000000);
  EXPECT_EQ(g->get_int("a.i32", 0), -2000000000);
  EXPECT_EQ(g->get_int("a.u64", 0), int64_t{1} << 40);
  EXPECT_EQ(g->get_int("a.i64", 0), -(int64_t{1} << 40));
  EXPECT_TRUE(g->get_bool("a.bool", false));
  EXPECT_EQ(g->get_float("a.f32", 0), 0.25);
  EXPECT_EQ(g->get_float("a.f64", 0), 1e-300);
  EXPECT_EQ(g->find("a.strs")->strs, (std::vector<std::string>{"x", "", "h\xc3\xa9llo"}));
  EXPECT_EQ(g->find("a.ints")->ints, (std::vector<int64_t>{1, -2, 3}));
  EXPECT_EQ(g->get_int("absent", 7), 7);
  test::expect_error([&] { g->get_int("a.f32", 0); }, "'a.f32' is a f32, expected an integer");
  test::expect_error([&] { g->require_int("absent"); }, "'absent' is missing");
  ASSERT_EQ(g->tensors().size(), 2u);
  const GgufTensor* w = g->find_tensor("w");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->shape(), (std::vector<int64_t>{3, 8}));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(w->data) % 32, 0u);
  EXPECT_EQ(std::memcmp(w->data, t[0].data.data(), t[0].data.size()), 0);
  const GgufTensor* qt = g->find_tensor("q");
  ASSERT_NE(qt, nullptr);
  EXPECT_EQ(qt->bytes, 4u * 34u);
  std::vector<float> back(128);
  ggml_dequantize(qt->type, qt->data, back.data(), 128);
  EXPECT_EQ(back, q);
}

TEST(Gguf, EveryTruncationFailsCleanly) {
  std::vector<float> q;
  const fs::path p = write("full.gguf", {{"general.architecture", str("dream")}, {"v", strs({"a", "bc"})}},
                           {f32_tensor("w", {8, 2}, 1), q8_tensor("q", {32}, &q)});
  const std::vector<uint8_t> full = read_bytes(p);
  ASSERT_NO_THROW(GgufFile::open(p));
  // The writer pads the last tensor (34 bytes of q8_0) to 64: a cut inside that padding is still valid.
  const size_t needed = full.size() - 30;
  for (size_t n = 0; n < needed; ++n) {
    const fs::path cut =
        write_bytes("cut.gguf", std::vector<uint8_t>(full.begin(), full.begin() + static_cast<long>(n)));
    try {
      GgufFile::open(cut);
      ADD_FAILURE() << "a file cut to " << n << " of " << full.size() << " bytes was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("cut.gguf"), std::string::npos) << e.what();
    }
  }
}

TEST(Gguf, MalformedFilesNameTheFault) {
  const fs::path good = write("good.gguf", {{"k", num(GgufValue::U32, 1)}}, {f32_tensor("w", {4}, 1)});
  const std::vector<uint8_t> g = read_bytes(good);
  auto patched = [&](size_t at, std::vector<uint8_t> bytes) {
    std::vector<uint8_t> b = g;
    std::copy(bytes.begin(), bytes.end(), b.begin() + static_cast<long>(at));
    return write_bytes("bad.gguf", b);
  };
  auto expect = [](const fs::path& p, const std::string& want) {
    test::expect_error([&] { GgufFile::open(p); }, want);
  };
  expect(patched(0, {'G', 'G', 'U', 'X'}), "does not start with \"GGUF\"");
  expect(patched(4, {1, 0, 0, 0}), "GGUF version 1 is obsolete");
  expect(patched(4, {0, 0, 0, 3}), "big-endian GGUF files are not supported");
  expect(patched(4, {9, 0, 0, 0}), "unknown GGUF version 9");
  expect(patched(8, {0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0}), "counts larger than the file");
  // Layout: magic 4, version 4, n_tensors 8, n_kv 8, key "k" (8 + 1), type 4 at 33, value 4 at 37,
  // then the tensor "w": name (8 + 1) at 41, n_dims 4 at 50, ne 8 at 54, type 4 at 62, offset 8 at 66.
  expect(patched(33, {99, 0, 0, 0}), "unknown value type 99");
  expect(patched(50, {5, 0, 0, 0}), "has 5 dimensions");
  expect(patched(54, {0, 0, 0, 0, 0, 0, 0, 0}), "has dimension 0");
  expect(patched(62, {77, 0, 0, 0}), "unknown ggml type 77");
  expect(patched(62, {8, 0, 0, 0}), "rows of 4 are not a multiple of the block of 32");
  expect(patched(66, {4, 0, 0, 0, 0, 0, 0, 0}), "is not aligned to 32");
  expect(patched(66, {0, 1, 0, 0, 0, 0, 0, 0}), "runs past the end of the file");
  // Structural faults written on purpose.
  GgufValue nested;
  nested.type = GgufValue::Array;
  nested.elem = GgufValue::Array;
  expect(write("nested.gguf", {{"n", nested}}, {}), "array of arrays");
  expect(write("dup.gguf", {}, {f32_tensor("w", {4}, 1), f32_tensor("w", {4}, 2)}),
         "tensor 'w' appears twice");
  expect(write("align.gguf", {{"general.alignment", num(GgufValue::U32, 24)}}, {}), "not a power of two");
  // general.alignment 1 lets the data section start at byte 90 (the end of this header): an f32 tensor
  // there cannot be read in place (found by the model fuzzer as a misaligned bf16 load).
  expect(write("align1.gguf", {{"general.alignment", num(GgufValue::U32, 1)}}, {f32_tensor("w", {4}, 1)}),
         "tensor 'w' of type f32 starts at byte 90 of the file, not a multiple of 4 (general.alignment 1)");
  expect(write("bool.gguf", {{"b", num(GgufValue::Bool, 2)}}, {}), "is a bool of value 2");
  EXPECT_FALSE(is_gguf_file(test::temp_dir("gguf_dir")));
  EXPECT_TRUE(is_gguf_file(good));
}

TEST(Gguf, MoeConfigAndExpertSlices) {
  const TinyMoe m = tiny_moe();
  const fs::path p = write("moe.gguf", m.kv, m.tensors);
  const ModelConfig c = gguf_config(*GgufFile::open(p));
  EXPECT_EQ(c.family, Family::LLaDAMoE);
  EXPECT_EQ(c.n_layers, 2);
  EXPECT_EQ(c.hidden, 32);
  EXPECT_EQ(c.n_heads, 4);
  EXPECT_EQ(c.n_kv_heads, 2);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.vocab, 48);
  EXPECT_EQ(c.max_positions, 256);
  EXPECT_FLOAT_EQ(c.rope_theta, 50000.0f);
  EXPECT_FLOAT_EQ(c.rms_eps, 1e-6f);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_FALSE(c.tie_embeddings);
  EXPECT_FALSE(c.logit_shift);
  EXPECT_FALSE(c.rope_interleaved);
  EXPECT_EQ(c.moe.n_experts, 4);
  EXPECT_EQ(c.moe.top_k, 2);
  EXPECT_EQ(c.moe.expert_inter, 32);
  EXPECT_FALSE(c.moe.norm_topk);
  EXPECT_EQ(c.mask_id, 40);
  EXPECT_EQ(c.eos_id, 41);
  EXPECT_EQ(c.pad_id, 41);
  EXPECT_EQ(load_config(p).n_layers, 2);  // load_config takes a GGUF path too

  for (DType to : {DType::F32, DType::BF16}) {
    const auto file = GgufFile::open(p);
    const Checkpoint ck = gguf_checkpoint(file, gguf_config(*file), to);
    // Expert 2 of the q8_0 stack: the third [32, 32] slice, converted.
    const StTensor& up = ck.get("model.layers.0.mlp.experts.2.up_proj.weight", {32, 32});
    EXPECT_EQ(up.dtype, to);
    std::vector<float> got(1024);
    convert_to_f32(up.data, up.dtype, got.data(), got.size());
    for (size_t i = 0; i < got.size(); ++i) {
      const float want = m.up_exps[2048 + i];
      ASSERT_EQ(got[i], to == DType::F32 ? want : round_bf16(want)) << i;
    }
    // f32 tensors stay views of the file; down experts are [hidden, inter] slices.
    const StTensor& down = ck.get("model.layers.1.mlp.experts.3.down_proj.weight", {32, 32});
    EXPECT_EQ(down.dtype, DType::F32);
    const GgufTensor* src = file->find_tensor("blk.1.ffn_down_exps.weight");
    EXPECT_EQ(std::memcmp(down.data, src->data + 3 * 1024 * 4, 1024 * 4), 0);
    EXPECT_NE(ck.find("model.layers.1.self_attn.k_norm.weight"), nullptr);
    EXPECT_NE(ck.find("model.layers.0.mlp.gate.weight"), nullptr);
    EXPECT_NE(ck.find("lm_head.weight"), nullptr);
  }
}

TEST(Gguf, ConfigErrorsNameTheKey) {
  TinyMoe m = tiny_moe();
  auto without = [&](const std::string& key) {
    KV kv;
    for (const auto& e : m.kv)
      if (e.first != key) kv.push_back(e);
    return write("cfg.gguf", kv, m.tensors);
  };
  auto expect = [](const fs::path& p, const std::string& want) {
    test::expect_error([&] { gguf_config(*GgufFile::open(p)); }, want);
  };
  expect(without("general.architecture"), "'general.architecture' is missing");
  expect(without("llada-moe.block_count"), "'llada-moe.block_count' is missing");
  expect(without("llada-moe.attention.layer_norm_rms_epsilon"), "layer_norm_rms_epsilon' is missing");
  expect(without("llada-moe.expert_used_count"), "'llada-moe.expert_used_count' is missing");
  expect(without("tokenizer.ggml.mask_token_id"), "names no mask token");
  KV kv = m.kv;
  kv[0].second = str("llama");
  expect(write("arch.gguf", kv, m.tensors), "architecture 'llama' is not a diffusion LM tessera loads");
  kv = m.kv;
  kv.emplace_back("llada-moe.rope.scaling.type", str("yarn"));
  expect(write("yarn.gguf", kv, m.tensors), "RoPE scaling 'yarn'");
  kv = m.kv;
  kv.emplace_back("llada-moe.expert_feed_forward_length", num(GgufValue::U32, 16));
  kv.erase(kv.begin() + 11);  // the first expert_feed_forward_length
  expect(write("eff.gguf", kv, m.tensors), "contradicts the expert tensors");
  kv = m.kv;
  kv[12].second = num(GgufValue::U32, 480);
  expect(write("mask.gguf", kv, m.tensors), "outside the vocabulary");
  // A tensor type tessera cannot convert fails at load, naming the type.
  std::vector<GgufWriteTensor> t = m.tensors;
  t[2].type = GgmlType::Q8_1;  // output.weight: blocks of 32 values in 36 bytes
  t[2].data.assign(48 * 36, 0);
  test::expect_error(
      [&] {
        const auto g = GgufFile::open(write("q81.gguf", m.kv, t));
        gguf_checkpoint(g, gguf_config(*g), DType::BF16);
      },
      "GGUF tensor type q8_1 cannot be loaded by tessera");
}

// A GGUF vocabulary as a tokenizer: pieces, merges, token types (3 = control: an added special token,
// 5 = unused: left out) and the pre-tokenizer named by tokenizer.ggml.pre.
TEST(Gguf, VocabularyAsTokenizer) {
  KV kv = {{"tokenizer.ggml.model", str("gpt2")},
           {"tokenizer.ggml.pre", str("gpt-2")},
           {"tokenizer.ggml.tokens", strs({"a", "b", "c", "ab", "abc", "\xc4\xa0",
                                           "\xc4\xa0"
                                           "ab",
                                           "<|x|>", "[PAD8]"})},
           {"tokenizer.ggml.token_type", ints(GgufValue::I32, {1, 1, 1, 1, 1, 1, 1, 3, 5})},
           {"tokenizer.ggml.merges", strs({"a b", "ab c", "\xc4\xa0 ab"})}};
  const Tokenizer t = Tokenizer::from_gguf(*GgufFile::open(write("vocab.gguf", kv, {})));
  EXPECT_EQ(t.encode("abc ab<|x|>"), (std::vector<int32_t>{4, 6, 7}));
  EXPECT_TRUE(t.is_special(7));
  EXPECT_EQ(t.token_id("[PAD8]"), -1);
  const std::vector<int32_t> ids = {4, 6, 7};
  EXPECT_EQ(t.decode(ids), "abc ab<|x|>");
  EXPECT_EQ(t.decode(ids, true), "abc ab");

  auto expect = [&](KV bad, const std::string& want) {
    test::expect_error([&] { Tokenizer::from_gguf(*GgufFile::open(write("badvocab.gguf", bad, {}))); }, want);
  };
  KV bad = kv;
  bad[1].second = str("nonesuch");
  expect(bad, "tokenizer.ggml.pre 'nonesuch' is a pre-tokenizer tessera does not know");
  bad = kv;
  bad[0].second = str("llama");
  expect(bad, "tokenizer.ggml.model 'llama' is not supported");
  bad = kv;
  bad[3].second = ints(GgufValue::I32, {1, 1});
  expect(bad, "does not give one type per token");
  bad = kv;
  bad.erase(bad.begin() + 4);
  expect(bad, "tokenizer.ggml.merges is missing");
  expect({}, "the GGUF has no vocabulary");
}

}  // namespace
}  // namespace tessera
