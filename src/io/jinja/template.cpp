// tessera::jinja::Template: parse once, render with a JSON context.
#include "core/error.h"
#include "io/jinja/interp.h"
#include "io/jinja/jinja.h"

namespace tessera::jinja {

struct Template::Impl {
  std::string name;
  Program program;
};

Template::Template(std::string_view source, std::string name) : impl_(std::make_unique<Impl>()) {
  impl_->name = std::move(name);
  try {
    impl_->program = parse(source);
  } catch (RenderError& e) {
    fail(impl_->name + ":" + std::to_string(e.line) + ": " + e.msg);
  }
}

Template::~Template() = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

std::string Template::render(const nlohmann::ordered_json& context, const Limits& limits) const {
  auto globals = std::make_shared<Frame>();
  std::string out;
  try {
    install_globals(*globals);
    auto root = std::make_shared<Frame>(Frame{{}, globals});
    if (!context.is_null() && !context.is_object()) raise("the context must be a JSON object");
    if (context.is_object())
      for (auto& [k, v] : context.items()) root->set(k, from_json(v));
    Interp in(limits, globals);
    in.exec(impl_->program.body, root, out);
  } catch (RenderError& e) {
    fail(impl_->name + ":" + std::to_string(e.line) + ": " + e.msg);
  }
  return out;
}

}  // namespace tessera::jinja
