// tessera plan: the memory plan of one step of a real geometry, without weights: activation peak,
// live lower bound, peak-to-average ratio, the chunk counts the lazy chunking optimizer picks for a
// budget, planning and search time, and the largest context that fits; optionally the memory
// timeline as SVG (op index across, offset up, one rectangle per tensor).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "apps/tessera/cli_session.h"
#include "apps/tessera/commands.h"
#include "core/error.h"
#include "io/config.h"
#include "io/gguf.h"
#include "memory/chunk_optimizer.h"
#include "models/model.h"

namespace tessera::cli {
namespace {

using json = nlohmann::json;

struct PlanArgs {
  std::string model, geometry, budget, svg, device = "cpu";
  int64_t context = 0;
  double mask_ratio = 0.5;
  bool json = false;
  bool cache = false;  // a KV cache (--cache prefix|dual) is held for the request
  int64_t sparse = 0;  // > 0: SparseD patterns with tiles of this many positions are held
};

// One planned step with its figures.
struct Planned {
  graph::Program prog;
  memory::ActivationStats stats;
  double plan_ms = 0;
};

Planned plan_step(const graph::GraphTemplate& g, graph::StepShape s, int64_t k_ffn, int64_t k_logits) {
  s.k_ffn = k_ffn;
  s.k_logits = k_logits;
  const auto t0 = std::chrono::steady_clock::now();
  Planned p{graph::instantiate(g, s), {}, 0};
  memory::plan(g, p.prog);
  p.plan_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  p.stats = memory::activation_stats(g, p.prog);
  return p;
}

json stats_json(const Planned& p) {
  return {{"k_ffn", p.prog.shape.k_ffn},
          {"k_logits", p.prog.shape.k_logits},
          {"peak_bytes", p.stats.peak},
          {"lower_bound_bytes", p.stats.lower_bound},
          {"average_live_bytes", p.stats.average},
          {"peak_to_average", p.stats.peak_to_average()},
          {"plan_ms", p.plan_ms}};
}

// ---- SVG timeline ------------------------------------------------------------------------------

struct Kind {
  const char* label;
  const char* colour;
};
constexpr Kind kKinds[] = {{"residual x", "#4e79a7"},   {"attention", "#59a14f"},  {"FFN chunk", "#f28e2b"},
                           {"logits chunk", "#e15759"}, {"norm", "#b07aa1"},       {"step inputs", "#9c9c9c"},
                           {"outputs", "#76b7b2"},      {"full logits", "#ff9da7"}};

int kind_of(const graph::TensorDecl& d) {
  if (d.rows == graph::Sym::FfnRows) return 2;
  if (d.rows == graph::Sym::LogitRows) return 3;
  if (d.kind == graph::TensorKind::Input) return 5;
  if (d.kind == graph::TensorKind::Output) return d.cols > 1 ? 7 : 6;
  if (d.name == "x") return 0;
  if (d.name.find("norm") != std::string::npos) return 4;
  return 1;  // q, k, v, attn_out, K/V staging
}

std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) o += c == '<' ? std::string("&lt;") : c == '&' ? std::string("&amp;") : std::string(1, c);
  return o;
}

// Tick steps: 1, 2 or 5 times a power of ten for op indices; a power of two for bytes.
double nice_step(double range, int n) {
  double unit = 1;
  while (unit * 10 <= range / n) unit *= 10;
  for (double m : {1.0, 2.0, 5.0}) {
    if (unit * m >= range / n) return unit * m;
  }
  return unit * 10;
}
double byte_step(double range, int n) {
  double step = 1;
  while (step < range / n) step *= 2;
  return step;
}

void write_svg(const std::string& path, const graph::GraphTemplate& g, const Planned& p,
               const std::string& title, size_t activation_budget) {
  const double W = 1400, H = 720, left = 96, right = 200, top = 56, bottom = 64;
  const double pw = W - left - right, ph = H - top - bottom;
  const int n_ops = static_cast<int>(g.ops().size()) + 1;  // outputs live one past the last op
  // The budget line is drawn when it is within twice the peak (else the tensors would be squeezed).
  const size_t shown =
      activation_budget <= 2 * p.prog.peak ? std::max(activation_budget, p.prog.peak) : p.prog.peak;
  const double ymax = static_cast<double>(std::max<size_t>(shown, 1)) * 1.08;
  const auto X = [&](double t) { return left + t * pw / n_ops; };
  const auto Y = [&](double off) { return top + ph - off * ph / ymax; };
  std::ofstream f(path);
  if (!f) fail("--svg: cannot write " + path);
  char buf[512];
  f << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H << "\" viewBox=\"0 0 "
    << W << " " << H
    << "\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" "
       "fill=\"white\"/>\n";
  f << "<text x=\"" << left << "\" y=\"24\" font-size=\"16\" font-weight=\"bold\">" << esc(title)
    << "</text>\n";
  std::string sub = "activation peak " + human_bytes(static_cast<double>(p.prog.peak)) +
                    ", live lower bound " + human_bytes(static_cast<double>(p.stats.lower_bound)) +
                    ", peak / average live " + std::to_string(p.stats.peak_to_average()).substr(0, 4) + "x";
  if (activation_budget > 0)
    sub += ", activation budget " + human_bytes(static_cast<double>(activation_budget));
  f << "<text x=\"" << left << "\" y=\"44\" fill=\"#404040\">" << esc(sub) << "</text>\n";
  // Tensors: one rectangle per buffer (aliases share their root's), tooltip with name, size, ops.
  const auto& decls = g.tensors();
  for (size_t i = 0; i < decls.size(); ++i) {
    const graph::TensorDecl& d = decls[i];
    const graph::InstTensor& t = p.prog.tensors[i];
    if (d.kind == graph::TensorKind::Weight || d.alias_of >= 0 || t.bytes == 0) continue;
    const double x0 = X(t.first), x1 = std::max(X(t.last + 1), x0 + 1.0);
    const double y1 = Y(static_cast<double>(t.offset)), y0 = Y(static_cast<double>(t.offset + t.bytes));
    std::snprintf(buf, sizeof buf,
                  "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.2f\" fill=\"%s\" stroke=\"white\" "
                  "stroke-width=\"0.3\"><title>%s: %s, ops %d-%d, offset %s</title></rect>\n",
                  x0, y0, x1 - x0, std::max(y1 - y0, 0.5), kKinds[kind_of(d)].colour,
                  esc(d.full_name()).c_str(), human_bytes(static_cast<double>(t.bytes)).c_str(), t.first,
                  t.last, human_bytes(static_cast<double>(t.offset)).c_str());
    f << buf;
  }
  // Axes, ticks and grid.
  f << "<g stroke=\"black\"><line x1=\"" << left << "\" y1=\"" << top + ph << "\" x2=\"" << left + pw
    << "\" y2=\"" << top + ph << "\"/><line x1=\"" << left << "\" y1=\"" << top << "\" x2=\"" << left
    << "\" y2=\"" << top + ph << "\"/></g>\n";
  const double xs = nice_step(n_ops, 10);
  for (double t = 0; t <= n_ops; t += xs) {
    std::snprintf(buf, sizeof buf,
                  "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/><text x=\"%.1f\" "
                  "y=\"%.1f\" text-anchor=\"middle\">%.0f</text>\n",
                  X(t), top + ph, X(t), top + ph + 5, X(t), top + ph + 19, t);
    f << buf;
  }
  const double ys = byte_step(ymax, 8);
  for (double o = 0; o <= ymax; o += ys) {
    std::snprintf(
        buf, sizeof buf,
        "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#dddddd\"/><text x=\"%.1f\" "
        "y=\"%.1f\" text-anchor=\"end\">%s</text>\n",
        left, Y(o), left + pw, Y(o), left - 6, Y(o) + 4, human_bytes(o).c_str());
    f << buf;
  }
  std::snprintf(
      buf, sizeof buf,
      "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">op index (%d ops)</text>\n<text "
      "transform=\"translate(18 %.1f) rotate(-90)\" text-anchor=\"middle\">offset in the workspace</text>\n",
      left + pw / 2, H - 18, n_ops - 1, top + ph / 2);
  f << buf;
  // Peak, lower bound and budget lines.
  const auto hline = [&](double v, const char* colour, const char* dash, const std::string& label) {
    if (v > ymax) return;
    std::snprintf(buf, sizeof buf,
                  "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"1.5\" "
                  "stroke-dasharray=\"%s\"/><text x=\"%.1f\" y=\"%.1f\" fill=\"%s\">%s</text>\n",
                  left, Y(v), left + pw, Y(v), colour, dash, left + pw + 6, Y(v) + 4, colour,
                  esc(label).c_str());
    f << buf;
  };
  hline(static_cast<double>(p.prog.peak), "#c00000", "6 3",
        "peak " + human_bytes(static_cast<double>(p.prog.peak)));
  if (p.stats.lower_bound + ymax / 40 < p.prog.peak)
    hline(static_cast<double>(p.stats.lower_bound), "#404040", "2 2",
          "lower bound " + human_bytes(static_cast<double>(p.stats.lower_bound)));
  if (activation_budget > 0)
    hline(static_cast<double>(activation_budget), "#0060c0", "10 4",
          "budget " + human_bytes(static_cast<double>(activation_budget)));
  // Legend (the kinds present), at the bottom right, clear of the peak and budget labels.
  bool present[std::size(kKinds)] = {};
  for (size_t i = 0; i < decls.size(); ++i) {
    if (decls[i].kind != graph::TensorKind::Weight && p.prog.tensors[i].bytes > 0)
      present[kind_of(decls[i])] = true;
  }
  double ly = top + ph - 20.0 * static_cast<double>(std::count(std::begin(present), std::end(present), true));
  for (size_t k = 0; k < std::size(kKinds); ++k) {
    if (!present[k]) continue;
    std::snprintf(buf, sizeof buf,
                  "<rect x=\"%.1f\" y=\"%.1f\" width=\"14\" height=\"12\" fill=\"%s\"/><text x=\"%.1f\" "
                  "y=\"%.1f\">%s</text>\n",
                  left + pw + 16, ly, kKinds[k].colour, left + pw + 36, ly + 10, kKinds[k].label);
    f << buf;
    ly += 20;
  }
  f << "</svg>\n";
}

// ---- the command ----------------------------------------------------------------------------------

int run_plan(const PlanArgs& a) {
  ModelConfig c;
  DType act = DType::BF16;
  std::string name = a.geometry;
  std::optional<WeightSummary> gguf;  // a GGUF file: its tensors (quantized ones kept so on the CPU)
  if (!a.model.empty()) {
    c = load_config(a.model);  // config.json only (a GGUF: its directory): no weights are read
    if (is_gguf_file(a.model)) {
      gguf = summarize_weights(a.model);
      act = gguf->act;
    } else {
      std::ifstream f(a.model + "/config.json");
      const json j = json::parse(f, nullptr, false);
      if (j.is_object() && j.value("torch_dtype", std::string()) == "float32") act = DType::F32;
    }
    name = a.model;
  } else {
    c = named_geometry(a.geometry);
  }
  if (a.context < 1) fail("--context must be at least 1 token");
  // CUDA plans the bf16 K / V staging of its flash attention and converts quantized GGUF tensors at load.
  const bool cuda = a.device == "cuda";
  const graph::GraphTemplate g =
      build_dense_graph(shape_only_weights(c, act), graph_options(c, act, cuda ? Device::CUDA : Device::CPU),
                        OutputMode::Sample);
  // A GGUF's weights as the device loads them: CUDA converts its quantized tensors.
  const size_t weights = !gguf ? static_cast<size_t>(c.param_count()) * dtype_size(act)
                         : cuda && gguf->dequantized_bytes > 0 ? gguf->dequantized_bytes
                                                               : gguf->bytes;
  const size_t budget = a.budget.empty() ? 0 : memory::parse_size(a.budget);
  const size_t per_token =
      a.cache ? static_cast<size_t>(c.kv_cache_bytes_per_token(static_cast<int64_t>(dtype_size(act)))) : 0;
  const size_t kv = per_token * static_cast<size_t>(a.context);
  const auto patterns = [&](int64_t L) {
    return a.sparse > 0 ? static_cast<size_t>(c.sparse_pattern_bytes(L, a.sparse)) : size_t{0};
  };
  const size_t held = kv + patterns(a.context);
  const size_t act_budget = budget > weights + held ? budget - weights - held : 0;
  const graph::StepShape s = memory::step_shape(a.context, a.mask_ratio);

  const Planned unchunked = plan_step(g, s, 1, 1);
  const size_t floor = memory::chunk_floor(g, s);
  memory::ChunkChoice choice;
  choice.fits = true;
  int64_t l_max = -1;
  if (budget > 0) {
    choice = memory::choose_chunks(g, s, act_budget);
    l_max = budget > weights
                ? memory::largest_context(
                      g, a.mask_ratio, budget - weights,
                      [&](int64_t L) { return static_cast<size_t>(L) * per_token + patterns(L); })
                : 0;
  }
  const Planned chosen = plan_step(g, s, choice.k_ffn, choice.k_logits);
  const std::string dtype = std::string(dtype_name(act));

  if (!a.svg.empty()) {
    char title[256];
    std::snprintf(title, sizeof title, "%s: context %lld, mask ratio %.2f, K_ffn %lld, K_logits %lld",
                  name.c_str(), static_cast<long long>(a.context), a.mask_ratio,
                  static_cast<long long>(choice.k_ffn), static_cast<long long>(choice.k_logits));
    write_svg(a.svg, g, chosen, title, act_budget);
  }
  if (a.json) {
    json j = {{"model", name},
              {"device", a.device},
              {"layers", c.n_layers},
              {"hidden", c.hidden},
              {"intermediate", c.intermediate},
              {"vocab", c.vocab},
              {"dtype", dtype},
              {"weight_bytes", weights},
              {"context", a.context},
              {"mask_ratio", a.mask_ratio},
              {"n_logits", s.n_logits},
              {"unchunked", stats_json(unchunked)},
              {"chosen", stats_json(chosen)},
              {"floor_bytes", floor},
              {"kv_cache_bytes", kv},
              {"sparse_pattern_bytes", patterns(a.context)}};
    if (budget > 0) {
      j["budget_bytes"] = budget;
      j["activation_budget_bytes"] = act_budget;
      j["fits"] = choice.fits;
      j["search_ms"] = choice.search_ms;
      j["search_plans"] = choice.plans;
      j["l_max"] = l_max;
    }
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  const auto hb = [](double b) { return human_bytes(b); };
  const std::string how =
      gguf ? (cuda ? "the GGUF's tensors, quantized ones converted to " + dtype + " at load"
                   : std::string("the GGUF's tensors, quantized ones kept on the CPU"))
           : "parameters x " + std::to_string(dtype_size(act)) + " bytes";
  std::printf("%s on %s: %lld layers, d %lld, ffn %lld, vocab %lld; %s weights %s (%s)\n", name.c_str(),
              a.device.c_str(), static_cast<long long>(c.n_layers), static_cast<long long>(c.hidden),
              static_cast<long long>(c.intermediate), static_cast<long long>(c.vocab), dtype.c_str(),
              hb(static_cast<double>(weights)).c_str(), how.c_str());
  std::printf("step: %lld tokens, mask ratio %.2f -> %lld logit rows\n", static_cast<long long>(a.context),
              a.mask_ratio, static_cast<long long>(s.n_logits));
  if (a.cache) {
    std::printf("KV cache %s (--cache: K and V of every layer, %s, for the whole canvas)\n",
                hb(static_cast<double>(kv)).c_str(), dtype.c_str());
  }
  if (a.sparse > 0) {
    std::printf("SparseD patterns %s (--sparse-block %lld: one byte per layer, head and tile)\n",
                hb(static_cast<double>(patterns(a.context))).c_str(), static_cast<long long>(a.sparse));
  }
  if (budget > 0) {
    std::printf("budget %s total -> %s for activations%s\n", hb(static_cast<double>(budget)).c_str(),
                hb(static_cast<double>(act_budget)).c_str(),
                held > 0 ? " (after the weights and the memory held for the request)" : "");
  }
  char col[64];
  std::snprintf(col, sizeof col, "lazy (K_ffn %lld, K_logits %lld)", static_cast<long long>(choice.k_ffn),
                static_cast<long long>(choice.k_logits));
  std::printf("\n%-22s %-14s %s\n", "", "unchunked", budget > 0 ? col : "");
  const auto row = [&](const char* label, const std::string& u, const std::string& l) {
    std::printf("%-22s %-14s %s\n", label, u.c_str(), budget > 0 ? l.c_str() : "");
  };
  const auto times = [](double v) {
    char b[32];
    std::snprintf(b, sizeof b, "%.2fx", v);
    return std::string(b);
  };
  const auto ms = [](double v) {
    char b[32];
    std::snprintf(b, sizeof b, "%.3f ms", v);
    return std::string(b);
  };
  row("activation peak", hb(static_cast<double>(unchunked.stats.peak)),
      hb(static_cast<double>(chosen.stats.peak)));
  row("lower bound (live)", hb(static_cast<double>(unchunked.stats.lower_bound)),
      hb(static_cast<double>(chosen.stats.lower_bound)));
  row("peak / average live", times(unchunked.stats.peak_to_average()), times(chosen.stats.peak_to_average()));
  row("planning time", ms(unchunked.plan_ms), ms(chosen.plan_ms));
  std::printf("%-22s %s (FFN and logits at one row per chunk)\n", "non-chunkable floor",
              hb(static_cast<double>(floor)).c_str());
  if (budget == 0) {
    std::printf("(give --budget SIZE for the lazy chunking choice and the largest context that fits)\n");
    return 0;
  }
  std::printf("%-22s %d plans, %s\n", "chunk search", choice.plans, ms(choice.search_ms).c_str());
  if (!choice.fits) {
    std::printf(
        "%-22s DOES NOT FIT: %s\n", "verdict",
        act_budget == 0
            ? (held > 0 ? "the weights and the memory held for the request exceed the budget"
                        : "the weights alone exceed the budget")
            : ("the floor " + hb(static_cast<double>(floor)) + " exceeds the activation budget").c_str());
  }
  std::printf("%-22s %lld tokens at mask ratio %.2f\n", "L_max (this budget)", static_cast<long long>(l_max),
              a.mask_ratio);
  if (cuda) {
    std::printf(
        "(the CUDA context and cuBLASLt are not in the budget: 0.55 GiB more on an H100; see "
        "docs/PERF.md)\n");
  }
  return 0;
}

}  // namespace

void add_plan(CLI::App& app, Registry& reg) {
  auto* sub = app.add_subcommand(
      "plan", "Plan the activation memory of one step (real dimensions, no weights): peak, chunking, L_max");
  auto a = std::make_shared<PlanArgs>();
  auto* m = sub->add_option("-m,--model", a->model, "model directory (reads only its config.json)");
  sub->add_option("--geometry", a->geometry, "a named geometry instead of a model directory")
      ->check(CLI::IsMember({"llada-8b", "dream-7b", "llada-moe-7b", "llada2-mini", "llada-mid",
                             "llada-moe-mid", "llada2-mid"}))
      ->excludes(m);
  sub->add_option("--context", a->context, "tokens in the canvas (prompt + generation)")->required();
  sub->add_option("--mask-ratio", a->mask_ratio, "fraction of the canvas that is masked (needs logits)")
      ->check(CLI::Range(0.0, 1.0));
  sub->add_option("--budget", a->budget,
                  "total memory budget, weights included (24GiB, 512MiB, 1.5GB or bytes): picks K_ffn / "
                  "K_logits and reports L_max")
      ->check(size_validator());
  sub->add_flag("--json", a->json, "print one JSON object");
  sub->add_flag("--cache", a->cache,
                "a KV cache (generate --cache prefix|dual) is held: count it in the budget");
  sub->add_option(
         "--sparse-block", a->sparse,
         "SparseD patterns (generate --sparse) with tiles of this many positions are held: count them")
      ->check(CLI::PositiveNumber);
  sub->add_option("--svg", a->svg, "write the memory timeline of the chosen plan to FILE (SVG)");
  sub->add_option("--device", a->device,
                  "plan the step as this device runs it (cuda: bf16 K / V staging for its attention, "
                  "quantized GGUF tensors converted at load); no GPU is needed")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  reg.handlers.emplace_back(sub, [a] {
    if (a->model.empty() && a->geometry.empty()) fail("plan: give -m DIR or --geometry NAME");
    return run_plan(*a);
  });
}

}  // namespace tessera::cli
