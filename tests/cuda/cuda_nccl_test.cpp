// NCCL, the GPUs' communicator of tensor parallelism (src/dist/comm_nccl.cpp), on one rank: the machine
// that runs these tests has one GPU, so every collective must give back its own input, queued on the
// backend's stream like the engine's kernels (the engine builds it so for --tp on --device cuda). Over
// several GPUs the same calls sum, gather and exchange across them (tests/mpi checks the layouts over MPI).
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cuda_test_util.h"
#include "dist/communicator.h"
#ifdef TESSERA_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace tessera {
namespace {

// The bootstrap of one rank: nothing to exchange; a deadline for the NCCL watchdog when one is given.
class OneRank final : public dist::Communicator {
 public:
  explicit OneRank(double deadline_s = 0) : deadline_s_(deadline_s) {}
  double deadline_s() const override { return deadline_s_; }
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const char* name() const override { return "local"; }
  void all_reduce_sum(float*, size_t) override {}
  void all_gather(const void*, void*, size_t) override { FAIL() << "not used by the bootstrap"; }
  void all_to_all(const void*, void*, size_t) override { FAIL() << "not used by the bootstrap"; }
  void broadcast(void*, size_t, int) override {}
  void barrier() override {}

 private:
  double deadline_s_;
};

using CudaNccl = test::CudaTest;

TEST_F(CudaNccl, OneRanksCollectivesGiveBackItsOwnValues) {
  std::string why;
  auto comm = dist::make_nccl_communicator(std::make_shared<OneRank>(), gpu->native_stream(), &why);
  if (!comm) GTEST_SKIP() << "no NCCL: " << why;
  ASSERT_STREQ(comm->name(), "nccl");
  ASSERT_EQ(comm->size(), 1);
  const size_t n = 1000;
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = 0.25f * static_cast<float>(i) - 7.0f;
  test::DevBuf a(*gpu, n * sizeof(float)), b(*gpu, n * sizeof(float));
  a.upload(x);
  comm->all_reduce_sum(static_cast<float*>(a.p), n);
  EXPECT_EQ(a.download<float>(n), x);
  b.poison();
  comm->all_gather(a.p, b.p, n * sizeof(float));
  EXPECT_EQ(b.download<float>(n), x);
  b.poison();
  comm->all_to_all(a.p, b.p, n * sizeof(float));
  EXPECT_EQ(b.download<float>(n), x);
  comm->broadcast(a.p, n * sizeof(float), 0);
  EXPECT_EQ(a.download<float>(n), x);
  comm->barrier();
  EXPECT_EQ(comm->stats().calls, 5);
}

// The watchdog (a 1 s deadline) times collectives, not the time between them: a rank idle for longer
// than the deadline, then queuing more, goes on.
TEST_F(CudaNccl, TheWatchdogLeavesAnIdleRankAlone) {
  std::string why;
  auto comm = dist::make_nccl_communicator(std::make_shared<OneRank>(1.0), gpu->native_stream(), &why);
  if (!comm) GTEST_SKIP() << "no NCCL: " << why;
  std::vector<float> x = {1.5f, -2.0f, 3.25f};
  test::DevBuf a(*gpu, x.size() * sizeof(float));
  a.upload(x);
  for (int round = 0; round < 3; ++round) {
    comm->all_reduce_sum(static_cast<float*>(a.p), x.size());
    EXPECT_EQ(a.download<float>(x.size()), x);
    std::this_thread::sleep_for(std::chrono::milliseconds(700));
  }
  comm->barrier();
}

#ifdef TESSERA_HAVE_CUDA
void sleep_on_the_stream(void* seconds) {
  std::this_thread::sleep_for(std::chrono::duration<double>(*static_cast<double*>(seconds)));
}

// A collective that cannot complete within the deadline (here its stream is held for 30 s, as a peer that
// never arrives would hold it) ends the process with exit code 3 and one line naming it, in about the
// deadline, not after the 30 s.
TEST_F(CudaNccl, ACollectivePastItsDeadlineEndsTheJobWithOneLine) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // the child starts CUDA afresh
  std::string why;
  if (!dist::make_nccl_communicator(std::make_shared<OneRank>(), gpu->native_stream(), &why))
    GTEST_SKIP() << "no NCCL: " << why;
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EXIT(
      {
        auto comm = dist::make_nccl_communicator(std::make_shared<OneRank>(1.0), gpu->native_stream(), &why);
        test::DevBuf a(*gpu, 4 * sizeof(float));  // (before the hold: an allocation may synchronise)
        static double hold_s = 30;
        cudaLaunchHostFunc(static_cast<cudaStream_t>(gpu->native_stream()), sleep_on_the_stream, &hold_s);
        comm->all_reduce_sum(static_cast<float*>(a.p), 4);
        gpu->synchronize();
        std::_Exit(0);
      },
      testing::ExitedWithCode(3), "rank 0 of 1: the NCCL all-reduce of 16 bytes did not complete within 1 s");
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 20.0);
}
#endif

}  // namespace
}  // namespace tessera
