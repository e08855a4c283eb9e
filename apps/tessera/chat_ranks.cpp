#include "apps/tessera/chat_ranks.h"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <stdexcept>

namespace tessera::cli {

RankLink::RankLink(std::shared_ptr<dist::Communicator> comm, double dist_timeout_s)
    : comm_(std::move(comm)), beat_s_(std::max(0.05, dist_timeout_s / 4.0)) {
  if (comm_->rank() == 0) beat_ = std::thread([this] { heartbeat(); });
}

RankLink::~RankLink() {
  if (comm_->rank() != 0 || !beat_.joinable()) return;
  {
    std::lock_guard<std::mutex> l(m_);
    stop_ = true;
  }
  cv_.notify_all();
  beat_.join();
  std::lock_guard<std::mutex> l(m_);
  if (quit_sent_) return;
  try {
    broadcast(Header{kQuit}, {});
  } catch (...) {  // a follower already gone: mpirun reports it
  }
}

void RankLink::broadcast(Header h, const std::string& body) {
  h.body_bytes = static_cast<int64_t>(body.size());
  comm_->broadcast(&h, sizeof h, 0);
  if (!body.empty()) comm_->broadcast(const_cast<char*>(body.data()), body.size(), 0);
}

void RankLink::send(const std::unique_lock<std::mutex>& held, int32_t kind, int32_t a, int32_t b,
                    const std::string& body) {
  if (!held.owns_lock() || held.mutex() != &m_) throw std::logic_error("RankLink::send without hold()");
  broadcast(Header{kind, a, b}, body);
  quit_sent_ = quit_sent_ || kind == kQuit;
}

void RankLink::followers_left(const std::unique_lock<std::mutex>& held) {
  if (!held.owns_lock() || held.mutex() != &m_)
    throw std::logic_error("RankLink::followers_left without hold()");
  quit_sent_ = true;
}

void RankLink::heartbeat() {
  std::unique_lock<std::mutex> l(m_);
  while (!stop_ && !quit_sent_) {
    if (cv_.wait_for(l, std::chrono::duration<double>(beat_s_), [this] { return stop_ || quit_sent_; }))
      break;
    broadcast(Header{kNoop}, {});
  }
}

RankLink::Message RankLink::receive() {
  if (!signals_ignored_) {
    std::signal(SIGTERM, SIG_IGN);
    std::signal(SIGINT, SIG_IGN);
    signals_ignored_ = true;
  }
  for (;;) {
    Header h;
    comm_->broadcast(&h, sizeof h, 0);
    if (h.kind == kNoop) continue;
    Message m{h.kind, h.a, h.b, std::string(static_cast<size_t>(h.body_bytes), '\0')};
    if (!m.body.empty()) comm_->broadcast(m.body.data(), m.body.size(), 0);
    return m;
  }
}

bool RankLink::stop_here(bool stop) {
  int32_t flag = stop ? 1 : 0;
  comm_->broadcast(&flag, sizeof flag, 0);
  return flag != 0;
}

}  // namespace tessera::cli
