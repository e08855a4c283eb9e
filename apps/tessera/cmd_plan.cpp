// tessera plan: the memory plan of one step of a real geometry, without weights: activation peak,
// live lower bound, peak-to-average ratio, the chunk counts the lazy chunking optimizer picks for a
// budget, planning and search time, and the largest context that fits; optionally the memory over the
// forward as SVG (op index across, memory up, one rectangle per tensor, the weights below; the
// unchunked plan beside the chunked one). Exit status 3 when the plan does not fit the budget.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "apps/tessera/cli_parse.h"
#include "apps/tessera/cli_session.h"
#include "apps/tessera/commands.h"
#include "apps/tessera/svg.h"
#include "core/error.h"
#include "engine/engine.h"
#include "io/config.h"
#include "io/gguf.h"
#include "memory/chunk_optimizer.h"
#include "models/model.h"

namespace tessera::cli {
namespace {

using json = nlohmann::json;

constexpr int kDoesNotFit = 3;  // exit status: the plan does not fit the budget

struct PlanArgs {
  std::string model, geometry, budget, svg, json_out, device = "cpu";
  int64_t context = 0;
  double mask_ratio = 0.5;
  bool json = false;
  std::string cache = "none";  // a KV cache (prefix | dual) is held for the request
  int64_t sparse = 0;          // > 0: SparseD patterns with tiles of this many positions are held
  std::string mode;            // tri-mode models: plan this decoding mode's forwards (ar | diffusion | spec)
  int64_t block = 0;           // its block (0: the model's trained block, else 32)
  int tp = 1, ep = 1;          // tensor- / expert-parallel ranks: plan one rank's share
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

std::string hb(double b) {
  return human_bytes(b);
}

// ---- SVG: memory over one forward ----------------------------------------------------------------

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

constexpr const char* kBudgetColour = "#0060c0";
constexpr const char* kPeakColour = "#c00000";
constexpr const char* kBoundColour = "#505050";

// What the picture shows beside the plans.
struct Picture {
  std::string title, subtitle, subtitle2;
  size_t weights = 0, kv = 0, patterns = 0;  // held below the activations for the whole forward
  size_t budget = 0;                         // the total the user gave (0: none)
  bool fits = true;
  std::string chosen_heading;
};

// One panel: a plan's tensors over op index, its peak and lower bound, the budget; the labels of its
// lines in the column to its right, kept apart by svg::spread.
struct Panel {
  const Planned* plan;
  std::string heading;
  double x, w;  // plot area
};

void write_svg(const std::string& path, const graph::GraphTemplate& g, const std::vector<Panel>& panels,
               const Picture& pic) {
  const double top = 128, ph = 420, band = 64, left = 96, label_col = 230;
  const double act0 = top + ph;     // the activations' zero (the top of the held memory)
  const double axis = act0 + band;  // memory 0 and the op axis
  const double W = panels.back().x + panels.back().w + label_col + 10, H = axis + 128;
  const size_t base = pic.weights + pic.kv + pic.patterns;
  size_t peak_max = 1;
  for (const Panel& p : panels) peak_max = std::max(peak_max, p.plan->prog.peak);
  // The activation scale: the largest peak, and the budget when it is not far above it (else it is
  // marked at the top, off the scale).
  const double act_budget = pic.budget > base ? static_cast<double>(pic.budget - base) : 0;
  const bool budget_on_scale = pic.budget > 0 && act_budget <= 3.0 * static_cast<double>(peak_max);
  const double ymax = std::max(static_cast<double>(peak_max), budget_on_scale ? act_budget : 0.0) * 1.08;
  // Y of a total memory figure: the held memory in the band (not to scale), the activations above it.
  const auto Y = [&](double total) {
    const double b = static_cast<double>(base);
    if (total <= b) return axis - (b > 0 ? total / b : 0.0) * band;
    return act0 - std::min(total - b, ymax) * ph / ymax;
  };
  const int n_ops = static_cast<int>(g.ops().size()) + 1;  // outputs live one past the last op
  svg::Doc d(W, H);
  d.text(20, 30, pic.title, "font-size=\"17\" font-weight=\"bold\"");
  d.text(20, 52, pic.subtitle, "fill=\"#303030\"");
  d.text(20, 70, pic.subtitle2, std::string("fill=\"") + (pic.fits ? "#303030" : kPeakColour) + "\"");
  // Y ticks (total memory), shared by the panels.
  const double ys = svg::byte_step(ymax, 6);
  for (double t = std::ceil(static_cast<double>(base) / ys) * ys; t <= static_cast<double>(base) + ymax;
       t += ys) {
    if (t <= static_cast<double>(base)) continue;
    for (const Panel& p : panels) d.line(p.x, Y(t), p.x + p.w, Y(t), "#e6e6e6");
    d.text(left - 8, Y(t) + 4, hb(t), "text-anchor=\"end\" font-size=\"11\"");
  }
  d.text(left - 8, axis + 4, "0", "text-anchor=\"end\" font-size=\"11\"");
  d << "<text transform=\"translate(16 " << svg::fixed(top + ph / 2, 1)
    << ") rotate(-90)\" text-anchor=\"middle\">memory (activations above the weights)</text>\n";
  bool present[std::size(kKinds)] = {};
  for (const Panel& p : panels) {
    const auto X = [&](double t) { return p.x + t * p.w / n_ops; };
    d.text(p.x, top - 34, p.heading, "font-size=\"13\" font-weight=\"bold\"");
    // Tensors: one rectangle per buffer (aliases share their root's), hover text with name, size, ops.
    const auto& decls = g.tensors();
    for (size_t i = 0; i < decls.size(); ++i) {
      const graph::TensorDecl& dt = decls[i];
      const graph::InstTensor& t = p.plan->prog.tensors[i];
      if (dt.kind == graph::TensorKind::Weight || dt.alias_of >= 0 || t.bytes == 0) continue;
      present[kind_of(dt)] = true;
      const double x0 = X(t.first), x1 = std::max(X(t.last + 1), x0 + 0.8);
      const double lo = static_cast<double>(base + t.offset), hi = lo + static_cast<double>(t.bytes);
      if (lo - static_cast<double>(base) > ymax) continue;
      d.rect(x0, Y(hi), x1 - x0, std::max(Y(lo) - Y(hi), 0.5), kKinds[kind_of(dt)].colour,
             "stroke=\"white\" stroke-width=\"0.3\"",
             dt.full_name() + ": " + hb(static_cast<double>(t.bytes)) + ", ops " + std::to_string(t.first) +
                 "-" + std::to_string(t.last) + ", offset " + hb(static_cast<double>(t.offset)));
    }
    // The memory held through the whole forward: weights, then the KV cache and SparseD patterns.
    double y = axis;
    const double b = static_cast<double>(std::max<size_t>(base, 1));
    for (const auto& [bytes, fill, name] : std::vector<std::tuple<size_t, const char*, std::string>>{
             {pic.weights, "#d0d0d0", "weights"},
             {pic.kv, "#bcd4e6", "KV cache"},
             {pic.patterns, "#e6d3bc", "SparseD patterns"}}) {
      if (bytes == 0) continue;
      const double h = static_cast<double>(bytes) / b * band;
      d.rect(p.x, y - h, p.w, h, fill, "class=\"held\" stroke=\"white\"",
             name + " " + hb(static_cast<double>(bytes)) + ": held through the whole forward");
      if (h >= 13)
        d.text(p.x + 6, y - h / 2 + 4, name + " " + hb(static_cast<double>(bytes)), "font-size=\"11\"");
      y -= h;
    }
    // The axis break between the held memory (not to scale) and the activations.
    d << "<path d=\"M" << svg::fixed(p.x - 6, 1) << " " << svg::fixed(act0 + 3, 1) << " l4 -6 l4 6 l4 -6\" "
      << "fill=\"none\" stroke=\"black\"/>\n";
    d.line(p.x, top, p.x, axis, "black");
    d.line(p.x, axis, p.x + p.w, axis, "black");
    const double xs = svg::nice_step(n_ops, 6);
    for (double t = 0; t <= n_ops; t += xs) {
      d.line(X(t), axis, X(t), axis + 4, "black");
      d.text(X(t), axis + 17, svg::fixed(t, 0), "text-anchor=\"middle\" font-size=\"11\"");
    }
    d.text(p.x + p.w / 2, axis + 34, "op index (" + std::to_string(n_ops - 1) + " ops in one forward)",
           "text-anchor=\"middle\"");
    // Lines and their labels, placed by the collision rule in the column right of the panel.
    struct Mark {
      double total;
      std::string text;
      const char* colour;
      const char* dash;
      bool on_scale;
    };
    const size_t peak = p.plan->prog.peak;
    std::vector<Mark> marks = {{static_cast<double>(base + peak),
                                "peak " + hb(static_cast<double>(base + peak)), kPeakColour, "7 3", true}};
    if (p.plan->stats.lower_bound + ymax / 30 < peak)
      marks.push_back({static_cast<double>(base + p.plan->stats.lower_bound),
                       "lower bound " + hb(static_cast<double>(base + p.plan->stats.lower_bound)),
                       kBoundColour, "2 2", true});
    if (pic.budget > 0)
      marks.push_back({static_cast<double>(pic.budget),
                       "budget " + hb(static_cast<double>(pic.budget)) + (budget_on_scale ? "" : " (above)"),
                       kBudgetColour, "11 4", budget_on_scale});
    std::vector<double> want;
    for (const Mark& m : marks) want.push_back(m.on_scale ? Y(m.total) : top - 10);
    const std::vector<double> at = svg::spread(want, 18, 3, top - 10, axis - 9);
    for (size_t i = 0; i < marks.size(); ++i) {
      const Mark& m = marks[i];
      if (m.on_scale) {
        d.line(p.x, want[i], p.x + p.w, want[i], m.colour,
               std::string("class=\"mark\" stroke-width=\"1.6\" stroke-dasharray=\"") + m.dash + "\"");
      }
      d.line(p.x + p.w, want[i], p.x + p.w + 12, at[i], m.colour, "stroke-width=\"0.8\"");
      d.label(p.x + p.w + 12, at[i], m.text, m.colour, 11.5);
    }
  }
  // Legend: tensor kinds and line styles.
  double lx = 20, ly = axis + 66;
  for (size_t k = 0; k < std::size(kKinds); ++k) {
    if (!present[k]) continue;
    d.rect(lx, ly - 10, 14, 12, kKinds[k].colour);
    d.text(lx + 19, ly, kKinds[k].label);
    lx += 32 + svg::text_width(kKinds[k].label, 12);
  }
  lx = 20;
  ly += 24;
  for (const auto& [colour, dash, name] : std::vector<std::tuple<const char*, const char*, std::string>>{
           {kBudgetColour, "11 4", "budget you gave (weights included)"},
           {kPeakColour, "7 3", "peak: weights + held memory + activations at the fullest op"},
           {kBoundColour, "2 2", "live lower bound (no placement can go below)"}}) {
    d.line(lx, ly - 4, lx + 28, ly - 4, colour,
           std::string("stroke-width=\"1.6\" stroke-dasharray=\"") + dash + "\"");
    d.text(lx + 34, ly, name);
    lx += 60 + svg::text_width(name, 12);
  }
  d.text(20, ly + 22, "hover a rectangle for its tensor; the weights band is not to scale",
         "font-size=\"11\" fill=\"#707070\"");
  d.save(path, "--svg");
}

// ---- tri-mode decoding (--mode) --------------------------------------------------------------------

// A tri-mode model's forwards in one decoding mode (decode/causal.cpp), each against the causal KV cache
// of the whole context, which the request holds throughout: the causal prefill over the prompt (planned
// at the whole context: the longest prompt), then per mode ar's one-row steps, diffusion's bidirectional
// drafts over a block and the causal pass that writes the finished block, or spec's drafts (with the
// draft adapter when the model has one) and the causal verify pass over the block. A budget chunks each
// forward on its own (the engine plans every step shape); L_max is the longest context whose cache and
// every forward's floor fit.
int run_plan_modes(const PlanArgs& a, const ModelConfig& c, DType act, size_t weights, Device dev,
                   const std::string& name) {
  const bool uniform = c.is_uniform();
  if (!c.tri_mode && !uniform)
    fail("--mode plans a tri-mode model's decoding (Nemotron-Labs-Diffusion); " + name + " has one mode");
  if (uniform && a.mode != "uniform")
    fail("--mode: " + name + " is a uniform-noise model (DiffusionGemma): its only mode is uniform");
  if (a.cache != "none" || a.sparse > 0)
    fail("--mode plans the causal KV cache tri-mode decoding keeps; --cache and --sparse-block do not apply");
  if (!a.svg.empty()) fail("--svg draws one bidirectional step; it does not draw --mode's forwards yet");
  GraphOptions go = graph_options(c, act, dev);
  go.kv_cache = true;
  go.tp_size = a.tp;  // c is one rank's share under --tp / --ep (its all-reduces need no memory)
  go.ep_size = a.ep;
  if (a.tp > 1 && dev == Device::CPU) go.vocab_split = vocab_share(c.vocab, a.tp, 0);  // the largest share
  const auto w = shape_only_weights(c, act);
  GraphOptions enc = go;
  enc.mask = MaskKind::Causal;  // a uniform-noise model's encoder (its graph's other mode)
  const graph::GraphTemplate g = build_model_graph(c, w, uniform ? enc : go, OutputMode::Sample);
  const graph::GraphTemplate gc =
      uniform ? build_model_graph(c, w, go, OutputMode::Sample) : graph::GraphTemplate{};
  go.draft_adapter = a.mode == "spec" && c.draft_adapter.rank > 0;
  const graph::GraphTemplate gd = go.draft_adapter ? build_model_graph(c, w, go, OutputMode::Sample) : g;
  const int64_t block = a.block > 0             ? a.block
                        : uniform               ? c.uniform.canvas
                        : c.diffusion_block > 0 ? c.diffusion_block
                                                : 32;
  struct Forward {
    std::string what;
    const graph::GraphTemplate* g;
    int64_t rows, logits;  // at context L: min(rows, L) and min(logits, L)
  };
  std::vector<Forward> fw = {{"prefill (causal, the prompt)", &g, -1, 1}};
  if (uniform) {  // decode/uniform.cpp: the prompt in chunks of 512 rows, then per canvas its steps and
                  // commit
    fw = {{"prefill chunk (causal, 512 rows)", &g, 512, 0},
          {"canvas step (bidirectional, all rows)", &gc, block, block},
          {"commit (causal, writes the canvas)", &g, block, 0}};
  }
  if (a.mode == "ar") fw.push_back({"step (causal, one token)", &g, 1, 1});
  if (a.mode == "diffusion") {
    fw.push_back({"draft (bidirectional, a block)", &g, block, block});
    fw.push_back({"block pass (causal, writes K / V)", &g, block, 1});
  }
  if (a.mode == "spec") {
    fw.push_back({go.draft_adapter ? "draft (bidirectional + adapter)" : "draft (bidirectional, a block)",
                  &gd, block, block});
    fw.push_back({"verify (causal, a block)", &g, block, block});
  }
  const auto shape = [](const Forward& f, int64_t L) {
    graph::StepShape s;
    s.n_query = f.rows < 0 ? L : std::min(f.rows, L);
    s.n_kv = L;
    s.n_logits = std::min(f.logits, s.n_query);
    return s;
  };
  const size_t per_token =
      static_cast<size_t>(c.kv_cache_bytes_per_token(static_cast<int64_t>(dtype_size(act))));
  const size_t kv = per_token * static_cast<size_t>(a.context);
  const size_t budget = a.budget.empty() ? 0 : memory::parse_size(a.budget);
  const size_t act_budget = budget > weights + kv ? budget - weights - kv : 0;
  json rows = json::array();
  bool fits = true;
  size_t peak = 0;
  struct Row {
    graph::StepShape s;
    Planned unchunked;
    memory::ChunkChoice choice;
  };
  std::vector<Row> out;
  for (const Forward& f : fw) {
    const graph::StepShape s = shape(f, a.context);
    Row r{s, plan_step(*f.g, s, 1, 1), {}};
    r.choice.fits = true;
    r.choice.peak = r.unchunked.stats.peak;
    if (budget > 0) r.choice = memory::choose_chunks(*f.g, r.s, act_budget);
    fits = fits && r.choice.fits;
    peak = std::max(peak, budget > 0 ? r.choice.peak : r.unchunked.stats.peak);
    rows.push_back({{"forward", f.what},
                    {"rows", r.s.n_query},
                    {"keys", r.s.n_kv},
                    {"logit_rows", r.s.n_logits},
                    {"unchunked", stats_json(r.unchunked)},
                    {"k_ffn", r.choice.k_ffn},
                    {"k_logits", r.choice.k_logits},
                    {"peak_bytes", r.choice.peak},
                    {"fits", r.choice.fits}});
    out.push_back(std::move(r));
  }
  int64_t l_max = -1;
  if (budget > 0) {
    l_max = memory::largest_fitting(
        [&](int64_t L) {
          const size_t held = weights + per_token * static_cast<size_t>(L);
          if (held > budget) return false;
          for (const Forward& f : fw)
            if (memory::chunk_floor(*f.g, shape(f, L)) > budget - held) return false;
          return true;
        },
        c.max_positions);  // at most the model's context
  }
  json j = {{"model", name},           {"device", a.device},
            {"mode", a.mode},          {"block", block},
            {"context", a.context},    {"dtype", std::string(dtype_name(act))},
            {"weight_bytes", weights}, {"kv_cache_bytes", kv},
            {"forwards", rows},        {"activation_peak_bytes", peak}};
  if (budget > 0) {
    j["budget_bytes"] = budget;
    j["activation_budget_bytes"] = act_budget;
    j["fits"] = fits;
    j["l_max"] = l_max;
  }
  if (!a.json_out.empty()) {
    std::ofstream f(a.json_out);
    if (!f || !(f << j.dump(2) << "\n")) fail("--json-out: cannot write " + a.json_out);
  }
  const auto verdict = [&] {
    if (fits) return 0;
    std::fprintf(stderr, "tessera: plan: --mode %s does not fit the budget of %s: %s\n", a.mode.c_str(),
                 hb(static_cast<double>(budget)).c_str(),
                 act_budget == 0 ? "the weights and the KV cache exceed it"
                                 : "a forward's non-chunkable floor exceeds the activation budget");
    return kDoesNotFit;
  };
  if (a.json) {
    std::printf("%s\n", j.dump(2).c_str());
    return verdict();
  }
  std::printf("%s on %s: %lld layers, d %lld, vocab %lld; %s weights %s\n", name.c_str(), a.device.c_str(),
              static_cast<long long>(c.n_layers), static_cast<long long>(c.hidden),
              static_cast<long long>(c.vocab), std::string(dtype_name(act)).c_str(),
              hb(static_cast<double>(weights)).c_str());
  std::printf("--mode %s, block %lld: causal KV cache %s for the %lld-token context, held throughout\n",
              a.mode.c_str(), static_cast<long long>(block), hb(static_cast<double>(kv)).c_str(),
              static_cast<long long>(a.context));
  if (budget > 0)
    std::printf("budget %s total -> %s for activations (after the weights and the KV cache)\n",
                hb(static_cast<double>(budget)).c_str(), hb(static_cast<double>(act_budget)).c_str());
  std::printf("\n%-36s %8s %8s %7s %12s %s\n", "forward", "rows", "keys", "logits", "unchunked",
              budget > 0 ? "chunked to the budget" : "");
  for (size_t i = 0; i < fw.size(); ++i) {
    const Row& r = out[i];
    std::string chunked;
    if (budget > 0)
      chunked = hb(static_cast<double>(r.choice.peak)) + " (K_ffn " + std::to_string(r.choice.k_ffn) +
                ", K_logits " + std::to_string(r.choice.k_logits) + ")" +
                (r.choice.fits ? "" : " DOES NOT FIT");
    std::printf("%-36s %8lld %8lld %7lld %12s %s\n", fw[i].what.c_str(), static_cast<long long>(r.s.n_query),
                static_cast<long long>(r.s.n_kv), static_cast<long long>(r.s.n_logits),
                hb(static_cast<double>(r.unchunked.stats.peak)).c_str(), chunked.c_str());
  }
  std::printf("\n%-22s %s (weights + KV cache + the largest activation peak)\n", "total peak",
              hb(static_cast<double>(weights + kv + peak)).c_str());
  if (budget > 0) {
    std::printf("%-22s %s\n", "verdict", fits ? "fits" : "DOES NOT FIT");
    std::printf("%-22s %lld tokens (the cache and every forward's floor fit)\n", "L_max (this budget)",
                static_cast<long long>(l_max));
  }
  std::fflush(stdout);
  return verdict();
}

// ---- the command ----------------------------------------------------------------------------------

std::string with_commas(int64_t v) {
  std::string s = std::to_string(v);
  for (int i = static_cast<int>(s.size()) - 3; i > (v < 0 ? 1 : 0); i -= 3)
    s.insert(static_cast<size_t>(i), ",");
  return s;
}

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
  // --tp N: one rank's share (its heads, key / value heads and dense FFN; the rest whole), as every rank
  // holds and runs it (the ranks are alike).
  const ModelConfig whole = c;
  const int64_t whole_params = c.param_count();
  const bool parallel = a.tp > 1 || a.ep > 1;
  int64_t rank_params = whole_params;
  if (parallel) {
    if (a.tp > 1 && a.ep > 1 && a.tp != a.ep)
      fail("plan: --tp " + std::to_string(a.tp) + " --ep " + std::to_string(a.ep) +
           ": each must be 1 or the number of ranks (they share the ranks)");
    if (c.is_uniform()) fail("plan: DiffusionGemma has no tensor or expert parallelism yet");
    rank_params = parallel_rank_params(c, a.tp, a.ep, a.device != "cuda");  // the CPU splits the LM head
    c = tensor_parallel_rank_config(c, a.tp, a.ep);
  }
  // CUDA plans the bf16 K / V staging of its flash attention and keeps the GGUF tensors of the
  // cuda_keeps_quantized types quantized (others converted at load), plus the tile its GEMMs dequantize into.
  const bool cuda = a.device == "cuda";
  // A GGUF's weights as the device loads them.
  size_t weights = !gguf  ? static_cast<size_t>(rank_params) * dtype_size(act)
                   : cuda ? gguf->cuda_bytes
                          : gguf->bytes;
  if (gguf && parallel)  // the rank's share of the file's bytes, as of the parameters
    weights = static_cast<size_t>(static_cast<double>(weights) * static_cast<double>(rank_params) /
                                  static_cast<double>(whole_params));
  // What a rank's load holds at most: its share plus one layer bound whole (at the weights' bytes a
  // parameter).
  const size_t load_peak =
      weights +
      (parallel ? static_cast<size_t>(static_cast<double>(parallel_load_extra_params(whole, a.tp, a.ep)) *
                                      static_cast<double>(weights) / static_cast<double>(rank_params))
                : 0);
  if (!a.mode.empty() || c.is_uniform()) {  // a uniform-noise model has only its own mode
    PlanArgs m = a;
    if (c.is_uniform() && m.mode.empty()) m.mode = "uniform";
    return run_plan_modes(m, c, act, weights, cuda ? Device::CUDA : Device::CPU, name);
  }
  GraphOptions go = graph_options(c, act, cuda ? Device::CUDA : Device::CPU);
  go.tp_size = a.tp;  // the all-reduces (in place: no memory of their own)
  go.ep_size = a.ep;
  if (a.tp > 1 && !cuda) go.vocab_split = vocab_share(c.vocab, a.tp, 0);  // the largest share's logits
  const graph::GraphTemplate g = build_model_graph(c, shape_only_weights(c, act), go, OutputMode::Sample);
  const size_t budget = a.budget.empty() ? 0 : memory::parse_size(a.budget);
  const bool cache = a.cache != "none";
  const size_t per_token =
      cache ? static_cast<size_t>(c.kv_cache_bytes_per_token(static_cast<int64_t>(dtype_size(act)))) : 0;
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
  const std::string why_not =
      act_budget == 0 ? (held > 0 ? "the weights and the memory held for the request exceed the budget"
                                  : "the weights alone exceed the budget")
                      : "the floor " + hb(static_cast<double>(floor)) + " exceeds the activation budget " +
                            hb(static_cast<double>(act_budget));

  if (!a.svg.empty()) {
    Picture pic;
    const std::string who =
        a.model.empty() ? "geometry " + a.geometry : std::filesystem::path(a.model).filename().string();
    pic.title = (who.empty() ? a.model : who) + ": memory over one forward of a " + with_commas(a.context) +
                "-token canvas";
    char sub[320];
    std::snprintf(sub, sizeof sub,
                  "%lld layers, hidden %lld, FFN %lld, vocab %lld, %s on %s; %.0f%% of the canvas masked: "
                  "%lld positions need logits",
                  static_cast<long long>(c.n_layers), static_cast<long long>(c.hidden),
                  static_cast<long long>(c.intermediate), static_cast<long long>(c.vocab), dtype.c_str(),
                  a.device.c_str(), 100 * a.mask_ratio, static_cast<long long>(s.n_logits));
    pic.subtitle = sub;
    pic.weights = weights;
    pic.kv = kv;
    pic.patterns = patterns(a.context);
    pic.budget = budget;
    pic.fits = choice.fits;
    std::string held_text = "weights " + hb(static_cast<double>(weights));
    if (kv > 0) held_text += " + KV cache " + hb(static_cast<double>(kv));
    if (pic.patterns > 0) held_text += " + SparseD patterns " + hb(static_cast<double>(pic.patterns));
    const std::string peaks = "activation peak " + hb(static_cast<double>(unchunked.prog.peak));
    std::vector<Panel> panels;
    if (budget > 0) {
      pic.subtitle2 = act_budget == 0 ? "budget " + hb(static_cast<double>(budget)) + " < " + held_text +
                                            ": no room for activations: DOES NOT FIT"
                                      : "budget " + hb(static_cast<double>(budget)) + " = " + held_text +
                                            " + up to " + hb(static_cast<double>(act_budget)) +
                                            " for activations; chunking takes the " + peaks + " to " +
                                            hb(static_cast<double>(chosen.prog.peak)) +
                                            (choice.fits ? ": fits" : ": DOES NOT FIT (" + why_not + ")");
      panels.push_back({&unchunked, "without chunking: " + peaks, 96, 470});
      const auto chunks = [](int64_t k) {
        return k == 1 ? std::string(" whole") : " in " + std::to_string(k) + " chunks";
      };
      const std::string how = choice.fits       ? "chunked to fit"
                              : act_budget == 0 ? "does not fit, whatever the chunking"
                                                : "chunked as far as it goes, does not fit";
      panels.push_back(
          {&chosen,
           how + ": FFN" + chunks(choice.k_ffn) + ", logits" + chunks(choice.k_logits) + " (same scale)",
           96 + 470 + 230 + 34, 470});
    } else {
      pic.subtitle2 = held_text + " below the activations (no --memory-budget: no chunking chosen)";
      panels.push_back({&unchunked, "one forward without chunking: " + peaks, 96, 940});
    }
    write_svg(a.svg, g, panels, pic);
  }
  json j = {{"model", name},
            {"device", a.device},
            {"layers", c.n_layers},
            {"hidden", c.hidden},
            {"intermediate", c.intermediate},
            {"vocab", c.vocab},
            {"dtype", dtype},
            {"weight_bytes", weights},
            {"load_peak_bytes", load_peak},
            {"tp", a.tp},
            {"ep", a.ep},
            {"context", a.context},
            {"mask_ratio", a.mask_ratio},
            {"n_logits", s.n_logits},
            {"cache", a.cache},
            {"unchunked", stats_json(unchunked)},
            {"chosen", stats_json(chosen)},
            {"floor_bytes", floor},
            {"kv_cache_bytes", kv},
            {"sparse_pattern_bytes", patterns(a.context)}};
  // The runtime's own memory is not planned here (no model runs); generate and serve measure theirs at
  // start-up and count it in --memory-budget. This process's resident memory is its lower bound.
  j["runtime_bytes_estimate"] = process_memory().rss;
  if (budget > 0) {
    j["budget_bytes"] = budget;
    j["activation_budget_bytes"] = act_budget;
    j["fits"] = choice.fits;
    j["search_ms"] = choice.search_ms;
    j["search_plans"] = choice.plans;
    j["l_max"] = l_max;
  }
  if (!a.json_out.empty()) {
    std::ofstream f(a.json_out);
    if (!f || !(f << j.dump(2) << "\n")) fail("--json-out: cannot write " + a.json_out);
  }
  const auto verdict = [&] {
    if (choice.fits) return 0;
    std::fprintf(stderr, "tessera: plan: does not fit the budget of %s: %s\n",
                 hb(static_cast<double>(budget)).c_str(), why_not.c_str());
    return kDoesNotFit;
  };
  if (a.json) {
    std::printf("%s\n", j.dump(2).c_str());
    return verdict();
  }
  const std::string how =
      gguf ? (cuda ? "the GGUF's tensors, q8_0 / q4_0 / q4_K / q5_K / q6_K kept quantized with a " +
                         hb(static_cast<double>(gguf->cuda_tile)) + " tile to dequantize into, other types " +
                         "and routed experts converted to " + dtype + " at load"
                   : std::string("the GGUF's tensors, quantized ones kept on the CPU"))
           : "parameters x " + std::to_string(dtype_size(act)) + " bytes";
  std::printf("%s on %s: %lld layers, d %lld, ffn %lld, vocab %lld; %s weights %s (%s)\n", name.c_str(),
              a.device.c_str(), static_cast<long long>(c.n_layers), static_cast<long long>(c.hidden),
              static_cast<long long>(c.intermediate), static_cast<long long>(c.vocab), dtype.c_str(),
              hb(static_cast<double>(weights)).c_str(), how.c_str());
  if (parallel) {
    std::string experts;
    if (c.moe.n_experts > 0)
      experts = ", " + std::to_string(c.moe.n_experts / a.ep) + " of " + std::to_string(c.moe.n_experts) +
                " experts";
    const bool replicated = whole.n_kv_heads < a.tp;
    std::printf(
        "--tp %d --ep %d: every figure is one rank's (%lld of %lld heads, %lld of %lld key / value heads%s, "
        "dense FFN %lld%s; %.1f%% of the parameters)\n",
        a.tp, a.ep, static_cast<long long>(c.n_heads), static_cast<long long>(whole.n_heads),
        static_cast<long long>(c.n_kv_heads), static_cast<long long>(whole.n_kv_heads),
        replicated ? ", replicated" : "", static_cast<long long>(c.intermediate), experts.c_str(),
        100.0 * static_cast<double>(rank_params) / static_cast<double>(whole_params));
    std::printf("loading: at most %s of weights (the share, and one layer whole until its share is taken)\n",
                hb(static_cast<double>(load_peak)).c_str());
  }
  std::printf("step: %lld tokens, mask ratio %.2f -> %lld logit rows\n", static_cast<long long>(a.context),
              a.mask_ratio, static_cast<long long>(s.n_logits));
  if (cache) {
    std::printf("KV cache %s (--cache %s: K and V of every layer, %s, for the whole canvas)\n",
                hb(static_cast<double>(kv)).c_str(), a.cache.c_str(), dtype.c_str());
  }
  if (a.sparse > 0) {
    std::printf("SparseD patterns %s (--sparse-block %lld: one byte per layer, head and tile)\n",
                hb(static_cast<double>(patterns(a.context))).c_str(), static_cast<long long>(a.sparse));
  }
  if (budget > 0) {
    std::printf(
        "budget %s total -> %s for activations%s\n", hb(static_cast<double>(budget)).c_str(),
        hb(static_cast<double>(act_budget)).c_str(),
        held > 0 ? " (after the weights and the memory held for the request)" : " (after the weights)");
    std::printf(
        "runtime ~%s not in this plan: generate and serve measure their own (libraries, threads, "
        "tokenizer) at start-up and take it off the budget too\n",
        hb(static_cast<double>(process_memory().rss)).c_str());
  }
  char col[64];
  std::snprintf(col, sizeof col, "lazy (K_ffn %lld, K_logits %lld)", static_cast<long long>(choice.k_ffn),
                static_cast<long long>(choice.k_logits));
  std::printf("\n%-22s %-14s %s\n", "", "unchunked", budget > 0 ? col : "");
  const auto row = [&](const char* label, const std::string& u, const std::string& l) {
    std::printf("%-22s %-14s %s\n", label, u.c_str(), budget > 0 ? l.c_str() : "");
  };
  const auto times = [](double v) { return svg::fixed(v, 2) + "x"; };
  const auto ms = [](double v) { return svg::fixed(v, 3) + " ms"; };
  row("activation peak", hb(static_cast<double>(unchunked.stats.peak)),
      hb(static_cast<double>(chosen.stats.peak)));
  row("lower bound (live)", hb(static_cast<double>(unchunked.stats.lower_bound)),
      hb(static_cast<double>(chosen.stats.lower_bound)));
  row("peak / average live", times(unchunked.stats.peak_to_average()), times(chosen.stats.peak_to_average()));
  row("planning time", ms(unchunked.plan_ms), ms(chosen.plan_ms));
  std::printf("%-22s %s (FFN and logits at one row per chunk)\n", "non-chunkable floor",
              hb(static_cast<double>(floor)).c_str());
  if (budget == 0) {
    std::printf(
        "(give --memory-budget SIZE for the lazy chunking choice and the largest context that fits)\n");
    return 0;
  }
  std::printf("%-22s %d plans, %s\n", "chunk search", choice.plans, ms(choice.search_ms).c_str());
  std::printf("%-22s %s\n", "verdict", choice.fits ? "fits" : ("DOES NOT FIT: " + why_not).c_str());
  std::printf("%-22s %lld tokens at mask ratio %.2f\n", "L_max (this budget)", static_cast<long long>(l_max),
              a.mask_ratio);
  if (cuda) {
    std::printf(
        "(the CUDA context and cuBLASLt are not in the budget: 0.55 GiB more on an H100; see "
        "docs/PERF.md)\n");
  }
  std::fflush(stdout);
  return verdict();
}

}  // namespace

void add_plan(CLI::App& app, Registry& reg) {
  auto* sub = app.add_subcommand(
      "plan", "Plan the activation memory of one step (real dimensions, no weights): peak, chunking, L_max");
  sub->option_defaults()->always_capture_default();
  auto a = std::make_shared<PlanArgs>();
  auto* m = sub->add_option("-m,--model", a->model, "model directory (reads only its config.json)");
  sub->add_option("--geometry", a->geometry, "a named geometry instead of a model directory")
      ->check(CLI::IsMember(geometry_names()))
      ->excludes(m);
  sub->add_option("--context", a->context, "tokens in the canvas (prompt + generation)")
      ->required()
      ->default_str("");
  sub->add_option("--mask-ratio", a->mask_ratio, "fraction of the canvas that is masked (needs logits)")
      ->check(in_range(0, 1));
  sub->add_option("--memory-budget,--budget", a->budget,
                  "total memory budget, weights included (24GiB, 512MiB, 1.5GB or bytes): picks K_ffn / "
                  "K_logits and reports L_max; --budget is an alias")
      ->check(size_validator());
  sub->add_option(
         "--cache", a->cache,
         "the KV cache generate --cache MODE holds (prefix and dual hold the whole canvas): count it "
         "in the budget")
      ->check(CLI::IsMember({"none", "prefix", "dual"}));
  sub->add_option("--sparse-block", a->sparse,
                  "SparseD patterns (generate --sparse) with tiles of this many positions are held: count "
                  "them (0: none)")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--mode", a->mode,
                  "tri-mode models (Nemotron-Labs-Diffusion): plan this decoding mode's forwards against the "
                  "causal KV cache of the whole context (the prefill, and ar's steps, diffusion's drafts and "
                  "block passes, or spec's drafts and verify passes) instead of one bidirectional step")
      ->check(CLI::IsMember({"ar", "diffusion", "spec", "uniform"}));
  sub->add_option("--block-length", a->block,
                  "--mode diffusion / spec: the block (0: the model's trained block, else 32)")
      ->check(CLI::NonNegativeNumber);
  sub->add_option(
         "--tp", a->tp,
         "tensor parallelism over N ranks: plan one rank (its share of the heads, the key / value "
         "cache and the dense FFN; embedding, LM head and MoE FFNs whole); weights, peak, L_max per rank")
      ->check(CLI::Range(1, 1024));
  sub->add_option("--ep", a->ep,
                  "expert parallelism over N ranks (the --tp ranks when both are given): plan one rank, "
                  "holding 1/N of every MoE layer's experts")
      ->check(CLI::Range(1, 1024));
  sub->add_option("--device", a->device,
                  "plan the step as this device runs it (cuda: bf16 K / V staging for its attention, "
                  "quantized GGUF tensors converted at load); no GPU is needed")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  sub->add_flag("--json", a->json, "print the result as JSON on stdout instead of the table");
  sub->add_option("--json-out", a->json_out, "also write the JSON to FILE")->check(svg::writable_file());
  sub->add_option("--svg", a->svg,
                  "draw the memory over one forward to FILE (SVG): the tensors by op, the weights below, the "
                  "budget, the peaks of the unchunked and the chunked plan side by side")
      ->check(svg::writable_file());
  sub->footer(
      "Exit status: 0 when the plan fits the budget (or none is given), 3 when it does not (the reason on "
      "stderr), 1 on an error.\n\nExamples:\n"
      "  tessera plan --geometry llada-8b --context 32768 --memory-budget 24GiB --svg plan.svg\n"
      "  tessera plan -m /models/LLaDA-8B-Instruct --context 8192 --cache prefix --memory-budget 20GiB "
      "--json");
  reg.handlers.emplace_back(sub, [a] {
    if (a->model.empty() && a->geometry.empty()) fail("plan: give -m DIR or --geometry NAME");
    return run_plan(*a);
  });
}

}  // namespace tessera::cli
