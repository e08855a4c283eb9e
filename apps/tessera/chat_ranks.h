// tessera chat over tensor / expert-parallel ranks (mpirun -np N tessera chat --tp N): rank 0 reads the
// lines; every turn runs on all ranks at once. Rank 0 broadcasts each line typed, and the other ranks turn
// it into the same conversation with the same code and run the same generation; after every step rank 0
// broadcasts whether it goes on (Ctrl-C ends an answer on rank 0 only), so every rank stops at the same
// step. While idle (waiting for a line), rank 0 broadcasts a heartbeat every --dist-timeout / 4 s, so a
// follower waits without its collective deadline firing and still notices a rank 0 that died; when rank 0
// ends, it tells the followers to exit. (serve over ranks goes through engine/batcher.h instead: its
// requests are batched.)
#pragma once
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "dist/communicator.h"

namespace tessera::cli {

class RankLink {
 public:
  static constexpr int32_t kNoop = 0, kQuit = 2, kLine = 3;
  struct Message {
    int32_t kind = kNoop, a = 0, b = 0;
    std::string body;
  };

  RankLink(std::shared_ptr<dist::Communicator> comm, double dist_timeout_s);
  ~RankLink();  // rank 0: stops the heartbeat and tells the followers to exit
  int rank() const { return comm_->rank(); }

  // Rank 0: the link held from a message through the generation it starts (no heartbeat in between).
  std::unique_lock<std::mutex> hold() { return std::unique_lock<std::mutex>(m_); }
  // (kQuit ends the followers: nothing is sent after it.)
  void send(const std::unique_lock<std::mutex>& held, int32_t kind, int32_t a, int32_t b,
            const std::string& body);
  // Rank 0: the followers left by themselves (they ran the same line that ends a chat): nothing more to send.
  void followers_left(const std::unique_lock<std::mutex>& held);
  // Ranks > 0: the next message that is not a heartbeat. Ignores SIGTERM / SIGINT from the first call
  // (mpirun passes them to every rank: rank 0 ends, then tells this rank to).
  Message receive();
  // After every step of a generation: rank 0 (holding the link) says whether it stops; every rank gets it.
  bool stop_here(bool stop);

 private:
  struct Header {
    int32_t kind = kNoop, a = 0, b = 0, pad = 0;
    int64_t body_bytes = 0;
  };
  void broadcast(Header h, const std::string& body);
  void heartbeat();

  std::shared_ptr<dist::Communicator> comm_;
  double beat_s_;
  std::mutex m_;  // one message or generation at a time (MPI's serialized threads)
  std::condition_variable cv_;
  bool stop_ = false, signals_ignored_ = false, quit_sent_ = false;  // kQuit sent: the followers are gone
  std::thread beat_;
};

}  // namespace tessera::cli
