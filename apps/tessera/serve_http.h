// tessera serve: admission control. A request asks for its sequences (prompts x n) before it generates:
// it runs when they fit beside those running (at most `parallel`), waits first come, first served while
// fewer than `max_queue` requests wait (until its deadline), and is refused otherwise (503 with
// Retry-After). A request that asks for more than `parallel` alone could never run (400). Each admitted
// request holds a Ticket; its sequences are given back when the ticket is destroyed. close() (the drain
// deadline) refuses the waiting requests and every later one.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace tessera::cli {

class Admission {
 public:
  Admission(int parallel, int max_queue) : parallel_(parallel), max_queue_(max_queue) {}
  class Ticket {
   public:
    Ticket(Admission& a, int n) : a_(a), n_(n) {}
    ~Ticket() { a_.leave(n_); }
    Ticket(const Ticket&) = delete;
    Ticket& operator=(const Ticket&) = delete;

   private:
    Admission& a_;
    int n_;
  };
  // A ticket for n sequences; throws BadRequest (400: more than `parallel`; 503: the queue is full, the
  // deadline passed while waiting, or the server is closing).
  std::unique_ptr<Ticket> enter(int n, std::chrono::steady_clock::time_point deadline);
  void close();
  int running() const;
  int waiting() const;
  int parallel() const { return parallel_; }
  int max_queue() const { return max_queue_; }
  int64_t refused() const;

 private:
  void leave(int n);
  void advance();  // serving_ past the tickets that left the line
  const int parallel_, max_queue_;
  mutable std::mutex m_;
  std::condition_variable cv_;
  int running_ = 0, waiting_ = 0;
  uint64_t next_ = 0, serving_ = 0;  // tickets of the waiting line, first come first served
  int64_t refused_ = 0;
  std::vector<uint64_t> skipped_;  // tickets that left the line before their turn
  bool closed_ = false;
};

}  // namespace tessera::cli
