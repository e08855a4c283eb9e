#include "decode/options.h"

#include <array>
#include <string>

#include "core/error.h"

namespace tessera {
namespace {

template <class E, size_t N>
E parse_choice(std::string_view s, const std::array<std::string_view, N>& names, const std::string& what,
               const std::string& choices) {
  for (size_t i = 0; i < N; ++i)
    if (names[i] == s) return static_cast<E>(i);
  fail("unknown " + what + " '" + std::string(s) + "'; use " + choices);
}

constexpr std::array<std::string_view, 6> kUnmask = {"low_confidence", "random",      "origin",
                                                     "maskgit_plus",   "topk_margin", "entropy"};
constexpr std::array<std::string_view, 3> kCache = {"none", "prefix", "dual"};
constexpr std::array<std::string_view, 3> kDes = {"off", "seq", "vote"};
constexpr std::array<std::string_view, 2> kScope = {"block", "all"};
constexpr std::array<std::string_view, 3> kEditMode = {"off", "quality", "speed"};
constexpr std::array<std::string_view, 4> kMode = {"diffusion", "ar", "spec", "uniform"};
constexpr std::array<std::string_view, 2> kSpecSampling = {"match", "rejection"};

}  // namespace

Unmask parse_unmask(std::string_view s) {
  return parse_choice<Unmask>(s, kUnmask, "algorithm",
                              "one of low_confidence, random, origin, maskgit_plus, topk_margin, entropy");
}
KvCache parse_kv_cache(std::string_view s) {
  return parse_choice<KvCache>(s, kCache, "KV cache", "none, prefix or dual");
}
DesMode parse_des(std::string_view s) {
  return parse_choice<DesMode>(s, kDes, "expert sharing", "off, seq or vote");
}
DesScope parse_des_scope(std::string_view s) {
  return parse_choice<DesScope>(s, kScope, "des-scope", "block or all");
}
EditMode parse_edit_mode(std::string_view s) {
  return parse_choice<EditMode>(s, kEditMode, "edit mode", "off, quality or speed");
}
DecodeMode parse_decode_mode(std::string_view s) {
  return parse_choice<DecodeMode>(s, kMode, "mode", "diffusion, ar, spec or uniform");
}
std::string_view name(DecodeMode m) {
  return kMode[static_cast<size_t>(m)];
}
SpecSampling parse_spec_sampling(std::string_view s) {
  return parse_choice<SpecSampling>(s, kSpecSampling, "spec sampling", "match or rejection");
}
std::string_view name(SpecSampling s) {
  return kSpecSampling[static_cast<size_t>(s)];
}
EditPreset edit_preset(EditMode m) {
  return m == EditMode::Quality ? EditPreset{0.7f, 0.5f, 16} : EditPreset{0.5f, 0.0f, 16};
}
std::string_view name(EditMode m) {
  return kEditMode[static_cast<size_t>(m)];
}
void apply_edit_flags(const EditFlags& f, GenerateOptions& o) {
  const bool values = f.edit_threshold || f.max_post || f.penalty;
  if (f.mode == EditMode::Off) {
    TESSERA_CHECK(!values,
                  "edit-mode off turns token editing off; drop edit-threshold, max-post-steps and "
                  "edit-penalty, or choose edit-mode quality or speed");
    o.edit = false;
    return;
  }
  if (f.mode) {  // a preset, then what was given
    const EditPreset p = edit_preset(*f.mode);
    o.edit = true;
    o.threshold = f.threshold.value_or(p.threshold);
    o.edit_threshold = p.edit_threshold;
    o.max_post_steps = p.max_post_steps;
  }
  if (f.edit_threshold) {
    o.edit = true;
    o.edit_threshold = *f.edit_threshold;
  }
  if (f.max_post) o.max_post_steps = *f.max_post;
  if (f.penalty) o.edit_penalty = *f.penalty;
  TESSERA_CHECK(o.edit || !f.max_post,
                "max-post-steps applies to token editing; turn editing on (edit-mode or edit-threshold)");
}

std::string_view name(Unmask a) {
  return kUnmask[static_cast<size_t>(a)];
}
std::string_view name(KvCache c) {
  return kCache[static_cast<size_t>(c)];
}
std::string_view name(DesMode d) {
  return kDes[static_cast<size_t>(d)];
}
std::string_view name(DesScope s) {
  return kScope[static_cast<size_t>(s)];
}

}  // namespace tessera
