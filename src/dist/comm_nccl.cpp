// NCCL between the GPUs of the ranks (TESSERA_CUDA=ON with NCCL found): one GPU per process, the
// unique id made by rank 0 and broadcast over the bootstrap communicator (MPI), collectives queued on
// the backend's stream. Buffers are device memory. A watchdog thread gives the collectives the
// bootstrap's deadline: NCCL itself waits for a lost peer for ever.
#if defined(TESSERA_NCCL) && defined(TESSERA_HAVE_CUDA)
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "dist/communicator.h"

namespace tessera::dist {

namespace {

void nccl_check(ncclResult_t rc, const char* what) {
  if (rc != ncclSuccess) fail(std::string("NCCL ") + what + ": " + ncclGetErrorString(rc));
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(std::shared_ptr<Communicator> bootstrap, cudaStream_t stream)
      : bootstrap_(std::move(bootstrap)), stream_(stream), timeout_s_(bootstrap_->deadline_s()) {
    rank_ = bootstrap_->rank();
    size_ = bootstrap_->size();
    ncclUniqueId id{};
    if (rank_ == 0) nccl_check(ncclGetUniqueId(&id), "unique id");
    bootstrap_->broadcast(&id, sizeof(id), 0);
    nccl_check(ncclCommInitRank(&comm_, size_, id, rank_), "init");
    if (timeout_s_ > 0) {
      if (cudaGetDevice(&device_) != cudaSuccess) fail("NCCL: no current CUDA device");
      watchdog_ = std::thread([this] { watch(); });
    }
  }
  ~NcclCommunicator() override {
    if (watchdog_.joinable()) {
      {
        std::lock_guard<std::mutex> lk(mu_);
        stop_ = true;
      }
      cv_.notify_all();
      watchdog_.join();
    }
    for (const Pending& p : pending_) cudaEventDestroy(p.done);
    for (cudaEvent_t e : spare_) cudaEventDestroy(e);
    if (comm_ != nullptr) ncclCommDestroy(comm_);
  }
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* name() const override { return "nccl"; }
  void all_reduce_sum(float* p, size_t n) override {
    count(n * sizeof(float));
    nccl_check(ncclAllReduce(p, p, n, ncclFloat32, ncclSum, comm_, stream_), "all-reduce");
    queued("all-reduce", n * sizeof(float));
  }
  void all_gather(const void* send, void* recv, size_t bytes) override {
    count(bytes);
    nccl_check(ncclAllGather(send, recv, bytes, ncclUint8, comm_, stream_), "all-gather");
    queued("all-gather", bytes);
  }
  void all_to_all(const void* send, void* recv, size_t bytes) override {
    count(bytes * static_cast<size_t>(size_));
    nccl_check(ncclGroupStart(), "group");
    for (int r = 0; r < size_; ++r) {
      nccl_check(ncclSend(static_cast<const char*>(send) + static_cast<size_t>(r) * bytes, bytes, ncclUint8,
                          r, comm_, stream_),
                 "send");
      nccl_check(ncclRecv(static_cast<char*>(recv) + static_cast<size_t>(r) * bytes, bytes, ncclUint8, r,
                          comm_, stream_),
                 "recv");
    }
    nccl_check(ncclGroupEnd(), "group");
    queued("all-to-all", bytes);
  }
  void broadcast(void* p, size_t bytes, int root) override {
    TESSERA_CHECK(root >= 0 && root < size_,
                  "broadcast: root " + std::to_string(root) + " is not a rank of " + std::to_string(size_));
    count(bytes);
    nccl_check(ncclBroadcast(p, p, bytes, ncclUint8, root, comm_, stream_), "broadcast");
    queued("broadcast", bytes);
  }
  void barrier() override {
    // A one-float all-reduce on the stream, then the stream drained: every rank has reached it.
    float* one = nullptr;
    if (cudaMallocAsync(reinterpret_cast<void**>(&one), sizeof(float), stream_) != cudaSuccess)
      fail("NCCL barrier: cudaMallocAsync failed");
    nccl_check(ncclAllReduce(one, one, 1, ncclFloat32, ncclSum, comm_, stream_), "barrier");
    queued("barrier", 0);
    cudaFreeAsync(one, stream_);
    if (cudaStreamSynchronize(stream_) != cudaSuccess) fail("NCCL barrier: the stream failed");
    count(0);
  }

 private:
  // A collective queued on the stream and not yet seen complete: `done` is recorded after it.
  struct Pending {
    cudaEvent_t done;
    const char* what;
    size_t bytes;
    std::chrono::steady_clock::time_point queued;
  };

  void queued(const char* what, size_t bytes) {
    if (!watchdog_.joinable()) return;
    std::lock_guard<std::mutex> lk(mu_);
    cudaEvent_t e = nullptr;
    if (!spare_.empty()) {
      e = spare_.back();
      spare_.pop_back();
    } else if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess) {
      fail("NCCL: cudaEventCreate failed");
    }
    if (cudaEventRecord(e, stream_) != cudaSuccess) {
      spare_.push_back(e);
      fail("NCCL: cudaEventRecord failed");
    }
    pending_.push_back({e, what, bytes, std::chrono::steady_clock::now()});
  }

  // Every 50 ms: retire the collectives that completed; end the job on an error NCCL reports, or when the
  // oldest one still waiting was queued longer ago than the deadline (the time includes the kernels queued
  // before it: a step's, milliseconds, against a deadline of seconds).
  void watch() {
    cudaSetDevice(device_);
    std::unique_lock<std::mutex> lk(mu_);
    while (!stop_) {
      cv_.wait_for(lk, std::chrono::milliseconds(50));
      while (!pending_.empty()) {
        const cudaError_t rc = cudaEventQuery(pending_.front().done);
        if (rc == cudaErrorNotReady) break;
        spare_.push_back(pending_.front().done);  // complete (or failed: the stream's owner sees it)
        pending_.pop_front();
      }
      ncclResult_t async = ncclSuccess;
      if (ncclCommGetAsyncError(comm_, &async) == ncclSuccess && async != ncclSuccess &&
          async != ncclInProgress) {
        end_collective(
            pending_.empty() ? "a collective" : pending_.front().what,
            pending_.empty() ? 0 : pending_.front().bytes,
            std::string("failed: ") + ncclGetErrorString(async) + ": another rank died or is unreachable");
      }
      if (!pending_.empty()) {
        const Pending& p = pending_.front();
        if (std::chrono::duration<double>(std::chrono::steady_clock::now() - p.queued).count() > timeout_s_) {
          char why[96];
          std::snprintf(why, sizeof(why), "did not complete within %.0f s: another rank died or hangs",
                        timeout_s_);
          end_collective(p.what, p.bytes, why);
        }
      }
    }
  }

  [[noreturn]] void end_collective(const char* what, size_t bytes, const std::string& why) {
    // The processes end (MPI_Abort: every rank's); the driver frees their GPUs, NCCL's waiting kernels
    // with them. No ncclCommAbort here: the engine thread may be inside an NCCL call on comm_.
    bootstrap_->end_job("the NCCL " + std::string(what) + " of " + std::to_string(bytes) + " bytes " + why);
  }

  std::shared_ptr<Communicator> bootstrap_;  // MPI: the id's broadcast, and the job's abort
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_;
  double timeout_s_;
  int rank_ = 0, size_ = 1, device_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::deque<Pending> pending_;
  std::vector<cudaEvent_t> spare_;
  std::thread watchdog_;
};

}  // namespace

std::shared_ptr<Communicator> make_nccl_communicator(std::shared_ptr<Communicator> bootstrap, void* stream,
                                                     std::string*) {
  TESSERA_CHECK(bootstrap != nullptr, "NCCL needs a bootstrap communicator");
  return std::make_shared<NcclCommunicator>(std::move(bootstrap), static_cast<cudaStream_t>(stream));
}

}  // namespace tessera::dist
#endif
