#include "engine/batcher.h"

#include <algorithm>
#include <utility>

#include "core/error.h"

namespace tessera {

using Clock = std::chrono::steady_clock;

// One forward a request asked for: predict (tokens, conf) or logits (out).
struct Batcher::Call {
  bool logits = false;
  int block = 0;  // the request's attention block (block-causal models)
  std::span<const int32_t> canvas, positions;
  SampleParams sp;
  std::span<int32_t> tokens;
  std::span<float> conf, out;
  Clock::time_point posted;
  bool done = false;
  std::exception_ptr error;
};

struct Batcher::Job {
  std::function<void()> fn;
  bool done = false;
  std::exception_ptr error;
  void run() {
    try {
      fn();
    } catch (...) {
      error = std::current_exception();
    }
  }
};

// The Denoiser a batched request's generate() sees: its forwards are posted to the engine thread.
class Batcher::Proxy final : public Denoiser {
 public:
  explicit Proxy(Batcher& b) : b_(b), block_(b.initial_block_) {}
  int64_t vocab_size() const override { return b_.vocab_; }
  int32_t mask_token() const override { return b_.mask_; }
  int attention_block() const override { return block_; }
  void set_attention_block(int block) override {
    if (b_.initial_block_ == 0) fail("set_attention_block: the model is not block-causal");
    if (block <= 0) fail("the attention block must be positive (got " + std::to_string(block) + ")");
    block_ = block;
  }
  void predict(std::span<const int32_t> canvas, std::span<const int32_t> positions, const SampleParams& sp,
               std::span<int32_t> tokens, std::span<float> conf) override {
    Call c;
    c.canvas = canvas;
    c.positions = positions;
    c.sp = sp;
    c.tokens = tokens;
    c.conf = conf;
    post(c);
  }
  void logits(std::span<const int32_t> canvas, std::span<const int32_t> positions,
              std::span<float> out) override {
    Call c;
    c.logits = true;
    c.canvas = canvas;
    c.positions = positions;
    c.out = out;
    post(c);
  }

 private:
  void post(Call& c) {
    c.block = block_;
    std::unique_lock<std::mutex> l(b_.m_);
    c.posted = Clock::now();
    b_.pending_.push_back(&c);
    b_.engine_cv_.notify_one();
    b_.request_cv_.wait(l, [&] { return c.done; });
    if (c.error) std::rethrow_exception(c.error);
  }
  Batcher& b_;
  int block_;
};

Batcher::Batcher(Engine& engine, int max_batch, std::chrono::microseconds grace)
    : engine_(engine),
      max_batch_(max_batch),
      grace_(grace),
      vocab_(engine.vocab_size()),
      mask_(engine.mask_token()),
      initial_block_(engine.attention_block()) {
  if (max_batch < 1) fail("the batch size must be at least 1 (got " + std::to_string(max_batch) + ")");
  thread_ = std::thread([this] { loop(); });
}

Batcher::~Batcher() {
  {
    std::lock_guard<std::mutex> l(m_);
    stop_ = true;
  }
  engine_cv_.notify_one();
  thread_.join();
}

bool Batcher::batchable(const GenerateOptions& o) {
  return !holds_kv_cache(o) && !o.sparse && o.des == "off" && !o.moe_stats;
}

BatchStats Batcher::stats() const {
  std::lock_guard<std::mutex> l(m_);
  return stats_;
}

GenerateResult Batcher::generate(std::span<const int32_t> prompt, const GenerateOptions& o,
                                 const std::function<void(const StepEvent&)>& on_step) {
  if (!batchable(o)) {
    fail("internal error: a request that holds a KV cache, SparseD patterns or DES state cannot be batched");
  }
  {
    std::unique_lock<std::mutex> l(m_);
    request_cv_.wait(l, [&] { return exclusive_.empty() && !exclusive_running_; });
    ++admitted_;
  }
  struct Leave {
    Batcher& b;
    ~Leave() {
      {
        std::lock_guard<std::mutex> l(b.m_);
        --b.admitted_;
      }
      b.engine_cv_.notify_one();
    }
  } leave{*this};
  Proxy p(*this);
  return tessera::generate(p, prompt, o, on_step);
}

void Batcher::run(const std::function<void()>& job, bool exclusive) {
  Job j{job};
  std::unique_lock<std::mutex> l(m_);
  (exclusive ? exclusive_ : light_).push_back(&j);
  engine_cv_.notify_one();
  request_cv_.wait(l, [&] { return j.done; });
  if (j.error) std::rethrow_exception(j.error);
}

bool Batcher::ready(Clock::time_point now) const {
  if (pending_.empty()) return false;
  const auto n = static_cast<int>(pending_.size());
  return n >= admitted_ || n >= max_batch_ || now >= deadline();
}

Clock::time_point Batcher::deadline() const {
  return std::max(pending_.front()->posted, last_forward_end_) + grace_;
}

void Batcher::loop() {
  std::unique_lock<std::mutex> l(m_);
  while (true) {
    Job* job = nullptr;
    if (!light_.empty()) {
      job = light_.front();
      light_.pop_front();
    } else if (!exclusive_.empty() && admitted_ == 0) {
      job = exclusive_.front();
      exclusive_.pop_front();
      exclusive_running_ = true;
    }
    if (job != nullptr) {
      l.unlock();
      job->run();
      l.lock();
      job->done = true;
      exclusive_running_ = false;
      request_cv_.notify_all();
      continue;
    }
    if (ready(Clock::now())) {
      std::deque<Call*> calls;
      while (!pending_.empty() && static_cast<int>(calls.size()) < max_batch_) {
        calls.push_back(pending_.front());
        pending_.pop_front();
      }
      l.unlock();
      run_calls(calls);
      l.lock();
      for (Call* c : calls) c->done = true;
      last_forward_end_ = Clock::now();
      request_cv_.notify_all();
      continue;
    }
    if (stop_ && pending_.empty() && exclusive_.empty()) return;
    if (!pending_.empty())
      engine_cv_.wait_until(l, deadline());
    else
      engine_cv_.wait(l);
  }
}

// Groups the calls by kind and attention block (one packed forward each), in order of arrival.
void Batcher::run_calls(std::deque<Call*>& calls) {
  std::vector<bool> taken(calls.size(), false);
  std::vector<Call*> group;
  for (size_t i = 0; i < calls.size(); ++i) {
    if (taken[i]) continue;
    group.clear();
    for (size_t j = i; j < calls.size(); ++j) {
      if (!taken[j] && calls[j]->logits == calls[i]->logits && calls[j]->block == calls[i]->block) {
        group.push_back(calls[j]);
        taken[j] = true;
      }
    }
    try {
      if (initial_block_ > 0 && engine_.attention_block() != calls[i]->block)
        engine_.set_attention_block(calls[i]->block);
    } catch (...) {
      for (Call* c : group) c->error = std::current_exception();
      continue;
    }
    run_group(group, calls[i]->logits);
  }
}

// One packed forward of the calls; halves when it exceeds the memory budget, and each call alone
// when the packed forward fails (so that an error reaches only the request that caused it).
void Batcher::run_group(std::span<Call* const> calls, bool logits) {
  if (calls.size() > 1) {
    std::vector<SeqInput> seqs;
    for (const Call* c : calls) seqs.push_back({c->canvas, c->positions});
    bool fits = true;
    try {
      fits = engine_.packed_step_fits(logits ? OutputMode::Logits : OutputMode::Sample, seqs);
    } catch (...) {
      fits = false;
    }
    if (!fits) {
      {
        std::lock_guard<std::mutex> l(m_);
        ++stats_.splits;
      }
      const size_t h = calls.size() / 2;
      run_group(calls.first(h), logits);
      run_group(calls.subspan(h), logits);
      return;
    }
  }
  try {
    run_packed(calls, logits);
  } catch (...) {
    if (calls.size() == 1) {
      calls[0]->error = std::current_exception();
      return;
    }
    for (Call* c : calls) {
      try {
        run_packed(std::span<Call* const>(&c, 1), logits);
      } catch (...) {
        c->error = std::current_exception();
      }
    }
  }
}

void Batcher::run_packed(std::span<Call* const> calls, bool logits) {
  std::vector<SeqInput> seqs;
  std::vector<SampleParams> sps;
  size_t n = 0;
  for (const Call* c : calls) {
    seqs.push_back({c->canvas, c->positions});
    sps.push_back(c->sp);
    n += c->positions.size();
  }
  if (logits) {
    const auto V = static_cast<size_t>(vocab_);
    for (const Call* c : calls)
      if (c->out.size() != c->positions.size() * V)
        fail("logits: one row of the vocabulary per position expected");
    if (calls.size() == 1) {
      engine_.forward_logits(seqs, calls[0]->out);
    } else {
      std::vector<float> all(n * V);
      engine_.forward_logits(seqs, all);
      size_t off = 0;
      for (Call* c : calls) {
        std::copy_n(all.begin() + static_cast<std::ptrdiff_t>(off), c->out.size(), c->out.begin());
        off += c->out.size();
      }
    }
  } else {
    for (const Call* c : calls) {
      if (c->tokens.size() != c->positions.size() || c->conf.size() != c->positions.size())
        fail("predict: one token and one confidence per position expected");
    }
    tokens_.resize(n);
    conf_.resize(n);
    engine_.forward_sample(seqs, sps, tokens_, conf_);
    size_t off = 0;
    for (Call* c : calls) {
      const size_t k = c->positions.size();
      std::copy_n(tokens_.begin() + static_cast<std::ptrdiff_t>(off), k, c->tokens.begin());
      std::copy_n(conf_.begin() + static_cast<std::ptrdiff_t>(off), k, c->conf.begin());
      off += k;
    }
  }
  std::lock_guard<std::mutex> l(m_);
  ++stats_.forwards;
  stats_.sequences += static_cast<int64_t>(calls.size());
  stats_.largest = std::max(stats_.largest, static_cast<int64_t>(calls.size()));
}

}  // namespace tessera
