// The JSON Schema compiler of io/json_grammar.h: a schema's keywords to the matcher's nodes
// (json_grammar_impl.h).
#include "io/json_grammar_impl.h"

namespace tessera {

using namespace json_grammar_detail;  // NOLINT(google-build-using-namespace)

// ---- Schema compilation ----

namespace {

const char* const kSupported =
    "type, properties, required, additionalProperties, items, prefixItems, minItems, maxItems, enum, const, "
    "anyOf, oneOf, $ref, $defs, definitions, minLength, maxLength, title, description, default, examples, "
    "$schema, $id, $comment, deprecated, readOnly, writeOnly";
bool is_annotation(const std::string& k) {
  static const char* const a[] = {"title",    "description", "default",  "examples",  "$schema", "$id",
                                  "$comment", "deprecated",  "readOnly", "writeOnly", "strict"};
  return std::find(std::begin(a), std::end(a), k) != std::end(a);
}
bool is_keyword(const std::string& k) {
  static const char* const a[] = {"type",     "properties",  "required",    "additionalProperties",
                                  "items",    "prefixItems", "minItems",    "maxItems",
                                  "enum",     "const",       "anyOf",       "oneOf",
                                  "$ref",     "$defs",       "definitions", "minLength",
                                  "maxLength"};
  return std::find(std::begin(a), std::end(a), k) != std::end(a) || is_annotation(k);
}
std::string ptr_token(const std::string& k) {
  std::string r;
  for (char c : k) r += c == '~' ? "~0" : c == '/' ? "~1" : std::string(1, c);
  return r;
}
std::string where(const std::string& ptr) {
  return ptr.empty() ? "the root" : ptr;
}

uint8_t type_bit(const ojson& t, const std::string& ptr) {
  static const std::pair<const char*, uint8_t> names[] = {
      {"object", T_OBJ},  {"array", T_ARR},    {"string", T_STR}, {"number", T_INT | T_FLT},
      {"integer", T_INT}, {"boolean", T_BOOL}, {"null", T_NULL}};
  if (t.is_string())
    for (auto& [n, b] : names)
      if (t.get<std::string>() == n) return b;
  fail("json_schema: unknown type " + t.dump() + " at " + where(ptr));
}
uint8_t type_mask(const ojson& t, const std::string& ptr) {
  if (!t.is_array()) return type_bit(t, ptr + "/type");
  uint8_t m = 0;
  for (size_t i = 0; i < t.size(); ++i) m |= type_bit(t[i], ptr + "/type/" + std::to_string(i));
  return m;
}
ojson type_json(uint8_t m) {
  ojson a = ojson::array();
  if ((m & (T_INT | T_FLT)) == (T_INT | T_FLT))
    a.push_back("number");
  else if (m & T_INT)
    a.push_back("integer");
  const std::pair<const char*, uint8_t> names[] = {
      {"object", T_OBJ}, {"array", T_ARR}, {"string", T_STR}, {"boolean", T_BOOL}, {"null", T_NULL}};
  for (auto& [n, b] : names)
    if (m & b) a.push_back(n);
  return a;
}
uint32_t count(const ojson& v, const std::string& ptr) {
  if (!v.is_number_integer() || v.get<int64_t>() < 0)
    fail("json_schema: " + where(ptr) + " must be a non-negative integer");
  return uint32_t(std::min<int64_t>(v.get<int64_t>(), kNoMax - 1));
}

struct Compiler {
  Impl& g;
  const ojson& root;
  std::map<std::string, uint32_t> refs;

  uint32_t fresh() {
    g.nodes.emplace_back();
    return uint32_t(g.nodes.size() - 1);
  }
  const ojson& lookup(const std::string& ref, const std::string& ptr, std::string* def_ptr) {
    if (ref == "#") {
      def_ptr->clear();
      return root;
    }
    for (const char* base : {"#/$defs/", "#/definitions/"}) {
      std::string_view b(base);
      if (ref.compare(0, b.size(), b) != 0) continue;
      std::string name;
      for (size_t i = b.size(); i < ref.size(); ++i) {
        if (ref[i] == '~' && i + 1 < ref.size() && (ref[i + 1] == '0' || ref[i + 1] == '1'))
          name += ref[++i] == '0' ? '~' : '/';
        else
          name += ref[i];
      }
      std::string sect(b.substr(2, b.size() - 3));
      if (root.is_object() && root.contains(sect) && root[sect].is_object() && root[sect].contains(name)) {
        *def_ptr = "/" + sect + "/" + ptr_token(name);
        return root[sect][name];
      }
      fail("json_schema: $ref '" + ref + "' at " + where(ptr) + ": no such definition");
    }
    fail("json_schema: $ref '" + ref + "' at " + where(ptr) +
         " is not supported (only #, #/$defs/.. and "
         "#/definitions/..)");
  }
  uint32_t ref_node(const std::string& ref, const std::string& ptr) {
    auto it = refs.find(ref);
    if (it != refs.end()) return it->second;
    std::string dp;
    const ojson& s = lookup(ref, ptr, &dp);
    uint32_t id = fresh();
    refs[ref] = id;
    compile_into(id, s, dp);
    return id;
  }
  uint32_t compile(const ojson& s, const std::string& ptr) {
    uint32_t id = fresh();
    compile_into(id, s, ptr);
    return id;
  }
  static bool only_annotations(const ojson& s, const char* except) {
    for (auto& [k, v] : s.items())
      if (k != except && !is_annotation(k) && k != "$defs" && k != "definitions") return false;
    return true;
  }
  // One anyOf alternative with the keywords beside anyOf merged in.
  ojson merge(const ojson& base, ojson alt, const std::string& ptr) {
    for (int i = 0; alt.is_object() && alt.contains("$ref") && only_annotations(alt, "$ref"); ++i) {
      std::string dp;
      if (!alt["$ref"].is_string() || i > 64) fail("json_schema: bad $ref at " + where(ptr));
      alt = lookup(alt["$ref"].get<std::string>(), ptr, &dp);
    }
    if (alt.is_boolean()) return alt.get<bool>() ? base : alt;
    if (!alt.is_object()) fail("json_schema: schema at " + where(ptr) + " is not an object or boolean");
    for (auto& [k, v] : base.items()) {
      if (!alt.contains(k)) {
        alt[k] = v;
      } else if (k == "type") {
        alt[k] = type_json(type_mask(alt[k], ptr) & type_mask(v, ptr));
      } else if (k == "required" && v.is_array() && alt[k].is_array()) {
        for (auto& r : v)
          if (std::find(alt[k].begin(), alt[k].end(), r) == alt[k].end()) alt[k].push_back(r);
      } else if (alt[k] != v) {
        fail("json_schema: '" + k + "' both beside and inside anyOf/oneOf at " + where(ptr) +
             " is not supported");
      }
    }
    return alt;
  }

  void compile_into(uint32_t id, const ojson& s, const std::string& ptr) {
    Node N;
    if (s.is_boolean()) {
      N.kind = Node::Alias, N.target = s.get<bool>() ? kAny : kNever;
      g.nodes[id] = std::move(N);
      return;
    }
    if (!s.is_object()) fail("json_schema: schema at " + where(ptr) + " is not an object or boolean");
    for (auto& [k, v] : s.items())
      if (!is_keyword(k))
        fail("json_schema: '" + k + "' at " + where(ptr) + " is not supported (supported: " + kSupported +
             ")");
    if (s.contains("anyOf") || s.contains("oneOf")) {
      if (s.contains("anyOf") && s.contains("oneOf"))
        fail("json_schema: anyOf together with oneOf at " + where(ptr) + " is not supported");
      const char* kw = s.contains("anyOf") ? "anyOf" : "oneOf";
      const ojson& alts = s[kw];
      if (!alts.is_array() || alts.empty())
        fail("json_schema: " + where(ptr) + "/" + kw + " must be a non-empty array");
      ojson base = ojson::object();
      for (auto& [k, v] : s.items())
        if (k != kw && !is_annotation(k) && k != "$defs" && k != "definitions") base[k] = v;
      N.kind = Node::AnyOf;
      for (size_t i = 0; i < alts.size(); ++i) {
        std::string p = ptr + "/" + kw + "/" + std::to_string(i);
        N.alts.push_back(base.empty() ? compile(alts[i], p) : compile(merge(base, alts[i], p), p));
      }
      g.nodes[id] = std::move(N);
      return;
    }
    if (s.contains("$ref")) {
      if (!only_annotations(s, "$ref"))
        fail("json_schema: '$ref' beside other keywords at " + where(ptr) + " is not supported");
      if (!s["$ref"].is_string()) fail("json_schema: $ref at " + where(ptr) + " must be a string");
      uint32_t t = ref_node(s["$ref"].get<std::string>(), ptr);
      g.nodes[id].kind = Node::Alias, g.nodes[id].target = t;
      return;
    }
    if (s.contains("type")) N.types = type_mask(s["type"], ptr);
    if (s.contains("enum")) {
      if (!s["enum"].is_array()) fail("json_schema: " + ptr + "/enum must be an array");
      N.has_enum = true;
      for (auto& v : s["enum"]) N.lits.push_back(v.dump());
    }
    if (s.contains("const")) {
      std::string c = s["const"].dump();
      if (N.has_enum && std::find(N.lits.begin(), N.lits.end(), c) == N.lits.end())
        N.lits.clear();
      else
        N.lits = {c};
      N.has_enum = true;
    }
    std::sort(N.lits.begin(), N.lits.end());
    N.lits.erase(std::unique(N.lits.begin(), N.lits.end()), N.lits.end());
    if (s.contains("minLength")) N.min_len = count(s["minLength"], ptr + "/minLength");
    if (s.contains("maxLength")) N.max_len = count(s["maxLength"], ptr + "/maxLength");
    if (s.contains("minItems")) N.min_items = count(s["minItems"], ptr + "/minItems");
    if (s.contains("maxItems")) N.max_items = count(s["maxItems"], ptr + "/maxItems");
    if (s.contains("prefixItems")) {
      const ojson& p = s["prefixItems"];
      if (!p.is_array()) fail("json_schema: " + ptr + "/prefixItems must be an array");
      for (size_t i = 0; i < p.size(); ++i) {
        uint32_t e = compile(p[i], ptr + "/prefixItems/" + std::to_string(i));
        N.prefix.push_back(e);
      }
    }
    if (s.contains("items")) {
      if (s["items"].is_array())
        fail("json_schema: 'items' as an array at " + where(ptr) + " is not supported (use prefixItems)");
      N.items = compile(s["items"], ptr + "/items");
    }
    if (s.contains("additionalProperties"))
      N.additional = compile(s["additionalProperties"], ptr + "/additionalProperties");
    std::vector<std::pair<std::string, uint32_t>> keys;
    if (s.contains("properties")) {
      if (!s["properties"].is_object()) fail("json_schema: " + ptr + "/properties must be an object");
      for (auto& [k, v] : s["properties"].items())
        keys.emplace_back(ojson(k).dump(), compile(v, ptr + "/properties/" + ptr_token(k)));
    }
    std::vector<std::string> req;
    if (s.contains("required")) {
      if (!s["required"].is_array()) fail("json_schema: " + ptr + "/required must be an array");
      for (auto& r : s["required"]) {
        if (!r.is_string()) fail("json_schema: " + ptr + "/required must list strings");
        req.push_back(r.dump());
        auto same = [&](auto& kv) { return kv.first == req.back(); };
        if (std::find_if(keys.begin(), keys.end(), same) == keys.end())
          keys.emplace_back(req.back(), N.additional);
      }
    }
    if (keys.size() > 64)
      fail("json_schema: more than 64 properties at " + where(ptr) + " are not supported");
    std::sort(keys.begin(), keys.end());
    for (uint32_t i = 0; i < keys.size(); ++i) {
      N.keys.push_back(keys[i].first);
      N.key_nodes.push_back(keys[i].second);
      if (std::find(req.begin(), req.end(), keys[i].first) != req.end()) N.required |= uint64_t{1} << i;
    }
    for (const char* cand : {"", "a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k"}) {
      N.extra_key = ojson(cand).dump();
      if (std::find(N.keys.begin(), N.keys.end(), N.extra_key) == N.keys.end()) break;
    }
    g.nodes[id] = std::move(N);
  }
};

void add_base_nodes(Impl& g) {
  g.nodes.resize(2);
  g.nodes[kAny].types = T_ALL;  // additional = items = kAny: any value
  g.nodes[kNever].types = 0;
}

}  // namespace

JsonGrammar::JsonGrammar() : impl_(std::make_unique<Impl>()) {}
JsonGrammar::~JsonGrammar() = default;

std::shared_ptr<const JsonGrammar> JsonGrammar::any_object() {
  std::shared_ptr<JsonGrammar> g(new JsonGrammar());
  add_base_nodes(*g->impl_);
  g->impl_->nodes.emplace_back();
  g->impl_->nodes.back().types = T_OBJ;
  g->impl_->root = uint32_t(g->impl_->nodes.size() - 1);
  g->impl_->finish();
  return g;
}

std::shared_ptr<const JsonGrammar> JsonGrammar::from_schema(const ojson& schema) {
  std::shared_ptr<JsonGrammar> g(new JsonGrammar());
  Impl& I = *g->impl_;
  add_base_nodes(I);
  Compiler c{I, schema, {}};
  I.root = c.ref_node("#", "");
  I.finish();
  if (I.nodes[I.root].vmin >= kInf) fail("json_schema: no value satisfies the schema");
  return g;
}

}  // namespace tessera
