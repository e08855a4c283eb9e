#include "runtime/json_constraint.h"

#include <algorithm>

#include "core/error.h"

namespace tessera {
namespace {

class JsonConstraint final : public TokenConstraint {
 public:
  JsonConstraint(std::shared_ptr<const JsonGrammar> g, std::shared_ptr<const VocabBytes> v,
                 std::vector<int32_t> eos)
      : g_(std::move(g)), v_(std::move(v)), eos_(std::move(eos)) {}

  class S final : public State {
   public:
    S(const JsonConstraint& c, JsonGrammar::State s) : c_(c), s_(std::move(s)) {}
    std::unique_ptr<State> clone() const override { return std::make_unique<S>(*this); }
    bool allows(int32_t t, int64_t left) const override {
      if (c_.is_eos(t)) return ended_ || s_.complete();
      if (ended_ || left < 0 || t < 0 || static_cast<size_t>(t) >= c_.v_->usable.size() ||
          !c_.v_->usable[static_cast<size_t>(t)])
        return false;
      JsonGrammar::State next = s_;
      return next.feed(c_.v_->bytes[static_cast<size_t>(t)]) &&
             next.min_completion() <= static_cast<size_t>(left);
    }
    void take(int32_t t) override {
      if (c_.is_eos(t)) {
        ended_ = true;
        return;
      }
      TESSERA_CHECK(s_.feed(c_.v_->bytes[static_cast<size_t>(t)]),
                    "structured output: internal error, a token the constraint refuses was taken");
    }
    bool complete() const override { return ended_ || s_.complete(); }
    int64_t min_tokens() const override { return ended_ ? 0 : static_cast<int64_t>(s_.min_completion()); }

   private:
    const JsonConstraint& c_;
    JsonGrammar::State s_;
    bool ended_ = false;
  };

  std::unique_ptr<State> start() const override { return std::make_unique<S>(*this, g_->start()); }
  bool is_eos(int32_t t) const { return std::find(eos_.begin(), eos_.end(), t) != eos_.end(); }

 private:
  std::shared_ptr<const JsonGrammar> g_;
  std::shared_ptr<const VocabBytes> v_;
  std::vector<int32_t> eos_;
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
  for (int b = 0x20; b < 0xC0; ++b) {
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
                                                       std::vector<int32_t> eos) {
  if (eos.empty()) fail("structured output needs the model's EOS token (the model has none)");
  return std::make_shared<JsonConstraint>(std::move(grammar), std::move(vocab), std::move(eos));
}

}  // namespace tessera
