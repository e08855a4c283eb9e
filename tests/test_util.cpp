#include "test_util.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <numeric>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"

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

bool python_has(const std::string& module) {
  std::string log;
  return run_command(python() + " -c 'import " + module + "'", &log) == 0;
}

std::string read_text(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
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

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
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

void expect_error(const std::function<void()>& f, const std::string& want) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one containing: " << want;
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find(want), std::string::npos) << err.what();
  }
}

void expect_command_error(const std::string& cmd, const std::string& want) {
  std::string out;
  EXPECT_NE(run_command(cmd, &out), 0) << cmd << "\n" << out;
  EXPECT_NE(out.find(want), std::string::npos) << cmd << "\n" << out;
}

std::vector<float> random_floats(size_t n, uint64_t seed, float scale) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

double rel_error(const float* a, const float* b, size_t n) {
  if (n == 0) {  // nothing compared: a bound on it would pass vacuously
    ADD_FAILURE() << "rel_error over an empty set (nothing was compared)";
    return INFINITY;
  }
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    num = std::max(num, std::fabs(static_cast<double>(a[i]) - b[i]));
    den = std::max(den, std::fabs(static_cast<double>(b[i])));
  }
  return den == 0 ? num : num / den;
}

void expect_selection_matches(const std::vector<uint8_t>& got, const SparseSelection& ref,
                              const SparseSelectCase& c, int* clear_rows) {
  const int64_t g = c.prompt / c.block;
  *clear_rows = 0;
  for (int64_t r = 0; r < c.hq * ref.n_qb; ++r) {
    const uint8_t* row = got.data() + r * ref.n_kb;
    int64_t pre = 0, gen = 0;
    for (int64_t kb = 0; kb < ref.n_kb; ++kb) {
      ASSERT_TRUE(row[kb] == 0 || row[kb] == 1);
      (kb < g ? pre : gen) += row[kb];
    }
    EXPECT_EQ(pre, sparse_keep(g, c.rho));
    EXPECT_EQ(gen, sparse_keep(ref.n_kb - g, c.rho));
    if (!ref.clear[static_cast<size_t>(r)]) continue;
    ++*clear_rows;
    for (int64_t kb = 0; kb < ref.n_kb; ++kb)
      EXPECT_EQ(row[kb], ref.mask[static_cast<size_t>(r * ref.n_kb + kb)]) << "row " << r << " block " << kb;
  }
}

SparseSelection sparse_select_reference(const std::vector<float>& q, const std::vector<float>& k, int64_t mq,
                                        int64_t mk, int hq, int hkv, int d, float scale, int block, float rho,
                                        int64_t n_prompt_keys, double tie) {
  SparseSelection r;
  r.n_qb = (mq + block - 1) / block;
  r.n_kb = (mk + block - 1) / block;
  r.mask.assign(static_cast<size_t>(hq * r.n_qb * r.n_kb), 0);
  r.clear.assign(static_cast<size_t>(hq * r.n_qb), 1);
  const int64_t g = n_prompt_keys / block;
  const int group = hq / hkv;
  std::vector<double> imp(static_cast<size_t>(r.n_kb)), s(static_cast<size_t>(mk));
  for (int h = 0; h < hq; ++h) {
    for (int64_t qb = 0; qb < r.n_qb; ++qb) {
      std::fill(imp.begin(), imp.end(), 0.0);
      for (int64_t i = qb * block; i < std::min<int64_t>(qb * block + block, mq); ++i) {
        double mx = -INFINITY, sum = 0.0;
        for (int64_t j = 0; j < mk; ++j) {
          double dot = 0.0;
          for (int t = 0; t < d; ++t)
            dot += static_cast<double>(q[static_cast<size_t>(i * hq * d + h * d + t)]) *
                   k[static_cast<size_t>(j * hkv * d + (h / group) * d + t)];
          s[static_cast<size_t>(j)] = dot * scale;
          mx = std::max(mx, s[static_cast<size_t>(j)]);
        }
        for (int64_t j = 0; j < mk; ++j) sum += std::exp(s[static_cast<size_t>(j)] - mx);
        for (int64_t j = 0; j < mk; ++j)
          imp[static_cast<size_t>(j / block)] += std::exp(s[static_cast<size_t>(j)] - mx) / sum;
      }
      uint8_t* row = r.mask.data() + (h * r.n_qb + qb) * r.n_kb;
      for (auto [a, b] : {std::pair<int64_t, int64_t>{0, g}, {g, r.n_kb}}) {
        const int64_t keep = sparse_keep(b - a, rho);
        std::vector<int64_t> order(static_cast<size_t>(b - a));
        std::iota(order.begin(), order.end(), a);
        std::stable_sort(order.begin(), order.end(), [&](int64_t x, int64_t y) {
          return imp[static_cast<size_t>(x)] > imp[static_cast<size_t>(y)];
        });
        for (int64_t i = 0; i < keep; ++i) row[order[static_cast<size_t>(i)]] = 1;
        if (keep > 0 && keep < b - a) {
          const double kept = imp[static_cast<size_t>(order[static_cast<size_t>(keep - 1)])];
          const double next = imp[static_cast<size_t>(order[static_cast<size_t>(keep)])];
          if (kept - next <= tie * std::max(kept, 1e-30)) r.clear[static_cast<size_t>(h * r.n_qb + qb)] = 0;
        }
      }
    }
  }
  return r;
}

std::string word_after(const std::string& text, size_t from) {
  auto letter = [&](size_t i) { return std::isalpha(static_cast<unsigned char>(text[i])) != 0; };
  size_t a = std::min(from, text.size()), b = a;
  while (b - a < 3 && a < text.size()) {
    a = b;
    while (a < text.size() && !letter(a)) ++a;
    b = a;
    while (b < text.size() && letter(b)) ++b;
  }
  return b - a >= 3 ? text.substr(a, b - a) : std::string();
}

}  // namespace tessera::test
