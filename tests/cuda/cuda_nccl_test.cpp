// NCCL, the GPUs' communicator of tensor parallelism (src/dist/comm_nccl.cpp), on one rank: the machine
// that runs these tests has one GPU, so every collective must give back its own input, queued on the
// backend's stream like the engine's kernels (the engine builds it so for --tp on --device cuda). Over
// several GPUs the same calls sum, gather and exchange across them (tests/mpi checks the layouts over MPI).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "dist/communicator.h"

namespace tessera {
namespace {

// The bootstrap of one rank: nothing to exchange.
class OneRank final : public dist::Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const char* name() const override { return "local"; }
  void all_reduce_sum(float*, size_t) override {}
  void all_gather(const void*, void*, size_t) override { FAIL() << "not used by the bootstrap"; }
  void all_to_all(const void*, void*, size_t) override { FAIL() << "not used by the bootstrap"; }
  void broadcast(void*, size_t, int) override {}
  void barrier() override {}
};

using CudaNccl = test::CudaTest;

TEST_F(CudaNccl, OneRanksCollectivesGiveBackItsOwnValues) {
  OneRank boot;
  std::string why;
  auto comm = dist::make_nccl_communicator(boot, gpu->native_stream(), &why);
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

}  // namespace
}  // namespace tessera
