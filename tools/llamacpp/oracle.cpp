// llamacpp-oracle: a small command-line front end to the REAL llama.cpp (the prebuilt libllama of
// node-llama-cpp 3.22.1 = llama.cpp release v0.5.0, fetched by scripts/fetch_llamacpp.sh), used to check
// tessera's GGUF loading and forward pass against llama.cpp.
//
// Build (scripts/fetch_llamacpp.sh does this; D = the fetch directory, default <repo>/.llamacpp):
//   g++ -std=c++17 -O2 -o $D/bin/llamacpp-oracle tools/llamacpp/oracle.cpp -I$D/include -L$D/lib
//   -l:libllama.v0.5.0.so -l:libggml.v0.5.0.so -l:libggml-base.so -Wl,-rpath,$D/lib
//
// Usage:
//   llamacpp-oracle logits   MODEL.gguf IDS OUT.f32      IDS = comma-separated token ids; one llama_decode
//   over
//                                                        all of them (positions 0..n-1, one sequence, logits
//                                                        of every row); writes [n, n_vocab] float32
//                                                        little-endian, prints n_vocab. Raw logits of each
//                                                        position: NO diffusion logit shift (Dream) is
//                                                        applied.
//   llamacpp-oracle tokenize MODEL.gguf TEXT             ids of llama.cpp's tokenizer (add_special false,
//                                                        parse_special true), comma-separated
//   llamacpp-oracle bench    MODEL.gguf N REPS           REPS full forwards over N tokens after one warm-up;
//                                                        prints the median ms per forward and the rows
//                                                        computed
//   llamacpp-oracle info     MODEL.gguf                  model sizes and every GGUF metadata key / value
// Options (anywhere after the subcommand; "--" ends them, e.g. for a TEXT starting with "--"):
//   --threads T   CPU threads (default 1)
//   --lib DIR     directory of the ggml backend libraries (libggml-cpu-*.so); default: $LLAMACPP_LIB, else
//                 <dir of this executable>/../lib, else ggml's own search (ggml_backend_load_all)
//   --flash-attn  enable flash attention (default off: with it llama.cpp casts K/V to f16, which costs
//                 ~1e-3 of accuracy; off keeps the forward all-f32 for f32 weights)
//   --verbose     show llama.cpp's log (default: errors only)
//
// The diffusion architectures (llada, dream, llada-moe) have no KV cache in llama.cpp; llama_decode runs
// them through the encoder path, non-causal (hparams.causal_attn = false is set by the loader for these
// archs, and llama_set_causal_attn(ctx, false) is called here as well), in a single ubatch, so
// n_ctx = n_batch = n_ubatch = n.

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "ggml-backend.h"
#include "ggml.h"
#include "llama.h"

namespace {

bool g_verbose = false;

void log_cb(enum ggml_log_level level, const char* text, void*) {
  static bool last_shown = false;
  bool show = g_verbose || level == GGML_LOG_LEVEL_ERROR || (level == GGML_LOG_LEVEL_CONT && last_shown);
  if (level != GGML_LOG_LEVEL_CONT) last_shown = show;
  if (show) fputs(text, stderr);
}

[[noreturn]] void die(const std::string& msg) {
  fprintf(stderr, "llamacpp-oracle: error: %s\n", msg.c_str());
  exit(1);
}

void usage() {
  fprintf(stderr,
          "usage: llamacpp-oracle logits   MODEL.gguf IDS OUT.f32 [--threads T]\n"
          "       llamacpp-oracle tokenize MODEL.gguf TEXT\n"
          "       llamacpp-oracle bench    MODEL.gguf N REPS [--threads T]\n"
          "       llamacpp-oracle info     MODEL.gguf\n"
          "options: --threads T  --lib DIR  --flash-attn  --verbose\n");
  exit(2);
}

bool is_dir(const std::string& p) {
  struct stat st {};
  return stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::string exe_dir() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "";
  buf[n] = 0;
  std::string s(buf);
  size_t k = s.rfind('/');
  return k == std::string::npos ? "." : s.substr(0, k);
}

struct Opts {
  int threads = 1;
  std::string lib;
  bool flash_attn = false;
  std::vector<std::string> pos;  // positional arguments after the subcommand
};

void load_backends(const Opts& o) {
  std::string dir = o.lib;
  if (dir.empty()) {
    if (const char* e = getenv("LLAMACPP_LIB")) dir = e;
  }
  if (dir.empty()) {
    std::string d = exe_dir() + "/../lib";
    if (is_dir(d)) dir = d;
  }
  if (!dir.empty()) {
    if (!is_dir(dir)) die("backend directory '" + dir + "' does not exist");
    ggml_backend_load_all_from_path(dir.c_str());
  } else {
    ggml_backend_load_all();
  }
  if (ggml_backend_dev_count() == 0) {
    die("no ggml backend could be loaded" +
        (dir.empty() ? std::string(" (ggml_backend_load_all)") : " from '" + dir + "'") +
        ": the CPU backend is a dlopen'ed libggml-cpu-<variant>.so next to libggml; pass --lib DIR or set "
        "LLAMACPP_LIB (run with --verbose for ggml's messages)");
  }
}

llama_model* load_model(const std::string& path, bool vocab_only) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) die("model file '" + path + "' not found");
  llama_model_params mp = llama_model_default_params();
  mp.n_gpu_layers = 0;
  mp.vocab_only = vocab_only;
  llama_model* m = llama_model_load_from_file(path.c_str(), mp);
  if (!m) die("llama.cpp could not load '" + path + "' (run with --verbose for its log)");
  return m;
}

llama_context* make_context(llama_model* m, int n, const Opts& o) {
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = (uint32_t)n;
  cp.n_batch = (uint32_t)n;
  cp.n_ubatch = (uint32_t)n;
  cp.n_seq_max = 1;
  cp.n_threads = o.threads;
  cp.n_threads_batch = o.threads;
  cp.flash_attn_type = o.flash_attn ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
  cp.no_perf = true;
  cp.embeddings = false;
  llama_context* ctx = llama_init_from_model(m, cp);
  if (!ctx) die("llama_init_from_model failed (run with --verbose for its log)");
  llama_set_causal_attn(ctx, false);
  return ctx;
}

std::vector<llama_token> parse_ids(const std::string& s) {
  std::vector<llama_token> ids;
  size_t i = 0;
  while (i <= s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    std::string t = s.substr(i, j - i);
    t.erase(0, t.find_first_not_of(" \t"));
    t.erase(t.find_last_not_of(" \t") + 1);
    if (!t.empty()) {
      char* end = nullptr;
      long v = strtol(t.c_str(), &end, 10);
      if (*end || v < 0 || v > INT32_MAX) die("bad token id '" + t + "'");
      ids.push_back((llama_token)v);
    }
    i = j + 1;
  }
  return ids;
}

// One forward over ids (positions 0..n-1, sequence 0, logits of every row). Returns 0 on success.
int forward(llama_context* ctx, const std::vector<llama_token>& ids) {
  const int n = (int)ids.size();
  llama_batch b = llama_batch_init(n, 0, 1);
  for (int i = 0; i < n; ++i) {
    b.token[i] = ids[i];
    b.pos[i] = i;
    b.n_seq_id[i] = 1;
    b.seq_id[i][0] = 0;
    b.logits[i] = 1;
  }
  b.n_tokens = n;
  int rc = llama_decode(ctx, b);
  llama_synchronize(ctx);
  llama_batch_free(b);
  return rc;
}

int cmd_logits(const Opts& o) {
  if (o.pos.size() != 3) usage();
  std::vector<llama_token> ids = parse_ids(o.pos[1]);
  if (ids.empty()) die("no token ids given");
  load_backends(o);
  llama_model* m = load_model(o.pos[0], false);
  const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(m));
  for (llama_token t : ids)
    if (t >= n_vocab) die("token id " + std::to_string(t) + " >= n_vocab " + std::to_string(n_vocab));
  llama_context* ctx = make_context(m, (int)ids.size(), o);
  if (int rc = forward(ctx, ids)) die("llama_decode returned " + std::to_string(rc));
  FILE* f = fopen(o.pos[2].c_str(), "wb");
  if (!f) die("cannot write '" + o.pos[2] + "'");
  for (int i = 0; i < (int)ids.size(); ++i) {
    const float* row = llama_get_logits_ith(ctx, i);
    if (!row) die("no logits for row " + std::to_string(i));
    // floats are little-endian on every platform node-llama-cpp ships x64 binaries for
    if (fwrite(row, sizeof(float), (size_t)n_vocab, f) != (size_t)n_vocab) die("write failed");
  }
  if (fclose(f) != 0) die("write failed");
  printf("%d\n", n_vocab);
  llama_free(ctx);
  llama_model_free(m);
  return 0;
}

int cmd_tokenize(const Opts& o) {
  if (o.pos.size() != 2) usage();
  load_backends(o);
  llama_model* m = load_model(o.pos[0], true);
  const llama_vocab* v = llama_model_get_vocab(m);
  const std::string& text = o.pos[1];
  std::vector<llama_token> toks(text.size() + 16);
  int n =
      llama_tokenize(v, text.data(), (int32_t)text.size(), toks.data(), (int32_t)toks.size(), false, true);
  if (n < 0) {
    toks.resize((size_t)-n);
    n = llama_tokenize(v, text.data(), (int32_t)text.size(), toks.data(), (int32_t)toks.size(), false, true);
  }
  if (n < 0) die("llama_tokenize failed");
  std::string out;
  for (int i = 0; i < n; ++i) out += (i ? "," : "") + std::to_string(toks[i]);
  printf("%s\n", out.c_str());
  llama_model_free(m);
  return 0;
}

int cmd_bench(const Opts& o) {
  if (o.pos.size() != 3) usage();
  const int n = atoi(o.pos[1].c_str()), reps = atoi(o.pos[2].c_str());
  if (n <= 0 || reps <= 0) die("N and REPS must be positive");
  load_backends(o);
  llama_model* m = load_model(o.pos[0], false);
  const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(m));
  std::vector<llama_token> ids(n);
  for (int i = 0; i < n; ++i) ids[i] = (llama_token)((1000003LL * i + 7) % n_vocab);
  llama_context* ctx = make_context(m, n, o);
  if (int rc = forward(ctx, ids)) die("warm-up llama_decode returned " + std::to_string(rc));
  std::vector<double> ms;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    if (int rc = forward(ctx, ids)) die("llama_decode returned " + std::to_string(rc));
    auto t1 = std::chrono::steady_clock::now();
    ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  std::vector<double> s = ms;
  std::sort(s.begin(), s.end());
  double med = s.size() % 2 ? s[s.size() / 2] : 0.5 * (s[s.size() / 2 - 1] + s[s.size() / 2]);
  printf("tokens %d reps %d threads %d\n", n, reps, o.threads);
  printf("ms_per_forward_median %.3f (min %.3f, max %.3f)\n", med, s.front(), s.back());
  printf("logits_rows %d (x %d vocab)\n", n, n_vocab);
  printf("tokens_per_s %.1f\n", n / (med / 1000.0));
  llama_free(ctx);
  llama_model_free(m);
  return 0;
}

int cmd_info(const Opts& o) {
  if (o.pos.size() != 1) usage();
  load_backends(o);
  llama_model* m = load_model(o.pos[0], false);
  const llama_vocab* v = llama_model_get_vocab(m);
  char desc[256];
  llama_model_desc(m, desc, sizeof(desc));
  printf("desc %s\nn_vocab %d\nn_embd %d\nn_layer %d\nn_head %d\nn_head_kv %d\nn_ctx_train %d\n", desc,
         llama_vocab_n_tokens(v), llama_model_n_embd(m), llama_model_n_layer(m), llama_model_n_head(m),
         llama_model_n_head_kv(m), llama_model_n_ctx_train(m));
  printf("bos %d eos %d pad %d mask %d add_bos %d\n", llama_vocab_bos(v), llama_vocab_eos(v),
         llama_vocab_pad(v), llama_vocab_mask(v), (int)llama_vocab_get_add_bos(v));
  const int nk = llama_model_meta_count(m);
  std::vector<char> key(512), val(1 << 16);
  for (int i = 0; i < nk; ++i) {
    llama_model_meta_key_by_index(m, i, key.data(), key.size());
    llama_model_meta_val_str_by_index(m, i, val.data(), val.size());
    std::string vs(val.data());
    if (vs.size() > 160) vs = vs.substr(0, 160) + "...";
    for (char& c : vs)
      if (c == '\n') c = ' ';
    printf("meta %s = %s\n", key.data(), vs.c_str());
  }
  llama_model_free(m);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) usage();
  std::string cmd = argv[1];
  Opts o;
  bool verbose = false, opts_done = false;
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    if (opts_done) {
      o.pos.push_back(a);
    } else if (a == "--") {
      opts_done = true;
    } else if (a == "--threads" && i + 1 < argc) {
      o.threads = atoi(argv[++i]);
      if (o.threads <= 0) die("--threads must be positive");
    } else if (a == "--lib" && i + 1 < argc) {
      o.lib = argv[++i];
    } else if (a == "--flash-attn") {
      o.flash_attn = true;
    } else if (a == "--verbose") {
      verbose = true;
    } else if (a.size() > 2 && a.rfind("--", 0) == 0) {
      die("unknown option '" + a + "'");
    } else {
      o.pos.push_back(a);
    }
  }
  g_verbose = verbose;
  llama_log_set(log_cb, nullptr);
  llama_backend_init();
  int rc;
  if (cmd == "logits")
    rc = cmd_logits(o);
  else if (cmd == "tokenize")
    rc = cmd_tokenize(o);
  else if (cmd == "bench")
    rc = cmd_bench(o);
  else if (cmd == "info")
    rc = cmd_info(o);
  else
    usage();
  llama_backend_free();
  return rc;
}
