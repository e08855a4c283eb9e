#include "test_util.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

namespace tessera::test {

std::filesystem::path shared_dir() {
  if (const char* e = std::getenv("TESSERA_SHARED_DIR")) return e;
  return TESSERA_SHARED_DIR;
}
std::filesystem::path source_dir() {
  if (const char* e = std::getenv("TESSERA_SOURCE_DIR")) return e;  // the tree copied to another machine
  return TESSERA_SOURCE_DIR;
}
std::string python() {
  if (const char* e = std::getenv("TESSERA_PYTHON")) return e;
  return TESSERA_PYTHON;
}

namespace {
// The temporary folders of this process, removed when it exits (set TESSERA_KEEP_TEMP to keep them).
struct TempDirs {
  std::vector<std::filesystem::path> dirs;
  ~TempDirs() {
    if (std::getenv("TESSERA_KEEP_TEMP") != nullptr) return;
    std::error_code ec;
    for (const auto& d : dirs) std::filesystem::remove_all(d, ec);
  }
};
TempDirs& temp_dirs() {
  static TempDirs t;
  return t;
}
}  // namespace

std::filesystem::path temp_dir(const std::string& name) {
  auto p =
      std::filesystem::temp_directory_path() / ("tessera_test_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  temp_dirs().dirs.push_back(p);
  return p;
}

int run_command(const std::string& cmd, std::string* out) {
  std::string full = cmd + " 2>&1";
  FILE* f = popen(full.c_str(), "r");
  if (f == nullptr) return -1;
  char buf[4096];
  std::string s;
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, n);
  int rc = pclose(f);
  if (out != nullptr) *out = s;
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

std::vector<float> random_floats(size_t n, uint64_t seed, float scale) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

double rel_error(const float* a, const float* b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    num = std::max(num, std::fabs(static_cast<double>(a[i]) - b[i]));
    den = std::max(den, std::fabs(static_cast<double>(b[i])));
  }
  return den == 0 ? num : num / den;
}

}  // namespace tessera::test
