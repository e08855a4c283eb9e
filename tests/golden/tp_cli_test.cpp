// The CLI's --tp under mpirun (tests/mpi checks the logits and generations of every family): the text
// two ranks print is the single process's, and a layout the launch or the model cannot take is a
// one-line error.
#include <gtest/gtest.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>

#include "test_util.h"

namespace tessera {
namespace {

std::string tiny_model() {
  return (test::source_dir() / "models" / "tessera-tiny").string();
}

std::string generate_args() {
  return " generate -m " + tiny_model() +
         " -p 'The old man walked' --gen-length 24 --steps 24 --precision f32 --threads 1";
}

// The generated tokens and text of a --json result.
std::string tokens_and_text(const std::string& out) {
  const auto j = nlohmann::json::parse(out, nullptr, false);
  if (!j.is_object() || !j.contains("tokens")) return "(not a result: " + out + ")";
  return j["tokens"].dump() + " " + j["text"].dump();
}

TEST(TensorParallelCli, WithoutALauncherTpIsRefusedInOneLine) {
  std::string out;
  EXPECT_NE(test::run_command(std::string(TESSERA_BINARY) + generate_args() + " --tp 2", &out), 0);
  EXPECT_NE(out.find("--tp 2 needs 2 processes, one per rank: run mpirun -np 2"), std::string::npos) << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
}

#ifdef TESSERA_MPIEXEC
std::string mpirun(int ranks) {
  return std::string(TESSERA_MPIEXEC) + " --allow-run-as-root --oversubscribe -np " + std::to_string(ranks) +
         " ";
}

TEST(TensorParallelCli, TwoRanksPrintTheSingleProcessText) {
  std::string one, two;
  ASSERT_EQ(test::run_command(std::string(TESSERA_BINARY) + generate_args() + " --json 2>/dev/null", &one), 0)
      << one;
  ASSERT_EQ(
      test::run_command(mpirun(2) + TESSERA_BINARY + generate_args() + " --tp 2 --json 2>/dev/null", &two), 0)
      << two;
  EXPECT_GT(nlohmann::json::parse(one)["tokens"].size(), 8u) << one;
  EXPECT_EQ(tokens_and_text(two), tokens_and_text(one));  // rank 0's result, once (one JSON line)
  // Under a memory budget every rank plans with the same runtime share (the largest measured), so their
  // steps chunk alike and their all-reduces match.
  ASSERT_EQ(test::run_command(mpirun(2) + TESSERA_BINARY + generate_args() +
                                  " --tp 2 --memory-budget 40MiB --json 2>/dev/null",
                              &two),
            0)
      << two;
  EXPECT_EQ(tokens_and_text(two), tokens_and_text(one));
}

TEST(TensorParallelCli, LayoutsThatCannotRunAreOneLineErrors) {
  std::string out;
  // 4 heads over 3 ranks: every rank refuses it at load.
  EXPECT_NE(test::run_command(mpirun(3) + TESSERA_BINARY + generate_args() + " --tp 3", &out), 0);
  EXPECT_NE(out.find("--tp 3: the model's attention heads (4) cannot be split evenly over 3 ranks"),
            std::string::npos)
      << out;
  // Two processes launched, one rank asked for.
  EXPECT_NE(test::run_command(mpirun(2) + TESSERA_BINARY + generate_args(), &out), 0);
  EXPECT_NE(out.find("this process is one of 2 started by the launcher, but --tp is 1"), std::string::npos)
      << out;
}
// A rank that dies (here: its model path does not exist) ends the job with its error; one that stops
// taking part (here: it runs fewer steps, then waits to finish) makes the others' next collective time
// out, and the job ends with a line naming it. Never a hang.
TEST(TensorParallelCli, ARankThatDiesOrStopsEndsTheJobWithAnError) {
  const std::string bin =
      std::string(TESSERA_BINARY) + " generate -p 'The old man walked' --gen-length 24 --tp 2 --threads 1";
  const std::string launch = std::string(TESSERA_MPIEXEC) + " --allow-run-as-root --oversubscribe ";
  std::string out;
  EXPECT_NE(test::run_command(launch + "-np 1 " + bin + " -m " + tiny_model() + " --steps 24 : -np 1 " + bin +
                                  " -m /nonexistent/model --steps 24",
                              &out),
            0);
  EXPECT_NE(out.find("tessera: rank 1: error: "), std::string::npos) << out;
  EXPECT_NE(out.find("/nonexistent/model"), std::string::npos) << out;
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_NE(test::run_command(launch + "-np 1 " + bin + " -m " + tiny_model() +
                                  " --steps 24 --dist-timeout 3 : -np 1 " + bin + " -m " + tiny_model() +
                                  " --steps 12 --dist-timeout 3",
                              &out),
            0);
  EXPECT_NE(out.find("did not complete within 3 s: another rank died or hangs; ending the job"),
            std::string::npos)
      << out;
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 60.0);
}
#endif

}  // namespace
}  // namespace tessera
