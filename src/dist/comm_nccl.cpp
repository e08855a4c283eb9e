// NCCL between the GPUs of the ranks (TESSERA_CUDA=ON with NCCL found): one GPU per process, the
// unique id made by rank 0 and broadcast over the bootstrap communicator (MPI), collectives queued on
// the backend's stream. Buffers are device memory.
#if defined(TESSERA_NCCL) && defined(TESSERA_HAVE_CUDA)
#include <cuda_runtime.h>
#include <nccl.h>

#include "core/error.h"
#include "dist/communicator.h"

namespace tessera::dist {

namespace {

void nccl_check(ncclResult_t rc, const char* what) {
  if (rc != ncclSuccess) fail(std::string("NCCL ") + what + ": " + ncclGetErrorString(rc));
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(Communicator& bootstrap, cudaStream_t stream) : stream_(stream) {
    rank_ = bootstrap.rank();
    size_ = bootstrap.size();
    ncclUniqueId id{};
    if (rank_ == 0) nccl_check(ncclGetUniqueId(&id), "unique id");
    bootstrap.broadcast(&id, sizeof(id), 0);
    nccl_check(ncclCommInitRank(&comm_, size_, id, rank_), "init");
  }
  ~NcclCommunicator() override {
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
  }
  void all_gather(const void* send, void* recv, size_t bytes) override {
    count(bytes);
    nccl_check(ncclAllGather(send, recv, bytes, ncclUint8, comm_, stream_), "all-gather");
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
  }
  void broadcast(void* p, size_t bytes, int root) override {
    TESSERA_CHECK(root >= 0 && root < size_,
                  "broadcast: root " + std::to_string(root) + " is not a rank of " + std::to_string(size_));
    count(bytes);
    nccl_check(ncclBroadcast(p, p, bytes, ncclUint8, root, comm_, stream_), "broadcast");
  }
  void barrier() override {
    // A one-float all-reduce on the stream, then the stream drained: every rank has reached it.
    float* one = nullptr;
    if (cudaMallocAsync(reinterpret_cast<void**>(&one), sizeof(float), stream_) != cudaSuccess)
      fail("NCCL barrier: cudaMallocAsync failed");
    nccl_check(ncclAllReduce(one, one, 1, ncclFloat32, ncclSum, comm_, stream_), "barrier");
    cudaFreeAsync(one, stream_);
    if (cudaStreamSynchronize(stream_) != cudaSuccess) fail("NCCL barrier: the stream failed");
    count(0);
  }

 private:
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_;
  int rank_ = 0, size_ = 1;
};

}  // namespace

std::shared_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap, void* stream, std::string*) {
  return std::make_shared<NcclCommunicator>(bootstrap, static_cast<cudaStream_t>(stream));
}

}  // namespace tessera::dist
#endif
