// Tests of the incremental JSON / JSON Schema matcher (src/io/json_grammar.h).
#include "io/json_grammar.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "core/error.h"

namespace tessera {
namespace {

using ojson = nlohmann::ordered_json;

std::shared_ptr<const JsonGrammar> G(const char* schema) {
  return JsonGrammar::from_schema(ojson::parse(schema));
}
bool acc(const JsonGrammar& g, std::string_view doc) {
  return json_grammar_accepts(g, doc);
}
bool viable(const JsonGrammar& g, std::string_view prefix) {
  auto s = g.start();
  return s.feed(prefix);
}
size_t mc(const JsonGrammar& g, std::string_view prefix) {
  auto s = g.start();
  EXPECT_TRUE(s.feed(prefix)) << prefix;
  return s.min_completion();
}
std::string refused_msg(const char* schema) {
  try {
    G(schema);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(JsonGrammar, AnyObjectDocuments) {
  auto g = JsonGrammar::any_object();
  for (const char* d : {"{}", "{\"a\":1}", " {\"a\" : [1, 2, {\"b\":null}], \"c\":\"x\", \"d\":true} \n",
                        "{\"a\\\"b\":{\"\":[]}}", "{\"k\":-0.5e+3}", "{\"k\":\"\\u00e9\\ud83d\\ude00\"}"})
    EXPECT_TRUE(acc(*g, d)) << d;
  for (const char* d : {"[]", "1", "\"a\"", "{\"a\":1,}", "{\"a\" 1}", "{a:1}", "{\"a\":01}", "{}x", "{}{}",
                        "{\"a\":1", "", "{\"a\":tru}", "{\"a\":[1,]}", "{,}"})
    EXPECT_FALSE(acc(*g, d)) << d;
  EXPECT_TRUE(viable(*g, "{\"a\":"));
  EXPECT_FALSE(viable(*g, "{\"a\":}"));
  EXPECT_FALSE(viable(*g, "["));
  // Nesting is bounded to 32 levels.
  std::string deep = "{\"a\":" + std::string(31, '[') + std::string(31, ']') + "}";
  EXPECT_TRUE(acc(*g, deep));
  EXPECT_FALSE(viable(*g, "{\"a\":" + std::string(32, '[')));
}

TEST(JsonGrammar, Whitespace) {
  auto g = JsonGrammar::any_object();
  EXPECT_TRUE(acc(*g, std::string(8, ' ') + "{}" + std::string(8, '\n')));
  EXPECT_FALSE(viable(*g, std::string(9, ' ')));
  EXPECT_TRUE(acc(*g, "{\"a\":1\t\t\t\t\t\t\t\t,\r\"b\"\n:\n2}"));
  EXPECT_FALSE(viable(*g, "{\"a\":1         "));
  EXPECT_TRUE(acc(*g, "{\"a\":\"          \"}"));  // spaces inside strings are content
  EXPECT_FALSE(viable(*g, "{\f"));
}

TEST(JsonGrammar, Strings) {
  auto g = G(R"({"type":"string"})");
  for (const char* d : {"\"\"", "\"\\\" \\\\ \\/ \\b \\f \\n \\r \\t \\u0041\"",
                        "\"\xc3\xa9\xe4\xb8\xad\xf0\x9f\x98\x80\"", "\"\\ud83d\\ude00\"", "\"\\u0000\""})
    EXPECT_TRUE(acc(*g, d)) << d;
  for (const char* d :
       {"\"\x01\"", "\"\n\"", "\"\xc0\x80\"", "\"\xed\xa0\x80\"", "\"\xf5\x80\x80\x80\"", "\"\xe4\xb8\"",
        "\"\\x\"", "\"\\udc00\"", "\"\\ud83d\"", "\"\\ud83dx\"", "\"\\ud83d\\u0041\"", "\"\\u12g4\""})
    EXPECT_FALSE(acc(*g, d)) << d;
  EXPECT_FALSE(viable(*g, "\"\\udc"));
  EXPECT_FALSE(viable(*g, "\"\xe0\x80"));  // overlong
}

TEST(JsonGrammar, Numbers) {
  auto num = G(R"({"type":"number"})");
  auto integer = G(R"({"type":"integer"})");
  for (const char* d : {"0", "-0", "12", "0.5e-3", "1E9", "-1.25", "1e+2"}) EXPECT_TRUE(acc(*num, d)) << d;
  for (const char* d : {"01", ".5", "+1", "1.e3", "1.", "-", "1e", "1e+", "--1", "0x1", "1 2"})
    EXPECT_FALSE(acc(*num, d)) << d;
  for (const char* d : {"0", "-7", "123"}) EXPECT_TRUE(acc(*integer, d)) << d;
  for (const char* d : {"1.0", "1e3", "1.5"}) EXPECT_FALSE(acc(*integer, d)) << d;
  EXPECT_EQ(mc(*num, "-"), 1u);
  EXPECT_EQ(mc(*num, "1."), 1u);
  EXPECT_EQ(mc(*num, "1e"), 1u);
  EXPECT_EQ(mc(*num, "1e-"), 1u);
  EXPECT_EQ(mc(*num, "1e-5"), 0u);
  EXPECT_EQ(mc(*num, ""), 1u);
}

TEST(JsonGrammar, LiteralsAndTypeArrays) {
  auto g = G(R"({"type":["boolean","null"]})");
  for (const char* d : {"true", "false", "null", " null "}) EXPECT_TRUE(acc(*g, d)) << d;
  for (const char* d : {"nul", "True", "0", "\"true\"", "truex"}) EXPECT_FALSE(acc(*g, d)) << d;
  EXPECT_EQ(mc(*g, "f"), 4u);
  EXPECT_EQ(mc(*g, "nu"), 2u);
  EXPECT_EQ(mc(*g, ""), 4u);
  auto any = G("{}");
  for (const char* d : {"1", "\"x\"", "[1,{}]", "{\"a\":null}", "true"}) EXPECT_TRUE(acc(*any, d)) << d;
  auto sn = G(R"({"type":["string","null"]})");
  EXPECT_TRUE(acc(*sn, "\"a\""));
  EXPECT_FALSE(acc(*sn, "1"));
}

TEST(JsonGrammar, MinCompletionAnyObject) {
  auto g = JsonGrammar::any_object();
  EXPECT_EQ(mc(*g, ""), 2u);
  EXPECT_EQ(mc(*g, "{"), 1u);
  EXPECT_EQ(mc(*g, "{\""), 4u);  // ":0}
  EXPECT_EQ(mc(*g, "{\"a"), 4u);
  EXPECT_EQ(mc(*g, "{\"a\""), 3u);
  EXPECT_EQ(mc(*g, "{\"a\":"), 2u);
  EXPECT_EQ(mc(*g, "{\"a\":1"), 1u);
  EXPECT_EQ(mc(*g, "{\"a\":-"), 2u);
  EXPECT_EQ(mc(*g, "{\"a\":1."), 2u);
  EXPECT_EQ(mc(*g, "{\"a\":t"), 4u);
  EXPECT_EQ(mc(*g, "{\"a\":\"\\"), 3u);       // n"}
  EXPECT_EQ(mc(*g, "{\"a\":\"\\u12"), 4u);    // 34"}
  EXPECT_EQ(mc(*g, "{\"a\":\"\\ud83d"), 8u);  // \udc00"}
  EXPECT_EQ(mc(*g, "{\"a\":[1"), 2u);
  EXPECT_EQ(mc(*g, "{\"a\":[1,"), 3u);
  EXPECT_EQ(mc(*g, "{\"a\":1,"), 5u);  // "":0}
  EXPECT_EQ(mc(*g, "{}"), 0u);
  EXPECT_EQ(mc(*g, "{\"a\":\"\xe4"), 4u);  // two continuation bytes, then "}
}

const char* kPerson = R"({"type":"object","properties":{"name":{"type":"string","minLength":1,"maxLength":8},
  "age":{"type":"integer"},"tags":{"type":"array","items":{"type":"string"},"maxItems":3},"ok":{"type":"boolean"}},
  "required":["name","age"],"additionalProperties":false})";

TEST(JsonGrammar, ObjectRequiredAndAdditional) {
  auto g = G(kPerson);
  EXPECT_TRUE(acc(*g, R"({"name":"x","age":3})"));
  EXPECT_TRUE(acc(*g, R"({"age":3,"ok":false,"name":"x","tags":["a","b"]})"));
  EXPECT_FALSE(acc(*g, R"({"name":"x"})"));
  EXPECT_FALSE(acc(*g, R"({"name":"","age":1})"));
  EXPECT_FALSE(acc(*g, R"({"name":"x","name":"y","age":1})"));
  EXPECT_FALSE(acc(*g, R"({"name":"x","age":1,"zip":1})"));
  EXPECT_FALSE(acc(*g, R"({"name":"x","age":1.5})"));
  EXPECT_FALSE(acc(*g, R"({"name":"x","age":1,"tags":["a","b","c","d"]})"));
  EXPECT_TRUE(viable(*g, "{\"nam"));
  EXPECT_FALSE(viable(*g, "{\"x"));
  EXPECT_FALSE(viable(*g, "{\"name\":\"x\",\"nam"));  // already given
  EXPECT_FALSE(viable(*g, "{\"\\u006eame"));          // escapes never spell declared keys
  EXPECT_FALSE(viable(*g, R"({"name":"x","age":3,"ok":true,"tags":[],)"));  // no key left
  EXPECT_EQ(mc(*g, ""), 20u);                                               // {"age":0,"name":"a"}
  EXPECT_EQ(mc(*g, "{\"name\":\""), 11u);                                   // a","age":0}
  EXPECT_EQ(mc(*g, "{\"tags\":["), 21u);                                    // ],"age":0,"name":"a"}
  EXPECT_EQ(mc(*g, "{\"t"), 27u);                                           // ags":[],"age":0,"name":"a"}
  EXPECT_EQ(mc(*g, "{\"age\":1,"), 11u);                                    // "name":"a"}
  EXPECT_EQ(mc(*g, "{\"age\":1,\"name\":\"a\","), 10u);                     // "ok":true}

  auto ab = G(
      R"({"type":"object","properties":{"a":{"type":"array"},"b":{"type":"string"}},"required":["a","b"]})");
  EXPECT_EQ(mc(*ab, "{\"a\":[1"), 9u);  // ],"b":""}
  // Undeclared required keys take additionalProperties; undeclared keys may not use escapes.
  auto extra =
      G(R"({"type":"object","properties":{"a":{"type":"null"}},"additionalProperties":{"type":"number"},
                    "required":["a","zz"]})");
  EXPECT_TRUE(acc(*extra, R"({"zz":1,"a":null,"q":2.5})"));
  EXPECT_FALSE(acc(*extra, R"({"zz":"x","a":null})"));
  EXPECT_FALSE(acc(*extra, R"({"a":null,"q":1})"));
  EXPECT_FALSE(viable(*extra, R"({"a\u0062)"));
  EXPECT_EQ(mc(*extra, ""), 17u);                         // {"a":null,"zz":0}
  EXPECT_EQ(mc(*extra, "{\"a\":null,\"zz\":0,"), 5u);     // "":0}
  EXPECT_EQ(mc(*extra, "{\"a\":null,\"zz\":0,\"a"), 5u);  // x":0}: "a" itself is given already
}

TEST(JsonGrammar, KeysWithSharedPrefixes) {
  auto g = G(
      R"({"type":"object","properties":{"a":{"type":"integer"},"ab":{"type":"string"},"abc":{"type":"boolean"},
                 "b\"q":{"type":"null"}},"additionalProperties":false})");
  EXPECT_TRUE(acc(*g, R"({"abc":true,"a":1,"ab":"s","b\"q":null})"));
  EXPECT_FALSE(acc(*g, R"({"ab":1})"));
  EXPECT_FALSE(acc(*g, R"({"abcd":1})"));
  EXPECT_EQ(mc(*g, "{\"a"), 4u);          // ":0}
  EXPECT_EQ(mc(*g, "{\"a\":0,\"a"), 6u);  // b":""}
  EXPECT_EQ(mc(*g, "{\"b"), 10u);         // \"q":null}
}

TEST(JsonGrammar, Arrays) {
  auto g = G(R"({"type":"array","prefixItems":[{"type":"number"},{"type":"string"}],"items":{"type":"null"},
                "minItems":1,"maxItems":3})");
  for (const char* d : {"[1]", "[1,\"a\"]", "[1,\"a\",null]", "[ 2 , \"\" ]"}) EXPECT_TRUE(acc(*g, d)) << d;
  for (const char* d : {"[]", "[\"a\"]", "[1,2]", "[1,\"a\",null,null]", "[1,\"a\",1]"})
    EXPECT_FALSE(acc(*g, d)) << d;
  EXPECT_EQ(mc(*g, ""), 3u);
  EXPECT_EQ(mc(*g, "["), 2u);
  EXPECT_EQ(mc(*g, "[1,"), 3u);
  auto tuple = G(R"({"type":"array","prefixItems":[{"type":"boolean"}],"items":false,"minItems":1})");
  EXPECT_TRUE(acc(*tuple, "[true]"));
  EXPECT_FALSE(viable(*tuple, "[true,"));
  EXPECT_EQ(mc(*tuple, ""), 6u);
  auto many = G(R"({"type":"array","items":{"type":"string","minLength":2},"minItems":3})");
  EXPECT_EQ(mc(*many, ""), 16u);  // ["aa","aa","aa"]
  EXPECT_EQ(mc(*many, "[\"a"), 13u);
  EXPECT_EQ(mc(*many, "[\"aa\","), 10u);
}

TEST(JsonGrammar, StringLengths) {
  auto g = G(R"({"type":"string","minLength":2,"maxLength":3})");
  for (const char* d : {"\"\xc3\xa9\xe4\xb8\xad\"", "\"ab\"", "\"\\ud83d\\ude00x\"", "\"\\n\\t\\\"\""})
    EXPECT_TRUE(acc(*g, d)) << d;
  for (const char* d : {"\"a\"", "\"abcd\"", "\"\"", "\"\\u0041bcd\""}) EXPECT_FALSE(acc(*g, d)) << d;
  EXPECT_EQ(mc(*g, "\""), 3u);
  EXPECT_EQ(mc(*g, "\"\\u"), 6u);  // 0000a"
  EXPECT_FALSE(viable(*g, "\"abcd"));
}

TEST(JsonGrammar, EnumAndConst) {
  auto g = G(R"({"enum":["red","green",1,[1,2],{"x":1},null,12]})");
  for (const char* d : {"\"red\"", "1", "12", "[1,2]", "{\"x\":1}", "null", " \"green\" "})
    EXPECT_TRUE(acc(*g, d)) << d;
  for (const char* d : {"\"blue\"", "[1, 2]", "123", "1.0", "{\"x\": 1}", "\"re\"", "2"})
    EXPECT_FALSE(acc(*g, d)) << d;
  EXPECT_EQ(mc(*g, ""), 1u);
  EXPECT_EQ(mc(*g, "\"gr"), 4u);
  EXPECT_EQ(mc(*g, "\""), 4u);
  EXPECT_EQ(mc(*g, "{"), 6u);
  auto c = G(R"({"type":"object","properties":{"kind":{"const":"a"}},"required":["kind"]})");
  EXPECT_TRUE(acc(*c, R"({"kind":"a"})"));
  EXPECT_FALSE(acc(*c, R"({"kind":"b"})"));
  // Enum values that break the schema's other keywords are dropped.
  auto typed = G(R"({"type":"string","enum":["a",1,"bbb"],"maxLength":2})");
  EXPECT_TRUE(acc(*typed, "\"a\""));
  EXPECT_FALSE(acc(*typed, "1"));
  EXPECT_FALSE(acc(*typed, "\"bbb\""));
  auto both = G(R"({"enum":[1,2],"const":2})");
  EXPECT_TRUE(acc(*both, "2"));
  EXPECT_FALSE(acc(*both, "1"));
}

TEST(JsonGrammar, AnyOf) {
  auto g =
      G(R"({"anyOf":[{"type":"string","maxLength":1},{"type":"integer"},{"type":"string","minLength":3}]})");
  for (const char* d : {"\"a\"", "\"\"", "\"abc\"", "\"abcdef\"", "-4"}) EXPECT_TRUE(acc(*g, d)) << d;
  for (const char* d : {"\"ab\"", "1.5", "null"}) EXPECT_FALSE(acc(*g, d)) << d;
  EXPECT_EQ(mc(*g, "\"ab"), 2u);
  EXPECT_EQ(mc(*g, "\"a"), 1u);
  EXPECT_EQ(mc(*g, ""), 1u);
  auto merged = G(R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string"}},
                     "anyOf":[{"required":["a"]},{"required":["b"]}]})");
  EXPECT_FALSE(acc(*merged, "{}"));
  EXPECT_TRUE(acc(*merged, R"({"a":1})"));
  EXPECT_TRUE(acc(*merged, R"({"b":"x","c":[]})"));
  EXPECT_FALSE(acc(*merged, R"({"b":1})"));
  EXPECT_EQ(mc(*merged, ""), 7u);  // {"a":0}
  auto one = G(R"({"oneOf":[{"type":"null"},{"$ref":"#/$defs/P"}],"$defs":{"P":{"type":"boolean"}}})");
  EXPECT_TRUE(acc(*one, "null"));
  EXPECT_TRUE(acc(*one, "false"));
  EXPECT_FALSE(acc(*one, "0"));
}

TEST(JsonGrammar, RecursiveRefs) {
  auto g = G(R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},
    "kids":{"type":"array","items":{"$ref":"#/$defs/node"}}},"required":["v"],"additionalProperties":false}},
    "$ref":"#/$defs/node"})");
  EXPECT_TRUE(acc(*g, R"({"v":1,"kids":[{"v":2},{"kids":[],"v":3}]})"));
  EXPECT_FALSE(acc(*g, R"({"v":1,"kids":[{}]})"));
  EXPECT_EQ(mc(*g, R"({"kids":[{"kids":[)"), 16u);  // ],"v":0}],"v":0}
  auto list =
      G(R"({"definitions":{"L":{"type":["null","object"],"properties":{"next":{"$ref":"#/definitions/L"}}}},
                   "$ref":"#/definitions/L"})");
  EXPECT_TRUE(acc(*list, R"({"next":{"next":null}})"));
  EXPECT_FALSE(acc(*list, R"({"next":1})"));
  auto self = G(R"({"type":"array","items":{"$ref":"#"}})");
  EXPECT_TRUE(acc(*self, "[[],[[]]]"));
  EXPECT_FALSE(acc(*self, "[1]"));
}

TEST(JsonGrammar, RefusedSchemas) {
  std::string m = refused_msg(R"({"type":"object","properties":{"id":{"type":"string","pattern":"^a"}}})");
  EXPECT_NE(m.find("json_schema: 'pattern' at /properties/id is not supported (supported: type,"),
            std::string::npos)
      << m;
  for (const char* s :
       {R"({"type":"string","format":"date"})", R"({"type":"integer","minimum":0})", R"({"allOf":[{}]})",
        R"({"not":{}})", R"({"type":"array","items":[{}]})", R"({"$ref":"http://x/y"})",
        R"({"$ref":"#/$defs/missing"})", R"({"type":"strin"})",
        R"({"type":"string","minLength":3,"maxLength":2})", R"({"type":"array","uniqueItems":true})",
        R"({"type":"object","required":["a"],"additionalProperties":false})",
        R"({"type":"string","anyOf":[{"minLength":1}],"minLength":2})", R"(false)"})
    EXPECT_THROW(G(s), Error) << s;
  EXPECT_NE(refused_msg(R"({"items":{"minimum":1}})").find("/items"), std::string::npos);
  EXPECT_NO_THROW(G(R"({"title":"t","description":"d","default":1,"examples":[1],"$schema":"x","$id":"y",
                       "$comment":"c","deprecated":false,"readOnly":true,"writeOnly":false,"type":"integer"})"));
}

// ---- Property tests: random valid documents from schemas ----

struct Gen {
  const ojson& root;
  std::mt19937& rng;
  int r(int n) { return int(rng() % unsigned(n)); }
  std::string ws() {
    std::string w;
    if (r(4) == 0)
      for (int k = r(4); k > 0; --k) w += " \t\n\r"[r(4)];
    return w;
  }
  const ojson& resolve(const ojson& s) {
    if (!s.is_object() || !s.contains("$ref")) return s;
    std::string ref = s["$ref"];
    if (ref == "#") return root;
    auto slash = ref.rfind('/');
    std::string sect = ref.substr(2, slash - 2), name = ref.substr(slash + 1);
    return resolve(root[sect][name]);
  }
  static void utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
      out += char(cp);
    } else if (cp < 0x800) {
      out += char(0xC0 | cp >> 6), out += char(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += char(0xE0 | cp >> 12), out += char(0x80 | (cp >> 6 & 0x3F)), out += char(0x80 | (cp & 0x3F));
    } else {
      out += char(0xF0 | cp >> 18), out += char(0x80 | (cp >> 12 & 0x3F));
      out += char(0x80 | (cp >> 6 & 0x3F)), out += char(0x80 | (cp & 0x3F));
    }
  }
  std::string str(int len, bool escapes) {
    static const uint32_t cps[] = {'a', 'b',  'Z',  '0',  ' ',    '"',     '\\',
                                   '/', '\n', 0x01, 0xE9, 0x4E2D, 0x1F600, '{'};
    std::string out = "\"";
    char buf[16];
    for (int i = 0; i < len; ++i) {
      uint32_t cp = cps[r(escapes ? 14 : 5)];
      int how = escapes ? r(3) : 0;
      if (cp == '"' || cp == '\\') {
        out += '\\', out += char(cp);
      } else if (cp < 0x20 || how == 2) {
        if (cp >= 0x10000) {
          uint32_t v = cp - 0x10000;
          snprintf(buf, sizeof buf, "\\u%04X\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
        } else {
          snprintf(buf, sizeof buf, "\\u%04x", cp);
        }
        out += buf;
      } else if (cp == '/' && how == 1) {
        out += "\\/";
      } else {
        utf8(out, cp);
      }
    }
    return out + "\"";
  }
  std::string number(bool integer) {
    std::string s = r(3) == 0 ? "-" : "";
    s += r(4) == 0 ? "0" : std::to_string(1 + r(999));
    if (integer) return s;
    if (r(2)) s += "." + std::to_string(r(100));
    if (r(3) == 0)
      s += std::string(r(2) ? "e" : "E") + (r(2) ? "-" : r(2) ? "+" : "") + std::to_string(r(30));
    return s;
  }
  std::string value(const ojson& s0, int depth) {
    const ojson& s = resolve(s0);
    if (s.is_boolean() || (s.is_object() && s.empty())) return any(depth);
    for (const char* kw : {"anyOf", "oneOf"})
      if (s.contains(kw)) return value(s[kw][r(int(s[kw].size()))], depth);
    if (s.contains("const")) return s["const"].dump();
    if (s.contains("enum")) return s["enum"][r(int(s["enum"].size()))].dump();
    std::vector<std::string> types;
    if (!s.contains("type"))
      types = {"object", "array", "string", "number", "integer", "boolean", "null"};
    else if (s["type"].is_string())
      types = {s["type"]};
    else
      for (auto& t : s["type"]) types.push_back(t);
    std::string t = types[r(int(types.size()))];
    if (depth > 4 && t == "object" && !s.contains("properties")) t = types.size() > 1 ? "null" : t;
    if (t == "object") return object(s, depth);
    if (t == "array") return array(s, depth);
    if (t == "string") {
      int lo = s.value("minLength", 0), hi = std::min(s.value("maxLength", lo + 6), lo + 6);
      return str(lo + r(hi - lo + 1), true);
    }
    if (t == "number" || t == "integer") return number(t == "integer");
    if (t == "boolean") return r(2) ? "true" : "false";
    return "null";
  }
  std::string any(int depth) {
    int k = depth > 3 ? 2 + r(5) : r(7);
    if (k == 0) return object(ojson::object(), depth);
    if (k == 1) return array(ojson::object(), depth);
    if (k == 2) return str(r(5), true);
    if (k == 3) return number(false);
    if (k == 4) return "true";
    if (k == 5) return "false";
    return "null";
  }
  std::string object(const ojson& s, int depth) {
    std::vector<std::pair<std::string, std::string>> kv;
    ojson props = s.value("properties", ojson::object());
    std::vector<std::string> req = s.value("required", std::vector<std::string>{});
    ojson add = s.contains("additionalProperties") ? s["additionalProperties"] : ojson(true);
    for (auto& [k, v] : props.items())
      if (std::find(req.begin(), req.end(), k) != req.end() || r(2))
        kv.emplace_back(ojson(k).dump(), value(v, depth + 1));
    for (auto& k : req)
      if (!props.contains(k)) kv.emplace_back(ojson(k).dump(), value(add, depth + 1));
    if (!(add.is_boolean() && !add.get<bool>()))
      for (int n = r(3) == 0 ? r(3) : 0; n > 0; --n) {
        std::string k = props.empty() ? str(r(4), true) : "\"x" + std::to_string(r(1000)) + "\"";
        if (!props.contains(ojson::parse(k).get<std::string>())) kv.emplace_back(k, value(add, depth + 1));
      }
    std::shuffle(kv.begin(), kv.end(), rng);
    std::string out = "{" + ws();
    for (size_t i = 0; i < kv.size(); ++i) {
      if (i) out += "," + ws();
      out += kv[i].first + ws() + ":" + ws() + kv[i].second + ws();
    }
    return out + "}";
  }
  std::string array(const ojson& s, int depth) {
    ojson prefix = s.value("prefixItems", ojson::array());
    ojson items = s.contains("items") ? s["items"] : ojson(true);
    int lo = s.value("minItems", 0), hi = std::min(s.value("maxItems", lo + 3), lo + 3);
    if (items.is_boolean() && !items.get<bool>()) hi = std::min(hi, int(prefix.size()));
    if (depth > 4) hi = lo;
    int n = lo + r(hi - lo + 1);
    std::string out = "[" + ws();
    for (int i = 0; i < n; ++i) {
      if (i) out += "," + ws();
      out += value(i < int(prefix.size()) ? prefix[i] : items, depth + 1) + ws();
    }
    return out + "]";
  }
};

const char* kSchemas[] = {
    R"({"type":"object"})",
    kPerson,
    R"({"type":"array","prefixItems":[{"type":"number"},{"enum":["x","y",1,null,{"a":[1,2]}]}],
        "items":{"type":["string","null"]},"minItems":2,"maxItems":5})",
    R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},"kids":{"type":"array",
        "items":{"$ref":"#/$defs/node"}}},"required":["v"],"additionalProperties":false}},"$ref":"#/$defs/node"})",
    R"({"type":"object","properties":{"x":{"anyOf":[{"type":"string","maxLength":2},{"type":"string","minLength":4},
        {"type":"integer"},{"type":"object","properties":{"k":{"const":"v"}},"required":["k"]}]}},"required":["x"]})",
    R"({"type":"object","properties":{"a":{"type":"null"}},"additionalProperties":{"type":"number"},
        "required":["a","zz"]})",
    R"({})",
    R"({"properties":{"a":{"type":"string","minLength":3}}})",
    R"({"type":"object","properties":{"a":{"type":"integer"},"ab":{"type":"string"},"abc":{"type":"boolean"},
        "b\"q":{"type":"null"}},"additionalProperties":false})",
    R"({"definitions":{"A":{"type":"object","properties":{"kind":{"const":"a"},"n":{"type":"integer"}},
        "required":["kind"],"additionalProperties":false},"B":{"type":"object","properties":{"kind":{"const":"b"},
        "s":{"type":"string","maxLength":3}},"required":["kind","s"],"additionalProperties":false}},
        "type":"array","items":{"oneOf":[{"$ref":"#/definitions/A"},{"$ref":"#/definitions/B"}]}})",
};

std::shared_ptr<const JsonGrammar> grammar_of(const char* s) {
  return std::string(s) == R"({"type":"object"})" ? JsonGrammar::any_object() : G(s);
}

// At a state: min_completion() is achieved by shortest_completion(), and no byte lowers it by more than 1
// (together: it is exact).
void check_completion(const JsonGrammar::State& st, const std::string& prefix) {
  size_t m = st.min_completion();
  ASSERT_NE(m, SIZE_MAX) << prefix;
  EXPECT_EQ(st.complete(), m == 0) << prefix;
  std::string c = st.shortest_completion();
  ASSERT_EQ(c.size(), m) << prefix << " | " << c;
  auto t = st;
  ASSERT_TRUE(t.feed(c)) << prefix << " | " << c;
  EXPECT_TRUE(t.complete()) << prefix << " | " << c;
  for (int b = 0; b < 256; ++b) {
    auto u = st;
    char ch = char(b);
    if (u.feed(std::string_view(&ch, 1))) {
      ASSERT_NE(u.min_completion(), SIZE_MAX);
      EXPECT_GE(u.min_completion() + 1, m) << prefix << " then byte " << b;
    }
  }
}

TEST(JsonGrammar, PropertyRandomDocuments) {
  std::mt19937 rng(12345);
  for (const char* schema : kSchemas) {
    ojson root = ojson::parse(schema);
    auto g = grammar_of(schema);
    Gen gen{root, rng};
    for (int i = 0; i < 150; ++i) {
      std::string doc = gen.ws() + gen.value(root, 0) + gen.ws();
      auto st = g->start();
      for (size_t k = 0; k < doc.size(); ++k) {
        ASSERT_TRUE(st.feed(std::string_view(&doc[k], 1))) << schema << "\n" << doc << "\nat " << k;
        ASSERT_NE(st.min_completion(), SIZE_MAX) << doc.substr(0, k + 1);
        ASSERT_EQ(st.complete(), st.min_completion() == 0) << doc.substr(0, k + 1);
        if (i < 30 && rng() % 8 == 0) check_completion(st, doc.substr(0, k + 1));
      }
      ASSERT_TRUE(st.complete()) << doc;
      if (i < 30) check_completion(g->start(), "");
      // Mutations: accepted exactly when every prefix feeds and the end is complete; accepted ones are JSON.
      for (int j = 0; j < 4; ++j) {
        std::string m = doc;
        static const char alphabet[] = "{}[]\",:0123456789.-eE tfn\\ux\xc3\xa9";
        char b = alphabet[rng() % (sizeof alphabet - 1)];
        size_t pos = rng() % (m.size() + 1);
        int op = int(rng() % 3);
        if (op == 0 && pos < m.size())
          m[pos] = b;
        else if (op == 1)
          m.insert(m.begin() + long(pos), b);
        else if (pos < m.size())
          m.erase(pos, 1);
        auto s2 = g->start();
        bool ok = true;
        for (size_t k = 0; k < m.size() && ok; ++k) {
          auto before = s2;
          ok = s2.feed(std::string_view(&m[k], 1));
          if (!ok) {
            EXPECT_NE(before.min_completion(), SIZE_MAX);
          }
        }
        bool whole = acc(*g, m);
        EXPECT_EQ(whole, ok && s2.complete()) << m;
        if (whole) {  // JSON (numbers too large for a double are still JSON)
          try {
            auto parsed = nlohmann::json::parse(m);
            EXPECT_FALSE(parsed.is_discarded());
          } catch (const nlohmann::json::out_of_range&) {
          } catch (const std::exception& e) {
            ADD_FAILURE() << m << ": " << e.what();
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace tessera
