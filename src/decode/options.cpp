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
