// A Jinja2 template interpreter for Hugging Face chat templates: the semantics of Python's jinja2 3.1 in
// the environment transformers renders them with (ImmutableSandboxedEnvironment, trim_blocks,
// lstrip_blocks, loopcontrols; raise_exception, strftime_now; tojson as json.dumps).
#pragma once
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace tessera::jinja {

struct Limits {
  uint64_t max_steps = 20'000'000;  // evaluation steps (loop iterations, node evaluations)
  size_t max_output = 64u << 20;    // bytes of output / of any one string built
  int max_depth = 256;              // nesting of macro calls / recursion
};

class Template {
 public:
  // Parses `source`. Errors throw tessera::Error with a one-line message "<name>:<line>: <what>".
  explicit Template(std::string_view source, std::string name = "chat template");
  ~Template();
  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;
  // Renders with `context` (a JSON object whose keys are the template's variables, in order). Errors
  // (raise_exception, a type error, a limit) throw tessera::Error "<name>:<line>: <what>".
  std::string render(const nlohmann::ordered_json& context, const Limits& limits = {}) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera::jinja
