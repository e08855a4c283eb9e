#include "apps/tessera/serve_http.h"

#include "apps/tessera/serve_request.h"

namespace tessera::cli {

bool read_body(const httplib::ContentReader& reader, std::string& body, httplib::Response& res) {
  bool over = false;
  reader([&](const char* data, size_t len) {
    if (body.size() + len > kMaxBody) {
      over = true;
      return false;
    }
    body.append(data, len);
    return true;
  });
  if (!over) return true;
  res.status = 413;
  res.set_header("Connection", "close");
  res.set_content(error_body({413, "invalid_request_error",
                              "the request body exceeds " + std::to_string(kMaxBody >> 20) + " MiB"}),
                  "application/json");
  return false;
}

httplib::Server::Handler method_not_allowed(const char* allow) {
  return [allow](const httplib::Request& req, httplib::Response& res) {
    res.status = 405;
    res.set_header("Allow", allow);
    res.set_content(
        error_body({405, "invalid_request_error",
                    "method " + req.method + " is not allowed on " + req.path + " (use " + allow + ")"}),
        "application/json");
  };
}

std::unique_ptr<Admission::Ticket> Admission::enter(int n, httplib::Response& res) {
  std::unique_lock<std::mutex> l(m_);
  if (n > parallel_) {
    res.status = 400;
    res.set_content(error_body({400, "invalid_request_error",
                                "the request asks for " + std::to_string(n) +
                                    " sequences (prompts x n); this "
                                    "server generates at most " +
                                    std::to_string(parallel_) + " at once (--parallel)"}),
                    "application/json");
    return nullptr;
  }
  if (waiting_ == 0 && running_ + n <= parallel_) {
    running_ += n;
    return std::make_unique<Ticket>(*this, n);
  }
  if (waiting_ >= max_queue_) {
    ++refused_;
    res.status = 503;
    res.set_header("Retry-After", "1");
    res.set_content(error_body({503, "server_busy",
                                "the server is busy: " + std::to_string(running_) +
                                    " sequences generating and " + std::to_string(waiting_) +
                                    " requests waiting (--parallel " + std::to_string(parallel_) +
                                    ", --max-queue " + std::to_string(max_queue_) + "); retry later"}),
                    "application/json");
    return nullptr;
  }
  const uint64_t mine = next_++;
  ++waiting_;
  cv_.wait(l, [&] { return serving_ == mine && running_ + n <= parallel_; });
  --waiting_;
  ++serving_;
  running_ += n;
  cv_.notify_all();  // the next in line may fit too
  return std::make_unique<Ticket>(*this, n);
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
