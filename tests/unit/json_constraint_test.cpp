// Structured output's token constraint (runtime/json_constraint.h) over a hand-made vocabulary: tokens
// continue the document, an EOS only once it is complete, the budget of positions is kept, and a suffix
// after the document (a forced tool call's end) is read both ways where it begins with what the document
// takes as whitespace.
#include "runtime/json_constraint.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "test_util.h"

namespace tessera {
namespace {

constexpr int32_t kEos = 300;

// Ids 0..255: the single bytes; 256..: the pieces below; kEos: no text.
const std::vector<std::string> kPieces = {"\n</", "tool_call>", "}\n", "{\"", "\":", "  "};

std::shared_ptr<VocabBytes> vocab() {
  auto v = std::make_shared<VocabBytes>();
  v->bytes.resize(kEos + 1);
  v->usable.assign(kEos + 1, 0);
  for (int b = 0; b < 256; ++b) {
    v->bytes[static_cast<size_t>(b)] = std::string(1, static_cast<char>(b));
    v->usable[static_cast<size_t>(b)] = 1;
  }
  for (size_t i = 0; i < kPieces.size(); ++i) {
    v->bytes[256 + i] = kPieces[i];
    v->usable[256 + i] = 1;
  }
  return v;
}

int32_t piece(const std::string& p) {
  if (p.size() == 1) return static_cast<unsigned char>(p[0]);
  return 256 + static_cast<int32_t>(std::find(kPieces.begin(), kPieces.end(), p) - kPieces.begin());
}

void take_all(TokenConstraint::State& s, std::initializer_list<const char*> ps, int64_t left = 1000) {
  for (const char* p : ps) {
    ASSERT_TRUE(s.allows(piece(p), left)) << "'" << p << "'";
    s.take(piece(p));
  }
}

TEST(JsonConstraint, TokensContinueTheDocumentAndEosEndsIt) {
  const auto c = json_constraint(JsonGrammar::any_object(), vocab(), {kEos});
  auto s = c->start();
  EXPECT_EQ(s->min_tokens(), 2);  // {}
  EXPECT_FALSE(s->allows(kEos, 10));
  EXPECT_FALSE(s->allows(piece("x"), 10));
  take_all(*s, {"{\"", "a", "\":", "1"});
  EXPECT_EQ(s->min_tokens(), 1);  // }
  EXPECT_FALSE(s->complete());
  EXPECT_FALSE(s->allows(kEos, 10));
  EXPECT_TRUE(s->allows(piece("}"), 0));
  EXPECT_FALSE(s->allows(piece("2"), 0));  // a digit more leaves no room for the }
  EXPECT_TRUE(s->allows(piece("2"), 1));
  take_all(*s, {"}"});
  EXPECT_TRUE(s->complete());
  EXPECT_TRUE(s->allows(kEos, 0));
  s->take(kEos);
  EXPECT_FALSE(s->allows(piece(" "), 10));  // only EOS after EOS
  EXPECT_TRUE(s->allows(kEos, 10));
}

TEST(JsonConstraint, ASuffixThatBeginsWithWhitespaceIsReadBothWays) {
  const std::string sfx = "\n</tool_call>";
  const auto c = json_constraint(JsonGrammar::any_object(), vocab(), {kEos}, sfx);
  auto s = c->start();
  EXPECT_EQ(s->min_tokens(), 2 + static_cast<int64_t>(sfx.size()));
  take_all(*s, {"{", "}"});
  EXPECT_FALSE(s->complete());
  EXPECT_FALSE(s->allows(kEos, 100));
  // With exactly the suffix's length left, "\n" must start the suffix (as whitespace it would leave no room).
  EXPECT_TRUE(s->allows(piece("\n"), static_cast<int64_t>(sfx.size()) - 1));
  EXPECT_FALSE(s->allows(piece(" "), static_cast<int64_t>(sfx.size()) - 1));
  // Whitespace first, then the suffix split across tokens.
  take_all(*s, {"  ", "\n", "\n</", "tool_call>"});
  EXPECT_TRUE(s->complete());
  EXPECT_TRUE(s->allows(kEos, 0));
  EXPECT_FALSE(s->allows(piece(" "), 10));  // nothing after the suffix
  // A token that closes the document and begins the suffix.
  auto t = c->start();
  take_all(*t, {"{", "\"", "k", "\":", "{", "}", "}\n", "<", "/"});
  EXPECT_EQ(t->min_tokens(), static_cast<int64_t>(std::string("tool_call>").size()));
  EXPECT_FALSE(t->allows(piece("x"), 100));
}

// Unusable ids are never allowed; a model without EOS cannot be constrained.
TEST(JsonConstraint, UnusableTokensAndNoEosAreRefused) {
  auto v = vocab();
  v->bytes[static_cast<size_t>('}')] = "";
  v->usable[static_cast<size_t>('}')] = 0;
  const auto c = json_constraint(JsonGrammar::any_object(), v, {kEos});
  auto s = c->start();
  take_all(*s, {"{"});
  EXPECT_FALSE(s->allows(piece("}"), 10));
  EXPECT_TRUE(s->allows(piece("}\n"), 10));
  test::expect_error([&] { (void)json_constraint(JsonGrammar::any_object(), v, {}); },
                     "needs the model's EOS token");
}

}  // namespace
}  // namespace tessera
