// tessera serve over tensor / expert-parallel ranks (mpirun -np N tessera serve --tp N): rank 0 answers
// HTTP; every generation runs on all ranks at once. Before one starts, rank 0 broadcasts the request (its
// body, chat or not, which choice) and the other ranks parse it as rank 0 did (same code, same session
// defaults: the same prompt and options) and run the same generation; after every step rank 0 broadcasts
// whether it goes on (a client gone, --timeout or the drain end a request on rank 0 only), so every rank
// stops at the same step. Generations run one at a time (the batcher's packing depends on arrival times,
// which the ranks do not share). While idle, rank 0 broadcasts a heartbeat every --dist-timeout / 4 s, so
// a follower waits without its collective deadline firing and still notices a rank 0 that died; when the
// server ends, rank 0 tells the followers to exit.
#pragma once
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dist/communicator.h"
#include "runtime/session.h"

namespace tessera::cli {

class RankLink {
 public:
  RankLink(std::shared_ptr<dist::Communicator> comm, double dist_timeout_s);
  ~RankLink();  // rank 0: stops the heartbeat and tells the followers to exit
  int rank() const { return comm_->rank(); }

  // Rank 0: choice `choice` of the request `body` (chat or completions), over every rank.
  tessera::Session::Output run(tessera::Session& s, const std::string& body, bool chat, int choice,
                               const std::vector<int32_t>& prompt, const GenerateOptions& o,
                               const std::function<void(const StepEvent&)>& on_step);

  // A follower's view of a request: its prompt and options for a choice (parse_request's, as rank 0's).
  using Parse = std::function<void(const std::string& body, bool chat, int choice,
                                   std::vector<int32_t>& prompt, GenerateOptions& o)>;
  // Ranks > 0: runs rank 0's generations until rank 0 ends; returns the exit code.
  int follow(tessera::Session& s, const Parse& parse);

 private:
  struct Header {
    int32_t kind = 0;  // kNoop, kRun, kQuit
    int32_t chat = 0, choice = 0, pad = 0;
    int64_t body_bytes = 0;
  };
  static constexpr int32_t kNoop = 0, kRun = 1, kQuit = 2;
  void send(const Header& h, const std::string& body);  // rank 0, holding m_
  void heartbeat();

  std::shared_ptr<dist::Communicator> comm_;
  double beat_s_;
  std::mutex m_;  // one broadcast or generation at a time (MPI's serialized threads)
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread beat_;
};

}  // namespace tessera::cli
