// The CLI's pictures (generate --order-svg, plan --svg, bench / eval --svg) parsed as XML and rendered
// with rsvg-convert (Debian librsvg2-bin; the rendering is skipped when it is absent), with what they
// must show; and the plan / bench / eval conventions around them: --compare specs checked before any
// work, --json a switch with --json-out FILE, progress on a terminal only, plan's exit status 3.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "memory/chunk_optimizer.h"
#include "test_util.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string bin() {
  return TESSERA_BINARY;
}

std::string tiny() {
  return (test::source_dir() / "models" / "tessera-tiny").string();
}

// Parses an SVG with Python's xml.etree (well-formed XML or the test fails) and summarises it: the root's
// size attributes, the count of each class, label boxes, mark lines, hover titles, texts, order cells.
json parse_svg(const fs::path& svg) {
  static const fs::path script = [] {
    const fs::path p = test::temp_dir("svg_parse") / "parse_svg.py";
    std::ofstream(p) << R"PY(import json, sys, xml.etree.ElementTree as ET
NS = '{http://www.w3.org/2000/svg}'
root = ET.parse(sys.argv[1]).getroot()
out = {'root': root.tag, 'width': root.get('width'), 'height': root.get('height'),
       'viewBox': root.get('viewBox'), 'classes': {}, 'labels': [], 'marks': [], 'titles': [],
       'texts': [], 'cells': [], 'bars': []}
for e in root.iter():
    cls = e.get('class') or ''
    for c in cls.split():
        out['classes'][c] = out['classes'].get(c, 0) + 1
    tag = e.tag.replace(NS, '')
    t = e.find(NS + 'title')
    if tag == 'title':
        out['titles'].append(e.text or '')
    elif tag == 'text':
        out['texts'].append(''.join(e.itertext()))
    elif tag == 'g' and cls == 'label':
        r, x = e.find(NS + 'rect'), e.find(NS + 'text')
        out['labels'].append([float(r.get('x')), float(r.get('y')), float(r.get('width')),
                              float(r.get('height')), x.text or ''])
    elif tag == 'line' and cls == 'mark':
        out['marks'].append(float(e.get('y1')))
    elif tag == 'rect' and cls.startswith('cell '):
        out['cells'].append([cls.split()[1], t.text if t is not None else None])
    elif tag == 'rect' and cls == 'bar':
        out['bars'].append(t.text)
print(json.dumps(out))
)PY";
    return p;
  }();
  std::string out;
  const int rc = test::run_command(test::python() + " " + script.string() + " " + svg.string(), &out);
  EXPECT_EQ(rc, 0) << svg << " is not well-formed XML: " << out;
  const json j = json::parse(out, nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << out;
  if (rc != 0 || j.is_discarded()) return json::object();
  EXPECT_EQ(j["root"], "{http://www.w3.org/2000/svg}svg");
  const std::string vb = "0 0 " + j["width"].get<std::string>() + " " + j["height"].get<std::string>();
  EXPECT_EQ(j["viewBox"], vb);
  return j;
}

// The PNG's size from its IHDR chunk.
std::pair<uint32_t, uint32_t> png_size(const fs::path& png) {
  const std::string b = test::read_text(png);
  if (b.size() < 24 || b.compare(1, 3, "PNG") != 0) return {0, 0};
  const auto be = [&](size_t o) {
    return static_cast<uint32_t>(static_cast<unsigned char>(b[o])) << 24 |
           static_cast<uint32_t>(static_cast<unsigned char>(b[o + 1])) << 16 |
           static_cast<uint32_t>(static_cast<unsigned char>(b[o + 2])) << 8 |
           static_cast<uint32_t>(static_cast<unsigned char>(b[o + 3]));
  };
  return {be(16), be(20)};
}

// Renders the SVG to PNG with rsvg-convert: exit 0 and a PNG of the SVG's size (skipped without it).
void expect_renders(const fs::path& svg, const json& parsed) {
  std::string out;
  if (test::run_command("command -v rsvg-convert", &out) != 0) {
    std::printf("note: rsvg-convert is absent (Debian librsvg2-bin): %s not rendered\n", svg.c_str());
    return;
  }
  const fs::path png = fs::path(svg).replace_extension(".png");
  ASSERT_EQ(test::run_command("rsvg-convert -o " + png.string() + " " + svg.string(), &out), 0) << out;
  const auto [w, h] = png_size(png);
  EXPECT_EQ(w, static_cast<uint32_t>(std::lround(std::stod(parsed["width"].get<std::string>()))));
  EXPECT_EQ(h, static_cast<uint32_t>(std::lround(std::stod(parsed["height"].get<std::string>()))));
}

// Runs a shell command; its exit status, and its stdout in *out (stderr dropped).
int run_stdout(const std::string& cmd, std::string* out) {
  return test::run_command("(" + cmd + ") 2>/dev/null", out);
}

bool has_text(const json& parsed, const std::string& want) {
  for (const auto& t : parsed["texts"])
    if (t.get<std::string>().find(want) != std::string::npos) return true;
  return false;
}

int count_class(const json& parsed, const std::string& cls) {
  return parsed["classes"].value(cls, 0);
}

// No two label boxes of the picture overlap.
void expect_labels_apart(const json& parsed) {
  const auto& l = parsed["labels"];
  for (size_t i = 0; i < l.size(); ++i) {
    for (size_t k = i + 1; k < l.size(); ++k) {
      const double ax = l[i][0], ay = l[i][1], aw = l[i][2], ah = l[i][3];
      const double bx = l[k][0], by = l[k][1], bw = l[k][2], bh = l[k][3];
      const bool overlap = ax < bx + bw && bx < ax + aw && ay < by + bh && by < ay + ah;
      EXPECT_FALSE(overlap) << l[i].dump() << " overlaps " << l[k].dump();
    }
  }
}

// generate --order-svg (the decoding options named: the model's defaults may change): one cell per
// (generated position, step run); the decided cells are the positions each step decided (the --canvas
// stream's "changed", less its edits), the edit cells its edits; the prompt length and the block
// boundaries are marked; the prompt's <, & and " are escaped.
TEST(CliSvg, OrderGridHasACellPerPositionAndStepAndMarksEdits) {
  const fs::path d = test::temp_dir("cli_svg_order");
  const fs::path svg = d / "order.svg";
  std::string out;
  ASSERT_EQ(
      run_stdout(
          bin() + " generate -m " + tiny() +
              " --raw -p 'Once <upon> & a \"time\"' --gen-length 32 --steps 32 "
              "--block-length 16 --alg low_confidence --temperature 0 --threshold 0.7 --edit-mode quality "
              "--json --canvas "
              "--order-svg " +
              svg.string(),
          &out),
      0)
      << out;
  std::vector<json> events;
  json result;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    const json j = json::parse(line);
    if (j.contains("canvas"))
      events.push_back(j["canvas"]);
    else
      result = j;
  }
  const int steps = result["steps"].get<int>();
  ASSERT_EQ(static_cast<int>(events.size()), steps);
  // What each step decided and edited, from the stream.
  std::set<std::pair<int, int>> decided, edited;
  std::set<int> seen;
  std::vector<json> edits;
  for (const json& ev : events) {
    std::set<int> step_edits;
    for (const json& e : ev["edits"]) {
      edited.insert({e["position"].get<int>(), ev["step"].get<int>()});
      step_edits.insert(e["position"].get<int>());
      edits.push_back(e);
    }
    for (const json& p : ev["changed"]) {
      if (step_edits.count(p.get<int>()) == 0 && seen.insert(p.get<int>()).second)
        decided.insert({p.get<int>(), ev["step"].get<int>()});
    }
  }
  ASSERT_GT(edits.size(), 0u) << "no edit: the test would not see edits drawn";

  const json svgj = parse_svg(svg);
  ASSERT_FALSE(svgj.empty());
  expect_renders(svg, svgj);
  EXPECT_EQ(count_class(svgj, "cell"), 32 * steps);
  EXPECT_EQ(count_class(svgj, "decided"), static_cast<int>(result["tokens"].size()));
  EXPECT_EQ(count_class(svgj, "decided"), static_cast<int>(decided.size()));
  EXPECT_EQ(count_class(svgj, "edit"), static_cast<int>(edits.size()));
  EXPECT_EQ(count_class(svgj, "block"), 32 / 16 - 1);
  // Each decided or edited cell says where and when: "position P (canvas C), step T: ...".
  std::set<std::pair<int, int>> drawn_decided, drawn_edited;
  for (const json& c : svgj["cells"]) {
    if (c[1].is_null()) continue;
    const std::string t = c[1];
    int p = -1, canvas = -1, step = -1;
    ASSERT_EQ(std::sscanf(t.c_str(), "position %d (canvas %d), step %d", &p, &canvas, &step), 3) << t;
    EXPECT_EQ(canvas - p, result["prompt_tokens"].get<int>()) << t;
    (c[0] == "decided" ? drawn_decided : drawn_edited).insert({p, step});
  }
  EXPECT_EQ(drawn_decided, decided);
  EXPECT_EQ(drawn_edited, edited);
  // An edit's hover text names the token before and after (where both are plain text).
  int named = 0;
  for (const json& e : edits) {
    const std::string from = e["old_text"], to = e["new_text"];
    const auto plain = [](const std::string& s) {
      return !s.empty() && std::all_of(s.begin(), s.end(), [](char ch) { return ch >= 32 && ch < 127; });
    };
    if (!plain(from) || !plain(to)) continue;
    ++named;
    bool found = false;
    for (const json& t : svgj["titles"])
      found = found ||
              t.get<std::string>().find("edited \"" + from + "\" -> \"" + to + "\"") != std::string::npos;
    EXPECT_TRUE(found) << e.dump();
  }
  EXPECT_GT(named, 0);
  EXPECT_TRUE(has_text(svgj, "prompt: " + std::to_string(result["prompt_tokens"].get<int>()) + " tokens"));
  EXPECT_TRUE(has_text(svgj, "\"Once <upon> & a \"time\"\"")) << "the title, escaped and read back";
  test::expect_command_error(bin() + " generate -m " + tiny() + " -p hi --order-svg /nonexistent/dir/o.svg",
                             "the directory /nonexistent/dir does not exist");
}

// plan --svg: a readable title, the budget given, both plans' peaks (weights included) side by side,
// the weights drawn, labels that do not overlap even where their lines lie closer than a label's height;
// a plan that does not fit exits 3 with the reason on stderr; --budget is --memory-budget's alias.
TEST(CliSvg, PlanPictureShowsBudgetWeightsAndBothPeaks) {
  const fs::path d = test::temp_dir("cli_svg_plan");
  const fs::path svg = d / "plan.svg";
  const std::string args = " plan --geometry llada-8b --context 65536 --mask-ratio 0.9 --memory-budget 24GiB";
  std::string out;
  ASSERT_EQ(run_stdout(bin() + args + " --json --svg " + svg.string(), &out), 0) << out;
  const json plan = json::parse(out);
  ASSERT_TRUE(plan["fits"].get<bool>());
  const json svgj = parse_svg(svg);
  ASSERT_FALSE(svgj.empty());
  expect_renders(svg, svgj);
  EXPECT_TRUE(has_text(svgj, "llada-8b: memory over one forward of a 65,536-token canvas"));
  const auto total = [&](const char* which) {
    return memory::format_bytes(
        static_cast<double>(plan["weight_bytes"].get<size_t>() + plan[which]["peak_bytes"].get<size_t>()));
  };
  std::set<std::string> labels;
  for (const json& l : svgj["labels"]) labels.insert(l[4].get<std::string>());
  EXPECT_TRUE(labels.count("budget 24.0 GiB")) << svgj["labels"].dump();
  EXPECT_TRUE(labels.count("peak " + total("unchunked"))) << svgj["labels"].dump();
  EXPECT_TRUE(labels.count("peak " + total("chosen"))) << svgj["labels"].dump();
  EXPECT_NE(total("unchunked"), total("chosen"));
  EXPECT_TRUE(has_text(svgj, "weights " + memory::format_bytes(plan["weight_bytes"].get<double>())));
  EXPECT_EQ(count_class(svgj, "held"), 2);  // the weights under each panel
  expect_labels_apart(svgj);
  // The collision rule had work to do: two marked lines of a panel closer than a label is high.
  std::vector<double> marks = svgj["marks"].get<std::vector<double>>();
  std::sort(marks.begin(), marks.end());
  const double label_h = svgj["labels"][0][3];
  bool close = false;
  for (size_t i = 1; i < marks.size(); ++i) close = close || marks[i] - marks[i - 1] < label_h;
  EXPECT_TRUE(close) << svgj["marks"].dump();
  // --budget: the same plan.
  std::string alias;
  ASSERT_EQ(run_stdout(bin() + " plan --geometry llada-8b --context 65536 --mask-ratio 0.9 --budget 24GiB "
                               "--json",
                       &alias),
            0);
  EXPECT_EQ(json::parse(alias)["chosen"]["peak_bytes"], plan["chosen"]["peak_bytes"]);
  // Does not fit: exit 3, the reason on stderr (the table or JSON on stdout), the picture says so.
  const std::string small =
      " plan --geometry llada-8b --context 65536 --mask-ratio 0.9 --memory-budget 16GiB";
  EXPECT_EQ(
      test::run_command(
          "(" + bin() + small + " --json --svg " + svg.string() + " 2>" + (d / "err").string() + ")", &out),
      3);
  EXPECT_FALSE(json::parse(out)["fits"].get<bool>());
  EXPECT_NE(test::read_text(d / "err").find("does not fit the budget of 16.0 GiB"), std::string::npos)
      << test::read_text(d / "err");
  const json nofit = parse_svg(svg);
  EXPECT_TRUE(has_text(nofit, "DOES NOT FIT")) << nofit["texts"].dump();
  expect_labels_apart(nofit);
  EXPECT_EQ(run_stdout(bin() + small, &out), 3);
  EXPECT_NE(out.find("DOES NOT FIT"), std::string::npos) << out;
}

// plan --cache MODE (as generate's): prefix and dual hold the same KV cache, counted in the budget.
TEST(CliSvg, PlanCacheTakesGeneratesModes) {
  const std::string base = bin() + " plan --geometry llada-mid --context 4096 --memory-budget 8GiB --json";
  std::map<std::string, json> j;
  for (const char* mode : {"none", "prefix", "dual"}) {
    std::string out;
    ASSERT_EQ(run_stdout(base + " --cache " + mode, &out), 0) << mode << out;
    j[mode] = json::parse(out);
  }
  EXPECT_EQ(j["none"]["kv_cache_bytes"], 0);
  EXPECT_GT(j["prefix"]["kv_cache_bytes"].get<size_t>(), 0u);
  EXPECT_EQ(j["prefix"]["kv_cache_bytes"], j["dual"]["kv_cache_bytes"]);
  EXPECT_EQ(
      j["prefix"]["activation_budget_bytes"].get<size_t>() + j["prefix"]["kv_cache_bytes"].get<size_t>(),
      j["none"]["activation_budget_bytes"].get<size_t>());
  test::expect_command_error(base + " --cache lru", "--cache");
}

// bench / eval --svg: one bar per (row, metric), the values of the JSON; --json prints the JSON on stdout
// instead of the table, --json-out writes the same to a file; titles escape what they quote.
TEST(CliSvg, BenchAndEvalChartTheirTables) {
  const fs::path d = test::temp_dir("cli_svg_charts");
  // A model directory whose name needs escaping in XML.
  const fs::path model = d / "tiny&<'\">";
  fs::create_directory_symlink(tiny(), model);
  const std::string m = " -m '" + d.string() + "/tiny&<'\\''\">'";
  std::string out;
  ASSERT_EQ(run_stdout(bin() + " bench" + m +
                           " --prompt-len 8 --gen-length 16 --block-length 16 --compare steps=8 "
                           "--compare cache=prefix --json --json-out " +
                           (d / "b.json").string() + " --svg " + (d / "b.svg").string(),
                       &out),
            0)
      << out;
  const json bench = json::parse(out);
  EXPECT_EQ(json::parse(test::read_text(d / "b.json")), bench);
  ASSERT_EQ(bench["rows"].size(), 3u);
  json svgj = parse_svg(d / "b.svg");
  ASSERT_FALSE(svgj.empty());
  expect_renders(d / "b.svg", svgj);
  ASSERT_EQ(svgj["bars"].size(), 3u * 4u);  // tokens/s, ms per step, speed-up, agreement
  for (size_t r = 0; r < 3; ++r) {
    char want[128];
    std::snprintf(want, sizeof want, "%s: tokens/s %.1f",
                  bench["rows"][r]["option"].get<std::string>().c_str(),
                  bench["rows"][r]["tokens_per_second"].get<double>());
    EXPECT_EQ(svgj["bars"][r], want);
  }
  EXPECT_TRUE(has_text(svgj, model.string())) << "the model's path, escaped and read back";

  const std::string eval =
      bin() + " eval" + m + " --heldout " + (test::source_dir() / "models/heldout.jsonl").string() +
      " --seqs 4 --seq-len 64 --ratios 0.5 --prompts 2 --seeds 1 --prompt-len 16 --gen-length 16";
  ASSERT_EQ(run_stdout(eval + " --compare steps=8 --json --svg " + (d / "e.svg").string(), &out), 0) << out;
  const json ev = json::parse(out);
  svgj = parse_svg(d / "e.svg");
  ASSERT_FALSE(svgj.empty());
  expect_renders(d / "e.svg", svgj);
  ASSERT_EQ(svgj["bars"].size(), 2u * 4u);  // agreement, ref match, NLL(exact), tokens/s
  char want[128];
  std::snprintf(want, sizeof want, "steps=8: agreement %.3f",
                ev["generation"]["comparisons"][0]["agreement"].get<double>());
  EXPECT_EQ(svgj["bars"][1], want);
  EXPECT_EQ(svgj["bars"][0], "exact: agreement 1.000");
  EXPECT_TRUE(has_text(svgj, "ref match: share of generated tokens equal to the held-out continuation"));
  // The tables carry the legend of their columns.
  ASSERT_EQ(run_stdout(eval + " --no-generation", &out), 0) << out;
  EXPECT_NE(out.find("unigram acc: accuracy of always guessing the most frequent token"), std::string::npos)
      << out;
}

// Every --compare spec is checked before any work: a typo names the spec and the closest key, a value
// generate would refuse names the rule; nothing is measured (no table). `--json FILE`, the old form,
// gets a hint to --json-out.
TEST(CliSvg, CompareSpecsAreCheckedBeforeAnyWork) {
  const std::string bench = bin() + " bench -m " + tiny() + " --prompt-len 8 --gen-length 16";
  const std::string eval = bin() + " eval -m " + tiny() + " --seqs 4 --seq-len 64 --prompts 2 --seeds 1";
  for (const std::string& cmd : {bench, eval}) {
    std::string out;
    EXPECT_EQ(test::run_command(cmd + " --compare steps=8 --compare stpes=4", &out), 1) << out;
    EXPECT_NE(out.find("tessera: error: --compare 'stpes=4': unknown option 'stpes' (did you mean 'steps'?)"),
              std::string::npos)
        << out;
    EXPECT_EQ(out.find("baseline"), std::string::npos) << out;
    EXPECT_EQ(out.find("infilling"), std::string::npos) << out;
    EXPECT_EQ(test::run_command(cmd + " --compare steps=0", &out), 1) << out;
    EXPECT_NE(out.find("--compare 'steps=0': steps must be > 0"), std::string::npos) << out;
    EXPECT_EQ(out.find("infilling"), std::string::npos) << out;
    test::expect_command_error(cmd + " --compare cache=lru",
                               "--compare 'cache=lru': unknown KV cache 'lru'; use none, prefix or dual");
    test::expect_command_error(cmd + " --compare steps=8x",
                               "--compare 'steps=8x': '8x' is not a number for steps");
    test::expect_command_error(cmd + " --json out.json", "--json-out out.json writes the JSON to a file");
  }
}

// Progress: on a terminal, a line on stderr while bench and eval work; never in a pipe.
TEST(CliSvg, ProgressShowsOnATerminalOnly) {
  std::string out;
  if (test::run_command("command -v script", &out) != 0) GTEST_SKIP() << "script (util-linux) is absent";
  const fs::path d = test::temp_dir("cli_svg_progress");
  const std::string bench =
      bin() + " bench -m " + tiny() + " --prompt-len 8 --gen-length 16 --compare steps=8";
  const std::string eval =
      bin() + " eval -m " + tiny() +
      " --seqs 4 --seq-len 64 --ratios 0.5 --prompts 2 --seeds 1 --prompt-len 16 --gen-length 16";
  std::ofstream(d / "run.sh") << bench << "\n" << eval << "\n";
  ASSERT_EQ(test::run_command("script -qec 'sh " + (d / "run.sh").string() + "' /dev/null", &out), 0) << out;
  for (const char* want : {"[bench] baseline (1/2): step 1/16", "[bench] steps=8 (2/2): step 8/8",
                           "[eval] infilling: mask ratio 0.50 (1/1)", "[eval] exact (1/1): prompt 2/2",
                           "[eval] exact (1/1): scoring"}) {
    EXPECT_NE(out.find(want), std::string::npos) << want << "\n" << out;
  }
  ASSERT_EQ(test::run_command("sh " + (d / "run.sh").string(), &out), 0) << out;
  EXPECT_EQ(out.find("[bench]"), std::string::npos) << out;
  EXPECT_EQ(out.find("[eval]"), std::string::npos) << out;
  EXPECT_NE(out.find("steps=8"), std::string::npos) << out;
}

}  // namespace
}  // namespace tessera
