// Helpers shared by the tests: paths of shared/ and the source tree, skip helpers, random data.
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace tessera::test {

std::filesystem::path shared_dir();
std::filesystem::path source_dir();
std::string python();
// Whether Python (python()) can import `module` (the oracles: jinja2, jsonschema).
bool python_has(const std::string& module);
// The bytes of a file ("" when it cannot be read).
std::string read_text(const std::filesystem::path& p);
// A fresh empty temporary directory, removed at process exit.
std::filesystem::path temp_dir(const std::string& name);
// Runs a shell command; returns its exit code and fills *out with stdout+stderr.
int run_command(const std::string& cmd, std::string* out);
// `s` as one shell word (single quotes; a ' inside written '\'').
std::string shell_quote(const std::string& s);
// Expects f() to throw tessera::Error whose message contains `want`.
void expect_error(const std::function<void()>& f, const std::string& want);
// Expects the shell command to fail with `want` in its stdout+stderr.
void expect_command_error(const std::string& cmd, const std::string& want);
// The first word of 3 or more ASCII letters that starts at or after offset `from` of text ("" if none).
std::string word_after(const std::string& text, size_t from);
std::vector<float> random_floats(size_t n, uint64_t seed, float scale = 1.0f);
// max_i |a-b| / max_i |b| (a norm-wise relative error that ignores tiny-element noise). n == 0 is a
// test failure (ADD_FAILURE) and returns infinity: an empty comparison must not pass a bound.
double rel_error(const float* a, const float* b, size_t n);

// SparseD selection computed in double, straight from the definition (Backend::sparse_select): q [mq,
// hq*d], k [mk, hkv*d] row-major f32. mask [hq, n_qb, n_kb]; clear[(h, qb)] is false where the
// selection of that query block is a near tie (a kept and a dropped block of one set within `tie`
// relative importance), where two correct implementations may differ by rounding.
struct SparseSelection {
  std::vector<uint8_t> mask, clear;
  int64_t n_qb = 0, n_kb = 0;
};
// One shape of the sparse_select tests (CPU and CUDA).
struct SparseSelectCase {
  int hq, hkv, d;
  int64_t mq, mk;
  int block;
  float rho;
  int64_t prompt;
};
SparseSelection sparse_select_reference(const std::vector<float>& q, const std::vector<float>& k, int64_t mq,
                                        int64_t mk, int hq, int hkv, int d, float scale, int block, float rho,
                                        int64_t n_prompt_keys, double tie = 1e-4);
// Checks a sparse_select mask `got` (c.hq * ref.n_qb rows of ref.n_kb blocks) against the reference: every
// entry 0 or 1 (fatal otherwise), each row keeping sparse_keep() blocks of the prompt and of the
// generation, and the rows the reference calls clear equal to its mask; *clear_rows counts those rows.
void expect_selection_matches(const std::vector<uint8_t>& got, const SparseSelection& ref,
                              const SparseSelectCase& c, int* clear_rows);

}  // namespace tessera::test

#define TESSERA_SKIP_WITHOUT_SHARED(sub)                                         \
  do {                                                                           \
    if (!std::filesystem::exists(::tessera::test::shared_dir() / (sub)))         \
      GTEST_SKIP() << "../shared/" << (sub) << " is absent; this test needs it"; \
  } while (0)
