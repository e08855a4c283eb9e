// An incremental matcher of JSON documents against a grammar: any JSON object (OpenAI's response_format
// json_object) or a JSON Schema (json_schema), for constrained decoding. A State is fed the bytes of a
// document as they are generated; it says whether they can still continue a valid document, whether they
// are one already, and how many bytes at least complete one.
//
// Documents: standard JSON texts (RFC 8259), with these restrictions (each makes the language smaller,
// never larger, so every accepted document is valid):
//  - Strings: escapes \" \\ \/ \b \f \n \r \t \uXXXX; any valid UTF-8 (invalid UTF-8, raw control bytes
//    < 0x20 and lone or reversed UTF-16 surrogate escapes are refused).
//  - Numbers: the JSON grammar (no leading zeros, optional fraction and exponent). "integer" accepts only
//    the digits form (-12, not 12.0 or 1e3).
//  - Whitespace (space, \t, \n, \r) wherever JSON allows it, at most 8 bytes in a row; none is required.
//  - Nesting of objects and arrays is bounded to 32 levels.
//  - In objects with declared properties, keys are written byte for byte as the compact JSON form of a
//    declared name (as nlohmann::json dumps it: UTF-8 kept raw), and further keys (where the schema allows
//    them) may not use backslash escapes (so that `"\u0061"` can never stand for a declared "a").
//  - enum / const values must be written in their compact form (nlohmann::json dump(): `{"x":1}`, `1.5`,
//    `"é"`): matching is byte-level.
//
// Schema keywords supported (from_schema):
//  type ("object", "array", "string", "number", "integer", "boolean", "null", or an array of them; absent:
//  any type), properties, required, additionalProperties (true / false / a schema), items (a schema or a
//  boolean), prefixItems, minItems, maxItems, minLength, maxLength (Unicode code points), enum, const,
//  anyOf, oneOf (treated as anyOf: a value matching several alternatives is accepted), $ref to
//  "#", "#/$defs/Name" or "#/definitions/Name" (recursion allowed), $defs, definitions, boolean schemas;
//  ignored annotations: title, description, default, examples, $schema, $id, $comment, deprecated,
//  readOnly, writeOnly, strict. Type-specific keywords apply to values of that type only (JSON Schema
//  semantics). anyOf/oneOf beside other keywords are merged into each alternative where this is exact
//  (type: intersected, required: united, other keywords: when only one side has them); otherwise refused.
//  Everything else (pattern, format, minimum, not, allOf, if, uniqueItems, ...) is refused with a
//  tessera::Error naming the keyword and its JSON pointer: better to refuse than to emit invalid output.
//  At most 64 properties (declared or required) per object schema.
//
// Known limits: min_completion() assumes the nesting bound does not bind (schemas whose shortest values
// nest deeper than the room left under 32 levels); at most 256 anyOf alternatives are tracked at once
// (further ones are dropped, which refuses some valid documents but never accepts invalid ones).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace tessera {

namespace json_grammar_detail {
struct Impl;
// One level of the matcher's pushdown stack (internal).
struct Frame {
  uint8_t kind = 0, st = 0;  // frame kind, sub-state
  uint8_t lex = 0, rem = 0;  // string lexer: state, UTF-8 continuation bytes left
  uint8_t lo8 = 0, hi8 = 0;  // string lexer: bounds of the next UTF-8 continuation byte
  uint8_t ud = 0, esc = 0;   // string lexer: \u digits seen; key used a backslash
  uint16_t u = 0;            // string lexer: \u value so far
  uint16_t cur = 0;          // object: property being written (kExtra for an undeclared key)
  uint32_t node = 0;         // schema node
  uint32_t n = 0;            // array: items; string and key: code points; enum / literal: bytes matched
  uint32_t kp = 0;           // key: bytes matched
  uint32_t lo = 0, hi = 0;   // key / enum: candidate literals [lo, hi)
  uint64_t seen = 0;         // object: declared properties given
  bool operator==(const Frame&) const = default;
};
struct Stack {
  std::vector<Frame> f;
  uint32_t ws = 0;  // consecutive structural whitespace bytes
  bool operator==(const Stack&) const = default;
};
}  // namespace json_grammar_detail

// A compiled JSON grammar. Immutable, shareable across threads.
class JsonGrammar {
 public:
  ~JsonGrammar();
  JsonGrammar(const JsonGrammar&) = delete;
  JsonGrammar& operator=(const JsonGrammar&) = delete;

  // Any JSON object (json_object mode).
  static std::shared_ptr<const JsonGrammar> any_object();
  // A JSON Schema (see the keywords above). Throws tessera::Error naming the first unsupported keyword
  // and its JSON pointer, and for schemas no value can satisfy.
  static std::shared_ptr<const JsonGrammar> from_schema(const nlohmann::ordered_json& schema);

  // The state after some bytes of a document. Copyable; copies are independent and cheap (a vector of
  // alternatives, each a small vector of frames). Refers to its grammar: must not outlive it.
  class State {
   public:
    State() = default;
    // Feeds bytes; false when they cannot continue any valid document (the state is then unspecified:
    // callers feed a copy). After a complete document only JSON whitespace is accepted.
    bool feed(std::string_view bytes);
    // Whether the bytes so far are a whole valid document (trailing whitespace allowed).
    bool complete() const;
    // The fewest bytes that complete the document from here (0 when complete(); SIZE_MAX after a failed
    // feed). Exact: a completion of exactly this many bytes exists, and it is made of single ASCII bytes,
    // except inside a multi-byte UTF-8 character, whose remaining continuation bytes come first.
    size_t min_completion() const;
    // A completion of exactly min_completion() bytes (debugging and tests; slow: tries bytes greedily).
    std::string shortest_completion() const;

   private:
    friend class JsonGrammar;
    friend struct json_grammar_detail::Impl;
    const json_grammar_detail::Impl* g_ = nullptr;
    std::vector<json_grammar_detail::Stack> alts_;  // the live alternatives (anyOf); none: failed
  };
  State start() const;

 private:
  friend struct json_grammar_detail::Impl;
  JsonGrammar();
  std::unique_ptr<json_grammar_detail::Impl> impl_;
};

// Whether `doc` is a whole document of the grammar (start().feed(doc) && complete()).
bool json_grammar_accepts(const JsonGrammar& g, std::string_view doc);

}  // namespace tessera
