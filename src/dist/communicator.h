// Collectives between the ranks of a tensor- / expert-parallel run, on existing distributed engines:
// Open MPI between CPU processes and hosts (comm_mpi.cpp), NCCL between GPUs (comm_nccl.cpp). One
// process per rank, started by the launcher (mpirun); the layout (--tp) is checked against it at start.
// Buffers are host memory for MPI and device memory for NCCL (the engine's backend decides which).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace tessera::dist {

// Bytes and calls of one rank's collectives (what it sent; docs/PERF.md's communication volume).
struct CommStats {
  uint64_t calls = 0;
  uint64_t bytes = 0;  // payload this rank handed to the collectives (an all-reduce of n floats: 4n)
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const char* name() const = 0;  // "mpi", "nccl", "local"
  // In place: p[i] = the sum over ranks of p[i], n f32 values; every rank gets the same values.
  virtual void all_reduce_sum(float* p, size_t n) = 0;
  // recv = the `bytes` of every rank's send, rank after rank (recv holds size() * bytes).
  virtual void all_gather(const void* send, void* recv, size_t bytes) = 0;
  // Block r of send (`bytes` each) goes to rank r; block r of recv came from rank r.
  virtual void all_to_all(const void* send, void* recv, size_t bytes) = 0;
  virtual void broadcast(void* p, size_t bytes, int root) = 0;
  virtual void barrier() = 0;
  // Seconds a collective may wait for the other ranks before the job ends (0: no deadline). A root that
  // stays idle longer than this sends the others a message now and then (Batcher's heartbeat).
  virtual double deadline_s() const { return 0; }
  // Ends the whole job now, every rank, with exit code 3, after one line on stderr: "tessera: rank R of N:
  // <why>; ending the job". For what leaves the ranks out of step: a collective past its deadline, a peer
  // lost, a failure on one rank between paired collectives.
  [[noreturn]] void end_job(const std::string& why);
  const CommStats& stats() const { return stats_; }
  void reset_stats() { stats_ = {}; }

 protected:
  // How end_job ends the job: MPI_Abort over MPI; without a launcher, this process.
  [[noreturn]] virtual void abort_job(int code);
  void count(size_t bytes) {
    ++stats_.calls;
    stats_.bytes += bytes;
  }
  CommStats stats_;
};

// The process's MPI world (MPI_Init on first use, MPI_Finalize at exit). A collective that has not
// completed after `timeout_s` seconds (a rank died or hangs) prints one line naming it and aborts the
// whole job (MPI_Abort), so no rank waits forever. Null, with the reason in *why, when tessera was built
// without MPI.
std::shared_ptr<Communicator> mpi_world(double timeout_s, std::string* why);
// Whether this process was started by an MPI launcher (mpirun / mpiexec set OMPI_COMM_WORLD_SIZE or
// PMI_SIZE): the size it gives, else 1.
int launcher_size();
// This process's rank as the launcher gives it (0 without a launcher).
int launcher_rank();
// Its rank among the launcher's processes on this host, and how many those are (0 and 1 without one).
int launcher_local_rank();
int launcher_local_size();

// NCCL between the GPUs of the ranks (one per process), bootstrapped over `bootstrap` (MPI: rank 0
// makes the unique id and broadcasts it); collectives are queued on the CUDA stream `stream` (the
// backend's), so they order with its kernels. With the bootstrap's deadline (deadline_s() > 0) a watchdog
// thread follows every queued collective: one that has not completed within it, or an error NCCL reports
// (a peer lost), prints one line and ends the job through the bootstrap (abort_job), as MPI's
// collectives do. Null, with the reason, without CUDA + NCCL.
std::shared_ptr<Communicator> make_nccl_communicator(std::shared_ptr<Communicator> bootstrap, void* stream,
                                                     std::string* why);

}  // namespace tessera::dist
