// tessera: the command-line interface. Each subcommand lives in its own file (cmd_*.cpp).
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <string>
#ifdef TESSERA_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif
#include <oneapi/dnnl/dnnl.h>

#include "apps/tessera/cli_parse.h"
#include "apps/tessera/commands.h"
#include "core/error.h"
#include "dist/communicator.h"

extern const char* const tessera_build_commit;  // generated/version.cpp (cmake/version.cmake)

namespace {

// libgomp's idle threads spin 300,000 times before they sleep. When another process holds one of the
// cores, a thread waiting at a barrier spins against a sibling that cannot run, and a small step takes
// 10-50x longer (measured: tessera-tiny-moe, 64 steps, 0.4 s alone, 34 s next to a 2-thread job).
// 2,000 spins keep the uncontended speed within ~10% and bound that loss to ~5x. libgomp reads its
// settings once, when it loads, so the process starts itself again with the setting in place; a user's
// own OMP_WAIT_POLICY or GOMP_SPINCOUNT is left alone.
// The binary is started by its real path, not /proc/self/exe: the kernel names a process after the
// file it executes, and `ps`, `top` and `pgrep tessera` would see "exe".
void bound_openmp_spinning(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr || std::getenv("GOMP_SPINCOUNT") != nullptr) return;
  if (setenv("GOMP_SPINCOUNT", "2000", 1) != 0) return;
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return;
  self[n] = '\0';
  execv(self, argv);  // returns only on failure: carry on with libgomp's defaults
}

// tessera --version: the release, the commit, and what this binary can run on.
std::string version_text() {
  const dnnl_version_t* d = dnnl_version();
  std::string s = "tessera " TESSERA_VERSION " (commit " + std::string(tessera_build_commit) + ")\n";
  s += "backends: cpu (oneDNN " + std::to_string(d->major) + "." + std::to_string(d->minor) + "." +
       std::to_string(d->patch) + ", OpenMP " + std::to_string(_OPENMP) + ")";
#ifdef TESSERA_HAVE_CUDA
  s += ", cuda (CUDA " + std::to_string(CUDART_VERSION / 1000) + "." +
       std::to_string(CUDART_VERSION % 1000 / 10) + ", cuBLASLt, cuDNN 9 attention when libcudnn.so.9 loads)";
#else
  s += "; cuda not compiled in (-DTESSERA_CUDA=ON)";
#endif
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  bound_openmp_spinning(argv);
  CLI::App app{"tessera: an inference engine for diffusion language models"};
  app.name("tessera");
  app.require_subcommand(1);
  app.set_version_flag("--version", version_text, "the version, the commit and the compiled backends");
  app.footer(
      "tessera help COMMAND (or tessera COMMAND --help) describes a command.\n"
      "Example: tessera generate -p \"Once upon a time\"");
  app.option_defaults()->always_capture_default();
  tessera::cli::Registry reg;
  tessera::cli::add_generate(app, reg);
  tessera::cli::add_chat(app, reg);
  tessera::cli::add_inspect(app, reg);
  tessera::cli::add_convert(app, reg);
  tessera::cli::add_plan(app, reg);
  tessera::cli::add_eval(app, reg);
  tessera::cli::add_bench(app, reg);
  tessera::cli::add_serve(app, reg);
  tessera::cli::add_features(app, reg);
  tessera::cli::add_completion(app, reg);
  if (const auto answered = tessera::cli::answer_before_parse(app, argc, argv)) return *answered;
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return tessera::cli::report_parse_error(app, e, argc, argv);
  }
  // Tensor parallelism (--tp, under mpirun): every rank runs the command, rank 0 prints its results;
  // the others' errors still reach stderr, each naming its rank.
  const int rank = tessera::dist::launcher_size() > 1 ? tessera::dist::launcher_rank() : 0;
  if (rank > 0 && std::freopen("/dev/null", "w", stdout) == nullptr) return 1;
  const std::string who =
      rank > 0 ? "tessera: rank " + std::to_string(rank) + ": error: " : "tessera: error: ";
  try {
    for (auto& [sub, fn] : reg.handlers) {
      if (sub->parsed()) return fn();
    }
  } catch (const tessera::Error& e) {
    std::fprintf(stderr, "%s%s\n", who.c_str(), e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s%s\n", who.c_str(), e.what());
    return 1;
  }
  return 0;
}
