#include "apps/tessera/serve_http.h"

#include <string>

#include "apps/tessera/serve_request.h"

namespace tessera::cli {

std::unique_ptr<Admission::Ticket> Admission::enter(int n, std::chrono::steady_clock::time_point deadline) {
  std::unique_lock<std::mutex> l(m_);
  if (n > parallel_) {
    throw BadRequest{400, "invalid_request_error",
                     "the request asks for " + std::to_string(n) +
                         " sequences (prompts x n); this server generates at most " +
                         std::to_string(parallel_) + " at once (--parallel)"};
  }
  if (closed_) {
    ++refused_;
    throw BadRequest{503, "server_shutting_down", "the server is shutting down"};
  }
  if (waiting_ == 0 && running_ + n <= parallel_) {
    running_ += n;
    return std::make_unique<Ticket>(*this, n);
  }
  if (waiting_ >= max_queue_) {
    ++refused_;
    throw BadRequest{503, "server_busy",
                     "the server is busy: " + std::to_string(running_) + " sequences generating and " +
                         std::to_string(waiting_) + " requests waiting (--parallel " +
                         std::to_string(parallel_) + ", --max-queue " + std::to_string(max_queue_) +
                         "); retry later"};
  }
  const uint64_t mine = next_++;
  ++waiting_;
  const bool turn =
      cv_.wait_until(l, deadline, [&] { return closed_ || (serving_ == mine && running_ + n <= parallel_); });
  --waiting_;
  if (!turn || closed_) {
    // Out of the line: the ones behind it move up (a ticket number is skipped by advancing past it).
    skipped_.push_back(mine);
    advance();
    cv_.notify_all();
    ++refused_;
    if (closed_) throw BadRequest{503, "server_shutting_down", "the server is shutting down"};
    throw BadRequest{503, "timeout", "the request waited for admission beyond its --timeout"};
  }
  ++serving_;
  advance();
  running_ += n;
  cv_.notify_all();  // the next in line may fit too
  return std::make_unique<Ticket>(*this, n);
}

void Admission::advance() {
  // Tickets that left the line are passed over.
  for (bool moved = true; moved;) {
    moved = false;
    for (auto it = skipped_.begin(); it != skipped_.end(); ++it) {
      if (*it == serving_) {
        ++serving_;
        skipped_.erase(it);
        moved = true;
        break;
      }
    }
  }
}

void Admission::close() {
  std::lock_guard<std::mutex> l(m_);
  closed_ = true;
  cv_.notify_all();
}

void Admission::leave(int n) {
  std::lock_guard<std::mutex> l(m_);
  running_ -= n;
  cv_.notify_all();
}

int Admission::running() const {
  std::lock_guard<std::mutex> l(m_);
  return running_;
}

int Admission::waiting() const {
  std::lock_guard<std::mutex> l(m_);
  return waiting_;
}

int64_t Admission::refused() const {
  std::lock_guard<std::mutex> l(m_);
  return refused_;
}

}  // namespace tessera::cli
