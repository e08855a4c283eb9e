// The fake Denoiser of the unmasking-loop tests: its logits are a hand-built function of the canvas, and
// it records every call generate() makes (forwards, cached rows, DES rows, SparseD phases).
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "core/error.h"
#include "decode/generate.h"
#include "decode/schedule.h"
#include "test_util.h"

namespace tessera {
inline namespace fake_denoiser {

constexpr int64_t kV = 8;
constexpr int32_t kMask = 7;
constexpr int32_t kEos = 6;

// Logits of one position as a function of the whole canvas.
using RowFn = std::function<std::vector<float>(std::span<const int32_t> canvas, int pos)>;

class FakeDenoiser final : public Denoiser {
 public:
  FakeDenoiser(RowFn fn, int64_t v = kV, int32_t mask = kMask) : fn_(std::move(fn)), v_(v), mask_(mask) {}
  int64_t vocab_size() const override { return v_; }
  int32_t mask_token() const override { return mask_; }
  void predict(std::span<const int32_t> canvas, std::span<const int32_t> positions, const SampleParams& sp,
               std::span<int32_t> tokens, std::span<float> conf) override {
    log.push_back("p/" + std::to_string(canvas.size()));
    sample(canvas, positions, sp, tokens, conf);
  }
  void sample(std::span<const int32_t> canvas, std::span<const int32_t> positions, const SampleParams& sp,
              std::span<int32_t> tokens, std::span<float> conf) {
    calls.emplace_back(positions.begin(), positions.end());
    seeds.push_back(sp.seed);
    if (in_sparse) phases.push_back(phase);
    if (!edits) {  // token editing predicts decided positions too
      for (int32_t p : positions)
        EXPECT_EQ(canvas[static_cast<size_t>(p)], mask_) << "prediction for a decided position";
    }
    std::vector<float> L(positions.size() * static_cast<size_t>(v_));
    fill(canvas, positions, L);
    std::vector<int32_t> keys(positions.begin(), positions.end());
    const auto R = static_cast<int64_t>(positions.size());
    Tensor tl(L.data(), DType::F32, {R, v_}), tk(keys.data(), DType::I32, {R});
    Tensor tt(tokens.data(), DType::I32, {R}), tc(conf.data(), DType::F32, {R});
    cpu_sample_rows(tl, tk, sp, tt, tc);
  }
  void logits(std::span<const int32_t> canvas, std::span<const int32_t> positions,
              std::span<float> out) override {
    logit_canvases.emplace_back(canvas.begin(), canvas.end());
    fill(canvas, positions, out);
  }

  // KV cache (off unless `cached`): records each predict_cached's computed range and canvas length,
  // then predicts from the whole canvas (the fake has no stale state).
  bool supports_kv_cache() const override { return cached; }
  void kv_cache_reset(int64_t capacity) override { resets.push_back(capacity); }
  void kv_cache_end() override { ++ends; }
  void predict_cached(std::span<const int32_t> canvas, int64_t q_lo, int64_t q_hi,
                      std::span<const int32_t> positions, const SampleParams& sp, std::span<int32_t> tokens,
                      std::span<float> conf) override {
    ranges.push_back({q_lo, q_hi, static_cast<int64_t>(canvas.size())});
    log.push_back("c" + std::to_string(q_lo) + "-" + std::to_string(q_hi) + "/" +
                  std::to_string(canvas.size()));
    sample(canvas, positions, sp, tokens, conf);
  }
  void predict_rows(std::span<const int32_t> canvas, std::span<const int32_t> rows,
                    std::span<const int32_t> positions, const SampleParams& sp, std::span<int32_t> tokens,
                    std::span<float> conf) override {
    std::string e = "r";
    for (size_t i = 0; i < rows.size(); ++i) e += (i ? "," : "") + std::to_string(rows[i]);
    log.push_back(e + "/" + std::to_string(canvas.size()));
    sample(canvas, positions, sp, tokens, conf);
  }
  int attention_block() const override { return block; }
  void set_attention_block(int b) override { block = b; }
  // DES (off unless `moe`): each des_rows goes into the log as "dLO-HI".
  bool supports_expert_sharing() const override { return moe; }
  void des_begin(const DesConfig& c) override { (void)c; }
  void des_rows(int64_t lo, int64_t hi) override {
    log.push_back("d" + std::to_string(lo) + "-" + std::to_string(hi));
  }
  // SparseD (off unless `sparse`): records sparse_begin and the phase of every predict().
  bool supports_sparse_attention() const override { return sparse; }
  void sparse_begin(int64_t canvas_len, const SparseConfig& c) override {
    sparse_begins.push_back({canvas_len, c.block, c.prompt_len});
    phase = SparsePhase::Dense;
    in_sparse = true;
  }
  void sparse_phase(SparsePhase p) override { phase = p; }
  void sparse_end() override { in_sparse = false; }

  bool cached = false, sparse = false, in_sparse = false, moe = false, edits = false;
  SparsePhase phase = SparsePhase::Dense;
  std::vector<std::array<int64_t, 3>> sparse_begins;  // (canvas, block, prompt length)
  std::vector<SparsePhase> phases;                    // of each predict() while a sparse request runs
  int block = 0;                                      // > 0: a block-causal model
  std::vector<int64_t> resets;
  int ends = 0;                                // kv_cache_end calls
  std::vector<std::array<int64_t, 3>> ranges;  // (q_lo, q_hi, canvas size) of each predict_cached
  std::vector<std::vector<int32_t>> calls;     // positions of each forward
  // Each forward: "p/N" predict over N positions, "cLO-HI/N" predict_cached, "rA,B,../N" predict_rows;
  // "dLO-HI" des_rows.
  std::vector<std::string> log;
  std::vector<uint64_t> seeds;                       // SampleParams.seed of each predict()
  std::vector<std::vector<int32_t>> logit_canvases;  // canvas of each logits()

 private:
  void fill(std::span<const int32_t> canvas, std::span<const int32_t> positions, std::span<float> out) {
    for (size_t i = 0; i < positions.size(); ++i) {
      std::vector<float> row = fn_(canvas, positions[i]);
      EXPECT_EQ(row.size(), static_cast<size_t>(v_));
      std::copy(row.begin(), row.end(),
                out.begin() + static_cast<std::ptrdiff_t>(i * static_cast<size_t>(v_)));
    }
  }
  RowFn fn_;
  int64_t v_;
  int32_t mask_;
};

// Position p predicts token tok(p) with logit strength(p) (others 0).
inline RowFn peaked(std::function<int(int)> tok, std::function<float(int)> strength) {
  return [=](std::span<const int32_t>, int p) {
    std::vector<float> r(kV, 0.0f);
    r[static_cast<size_t>(tok(p))] = strength(p);
    r[kMask] = -100.0f;
    return r;
  };
}
// Softmax confidence of a row with one logit s and kV - 2 zeros (mask at -100).
inline double conf_of(float s) {
  return std::exp(double(s)) / (std::exp(double(s)) + double(kV - 2));
}

inline std::vector<size_t> sizes(const GenerateResult& r) {
  std::vector<size_t> s;
  for (const auto& o : r.order) s.push_back(o.size());
  return s;
}

// Every generated position decided exactly once.
inline void expect_each_once(const GenerateResult& r, int lo, int n) {
  std::multiset<int32_t> all;
  for (const auto& o : r.order) all.insert(o.begin(), o.end());
  ASSERT_EQ(all.size(), static_cast<size_t>(n));
  for (int p = lo; p < lo + n; ++p) EXPECT_EQ(all.count(p), 1u) << "position " << p;
}

inline const std::vector<int32_t> kPrompt = {1, 2, 3};

inline void expect_error(const GenerateOptions& o, const std::string& msg,
                         std::vector<int32_t> prompt = kPrompt) {
  FakeDenoiser d(peaked([](int) { return 1; }, [](int) { return 1.0f; }));
  try {
    generate(d, prompt, o);
    ADD_FAILURE() << "expected an error containing: " << msg;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(msg), std::string::npos) << "got: " << e.what();
  }
}

}  // namespace fake_denoiser
}  // namespace tessera
