// Incremental JSON / JSON Schema matcher: a pushdown automaton per live anyOf alternative. See the header.
#include "io/json_grammar.h"

#include "io/json_grammar_impl.h"

namespace tessera {

using namespace json_grammar_detail;  // NOLINT(google-build-using-namespace)

JsonGrammar::State JsonGrammar::start() const {
  return impl_->start_at(impl_->root);
}

bool JsonGrammar::State::feed(std::string_view bytes) {
  if (alts_.empty()) return false;
  std::vector<Stack> forks;
  for (char ch : bytes) {
    uint8_t c = uint8_t(ch);
    size_t w = 0;
    for (size_t i = 0; i < alts_.size(); ++i) {
      if (!g_->step(alts_[i], c, forks)) continue;
      if (w != i) alts_[w] = std::move(alts_[i]);
      ++w;
    }
    alts_.erase(alts_.begin() + w, alts_.end());
    if (!forks.empty()) {
      for (auto& f : forks) alts_.push_back(std::move(f));
      forks.clear();
    }
    if (alts_.size() > 1) {
      size_t k = 1;
      for (size_t i = 1; i < alts_.size() && k < kMaxAlts; ++i) {
        bool dup = false;
        for (size_t j = 0; j < k && !dup; ++j) dup = alts_[j] == alts_[i];
        if (dup) continue;
        if (i != k) alts_[k] = std::move(alts_[i]);
        ++k;
      }
      alts_.erase(alts_.begin() + k, alts_.end());
    }
    if (alts_.empty()) return false;
  }
  return true;
}

bool JsonGrammar::State::complete() const {
  for (auto& s : alts_)
    if (Impl::done(*g_, s)) return true;
  return false;
}

size_t JsonGrammar::State::min_completion() const {
  size_t best = SIZE_MAX;
  for (auto& s : alts_) best = std::min(best, g_->cost(s));
  return best >= kInf ? SIZE_MAX : best;
}

std::string JsonGrammar::State::shortest_completion() const {
  std::string out;
  State s = *this;
  size_t m = s.min_completion();
  while (m > 0 && m != SIZE_MAX) {
    bool found = false;
    for (int b = 0x21; b <= 0xF4 && !found; ++b) {
      State t = s;
      char ch = char(b);
      if (t.feed(std::string_view(&ch, 1)) && t.min_completion() == m - 1) {
        s = std::move(t);
        out += ch;
        --m;
        found = true;
      }
    }
    if (!found) break;
  }
  return out;
}

bool json_grammar_accepts(const JsonGrammar& g, std::string_view doc) {
  auto s = g.start();
  return s.feed(doc) && s.complete();
}

}  // namespace tessera
