// The values a Jinja template computes with: Python's None, bool, int, float, str, list, tuple, dict, plus
// jinja2's Undefined, callables (macros, builtins, bound methods), namespaces and loop objects.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tessera::jinja {

// A failure while rendering; the evaluator fills in the line of the innermost node it was evaluating.
struct RenderError {
  std::string msg;
  int line = 0;
};
[[noreturn]] void raise(std::string msg);

enum class Kind : uint8_t {
  Undefined,
  None,
  Bool,
  Int,
  Float,
  String,
  List,
  Tuple,
  Dict,
  Func,
  Namespace,
  Loop
};

// Deepest nesting of lists / dicts a value may have (it bounds the recursion of printing and freeing them).
inline constexpr uint32_t kMaxValueDepth = 1000;

struct Value;
struct ListObj {
  std::vector<Value> items;
  uint32_t depth = 1;
};
struct DictObj {
  std::vector<std::pair<Value, Value>> items;
  uint32_t depth = 1;
  const Value* find(const Value& key) const;
  const Value* find(std::string_view key) const;
  void set(Value key, Value value);  // replaces the value of an existing key in place
};
class Interp;
struct CallArgs {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
};
struct FuncObj {
  std::string repr;  // how str() shows it
  std::function<Value(Interp&, CallArgs&)> fn;
};

struct Value {
  Kind kind = Kind::Undefined;
  int64_t i = 0;                         // Bool (0 / 1), Int
  double f = 0;                          // Float
  std::shared_ptr<const std::string> s;  // String; Undefined: the error its use raises (null: none)
  std::shared_ptr<ListObj> list;         // List, Tuple; Loop: the items looped over
  std::shared_ptr<DictObj> dict;         // Dict, Namespace (attributes)
  std::shared_ptr<FuncObj> fn;           // Func

  static Value undefined(std::string message = {});
  static Value none() { return make(Kind::None); }
  static Value boolean(bool b) {
    Value v = make(Kind::Bool);
    v.i = b;
    return v;
  }
  static Value integer(int64_t x) {
    Value v = make(Kind::Int);
    v.i = x;
    return v;
  }
  static Value number(double x) {
    Value v = make(Kind::Float);
    v.f = x;
    return v;
  }
  static Value string(std::string x);
  static Value make_list(std::vector<Value> items, Kind kind = Kind::List);
  static Value tuple(std::vector<Value> items) { return make_list(std::move(items), Kind::Tuple); }
  static Value make_dict(std::vector<std::pair<Value, Value>> items, Kind kind = Kind::Dict);
  static Value func(std::string repr, std::function<Value(Interp&, CallArgs&)> fn);

  bool is_undefined() const { return kind == Kind::Undefined; }
  bool is_none() const { return kind == Kind::None; }
  bool is_string() const { return kind == Kind::String; }
  bool is_number() const { return kind == Kind::Bool || kind == Kind::Int || kind == Kind::Float; }
  bool is_integral() const { return kind == Kind::Bool || kind == Kind::Int; }
  bool is_seq() const { return kind == Kind::List || kind == Kind::Tuple; }
  bool is_mapping() const { return kind == Kind::Dict; }
  const std::string& str() const { return *s; }
  double as_double() const { return kind == Kind::Float ? f : static_cast<double>(i); }
  const std::vector<Value>& items() const { return list->items; }

 private:
  static Value make(Kind k) {
    Value v;
    v.kind = k;
    return v;
  }
};

// Python semantics.
bool truthy(const Value& v);
bool equals(const Value& a, const Value& b);
int compare(const Value& a, const Value& b, const char* op);  // <0, 0, >0; raises TypeError text
std::string type_name(const Value& v);                        // Python's type(v).__name__
std::string to_str(const Value& v);                           // str(v)
std::string repr(const Value& v);                             // repr(v)
std::string repr_float(double x);
std::string repr_string(std::string_view s);
std::vector<Value> iterate(const Value& v);     // for x in v (dict: keys; str: characters)
int64_t length(const Value& v);                 // len(v)
std::string undefined_message(const Value& v);  // the error using this undefined raises

// JSON in and out (json.dumps with the options of transformers' tojson).
Value from_json(const nlohmann::ordered_json& j, uint32_t depth = 0);
struct JsonOptions {
  bool ensure_ascii = false;
  bool sort_keys = false;
  bool has_indent = false;
  std::string indent;
  std::string item_sep = ", ";
  std::string key_sep = ": ";
};
void dump_json(const Value& v, const JsonOptions& o, std::string& out, int level = 0);

// UTF-8 code points.
std::vector<std::string_view> utf8_chars(std::string_view s);
size_t utf8_length(std::string_view s);
void append_utf8(std::string& out, uint32_t cp);
uint32_t decode_utf8(std::string_view s, size_t& pos);  // advances pos; invalid bytes decode as themselves

}  // namespace tessera::jinja
