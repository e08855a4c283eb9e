#include "runtime/json_constraint.h"

#include <algorithm>

#include "core/error.h"

namespace tessera {
namespace {

class JsonConstraint final : public TokenConstraint {
 public:
  JsonConstraint(std::shared_ptr<const JsonGrammar> g, std::shared_ptr<const VocabBytes> v,
                 std::vector<int32_t> eos, std::string suffix)
      : g_(std::move(g)), v_(std::move(v)), eos_(std::move(eos)), suffix_(std::move(suffix)) {}

  class S final : public State {
   public:
    S(const JsonConstraint& c, JsonGrammar::State s) : c_(c), s_(std::move(s)) {}
    std::unique_ptr<State> clone() const override { return std::make_unique<S>(*this); }
    bool allows(int32_t t, int64_t left) const override {
      if (c_.is_eos(t)) return ended_ || complete();
      if (ended_ || left < 0 || t < 0 || static_cast<size_t>(t) >= c_.v_->usable.size() ||
          !c_.v_->usable[static_cast<size_t>(t)])
        return false;
      S next = *this;
      return next.feed(c_.v_->bytes[static_cast<size_t>(t)]) && next.min_tokens() <= left;
    }
    void take(int32_t t) override {
      if (c_.is_eos(t)) {
        ended_ = true;
        return;
      }
      TESSERA_CHECK(feed(c_.v_->bytes[static_cast<size_t>(t)]),
                    "structured output: internal error, a token the constraint refuses was taken");
    }
    bool complete() const override {
      if (ended_) return true;
      if (c_.suffix_.empty()) return json_ && s_.complete();
      return (sfx_ >> c_.suffix_.size()) & 1;
    }
    int64_t min_tokens() const override {
      if (ended_) return 0;
      const size_t n = c_.suffix_.size();
      size_t best = json_ ? s_.min_completion() + n : SIZE_MAX;
      for (size_t k = 0; k <= n; ++k)
        if ((sfx_ >> k) & 1) best = std::min(best, n - k);
      return static_cast<int64_t>(best);
    }

   private:
    // The bytes into the document, and into the suffix once the document is complete. Both readings are
    // kept where they differ (the suffix may begin with what the document takes as whitespace): the
    // document's state while it is alive, and the set of suffix lengths matched so far (bit k: k bytes).
    bool feed(std::string_view bytes) {
      const std::string& sfx = c_.suffix_;
      if (sfx_ == 0 && (sfx.empty() || bytes.find(sfx[0]) == std::string_view::npos)) {
        if (!json_) return false;  // the common case: the whole token goes to the document
        return s_.feed(bytes);
      }
      for (const char ch : bytes) {
        uint64_t next = 0;
        for (size_t k = 0; k < sfx.size(); ++k)
          if (((sfx_ >> k) & 1) && sfx[k] == ch) next |= uint64_t{1} << (k + 1);
        if (json_) {
          if (!sfx.empty() && s_.complete() && sfx[0] == ch) next |= 2;
          JsonGrammar::State one = s_;
          json_ = one.feed(std::string_view(&ch, 1));
          if (json_) s_ = std::move(one);
        }
        sfx_ = next;
        if (!json_ && sfx_ == 0) return false;
      }
      return true;
    }
    const JsonConstraint& c_;
    JsonGrammar::State s_;
    bool json_ = true, ended_ = false;  // json_: the document reading is alive
    uint64_t sfx_ = 0;                  // the suffix lengths matched (bit k)
  };

  std::unique_ptr<State> start() const override { return std::make_unique<S>(*this, g_->start()); }
  bool is_eos(int32_t t) const { return std::find(eos_.begin(), eos_.end(), t) != eos_.end(); }

 private:
  std::shared_ptr<const JsonGrammar> g_;
  std::shared_ptr<const VocabBytes> v_;
  std::vector<int32_t> eos_;
  std::string suffix_;
};

}  // namespace

std::shared_ptr<const VocabBytes> VocabBytes::of(const Tokenizer& t, int64_t vocab) {
  auto v = std::make_shared<VocabBytes>();
  const auto n = static_cast<size_t>(vocab);
  v->bytes.resize(n);
  v->usable.assign(n, 0);
  std::vector<char> single(256, 0);
  for (size_t id = 0; id < n && id < t.vocab_size(); ++id) {
    try {
      if (t.is_special(static_cast<int32_t>(id))) continue;
      v->bytes[id] = t.token_text(static_cast<int32_t>(id));
    } catch (const Error&) {  // a gap in the ids
      continue;
    }
    v->usable[id] = !v->bytes[id].empty();
    if (v->bytes[id].size() == 1) single[static_cast<unsigned char>(v->bytes[id][0])] = 1;
  }
  for (int b = 0x0A; b < 0xC0; ++b) {  // \n (a tool call's end), printable ASCII, continuation bytes
    if (b == 0x0B) b = 0x20;
    if (b == 0x7F) b = 0x80;
    if (!single[static_cast<size_t>(b)]) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02X", b);
      fail(std::string(
               "structured output needs a token for every ASCII character and UTF-8 continuation byte; "
               "this vocabulary has none for byte ") +
           hex);
    }
  }
  return v;
}

std::shared_ptr<const TokenConstraint> json_constraint(std::shared_ptr<const JsonGrammar> grammar,
                                                       std::shared_ptr<const VocabBytes> vocab,
                                                       std::vector<int32_t> eos, std::string suffix) {
  if (eos.empty()) fail("structured output needs the model's EOS token (the model has none)");
  if (suffix.size() > 62) fail("structured output: a suffix of more than 62 bytes");
  return std::make_shared<JsonConstraint>(std::move(grammar), std::move(vocab), std::move(eos),
                                          std::move(suffix));
}

}  // namespace tessera
