#include "engine/batcher.h"

#include <omp.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "core/error.h"
#include "engine/request_budget.h"

namespace tessera {

using Clock = std::chrono::steady_clock;

// One forward a request asked for: predict (tokens, conf) or logits (out).
struct Batcher::Call {
  uint64_t key = 0;  // the request's (over ranks: rank 0 names the calls it serves by these)
  bool logits = false;
  int block = 0;        // the request's attention block (block-causal models)
  bool causal = false;  // a tri-mode model's causal forward (Denoiser::set_causal)
  bool draft = false;   // with the draft adapter (Denoiser::set_draft_adapter)
  int slot = -1;        // a KV-cache step: the request's slot of the engine's cache pool (else -1)
  std::span<const int32_t> canvas, positions;
  std::span<const int32_t> rows;  // a KV-cache step: the canvas rows computed
  SampleParams sp;
  std::span<int32_t> tokens;
  std::span<float> conf, out;
  PredictLogprobs* lp = nullptr;  // sp.logprobs: the requester's copy of its rows' log-probabilities
  Clock::time_point posted;
  bool done = false;
  std::exception_ptr error;
};

struct Batcher::Job {
  std::function<void()> fn;
  uint64_t key = 0;
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

// The Denoiser a batched request's generate() sees: its forwards are posted to the engine thread. A
// request with a KV cache holds a slot of the engine's cache pool, opened by Batcher::generate.
class Batcher::Proxy final : public Denoiser {
 public:
  Proxy(Batcher& b, int slot, uint64_t key) : b_(b), block_(b.initial_block_), slot_(slot), key_(key) {}
  int64_t vocab_size() const override { return b_.vocab_; }
  int32_t mask_token() const override { return b_.mask_; }
  int attention_block() const override { return block_; }
  bool supports_causal() const override { return b_.tri_mode_; }
  void set_causal(bool causal) override {
    if (causal && !b_.tri_mode_) Denoiser::set_causal(causal);
    causal_ = causal;
  }
  bool supports_draft_adapter() const override { return b_.draft_adapter_; }
  void set_draft_adapter(bool on) override {
    if (on && !b_.draft_adapter_) Denoiser::set_draft_adapter(on);
    draft_ = on;
  }
  void set_attention_block(int block) override {
    if (b_.initial_block_ == 0) fail("set_attention_block: the model is not block-causal");
    if (block <= 0) fail("the attention block must be positive (got " + std::to_string(block) + ")");
    block_ = block;
  }
  void predict(std::span<const int32_t> canvas, std::span<const int32_t> positions, const SampleParams& sp,
               std::span<int32_t> tokens, std::span<float> conf) override {
    Call c = sample_call(canvas, positions, sp, tokens, conf);
    post(c);
  }
  const PredictLogprobs& last_logprobs() const override { return lp_; }
  void logits(std::span<const int32_t> canvas, std::span<const int32_t> positions,
              std::span<float> out) override {
    Call c;
    c.logits = true;
    c.canvas = canvas;
    c.positions = positions;
    c.out = out;
    post(c);
  }
  bool supports_kv_cache() const override { return slot_ >= 0; }
  void kv_cache_reset(int64_t capacity) override {
    if (slot_ < 0) fail("internal error: a batched request without a KV cache slot uses the cache");
    b_.run([&] { b_.engine_.kv_reset(slot_, capacity); }, false);
  }
  int64_t kv_prefix(std::span<const int32_t> canvas, int64_t rows) override {
    if (slot_ < 0) return 0;
    int64_t restored = 0;
    b_.run([&] { restored = b_.engine_.kv_prefix(slot_, canvas, rows, block_); }, false);
    return restored;
  }
  void predict_cached(std::span<const int32_t> canvas, int64_t q_lo, int64_t q_hi,
                      std::span<const int32_t> positions, const SampleParams& sp, std::span<int32_t> tokens,
                      std::span<float> conf) override {
    cached_range(q_lo, q_hi, static_cast<int64_t>(canvas.size()), range_);
    predict_rows(canvas, range_, positions, sp, tokens, conf);
  }
  void predict_rows(std::span<const int32_t> canvas, std::span<const int32_t> rows,
                    std::span<const int32_t> positions, const SampleParams& sp, std::span<int32_t> tokens,
                    std::span<float> conf) override {
    if (slot_ < 0) fail("internal error: a batched request without a KV cache slot uses the cache");
    Call c = sample_call(canvas, positions, sp, tokens, conf);
    c.slot = slot_;
    c.rows = rows;
    post(c);
  }

 private:
  Call sample_call(std::span<const int32_t> canvas, std::span<const int32_t> positions,
                   const SampleParams& sp, std::span<int32_t> tokens, std::span<float> conf) {
    Call c;
    if (sp.logprobs) c.lp = &lp_;
    c.canvas = canvas;
    c.positions = positions;
    c.sp = sp;
    c.tokens = tokens;
    c.conf = conf;
    return c;
  }
  void post(Call& c) {
    c.key = key_;
    c.block = block_;
    c.causal = causal_;
    c.draft = draft_;
    std::unique_lock<std::mutex> l(b_.m_);
    if (b_.following() && (b_.rank0_stopped_ || b_.cancelled_.count(key_) > 0))
      fail("this request was ended by rank 0");
    c.posted = Clock::now();
    b_.pending_.push_back(&c);
    b_.engine_cv_.notify_one();
    b_.request_cv_.wait(l, [&] { return c.done; });
    if (c.error) std::rethrow_exception(c.error);
  }
  Batcher& b_;
  int block_;
  bool causal_ = false, draft_ = false;
  const int slot_;
  const uint64_t key_;
  std::vector<int32_t> range_;  // predict_cached's rows
  PredictLogprobs lp_;          // of the last call that asked for them
};

Batcher::Batcher(Engine& engine, int max_batch, std::chrono::microseconds grace, bool over_ranks,
                 StartFn on_start)
    : engine_(engine),
      max_batch_(max_batch),
      grace_(grace),
      vocab_(engine.vocab_size()),
      mask_(engine.mask_token()),
      initial_block_(engine.attention_block()),
      tri_mode_(engine.supports_causal()),
      draft_adapter_(engine.supports_draft_adapter()),
      ranks_(over_ranks && engine.options().comm && engine.options().comm->size() > 1
                 ? engine.options().comm.get()
                 : nullptr),
      on_start_(std::move(on_start)),
      beat_(ranks_ != nullptr ? ranks_->deadline_s() / 4 : 0.0) {
  if (max_batch < 1) fail("the batch size must be at least 1 (got " + std::to_string(max_batch) + ")");
  if (ranks_ != nullptr && max_batch > 1 && engine.options().memory_budget > 0)
    fail(
        "batched requests over ranks (--tp / --ep) do not take a memory budget yet: give --batch 1 or drop "
        "--memory-budget");
    // The forwards run on the engine thread's OpenMP team. An idle team of another thread (this one's,
    // if it ran the model's loading or earlier forwards) makes libgomp count more threads than cores and
    // cut the spinning of every team to almost nothing: each parallel region of the engine thread then
    // waits for its workers to wake (small forwards took 1.7x as long, measured on the 2-core machine).
    // Give this thread's team back; a later parallel region here starts a new one. libgomp only: LLVM's
    // libomp (clang builds: the sanitizer CI) crashes in this thread's next parallel region after a hard
    // pause (a null team in __kmp_fork_call, seen when a program of the C API generates on its own thread
    // after opening a model), and its teams do not cut each other's spinning.
#if !defined(__clang__)
  omp_pause_resource_all(omp_pause_hard);
#endif
  thread_ = std::thread([this] {
    if (following())
      follow();
    else
      loop();
  });
}

Batcher::~Batcher() {
  {
    std::lock_guard<std::mutex> l(m_);
    stop_ = true;
  }
  engine_cv_.notify_one();
  thread_.join();
}

BatchStats Batcher::stats() const {
  std::lock_guard<std::mutex> l(m_);
  return stats_;
}

GenerateResult Batcher::generate(std::span<const int32_t> prompt, const GenerateOptions& o,
                                 const std::function<void(const StepEvent&)>& on_step, uint64_t key) {
  const RequestPlan plan = plan_checked(prompt, o, vocab_, initial_block_ > 0);
  if (!plan.shares_forwards())
    fail(
        "internal error: a request that holds per-request engine state (SparseD patterns, DES, cfg's second "
        "KV cache) cannot be batched");
  {
    std::unique_lock<std::mutex> l(m_);
    // (A follower rank admits at once: rank 0's order of forwards and exclusive jobs is the one kept.)
    request_cv_.wait(l, [&] { return following() || (exclusive_.empty() && !exclusive_running_); });
    ++admitted_;
    if (following()) active_.insert(key);
  }
  struct Leave {
    Batcher& b;
    uint64_t key = 0;
    int slot = -1;
    ~Leave() {
      if (slot >= 0) {
        try {
          b.run([&] { b.engine_.kv_close(slot); }, false);
        } catch (...) {  // (kv_close does not throw)
        }
      }
      {
        std::lock_guard<std::mutex> l(b.m_);
        --b.admitted_;
        if (slot >= 0) ++b.kv_released_;
        if (b.following()) {
          b.active_.erase(b.active_.find(key));
          if (b.active_.count(key) == 0) b.cancelled_.erase(key);
        }
      }
      b.engine_cv_.notify_one();
      b.request_cv_.notify_all();
    }
  } leave{*this, key};
  if (plan.kv_capacity > 0)
    leave.slot = admit_cache(plan);
  else if (engine_.options().memory_budget > 0)
    run([&] { check_request_budget(engine_, plan); }, false);
  Proxy p(*this, leave.slot, key);
  RequestScope request(p, plan);
  return tessera::generate(request, prompt, o, on_step);
}

int Batcher::admit_cache(const RequestPlan& plan) {
  const int64_t capacity = plan.kv_capacity;
  const bool budget = engine_.options().memory_budget > 0;
  while (true) {
    int slot = -1;
    bool wait = false;
    uint64_t released = 0;
    run(
        [&] {
          {
            std::lock_guard<std::mutex> l(m_);
            released = kv_released_;
          }
          // Slot 0 is the engine's own: an exclusive request's cache, stale while batched requests run.
          engine_.kv_close(0);
          const bool alone = engine_.kv_slots_open() == 0;
          if (!alone && !engine_.kv_fits(capacity)) {
            wait = true;
            return;
          }
          slot = engine_.kv_open(capacity);  // alone: the budget error if it can never fit
          if (!budget) return;
          try {
            check_request_budget(engine_, plan);
          } catch (...) {
            engine_.kv_close(slot);
            slot = -1;
            if (alone) throw;
            wait = true;
          }
        },
        false);
    if (!wait) return slot;
    // Not now, but alone it would: wait until another request gives its cache back.
    std::unique_lock<std::mutex> l(m_);
    ++waiting_;
    ++stats_.cache_waits;
    engine_cv_.notify_one();
    request_cv_.wait(l, [&] { return kv_released_ != released; });
    --waiting_;
  }
}

void Batcher::run(const std::function<void()>& job, bool exclusive, uint64_t key) {
  Job j{job, key};
  std::unique_lock<std::mutex> l(m_);
  if (exclusive && following() && rank0_stopped_) fail("this request was ended by rank 0");
  (exclusive ? exclusive_ : light_).push_back(&j);
  engine_cv_.notify_one();
  request_cv_.wait(l, [&] { return j.done; });
  if (j.error) std::rethrow_exception(j.error);
}

bool Batcher::ready(Clock::time_point now) const {
  if (pending_.empty()) return false;
  const auto n = static_cast<int>(pending_.size());
  return n >= admitted_ - waiting_ || n >= max_batch_ || now >= deadline();
}

Clock::time_point Batcher::deadline() const {
  return std::max(pending_.front()->posted, last_forward_end_) + grace_;
}

void Batcher::loop() {
  std::unique_lock<std::mutex> l(m_);
  last_told_ = Clock::now();
  while (true) {
    if (!ended_.empty()) {  // (over ranks) introduced requests that ended: the others end theirs
      const std::vector<uint64_t> keys = std::move(ended_);
      ended_.clear();
      l.unlock();
      announce(Next::End, keys);
      l.lock();
      continue;
    }
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
      const bool announced = exclusive_running_ && ranks_ != nullptr;
      if (announced) introduce(l, {job->key});
      l.unlock();
      if (announced) announce(Next::Exclusive, {job->key});
      run_exclusive(*job);
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
      std::vector<uint64_t> keys;
      if (ranks_ != nullptr) {
        for (const Call* c : calls) keys.push_back(c->key);
        introduce(l, keys);
      }
      l.unlock();
      if (ranks_ != nullptr) announce(Next::Forward, keys);
      run_calls(calls);
      l.lock();
      for (Call* c : calls) c->done = true;
      last_forward_end_ = Clock::now();
      request_cv_.notify_all();
      continue;
    }
    if (stop_ && pending_.empty() && exclusive_.empty()) {
      if (ranks_ != nullptr) {
        l.unlock();
        announce(Next::Stop, {});
      }
      return;
    }
    // Idle over ranks: a heartbeat every beat_, so the others' wait for the next order never times out.
    const bool beats = ranks_ != nullptr && beat_.count() > 0;
    const auto next_beat = last_told_ + std::chrono::duration_cast<Clock::duration>(beat_);
    if (beats && Clock::now() >= next_beat) {
      l.unlock();
      announce(Next::Beat, {});
      l.lock();
      continue;
    }
    if (!pending_.empty())
      engine_cv_.wait_until(l, beats ? std::min(deadline(), next_beat) : deadline());
    else if (beats)
      engine_cv_.wait_until(l, next_beat);
    else
      engine_cv_.wait(l);
  }
}

void Batcher::introduce(std::unique_lock<std::mutex>& l, const std::vector<uint64_t>& keys) {
  std::vector<std::pair<uint64_t, std::string>> told;
  for (uint64_t k : keys) {
    const auto it = intros_.find(k);
    if (it == intros_.end() || it->second.sent) continue;
    it->second.sent = true;
    told.emplace_back(k, it->second.words);
  }
  if (told.empty()) return;
  l.unlock();
  for (const auto& [k, words] : told) announce(Next::Start, {k}, words);
  l.lock();
}

Batcher::Introduction::Introduction(Batcher& b, uint64_t key, std::string words) : b_(b), key_(key) {
  if (b_.ranks_ == nullptr || b_.following()) return;
  std::lock_guard<std::mutex> l(b_.m_);
  if (!b_.intros_.emplace(key, Intro{std::move(words)}).second)
    fail("internal error: two requests alive with the key " + std::to_string(key));
}

Batcher::Introduction::~Introduction() {
  if (b_.ranks_ == nullptr || b_.following()) return;
  std::lock_guard<std::mutex> l(b_.m_);
  const auto it = b_.intros_.find(key_);
  if (it == b_.intros_.end()) return;
  if (it->second.sent) {
    b_.ended_.push_back(key_);
    b_.engine_cv_.notify_one();
  }
  b_.intros_.erase(it);
}

bool Batcher::agree_stop(bool stop) {
  if (ranks_ == nullptr) return stop;
  int32_t flag = stop ? 1 : 0;
  ranks_->broadcast(&flag, sizeof flag, 0);
  if (!following()) last_told_ = Clock::now();
  if (flag != 0) stop_agreed_ = true;
  return flag != 0;
}

void Batcher::wait_for_rank0() {
  std::unique_lock<std::mutex> l(m_);
  request_cv_.wait(l, [&] { return !following() || rank0_stopped_; });
}

int64_t Batcher::fail_waiting(bool all, uint64_t key, const char* why) {
  const auto err = std::make_exception_ptr(Error(why));
  int64_t n = 0;
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (all || (*it)->key == key) {
      (*it)->error = err;
      (*it)->done = true;
      it = pending_.erase(it);
      ++n;
    } else {
      ++it;
    }
  }
  if (all) {
    for (Job* j : exclusive_) {
      j->error = err;
      j->done = true;
      ++n;
    }
    exclusive_.clear();
  }
  request_cv_.notify_all();
  return n;
}

void Batcher::announce(Next what, const std::vector<uint64_t>& keys, const std::string& words) {
  std::array<uint64_t, 3> head{static_cast<uint64_t>(what), keys.size(), words.size()};
  ranks_->broadcast(head.data(), sizeof head, 0);
  if (!keys.empty()) ranks_->broadcast(const_cast<uint64_t*>(keys.data()), keys.size() * 8, 0);
  if (!words.empty()) ranks_->broadcast(const_cast<char*>(words.data()), words.size(), 0);
  last_told_ = Clock::now();
}

Batcher::Next Batcher::receive(std::vector<uint64_t>& keys, std::string& words) {
  std::array<uint64_t, 3> head{};
  ranks_->broadcast(head.data(), sizeof head, 0);
  const auto next = static_cast<Next>(head[0]);
  const bool one_key = next == Next::Exclusive || next == Next::Start;
  const bool some_keys = next == Next::Forward || next == Next::End;
  TESSERA_CHECK(head[0] <= static_cast<uint64_t>(Next::Beat) && head[1] <= (1u << 20) &&
                    (!one_key || head[1] == 1) && (!some_keys || head[1] > 0) &&
                    (one_key || some_keys || head[1] == 0) && (next == Next::Start || head[2] == 0) &&
                    head[2] <= (uint64_t{1} << 32),
                "batcher: a malformed message from rank 0");
  keys.resize(head[1]);
  if (!keys.empty()) ranks_->broadcast(keys.data(), keys.size() * 8, 0);
  words.assign(static_cast<size_t>(head[2]), '\0');
  if (!words.empty()) ranks_->broadcast(words.data(), words.size(), 0);
  return next;
}

// A rank other than 0: light jobs as they come; forwards and exclusive jobs in rank 0's order, each once
// the calls (the job) of the keys it names are here.
void Batcher::follow() {
  std::vector<uint64_t> keys;
  std::string words;
  bool told = false;
  Next next = Next::Stop;
  std::unique_lock<std::mutex> l(m_);
  while (true) {
    if (!light_.empty()) {
      Job* job = light_.front();
      light_.pop_front();
      l.unlock();
      job->run();
      l.lock();
      job->done = true;
      request_cv_.notify_all();
      continue;
    }
    if (!told) {  // (light jobs posted meanwhile wait: no request needs one for rank 0 to go on)
      l.unlock();
      next = receive(keys, words);
      l.lock();
      told = true;
      continue;
    }
    if (next == Next::Beat) {
      told = false;
      continue;
    }
    if (next == Next::Start) {  // a request rank 0 introduces: start it here
      TESSERA_CHECK(on_start_ != nullptr, "batcher: rank 0 introduced a request this rank cannot start");
      l.unlock();
      on_start_(keys[0], words);
      l.lock();
      told = false;
      continue;
    }
    if (next == Next::End) {  // introduced requests that ended on rank 0: end those still running here
      for (uint64_t k : keys) {
        if (active_.count(k) == 0) continue;  // done here too (or an exclusive job, already run)
        cancelled_.insert(k);
        fail_waiting(false, k, "this request was ended by rank 0");
      }
      told = false;
      continue;
    }
    if (next == Next::Stop) {  // rank 0's requests are done; this rank's may still run light jobs
      if (!rank0_stopped_) {
        rank0_stopped_ = true;
        stats_.orphaned += fail_waiting(true, 0, "this request was ended by rank 0");
      }
      if (stop_) return;
      engine_cv_.wait(l);
      continue;
    }
    if (next == Next::Exclusive) {
      auto it =
          std::find_if(exclusive_.begin(), exclusive_.end(), [&](const Job* j) { return j->key == keys[0]; });
      if (it != exclusive_.end()) {
        Job* job = *it;
        exclusive_.erase(it);
        exclusive_running_ = true;
        l.unlock();
        run_exclusive(*job);
        l.lock();
        job->done = true;
        exclusive_running_ = false;
        told = false;
        request_cv_.notify_all();
        continue;
      }
    } else {  // Forward: every named call posted, taken in rank 0's order
      std::deque<Call*> calls;
      for (uint64_t k : keys) {
        auto it = std::find_if(pending_.begin(), pending_.end(), [&](const Call* c) { return c->key == k; });
        if (it == pending_.end()) break;
        calls.push_back(*it);
      }
      if (calls.size() == keys.size()) {
        for (const Call* c : calls) pending_.erase(std::find(pending_.begin(), pending_.end(), c));
        l.unlock();
        run_calls(calls);
        l.lock();
        for (Call* c : calls) c->done = true;
        told = false;
        request_cv_.notify_all();
        continue;
      }
    }
    engine_cv_.wait(l);
  }
}

// Groups the calls by kind, attention block and causality (one packed forward each), in order of arrival.
void Batcher::run_calls(std::deque<Call*>& calls) {
  std::vector<bool> taken(calls.size(), false);
  std::vector<Call*> group;
  for (size_t i = 0; i < calls.size(); ++i) {
    if (taken[i]) continue;
    group.clear();
    for (size_t j = i; j < calls.size(); ++j) {
      if (!taken[j] && calls[j]->logits == calls[i]->logits && calls[j]->block == calls[i]->block &&
          calls[j]->causal == calls[i]->causal && calls[j]->draft == calls[i]->draft &&
          (calls[j]->slot >= 0) == (calls[i]->slot >= 0)) {
        group.push_back(calls[j]);
        taken[j] = true;
      }
    }
    try {
      if (initial_block_ > 0 && engine_.attention_block() != calls[i]->block)
        engine_.set_attention_block(calls[i]->block);
      if (tri_mode_) engine_.set_causal(calls[i]->causal);
      if (draft_adapter_) engine_.set_draft_adapter(calls[i]->draft);
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
    bool lp = false;
    for (const Call* c : calls) lp = lp || c->sp.logprobs;
    const OutputMode mode = logits ? OutputMode::Logits
                            : lp   ? OutputMode::SampleLogprobs
                                   : OutputMode::Sample;
    bool fits = true;
    try {
      if (calls[0]->slot >= 0) {
        std::vector<Engine::CachedSeq> seqs;
        for (const Call* c : calls) seqs.push_back({c->slot, c->canvas, c->rows, c->positions});
        fits = engine_.packed_cached_fits(mode, seqs);
      } else {
        std::vector<SeqInput> seqs;
        for (const Call* c : calls) seqs.push_back({c->canvas, c->positions});
        fits = engine_.packed_step_fits(mode, seqs);
      }
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
    if (ranks_ != nullptr)
      out_of_step(
          "a forward of " + std::to_string(calls.size()) + " sequence" + (calls.size() == 1 ? "" : "s"),
          std::current_exception());
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

// Over ranks a failed packed forward is not retried call by call: the other ranks ran its collectives, or
// wait in them, and the retries would pair this rank's collectives with theirs out of order (wrong sums,
// or a hang). Nor does a generation that runs alone and fails midway (this rank's memory, a lost peer)
// just report its error: the other ranks would wait in its next collectives. The job ends with one line.
void Batcher::out_of_step(const std::string& what, const std::exception_ptr& error) {
  std::string why = "unknown error";
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    why = e.what();
  } catch (...) {
  }
  ranks_->end_job(what + " failed (" + why + "): the ranks are no longer in step");
}

uint64_t Batcher::collective_calls() const {
  const dist::Communicator* device = engine_.collectives();
  return ranks_->stats().calls + (device != nullptr && device != ranks_ ? device->stats().calls : 0);
}

// A failure before the job's first collective (a request every rank refuses alike) stays the request's
// error; an agreed stop is no failure.
void Batcher::run_exclusive(Job& job) {
  if (ranks_ == nullptr) return job.run();
  stop_agreed_ = false;
  const uint64_t before = collective_calls();
  job.run();
  if (job.error && !stop_agreed_ && collective_calls() != before)
    out_of_step("a generation running alone", job.error);
}

void Batcher::run_packed(std::span<Call* const> calls, bool logits) {
  std::vector<SeqInput> seqs;
  std::vector<Engine::CachedSeq> cached;
  std::vector<SampleParams> sps;
  size_t n = 0;
  for (const Call* c : calls) {
    if (c->slot >= 0)
      cached.push_back({c->slot, c->canvas, c->rows, c->positions});
    else
      seqs.push_back({c->canvas, c->positions});
    sps.push_back(c->sp);
    n += c->positions.size();
  }
  if (logits) {
    if (!cached.empty()) fail("internal error: no logits of KV-cache steps");
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
    if (!cached.empty())
      engine_.forward_cached(cached, sps, tokens_, conf_);
    else
      engine_.forward_sample(seqs, sps, tokens_, conf_);
    size_t off = 0;
    const PredictLogprobs& all = engine_.last_logprobs();
    for (Call* c : calls) {
      const size_t k = c->positions.size();
      std::copy_n(tokens_.begin() + static_cast<std::ptrdiff_t>(off), k, c->tokens.begin());
      std::copy_n(conf_.begin() + static_cast<std::ptrdiff_t>(off), k, c->conf.begin());
      if (c->lp != nullptr) {  // this call's rows of the forward's log-probabilities
        const auto t = static_cast<size_t>(all.top);
        const auto at = [](const auto& v, size_t i) { return v.begin() + static_cast<std::ptrdiff_t>(i); };
        c->lp->top = all.top;
        c->lp->chosen.assign(at(all.chosen, off), at(all.chosen, off + k));
        c->lp->top_ids.assign(at(all.top_ids, off * t), at(all.top_ids, (off + k) * t));
        c->lp->top_lp.assign(at(all.top_lp, off * t), at(all.top_lp, (off + k) * t));
      }
      off += k;
    }
  }
  std::lock_guard<std::mutex> l(m_);
  ++stats_.forwards;
  stats_.sequences += static_cast<int64_t>(calls.size());
  stats_.largest = std::max(stats_.largest, static_cast<int64_t>(calls.size()));
  if (!cached.empty()) {
    ++stats_.cached_forwards;
    stats_.cached_sequences += static_cast<int64_t>(calls.size());
  }
}

}  // namespace tessera
