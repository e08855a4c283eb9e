// The command line's own messages: an unknown command or option gets the closest real one, every
// parse error one `tessera: error:` line and where to look, `tessera help [COMMAND]` the help.
#pragma once
#include <CLI/CLI.hpp>
#include <optional>
#include <string>
#include <vector>

namespace tessera::cli {

// Edit distance (Levenshtein, transpositions counted once) between two strings.
size_t edit_distance(const std::string& a, const std::string& b);
// The candidate closest to `word` when it is close enough to be a typo of it (or a prefix of exactly
// one candidate), else nothing.
std::optional<std::string> closest(const std::string& word, const std::vector<std::string>& candidates);

// Before CLI11 parses: `tessera`, `tessera help [COMMAND]` and an unknown command are answered here.
// Returns the exit status when the command line was answered, nothing when CLI11 should parse it.
std::optional<int> answer_before_parse(CLI::App& app, int argc, char** argv);
// A parse error as one line (`tessera: error: ...`, with the closest option for an unknown one) and a
// hint; returns the exit status (0 for --help / --version, which print as CLI11 does).
int report_parse_error(CLI::App& app, const CLI::ParseError& e, int argc, char** argv);

// Every spelling of an option: --long and -s.
std::vector<std::string> spellings(const CLI::Option& o);

// A numeric range check whose message reads "-1 is not in [0, 100]".
CLI::Validator in_range(double lo, double hi);

}  // namespace tessera::cli
