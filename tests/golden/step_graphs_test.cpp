// Step graphs (engine/step_graphs.h) on the CPU, through a backend that records and replays the ops of a
// step the way CUDA graphs do: between capture_begin and capture_end an op is stored with the arguments
// it was given, not run, and replay runs the stored ops again with those same arguments. Anything the
// engine's key missed (a host-side argument that changed between steps of one key) would replay stale and
// change the tokens; so would an op recorded where it cannot be (a copy or a synchronize inside a step,
// which CUDA refuses in capture: here too, so the step must run op by op).
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <vector>

#include "core/error.h"
#include "decode/generate.h"
#include "engine/engine.h"
#include "tiny_models.h"

namespace tessera {
namespace {

class RecordingBackend final : public Backend {
 public:
  explicit RecordingBackend(std::unique_ptr<Backend> inner) : b_(std::move(inner)) {}
  Device device() const override { return b_->device(); }
  std::string name() const override { return b_->name() + " (recording)"; }
  void* alloc_weights(size_t n) override {
    unrecordable("alloc_weights");
    return b_->alloc_weights(n);
  }
  void free_weights(void* p) override { b_->free_weights(p); }
  void copy_to_device(void* d, const void* s, size_t n) override {
    unrecordable("copy_to_device");
    b_->copy_to_device(d, s, n);
  }
  void copy_to_host(void* d, const void* s, size_t n) override {
    unrecordable("copy_to_host");
    b_->copy_to_host(d, s, n);
  }
  void copy_on_device(void* d, const void* s, size_t n) override {
    run([=, this] { b_->copy_on_device(d, s, n); });
  }
  void synchronize() override {
    unrecordable("synchronize");
    b_->synchronize();
  }
  void embed(const Tensor& t, const Tensor& w, Tensor& o) override {
    run([=, this]() mutable { b_->embed(t, w, o); });
  }
  void rmsnorm(const Tensor& x, const Tensor& w, float eps, Tensor& y) override {
    run([=, this]() mutable { b_->rmsnorm(x, w, eps, y); });
  }
  void gemm(const Tensor& a, const Tensor& w, const Tensor* bias, Tensor& c, bool acc) override {
    const bool has_bias = bias != nullptr;
    const Tensor bv = has_bias ? *bias : Tensor();
    run([=, this]() mutable { b_->gemm(a, w, has_bias ? &bv : nullptr, c, acc); });
  }
  void gather_gemm(const Tensor& a, const Tensor& r, const Tensor& w, Tensor& c) override {
    run([=, this]() mutable { b_->gather_gemm(a, r, w, c); });
  }
  void rope(Tensor& x, const Tensor& pos, int hd, const RopeParams& p) override {
    run([=, this]() mutable { b_->rope(x, pos, hd, p); });
  }
  void attention(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, int nh, int nkv, int hd,
                 const AttnParams& p) override {
    run([=, this]() mutable { b_->attention(q, k, v, out, nh, nkv, hd, p); });
  }
  void sparse_select(const Tensor& q, const Tensor& k, int nh, int nkv, int hd, const SparseSelectParams& p,
                     uint8_t* mask) override {
    run([=, this] { b_->sparse_select(q, k, nh, nkv, hd, p, mask); });
  }
  void swiglu(const Tensor& g, const Tensor& u, Tensor& o) override {
    run([=, this]() mutable { b_->swiglu(g, u, o); });
  }
  void sample_rows(const Tensor& l, const Tensor& keys, const SampleParams& p, Tensor& t,
                   Tensor& c) override {
    run([=, this]() mutable { b_->sample_rows(l, keys, p, t, c); });
  }
  void token_logprob(const Tensor& l, const Tensor& t, Tensor& lp) override {
    run([=, this]() mutable { b_->token_logprob(l, t, lp); });
  }
  void top_logprobs(const Tensor& l, const Tensor& t, Tensor& ch, Tensor& ids, Tensor& lp) override {
    run([=, this]() mutable { b_->top_logprobs(l, t, ch, ids, lp); });
  }
  void moe_route(const Tensor& l, const MoeRouteParams& p, Tensor& ids, Tensor& w) override {
    run([=, this]() mutable { b_->moe_route(l, p, ids, w); });
  }
  void moe_ffn(const Tensor& x, const Tensor& ids, const Tensor& w, const MoeExperts& e, Tensor& s,
               Tensor& o) override {
    run([=, this]() mutable { b_->moe_ffn(x, ids, w, e, s, o); });
  }
  void scatter_rows(const Tensor& s, const Tensor& r, Tensor& d) override {
    run([=, this]() mutable { b_->scatter_rows(s, r, d); });
  }
  void convert(const Tensor& s, Tensor& d) override {
    run([=, this]() mutable { b_->convert(s, d); });
  }
  void gather_rows(const Tensor& s, const Tensor& r, Tensor& d) override {
    run([=, this]() mutable { b_->gather_rows(s, r, d); });
  }

  bool can_capture() const override { return true; }
  void capture_begin() override {
    recording_ = true;
    broken_ = false;
    tape_.clear();
  }
  int64_t capture_end() override {
    recording_ = false;
    if (broken_) return -1;
    tapes_.push_back(std::move(tape_));
    return static_cast<int64_t>(tapes_.size()) - 1;
  }
  void replay(int64_t h) override {
    for (auto& op : tapes_.at(static_cast<size_t>(h))) op();
  }
  int64_t graph_nodes(int64_t h) const override {
    return static_cast<int64_t>(tapes_.at(static_cast<size_t>(h)).size());
  }
  void release_graph(int64_t h) override { tapes_.at(static_cast<size_t>(h)).clear(); }
  uint64_t recording_epoch() const override { return epoch_; }
  // Makes the next `n` captures fail at their first op, as an unrecordable op would.
  void fail_captures(int n) { fail_next_ = n; }
  // As a backend that released what recordings use: the old tapes are emptied (replaying one would
  // compute nothing) and the epoch moves on.
  void release_recorded_memory() {
    for (auto& t : tapes_) t.clear();
    ++epoch_;
  }

 private:
  void run(std::function<void()> f) {
    if (!recording_) return f();
    if (fail_next_ > 0) {
      --fail_next_;
      unrecordable("an op this test refuses");
    }
    tape_.push_back(std::move(f));
  }
  void unrecordable(const char* what) {
    if (!recording_) return;
    broken_ = true;  // as CUDA invalidates the capture; the op is not run
    fail(std::string("step graphs test: ") + what + " inside a capture");
  }
  std::unique_ptr<Backend> b_;
  bool recording_ = false, broken_ = false;
  int fail_next_ = 0;
  uint64_t epoch_ = 0;
  std::vector<std::function<void()>> tape_;
  std::vector<std::vector<std::function<void()>>> tapes_;
};

EngineOptions recording(RecordingBackend** out) {
  EngineOptions o;
  o.precision = Precision::F32;
  o.wrap_backend = [out](std::unique_ptr<Backend> b) -> std::unique_ptr<Backend> {
    auto r = std::make_unique<RecordingBackend>(std::move(b));
    *out = r.get();
    return r;
  };
  return o;
}

// 48 tokens in three blocks of 16, one per step, past EOS: the dual cache's steps of the second and
// third blocks repeat the first block's shapes.
GenerateOptions three_blocks() {
  GenerateOptions o;
  o.gen_length = 48;
  o.block_length = 16;
  o.steps = 48;
  o.stop_at_eos = false;
  return o;
}

// Greedy and sampled, dual cache (shapes repeat from block to block) and none: the replayed steps decide
// what the engine without step graphs decides.
TEST(StepGraphs, ReplayedStepsDecideWhatEagerStepsDecide) {
  for (const char* fam : {"llada", "dream"}) {
    TESSERA_TINY_OR_SKIP(dir, fam, "--seed 6");
    auto eager = Engine::load(dir, EngineOptions{.precision = Precision::F32});
    RecordingBackend* rec = nullptr;
    auto graphs = Engine::load(dir, recording(&rec));
    const auto prompt = test::random_canvas(10, eager->vocab_size() - 8, 3, 0, 0.0);
    GenerateOptions o = three_blocks();
    o.alg = std::string(fam) == "dream" ? Unmask::Entropy : Unmask::LowConfidence;
    for (const KvCache cache : {KvCache::Dual, KvCache::None}) {
      for (const float temperature : {0.0f, 0.8f}) {
        for (const uint64_t seed : {1u, 2u}) {
          o.cache = cache;
          o.temperature = temperature;
          o.seed = seed;
          const GenerateResult want = generate(*eager, prompt, o);
          const GenerateResult got = generate(*graphs, prompt, o);
          EXPECT_EQ(got.tokens, want.tokens)
              << fam << " cache " << static_cast<int>(cache) << " T " << temperature;
          EXPECT_EQ(got.order, want.order)
              << fam << " cache " << static_cast<int>(cache) << " T " << temperature;
        }
      }
    }
    EXPECT_GT(graphs->step_graphs().captures(), 0) << fam;
    EXPECT_GT(graphs->step_graphs().replays(), 2 * graphs->step_graphs().captures()) << fam;
    EXPECT_GT(graphs->step_graphs().last_nodes(), 10) << fam;
  }
}

// Recordings made before the backend released what they use are dropped and made again, never replayed.
TEST(StepGraphs, RecordingsOfAnOlderEpochAreNotReplayed) {
  TESSERA_TINY_OR_SKIP(dir, "llada", "--seed 6");
  auto eager = Engine::load(dir, EngineOptions{.precision = Precision::F32});
  RecordingBackend* rec = nullptr;
  auto graphs = Engine::load(dir, recording(&rec));
  const auto prompt = test::random_canvas(10, eager->vocab_size() - 8, 3, 0, 0.0);
  GenerateOptions o = three_blocks();
  o.cache = KvCache::Dual;
  const GenerateResult want = generate(*eager, prompt, o);
  EXPECT_EQ(generate(*graphs, prompt, o).tokens, want.tokens);
  const int64_t captures = graphs->step_graphs().captures();
  ASSERT_GT(captures, 0);
  rec->release_recorded_memory();
  EXPECT_EQ(generate(*graphs, prompt, o).tokens, want.tokens);
  EXPECT_GT(graphs->step_graphs().captures(), captures) << "the old recordings were replayed";
}

// A step that cannot be recorded runs op by op, with the same result; after StepGraphs::kMaxFailures such
// keys the engine stops recording.
TEST(StepGraphs, AStepThatCannotBeRecordedRunsOpByOp) {
  TESSERA_TINY_OR_SKIP(dir, "llada", "--seed 6");
  auto eager = Engine::load(dir, EngineOptions{.precision = Precision::F32});
  RecordingBackend* rec = nullptr;
  auto graphs = Engine::load(dir, recording(&rec));
  const auto prompt = test::random_canvas(10, eager->vocab_size() - 8, 3, 0, 0.0);
  GenerateOptions o = three_blocks();
  o.cache = KvCache::Dual;
  rec->fail_captures(1 << 20);
  EXPECT_EQ(generate(*graphs, prompt, o).tokens, generate(*eager, prompt, o).tokens);
  EXPECT_EQ(graphs->step_graphs().captures(), 0);
  EXPECT_EQ(graphs->step_graphs().replays(), 0);
  rec->fail_captures(0);
  EXPECT_EQ(generate(*graphs, prompt, o).tokens, generate(*eager, prompt, o).tokens);
  EXPECT_EQ(graphs->step_graphs().captures(), 0) << "recording should be off after repeated failures";
}

}  // namespace
}  // namespace tessera
