// Tokenizer load time and encode throughput.
// usage: tokenizer_load TOKENIZER_JSON [N=5] [TEXT_FILE]
// Prints the median load time over N loads and the encode / decode throughput (MB/s) on the text
// (default: a built-in English + multilingual paragraph repeated to ~1 MB).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/tokenizer.h"

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s TOKENIZER_JSON [N=5] [TEXT_FILE]\n", argv[0]);
    return 2;
  }
  int n = argc > 2 ? std::max(1, std::atoi(argv[2])) : 5;
  try {
    std::string text;
    if (argc > 3) {
      std::ifstream f(argv[3], std::ios::binary);
      std::stringstream ss;
      ss << f.rdbuf();
      text = ss.str();
    } else {
      const std::string para =
          "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
          "park. One day, she saw a big, red ball. It's 3:45 pm and the price is $12.99!\n"
          "    def f(x):\n        return x ** 2  # squares\n"
          "Ünïcödé naïve café, 東京は日本の首都です。Привет, мир! 🦙🚀 "
          "مرحبا "
          "بالعالم\n\n";
      while (text.size() < (1u << 20)) text += para;
    }
    std::vector<double> loads;
    tessera::Tokenizer tok = tessera::Tokenizer::from_file(argv[1]);
    for (int i = 0; i < n; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      tok = tessera::Tokenizer::from_file(argv[1]);
      loads.push_back(seconds_since(t0));
    }
    std::vector<double> enc, dec;
    std::vector<int32_t> ids;
    std::string back;
    for (int i = 0; i < 3; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      ids = tok.encode(text);
      enc.push_back(seconds_since(t0));
      t0 = std::chrono::steady_clock::now();
      back = tok.decode(ids);
      dec.push_back(seconds_since(t0));
    }
    double mb = static_cast<double>(text.size()) / 1e6;
    std::printf("tokenizer: %s (vocab %zu)\n", argv[1], tok.vocab_size());
    std::printf("load: median %.1f ms over %d loads (min %.1f, max %.1f)\n", 1e3 * median(loads), n,
                1e3 * *std::min_element(loads.begin(), loads.end()),
                1e3 * *std::max_element(loads.begin(), loads.end()));
    std::printf("encode: %.2f MB in %.1f ms -> %.2f MB/s, %zu tokens (%.2f bytes/token)\n", mb,
                1e3 * median(enc), mb / median(enc), ids.size(),
                static_cast<double>(text.size()) / static_cast<double>(ids.size()));
    std::printf("decode: %.1f ms -> %.2f MB/s, round trip %s\n", 1e3 * median(dec), mb / median(dec),
                back.size() == text.size() ? "same length" : "length differs (NFC)");
  } catch (const tessera::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
