// The launcher's environment, and MPI's communicator (built with TESSERA_MPI).
#include "dist/communicator.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "core/error.h"

#ifdef TESSERA_MPI
#define OMPI_SKIP_MPICXX 1  // MPI's C API only (Open MPI's deprecated C++ bindings are not used)
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif

namespace tessera::dist {

namespace {

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  return end != nullptr && *end == '\0' && n >= 0 && n < (1 << 20) ? static_cast<int>(n) : fallback;
}

}  // namespace

int launcher_size() {
  return std::max(1, env_int("OMPI_COMM_WORLD_SIZE", env_int("PMI_SIZE", 1)));
}

int launcher_rank() {
  return env_int("OMPI_COMM_WORLD_RANK", env_int("PMI_RANK", 0));
}

int launcher_local_rank() {
  return env_int("OMPI_COMM_WORLD_LOCAL_RANK", env_int("MPI_LOCALRANKID", env_int("SLURM_LOCALID", 0)));
}

int launcher_local_size() {
  return std::max(1, env_int("OMPI_COMM_WORLD_LOCAL_SIZE", env_int("MPI_LOCALNRANKS", 1)));
}

void Communicator::end_job(const std::string& why) {
  std::fprintf(stderr, "tessera: rank %d of %d: %s; ending the job\n", rank(), size(), why.c_str());
  abort_job(3);
  std::_Exit(3);  // (abort_job does not return; GCC does not see it through the virtual call)
}

void Communicator::abort_job(int code) {
  std::fflush(stderr);
  std::_Exit(code);
}

#ifdef TESSERA_MPI
namespace {

// MPI's world. Every collective is started non-blocking and waited for with a deadline: a peer that died
// or hangs aborts the job with one line instead of leaving this rank blocked for ever.
class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(double timeout_s) : timeout_s_(timeout_s) {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* name() const override { return "mpi"; }
  double deadline_s() const override { return timeout_s_; }
  void all_reduce_sum(float* p, size_t n) override {
    count(n * sizeof(float));
    if (size_ == 1 || n == 0) return;
    MPI_Request r;
    check(MPI_Iallreduce(MPI_IN_PLACE, p, checked_count(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &r),
          "all-reduce");
    wait(r, "all-reduce", n * sizeof(float));
  }
  void all_gather(const void* send, void* recv, size_t bytes) override {
    count(bytes);
    MPI_Request r;
    check(MPI_Iallgather(send, checked_count(bytes), MPI_BYTE, recv, checked_count(bytes), MPI_BYTE,
                         MPI_COMM_WORLD, &r),
          "all-gather");
    wait(r, "all-gather", bytes);
  }
  void all_to_all(const void* send, void* recv, size_t bytes) override {
    count(bytes * static_cast<size_t>(size_));
    MPI_Request r;
    check(MPI_Ialltoall(send, checked_count(bytes), MPI_BYTE, recv, checked_count(bytes), MPI_BYTE,
                        MPI_COMM_WORLD, &r),
          "all-to-all");
    wait(r, "all-to-all", bytes);
  }
  void broadcast(void* p, size_t bytes, int root) override {
    TESSERA_CHECK(root >= 0 && root < size_,
                  "broadcast: root " + std::to_string(root) + " is not a rank of " + std::to_string(size_));
    count(bytes);
    MPI_Request r;
    check(MPI_Ibcast(p, checked_count(bytes), MPI_BYTE, root, MPI_COMM_WORLD, &r), "broadcast");
    wait(r, "broadcast", bytes);
  }
  void barrier() override {
    count(0);
    MPI_Request r;
    check(MPI_Ibarrier(MPI_COMM_WORLD, &r), "barrier");
    wait(r, "barrier", 0);
  }

 private:
  static int checked_count(size_t n) {
    TESSERA_CHECK(n <= static_cast<size_t>(INT32_MAX),
                  "MPI: a message of " + std::to_string(n) + " elements is over MPI's count limit");
    return static_cast<int>(n);
  }
  void check(int rc, const char* what) const {
    if (rc == MPI_SUCCESS) return;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    fail("MPI " + std::string(what) + " failed on rank " + std::to_string(rank_) + ": " +
         std::string(msg, len));
  }
  // Polls the request: spins briefly (a collective between busy ranks completes in microseconds), then
  // sleeps between tests so a rank waiting for a slower one leaves it the cores.
  void wait(MPI_Request& r, const char* what, size_t bytes) {
    const auto t0 = std::chrono::steady_clock::now();
    int done = 0;
    for (int spin = 0;; ++spin) {
      check(MPI_Test(&r, &done, MPI_STATUS_IGNORE), what);
      if (done) return;
      if (spin < 2000) continue;
      std::this_thread::sleep_for(std::chrono::microseconds(spin < 20000 ? 20 : 200));
      if ((spin & 63) == 0 &&
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > timeout_s_) {
        char why[160];
        std::snprintf(why, sizeof why,
                      "the %s of %zu bytes did not complete within %.0f s: another rank died or hangs", what,
                      bytes, timeout_s_);
        end_job(why);
      }
    }
  }
  [[noreturn]] void abort_job(int code) override {
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);
  }
  int rank_ = 0, size_ = 1;
  double timeout_s_;
};

void finalize_mpi() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

}  // namespace

std::shared_ptr<Communicator> mpi_world(double timeout_s, std::string*) {
  TESSERA_CHECK(timeout_s > 0, "the collectives' timeout must be positive");
  static std::weak_ptr<Communicator> world;
  if (auto w = world.lock()) return w;
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) {
    int provided = 0;
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
      fail("MPI_Init failed: run under mpirun, or without --tp");
    std::atexit(finalize_mpi);
    // Errors come back as codes (check() turns them into one-line errors), not as MPI's own abort.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  }
  auto w = std::make_shared<MpiCommunicator>(timeout_s);
  world = w;
  return w;
}
#else
std::shared_ptr<Communicator> mpi_world(double, std::string* why) {
  if (why != nullptr)
    *why = "this tessera was built without MPI (install libopenmpi-dev and rebuild: CMake finds it)";
  return nullptr;
}
#endif

#if !(defined(TESSERA_NCCL) && defined(TESSERA_HAVE_CUDA))
std::shared_ptr<Communicator> make_nccl_communicator(std::shared_ptr<Communicator>, void*, std::string* why) {
  if (why != nullptr) *why = "this tessera was built without CUDA and NCCL (TESSERA_CUDA=ON finds NCCL)";
  return nullptr;
}
#endif

}  // namespace tessera::dist
