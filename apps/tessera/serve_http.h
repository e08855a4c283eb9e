// tessera serve: what the HTTP layer adds around a request. The body limit (httplib 0.11 caps only a body
// with a Content-Length), the 405 of a known route asked with another method, and admission control: a
// bound on the sequences generating at once and on the requests waiting for them.
#pragma once
#include <httplib.h>

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

namespace tessera::cli {

// The largest request body.
inline constexpr size_t kMaxBody = size_t{16} << 20;

// A POST body through httplib's content reader, at most kMaxBody bytes however it is sent (a 32 MB
// chunked upload was read whole: 6 s and 810 MB before its 400). False, with a 413 that closes the
// connection, when it is larger.
bool read_body(const httplib::ContentReader& reader, std::string& body, httplib::Response& res);

// The handler of a known route asked with a method it does not take: 405 with Allow.
httplib::Server::Handler method_not_allowed(const char* allow);

// Admission control. A request asks for its sequences (prompts x n) before it generates: it runs when
// they fit beside those running (at most `parallel`), waits first come, first served while fewer than
// `max_queue` requests wait, and is refused otherwise (503 with Retry-After). A request that asks for
// more than `parallel` alone could never run (400). Each admitted request holds a Ticket; its sequences
// are given back when the ticket is destroyed.
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
  // A ticket for n sequences, or nullptr with the refusal written to res (400 or 503).
  std::unique_ptr<Ticket> enter(int n, httplib::Response& res);
  int running() const;
  int waiting() const;
  int parallel() const { return parallel_; }
  int64_t refused() const;

 private:
  void leave(int n);
  const int parallel_, max_queue_;
  mutable std::mutex m_;
  std::condition_variable cv_;
  int running_ = 0, waiting_ = 0;
  uint64_t next_ = 0, serving_ = 0;  // tickets of the waiting line, first come first served
  int64_t refused_ = 0;
};

}  // namespace tessera::cli
