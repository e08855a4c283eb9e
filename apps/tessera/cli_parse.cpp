#include "apps/tessera/cli_parse.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

namespace tessera::cli {

size_t edit_distance(const std::string& a, const std::string& b) {
  // Optimal string alignment distance: insertions, deletions, substitutions and adjacent swaps.
  const size_t n = a.size(), m = b.size();
  std::vector<std::vector<size_t>> d(n + 1, std::vector<size_t>(m + 1));
  for (size_t i = 0; i <= n; ++i) d[i][0] = i;
  for (size_t j = 0; j <= m; ++j) d[0][j] = j;
  for (size_t i = 1; i <= n; ++i) {
    for (size_t j = 1; j <= m; ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[n][m];
}

std::optional<std::string> closest(const std::string& word, const std::vector<std::string>& candidates) {
  if (word.empty()) return std::nullopt;
  std::vector<std::string> prefixed;
  for (const std::string& c : candidates)
    if (c.size() > word.size() && c.compare(0, word.size(), word) == 0) prefixed.push_back(c);
  if (prefixed.size() == 1) return prefixed[0];
  std::optional<std::string> best;
  size_t best_d = std::max<size_t>(1, std::min<size_t>(3, word.size() / 3));  // a typo, not another word
  for (const std::string& c : candidates) {
    const size_t d = edit_distance(word, c);
    if (d <= best_d && (!best || d < best_d)) {
      best = c;
      best_d = d;
    }
  }
  return best;
}

std::vector<std::string> spellings(const CLI::Option& o) {
  std::vector<std::string> names;
  for (const std::string& l : o.get_lnames()) names.push_back("--" + l);
  for (const std::string& s : o.get_snames()) names.push_back("-" + s);
  return names;
}

namespace {

std::vector<std::string> command_names(const CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::App* s : app.get_subcommands([](const CLI::App*) { return true; }))
    names.push_back(s->get_name());
  return names;
}

CLI::App* find_command(CLI::App& app, const std::string& name) {
  for (CLI::App* s : app.get_subcommands([](CLI::App*) { return true; }))
    if (s->get_name() == name) return s;
  return nullptr;
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

// Every spelling of the options of `sub`: --long and -s.
std::vector<std::string> option_names(const CLI::App& sub) {
  std::vector<std::string> names;
  for (const CLI::Option* o : sub.get_options()) {
    const std::vector<std::string> s = spellings(*o);
    names.insert(names.end(), s.begin(), s.end());
  }
  return names;
}

}  // namespace

std::optional<int> answer_before_parse(CLI::App& app, int argc, char** argv) {
  if (argc < 2) {
    std::fputs(app.help().c_str(), stdout);
    return 1;
  }
  const std::string first = argv[1];
  if (first.empty() || first[0] == '-') return std::nullopt;  // --help, --version, or an error CLI11 words
  if (first == "help") {
    if (argc > 2) {
      CLI::App* sub = find_command(app, argv[2]);
      if (sub == nullptr) {
        const auto near = closest(argv[2], command_names(app));
        std::fprintf(stderr, "tessera: error: no command '%s'%s; the commands: %s\n", argv[2],
                     near ? ("; did you mean '" + *near + "'?").c_str() : "",
                     joined(command_names(app)).c_str());
        return 2;
      }
      std::fputs(sub->help().c_str(), stdout);
      return 0;
    }
    std::fputs(app.help().c_str(), stdout);
    return 0;
  }
  if (CLI::App* sub = find_command(app, first); sub != nullptr) {
    // An unknown option, found before CLI11 parses: it would take the option's value for an argument
    // and answer about that instead.
    for (int i = 2; i < argc; ++i) {
      const std::string arg = argv[i];
      if (arg == "--") break;
      if (arg.size() < 2 || arg[0] != '-' || (arg[1] >= '0' && arg[1] <= '9') || arg[1] == '.') continue;
      const std::string name = arg.substr(0, arg.find('='));
      const CLI::Option* opt = name.size() == 2 || name[1] == '-' ? sub->get_option_no_throw(name) : nullptr;
      if (opt == nullptr && name[1] != '-' && name.size() > 2)  // -n64: a short option with its value
        opt = sub->get_option_no_throw(name.substr(0, 2));
      if (name == "--help" || name == "-h") return std::nullopt;
      if (opt == nullptr) {
        const auto near = closest(name, option_names(*sub));
        std::fprintf(
            stderr,
            "tessera: error: unknown option %s for 'tessera %s'%s\n(tessera %s --help lists the options)\n",
            name.c_str(), first.c_str(), near ? ("; did you mean " + *near + "?").c_str() : "",
            first.c_str());
        return 2;
      }
      if (opt->get_items_expected_max() > 0 && arg.find('=') == std::string::npos &&
          name.size() == arg.size() && (name[1] == '-' || name.size() == 2))
        ++i;  // its value, whatever it looks like
    }
    return std::nullopt;
  }
  const auto near = closest(first, command_names(app));
  std::fprintf(stderr,
               "tessera: error: no command '%s'%s\nthe commands: %s (tessera --help describes them)\n",
               first.c_str(), near ? ("; did you mean 'tessera " + *near + "'?").c_str() : "",
               joined(command_names(app)).c_str());
  return 2;
}

int report_parse_error(CLI::App& app, const CLI::ParseError& e, int argc, char** argv) {
  if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
  CLI::App* sub = argc > 1 ? find_command(app, argv[1]) : nullptr;
  const std::string where = sub != nullptr ? "tessera " + sub->get_name() + " --help" : "tessera --help";
  std::string msg = e.what();
  if (dynamic_cast<const CLI::ExtrasError*>(&e) != nullptr && sub != nullptr) {
    const std::vector<std::string> extras = app.remaining(true);
    const std::vector<std::string> names = option_names(*sub);
    std::optional<std::string> unknown, positional;
    for (const std::string& x : extras) {
      if (x.size() > 1 && x[0] == '-' && !(x[1] >= '0' && x[1] <= '9') && !unknown) {
        unknown = x.substr(0, x.find('='));
      } else if (!positional) {
        positional = x;
      }
    }
    if (unknown) {
      const auto near = closest(*unknown, names);
      msg = "unknown option " + *unknown + " for 'tessera " + sub->get_name() + "'" +
            (near ? "; did you mean " + *near + "?" : "");
    } else if (positional) {
      msg = "unexpected argument '" + *positional + "' for 'tessera " + sub->get_name() + "'";
      if (positional->size() > 5 && positional->compare(positional->size() - 5, 5, ".json") == 0 &&
          sub->get_option_no_throw("--json-out") != nullptr)
        msg += " (--json is a switch now; --json-out " + *positional + " writes the JSON to a file)";
    }
  }
  std::fprintf(stderr, "tessera: error: %s\n(%s lists the options)\n", msg.c_str(), where.c_str());
  return 2;
}

CLI::Validator in_range(double lo, double hi) {
  return CLI::Validator(
      [lo, hi](std::string& v) {
        char* end = nullptr;
        const double x = std::strtod(v.c_str(), &end);
        if (end == v.c_str() || *end != '\0') return v + " is not a number";
        if (!(x >= lo && x <= hi)) {
          char b[96];
          std::snprintf(b, sizeof b, "%s is not in [%g, %g]", v.c_str(), lo, hi);
          return std::string(b);
        }
        return std::string();
      },
      "");
}

}  // namespace tessera::cli
