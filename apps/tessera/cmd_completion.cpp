// tessera completion bash: a bash completion script written from the command line's own definition, so
// it always knows every command, option and choice of this binary.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "apps/tessera/cli_parse.h"
#include "apps/tessera/commands.h"

namespace tessera::cli {

namespace {

// The choices of an option whose type reads "TEXT:{a,b,c}" (CLI11's IsMember), space-separated.
std::string choices(const CLI::Option& o) {
  const std::string t = o.get_type_name();
  const size_t open = t.find(":{"), close = t.find('}', open == std::string::npos ? 0 : open);
  if (open == std::string::npos || close == std::string::npos) return "";
  std::string c = t.substr(open + 2, close - open - 2);
  for (char& ch : c)
    if (ch == ',') ch = ' ';
  return c;
}

std::string bash_script(const CLI::App& app) {
  std::string cmds, cases;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    cmds += sub->get_name() + " ";
    std::string opts, values, files;
    for (const CLI::Option* o : sub->get_options()) {
      for (const std::string& n : spellings(*o)) {
        opts += n + " ";
        if (o->get_items_expected_max() == 0) continue;
        const std::string c = choices(*o);
        if (!c.empty())
          values += "      " + n + ") COMPREPLY=($(compgen -W \"" + c + "\" -- \"$cur\")); return ;;\n";
        else
          files += n + "|";
      }
    }
    if (!files.empty()) files.pop_back();
    cases +=
        "    " + sub->get_name() + ")\n      case \"$prev\" in\n" + values +
        (files.empty() ? "" : "      " + files + ") COMPREPLY=($(compgen -f -- \"$cur\")); return ;;\n") +
        "      esac\n      COMPREPLY=($(compgen -W \"" + opts + "\" -- \"$cur\")) ;;\n";
  }
  if (!cmds.empty()) cmds.pop_back();
  return "# bash completion for tessera (written by `tessera completion bash`)\n"
         "_tessera() {\n"
         "  local cur=\"${COMP_WORDS[COMP_CWORD]}\" prev=\"${COMP_WORDS[COMP_CWORD-1]}\"\n"
         "  if [ \"$COMP_CWORD\" -eq 1 ]; then\n"
         "    COMPREPLY=($(compgen -W \"" +
         cmds +
         " help --help --version\" -- \"$cur\")); return\n"
         "  fi\n"
         "  case \"${COMP_WORDS[1]}\" in\n" +
         cases + "    help) COMPREPLY=($(compgen -W \"" + cmds +
         "\" -- \"$cur\")) ;;\n"
         "  esac\n"
         "}\n"
         "complete -o default -F _tessera tessera\n";
}

}  // namespace

void add_completion(CLI::App& app, Registry& reg) {
  auto* sub = app.add_subcommand("completion", "Print a shell completion script (bash)");
  auto shell = std::make_shared<std::string>("bash");
  sub->add_option("shell", *shell, "the shell")->check(CLI::IsMember({"bash"}));
  sub->footer(
      "Example:\n  source <(tessera completion bash)     # this shell\n"
      "  tessera completion bash > ~/.local/share/bash-completion/completions/tessera");
  reg.handlers.emplace_back(sub, [&app] {
    const std::string s = bash_script(app);
    std::fwrite(s.data(), 1, s.size(), stdout);
    return 0;
  });
}

}  // namespace tessera::cli
