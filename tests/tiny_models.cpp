#include "tiny_models.h"

#include <gtest/gtest.h>

#include <fstream>
#include <map>

#include "backend/backend.h"
#include "io/safetensors.h"
#include "test_util.h"

namespace tessera::test {

CheckpointParams checkpoint_params(const std::filesystem::path& dir) {
  CheckpointParams p;
  const Checkpoint ck = Checkpoint::open(dir);
  for (const auto& [name, t] : ck.tensors()) {
    p.total += t.numel();
    if (name.find(".mlp.experts.") != std::string::npos) p.routed_experts += t.numel();
  }
  return p;
}

std::string join_ids(const std::vector<int32_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s;
}

std::filesystem::path tiny_checkpoint(const std::string& family, const std::string& extra_args,
                                      std::string* why) {
  static std::map<std::string, std::filesystem::path> made;
  const std::string key = family + "|" + extra_args;
  if (auto it = made.find(key); it != made.end()) return it->second;
  std::string out;
  if (run_command(python() + " -c 'import numpy'", &out) != 0) {
    *why = python() + " with numpy is not available (apt-get install python3-numpy)";
    return {};
  }
  const auto dir = temp_dir("tiny_" + family + "_" + std::to_string(made.size()));
  const std::string cmd = python() + " " + (source_dir() / "tools/make_tiny_checkpoint.py").string() +
                          " --family " + family + " --out " + dir.string() + " " + extra_args;
  if (run_command(cmd, &out) != 0) {
    ADD_FAILURE() << "make_tiny_checkpoint failed: " << cmd << "\n" << out;
    *why = "make_tiny_checkpoint failed";
    return {};
  }
  made[key] = dir;
  return dir;
}

namespace {
std::vector<float> read_floats(const std::filesystem::path& p, size_t n) {
  std::vector<float> v(n);
  std::ifstream f(p, std::ios::binary);
  f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(n * 4));
  EXPECT_EQ(static_cast<size_t>(f.gcount()), n * 4) << "reference output size of " << p;
  std::filesystem::remove(p);
  return v;
}
}  // namespace

std::vector<float> reference_logits(const std::filesystem::path& model, const std::vector<int32_t>& tokens,
                                    const std::vector<int32_t>& rows, int64_t vocab,
                                    std::vector<float>* margins, const std::string& extra_args) {
  const auto out = model / ("ref_" + std::to_string(::getpid()) + ".bin");
  const auto mout = model / ("ref_margins_" + std::to_string(::getpid()) + ".bin");
  const std::string cmd = python() + " " + (source_dir() / "tests/reference/reference.py").string() +
                          " logits --model " + model.string() + " --tokens " + join_ids(tokens) + " --rows " +
                          join_ids(rows) + " --out " + out.string() +
                          (margins != nullptr ? " --margins " + mout.string() : "") + " " + extra_args;
  std::string log;
  if (run_command(cmd, &log) != 0) {
    ADD_FAILURE() << "reference failed: " << cmd << "\n" << log;
    return {};
  }
  if (margins != nullptr) *margins = read_floats(mout, rows.size());
  return read_floats(out, rows.size() * static_cast<size_t>(vocab));
}

std::vector<int32_t> random_canvas(int64_t n, int64_t vocab, uint64_t seed, int32_t mask, double mask_ratio) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  uint64_t s = seed;
  for (auto& x : t) {
    s = rng_mix(s);
    x = static_cast<int32_t>(s % static_cast<uint64_t>(vocab));
    if (static_cast<double>(rng_mix(s) % 1000) / 1000.0 < mask_ratio) x = mask;
  }
  return t;
}

std::vector<int32_t> all_positions(int64_t n) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) p[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  return p;
}

}  // namespace tessera::test
