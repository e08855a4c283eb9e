// Batching of concurrent requests. Each request's unmasking loop (generate()) runs on the thread that
// asked for it, against a proxy Denoiser; the proxies' forwards are gathered by one engine thread,
// which owns the Engine, and run as packed forwards: one sequence per request, each sampled with its
// own SampleParams (Engine::forward_sample). Every op of a forward is row-wise or per sequence, so a
// request's tokens do not depend on what it was packed with (tests/golden/batch_test.cpp checks this
// against generate() alone).
//
// When a forward runs: as soon as every admitted request is waiting for one, or max_batch of them
// are, or the oldest waiting call has waited `grace` (counted from the end of the last forward at the
// earliest): a request whose host code is slow, or whose client reads its stream slowly, joins a
// later forward instead of holding the others. Calls are taken first come, first served. A packed forward
// that exceeds the memory budget is split in halves.
//
// A request with a KV cache (prefix / dual, Window-Diffusion's phase cache) holds a slot of the
// engine's cache pool from its admission to its end; its cached steps are packed with the other
// requests' cached steps (each sequence reads its keys from its own slot). Under a memory budget a
// request whose cache (and largest step) would fit alone but not beside the caches held now waits
// for one to be given back; one that cannot fit even alone fails with the budget error.
//
// Requests that hold other engine state across forwards (SparseD patterns, DES) cannot share
// forwards: they run as exclusive jobs on the engine thread, when no batched request is admitted;
// requests that arrive meanwhile wait for their admission.
//
// Over ranks (the engine's communicator has more than one: --tp / --ep), every rank runs the same
// requests, each with a key its caller gives alike on every rank (generate_many: the prompt's index),
// and they decide the same tokens. What runs next is decided by rank 0 alone: before each packed forward
// and each exclusive job it broadcasts the keys it serves, and the other ranks' engine threads run exactly
// those (light jobs, which run no collective, stay free). The timing of each rank's threads then changes
// nothing. Not under a memory budget (a rank's admissions would depend on its own timing).
// Where rank 0 alone knows the requests (serve reads them from HTTP on rank 0), rank 0 introduces each
// one (Introduction: words the other ranks turn into the same request, sent before its first forward)
// and, when it ends, says so: a request rank 0 stopped early (a client gone, a timeout) then ends on every
// rank, and an exclusive generation agrees after every step whether it goes on (agree_stop). While idle,
// rank 0 sends a heartbeat every quarter of the communicator's deadline, so the others wait without it
// firing.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "decode/generate.h"
#include "engine/engine.h"

namespace tessera {

struct BatchStats {
  int64_t forwards = 0;   // packed forwards run
  int64_t sequences = 0;  // sequences in them (sequences / forwards = the mean batch)
  int64_t largest = 0;    // the most sequences in one forward
  int64_t splits = 0;     // packed forwards split to fit the memory budget
  int64_t cached_forwards = 0, cached_sequences = 0;  // those of them that were KV-cache steps
  int64_t cache_waits = 0;  // times a request waited for another to give its KV cache back
  // Over ranks, a rank other than 0: forwards and exclusive jobs still waiting when rank 0 stopped (a
  // request rank 0 ended without telling this rank: none, unless something went wrong).
  int64_t orphaned = 0;
};

class Batcher {
 public:
  // max_batch >= 1 sequences per forward; grace: how long a waiting call waits for the others.
  // over_ranks: the engine runs over ranks (EngineOptions::comm) and every rank makes this batcher with
  // the same requests, keyed alike (see above); rank 0 orders what runs. Without it a batcher over ranks
  // must be fed by one rank's order otherwise.
  // on_start (over ranks, ranks other than 0): called on the engine thread when rank 0 introduces a
  // request, with its key and rank 0's words for it; it must start the same request on a thread of its
  // own (generate / run with that key, as Session::run does) and return at once.
  using StartFn = std::function<void(uint64_t key, const std::string& words)>;
  Batcher(Engine& engine, int max_batch, std::chrono::microseconds grace = std::chrono::milliseconds(2),
          bool over_ranks = false, StartFn on_start = {});
  ~Batcher();
  Batcher(const Batcher&) = delete;
  Batcher& operator=(const Batcher&) = delete;

  // generate(prompt, o, on_step) with its forwards packed with those of the other requests running at
  // the same time (its plan must share forwards: RequestPlan::shares_forwards). The unmasking loop and
  // on_step run on the calling thread. Under a memory budget the request's plan is checked on the engine
  // thread before its first forward, with its KV cache open. Safe to call from any number of threads.
  GenerateResult generate(std::span<const int32_t> prompt, const GenerateOptions& o,
                          const std::function<void(const StepEvent&)>& on_step = {}, uint64_t key = 0);

  // Runs `job` on the engine thread and waits (its exception is rethrown here). exclusive: while no
  // batched request is admitted (requests that hold engine state: their whole generation); otherwise
  // between two forwards (a memory check before a request is admitted).
  void run(const std::function<void()>& job, bool exclusive, uint64_t key = 0);

  BatchStats stats() const;
  int max_batch() const { return max_batch_; }
  bool over_ranks() const { return ranks_ != nullptr; }

  // Rank 0 over ranks: while it lives, rank 0 sends `words` to the other ranks before the first forward
  // or exclusive job of `key` (their StartFn starts the same request), and once it is destroyed (the
  // request has ended) tells them so, which ends that request there if it still waits for a forward.
  // Keys must be unique among the requests alive. Elsewhere it does nothing.
  class Introduction {
   public:
    Introduction(Batcher& b, uint64_t key, std::string words);
    ~Introduction();
    Introduction(const Introduction&) = delete;
    Introduction& operator=(const Introduction&) = delete;

   private:
    Batcher& b_;
    const uint64_t key_;
  };

  // Over ranks, inside an exclusive job (on the engine thread): rank 0's `stop` becomes every rank's answer.
  // Called after every step of an exclusive generation, so that a generation rank 0 stops early stops at
  // the same step everywhere. Without ranks: `stop`.
  bool agree_stop(bool stop);

  // Over ranks, ranks other than 0: waits until rank 0's batcher has stopped (all its requests done);
  // calls of this rank still waiting then fail, and so do later ones.
  void wait_for_rank0();

 private:
  class Proxy;
  struct Call;
  struct Job;
  void loop();
  void follow();  // loop() of a rank other than 0 over ranks
  bool following() const { return ranks_ != nullptr && ranks_->rank() != 0; }
  // Over ranks: rank 0 tells the others what runs next (kind, then the keys, then any words), and they
  // receive it. Start: a request introduced (one key, its words); End: introduced requests that ended;
  // Beat: nothing (rank 0 is idle).
  enum class Next : uint64_t { Stop, Forward, Exclusive, Start, End, Beat };
  void announce(Next what, const std::vector<uint64_t>& keys, const std::string& words = {});
  Next receive(std::vector<uint64_t>& keys, std::string& words);
  // Rank 0, lock held: introduces the keys not introduced yet (unlocks while it sends).
  void introduce(std::unique_lock<std::mutex>& l, const std::vector<uint64_t>& keys);
  // A follower, lock held: fails the waiting calls of `key` (every key and exclusive job if all) with
  // `why`; returns how many.
  int64_t fail_waiting(bool all, uint64_t key, const char* why);
  // Opens a KV cache slot for an admitted request and checks its plan's budget; waits while they fit
  // the memory budget alone but not beside the slots held now.
  int admit_cache(const RequestPlan& plan);
  bool ready(std::chrono::steady_clock::time_point now) const;
  // When the oldest pending call stops waiting for others: `grace` after it was posted or after the
  // last forward ended, whichever is later (the requests that forward served post their next calls
  // within it, so that requests stay in step instead of alternating in two halves).
  std::chrono::steady_clock::time_point deadline() const;
  void run_calls(std::deque<Call*>& calls);
  void run_group(std::span<Call* const> calls, bool logits);
  void run_packed(std::span<Call* const> calls, bool logits);
  // An exclusive job on the engine thread. Over ranks, one that fails after its collectives began, other
  // than by a stop agree_stop agreed on, ends the job (out_of_step): the other ranks wait in collectives
  // this rank will not make.
  void run_exclusive(Job& job);
  // Over ranks: `what` (a forward, a generation) failed on this rank between paired collectives; the job
  // ends with one line naming the failure.
  [[noreturn]] void out_of_step(const std::string& what, const std::exception_ptr& error);
  // The collectives this rank has made: the batcher's messages and the engine's (NCCL's, on a GPU).
  uint64_t collective_calls() const;

  Engine& engine_;
  const int max_batch_;
  const std::chrono::microseconds grace_;
  const int64_t vocab_;
  const int32_t mask_;
  const int initial_block_;          // the engine's attention block at construction (0: not block-causal)
  const bool tri_mode_;              // the model has a causal mode (Denoiser::set_causal)
  const bool draft_adapter_;         // and a draft adapter (Denoiser::set_draft_adapter)
  dist::Communicator* const ranks_;  // over ranks: the engine's communicator (else null)
  const StartFn on_start_;
  const std::chrono::duration<double> beat_;           // rank 0: the heartbeat's period (0: none)
  std::chrono::steady_clock::time_point last_told_{};  // rank 0: when it last sent the others anything
  bool stop_agreed_ = false;  // the engine thread's exclusive job: agree_stop has agreed to stop it

  mutable std::mutex m_;
  std::condition_variable engine_cv_;   // the engine thread waits here
  std::condition_variable request_cv_;  // request threads wait here (results, admission, jobs)
  std::deque<Call*> pending_;           // calls waiting for a forward, oldest first
  std::deque<Job*> light_, exclusive_;  // jobs waiting for the engine thread
  int admitted_ = 0;                    // batched requests between admission and their end
  int waiting_ = 0;                     // admitted requests waiting for cache memory (no calls)
  uint64_t kv_released_ = 0;            // KV cache slots given back so far
  bool exclusive_running_ = false, stop_ = false;
  std::chrono::steady_clock::time_point last_forward_end_{};
  struct Intro {
    std::string words;
    bool sent = false;
  };
  std::map<uint64_t, Intro> intros_;  // rank 0: the introductions alive
  std::vector<uint64_t> ended_;       // rank 0: introduced requests that ended, not yet told
  std::multiset<uint64_t> active_;    // a follower: the keys of its batched requests admitted
  std::set<uint64_t> cancelled_;      // a follower: those of them rank 0 ended
  bool rank0_stopped_ = false;        // a follower: rank 0's batcher has stopped
  BatchStats stats_;
  std::vector<int32_t> tokens_;  // the engine thread's output staging
  std::vector<float> conf_;
  std::thread thread_;  // last member: starts after everything above is initialised
};

}  // namespace tessera
