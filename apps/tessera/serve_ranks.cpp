#include "apps/tessera/serve_ranks.h"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <exception>

namespace tessera::cli {
namespace {

// A follower's generation ended by rank 0 (its step flag).
struct EndedByRankZero {};

}  // namespace

RankLink::RankLink(std::shared_ptr<dist::Communicator> comm, double dist_timeout_s)
    : comm_(std::move(comm)), beat_s_(std::max(0.05, dist_timeout_s / 4.0)) {
  if (comm_->rank() == 0) beat_ = std::thread([this] { heartbeat(); });
}

RankLink::~RankLink() {
  if (comm_->rank() != 0) return;
  {
    std::lock_guard<std::mutex> l(m_);
    stop_ = true;
  }
  cv_.notify_all();
  beat_.join();
  std::lock_guard<std::mutex> l(m_);
  try {
    send(Header{kQuit}, {});
  } catch (...) {  // a follower already gone: mpirun reports it
  }
}

void RankLink::send(const Header& h, const std::string& body) {
  Header copy = h;
  copy.body_bytes = static_cast<int64_t>(body.size());
  comm_->broadcast(&copy, sizeof copy, 0);
  if (!body.empty()) comm_->broadcast(const_cast<char*>(body.data()), body.size(), 0);
}

void RankLink::heartbeat() {
  std::unique_lock<std::mutex> l(m_);
  while (!stop_) {
    if (cv_.wait_for(l, std::chrono::duration<double>(beat_s_), [this] { return stop_; })) break;
    send(Header{kNoop}, {});
  }
}

tessera::Session::Output RankLink::run(tessera::Session& s, const std::string& body, bool chat, int choice,
                                       const std::vector<int32_t>& prompt, const GenerateOptions& o,
                                       const std::function<void(const StepEvent&)>& on_step) {
  std::lock_guard<std::mutex> l(m_);
  send(Header{kRun, chat ? 1 : 0, choice}, body);
  return s.run(prompt, o, [&](const StepEvent& ev) {
    int32_t stop = 0;
    std::exception_ptr err;
    try {
      if (on_step) on_step(ev);
    } catch (...) {
      err = std::current_exception();
      stop = 1;
    }
    comm_->broadcast(&stop, sizeof stop, 0);
    if (err) std::rethrow_exception(err);
  });
}

int RankLink::follow(tessera::Session& s, const Parse& parse) {
  // mpirun passes a SIGTERM / SIGINT to every rank: rank 0 drains its requests and then tells this rank to
  // exit, so a follower does not end first (a follower that is killed ends the job through rank 0's next
  // collective deadline).
  std::signal(SIGTERM, SIG_IGN);
  std::signal(SIGINT, SIG_IGN);
  for (;;) {
    Header h;
    comm_->broadcast(&h, sizeof h, 0);
    if (h.kind == kQuit) return 0;
    if (h.kind != kRun) continue;
    std::string body(static_cast<size_t>(h.body_bytes), '\0');
    if (!body.empty()) comm_->broadcast(body.data(), body.size(), 0);
    try {
      std::vector<int32_t> prompt;
      GenerateOptions o;
      parse(body, h.chat != 0, h.choice, prompt, o);
      s.run(prompt, o, [&](const StepEvent&) {
        int32_t stop = 0;
        comm_->broadcast(&stop, sizeof stop, 0);
        if (stop != 0) throw EndedByRankZero{};
      });
    } catch (const EndedByRankZero&) {
    } catch (const std::exception&) {  // rank 0 met the same error at the same point and answered it
    }
  }
}

}  // namespace tessera::cli
