#include "io/jinja/value.h"

#include <utf8proc.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace tessera::jinja {

void raise(std::string msg) {
  throw RenderError{std::move(msg), 0};
}

const Value* DictObj::find(const Value& key) const {
  for (auto& [k, v] : items)
    if (equals(k, key)) return &v;
  return nullptr;
}

const Value* DictObj::find(std::string_view key) const {
  for (auto& [k, v] : items)
    if (k.kind == Kind::String && *k.s == key) return &v;
  return nullptr;
}

void DictObj::set(Value key, Value value) {
  depth = std::max(depth, value.list ? value.list->depth + 1 : value.dict ? value.dict->depth + 1 : 1);
  if (depth > kMaxValueDepth)
    raise("a value nests deeper than " + std::to_string(kMaxValueDepth) + " levels");
  for (auto& [k, v] : items)
    if (equals(k, key)) {
      v = std::move(value);
      return;
    }
  items.emplace_back(std::move(key), std::move(value));
}

static uint32_t child_depth(const Value& v) {
  if (v.list) return v.list->depth;
  if (v.dict && v.kind == Kind::Dict) return v.dict->depth;
  return 0;
}

Value Value::undefined(std::string message) {
  Value v;
  if (!message.empty()) v.s = std::make_shared<const std::string>(std::move(message));
  return v;
}

Value Value::string(std::string x) {
  Value v = make(Kind::String);
  v.s = std::make_shared<const std::string>(std::move(x));
  return v;
}

Value Value::make_list(std::vector<Value> items, Kind kind) {
  Value v = make(kind);
  uint32_t depth = 0;
  for (auto& x : items) depth = std::max(depth, child_depth(x));
  if (depth + 1 > kMaxValueDepth)
    raise("a value nests deeper than " + std::to_string(kMaxValueDepth) + " levels");
  v.list = std::make_shared<ListObj>(ListObj{std::move(items), depth + 1});
  return v;
}

Value Value::make_dict(std::vector<std::pair<Value, Value>> items, Kind kind) {
  Value v = make(kind);
  uint32_t depth = 0;
  for (auto& x : items) depth = std::max(depth, child_depth(x.second));
  if (depth + 1 > kMaxValueDepth)
    raise("a value nests deeper than " + std::to_string(kMaxValueDepth) + " levels");
  v.dict = std::make_shared<DictObj>(DictObj{std::move(items), depth + 1});
  return v;
}

Value Value::func(std::string repr, std::function<Value(Interp&, CallArgs&)> fn) {
  Value v = make(Kind::Func);
  v.fn = std::make_shared<FuncObj>(FuncObj{std::move(repr), std::move(fn)});
  return v;
}

bool truthy(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined:
    case Kind::None:
      return false;
    case Kind::Bool:
    case Kind::Int:
      return v.i != 0;
    case Kind::Float:
      return v.f != 0;
    case Kind::String:
      return !v.s->empty();
    case Kind::List:
    case Kind::Tuple:
      return !v.list->items.empty();
    case Kind::Dict:
      return !v.dict->items.empty();
    default:
      return true;
  }
}

bool equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind == Kind::Float || b.kind == Kind::Float) return a.as_double() == b.as_double();
    return a.i == b.i;
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Kind::Undefined:
    case Kind::None:
      return true;
    case Kind::String:
      return *a.s == *b.s;
    case Kind::List:
    case Kind::Tuple: {
      if (a.list == b.list) return true;
      auto &x = a.list->items, &y = b.list->items;
      if (x.size() != y.size()) return false;
      for (size_t k = 0; k < x.size(); ++k)
        if (!equals(x[k], y[k])) return false;
      return true;
    }
    case Kind::Dict: {
      if (a.dict == b.dict) return true;
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (auto& [k, v] : a.dict->items) {
        const Value* o = b.dict->find(k);
        if (!o || !equals(v, *o)) return false;
      }
      return true;
    }
    case Kind::Func:
      return a.fn == b.fn;
    default:
      return a.dict == b.dict;
  }
}

int compare(const Value& a, const Value& b, const char* op) {
  if (a.is_number() && b.is_number()) {
    if (a.kind == Kind::Float || b.kind == Kind::Float) {
      double x = a.as_double(), y = b.as_double();
      return x < y ? -1 : x > y ? 1 : 0;
    }
    return a.i < b.i ? -1 : a.i > b.i ? 1 : 0;
  }
  if (a.is_undefined() || b.is_undefined()) raise(undefined_message(a.is_undefined() ? a : b));
  if (a.kind == Kind::String && b.kind == Kind::String) {
    int c = a.s->compare(*b.s);  // byte order of UTF-8 is code point order
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.is_seq() && a.kind == b.kind) {
    auto &x = a.list->items, &y = b.list->items;
    for (size_t k = 0; k < x.size() && k < y.size(); ++k)
      if (!equals(x[k], y[k])) return compare(x[k], y[k], op);
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  raise(std::string("'") + op + "' not supported between instances of '" + type_name(a) + "' and '" +
        type_name(b) + "'");
}

std::string type_name(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined:
      return "Undefined";
    case Kind::None:
      return "NoneType";
    case Kind::Bool:
      return "bool";
    case Kind::Int:
      return "int";
    case Kind::Float:
      return "float";
    case Kind::String:
      return "str";
    case Kind::List:
      return "list";
    case Kind::Tuple:
      return "tuple";
    case Kind::Dict:
      return "dict";
    case Kind::Func:
      return "function";
    case Kind::Namespace:
      return "Namespace";
    case Kind::Loop:
      return "LoopContext";
  }
  return "object";
}

std::string repr_float(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x < 0 ? "-inf" : "inf";
  if (x == 0) return std::signbit(x) ? "-0.0" : "0.0";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific);
  std::string sci(buf, r.ptr);  // [-]d[.ddd]e[+-]XX, shortest round trip
  bool neg = sci[0] == '-';
  if (neg) sci.erase(0, 1);
  size_t epos = sci.find('e');
  int exp = std::stoi(sci.substr(epos + 1));
  std::string digits;
  for (size_t k = 0; k < epos; ++k)
    if (sci[k] != '.') digits += sci[k];
  std::string out = neg ? "-" : "";
  if (exp >= -5 + 1 && exp < 16) {
    if (exp < 0) {
      out += "0." + std::string(-exp - 1, '0') + digits;
    } else if (static_cast<size_t>(exp) + 1 >= digits.size()) {
      out += digits + std::string(exp + 1 - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, exp + 1) + "." + digits.substr(exp + 1);
    }
  } else {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char e[16];
    std::snprintf(e, sizeof e, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    out += e;
  }
  return out;
}

static bool printable(uint32_t cp) {
  if (cp == ' ') return true;
  if (cp < 0x20 || cp == 0x7f) return false;
  if (cp < 0x7f) return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS:
      return false;
    default:
      return true;
  }
}

std::string repr_string(std::string_view s) {
  bool sq = s.find('\'') != std::string_view::npos, dq = s.find('"') != std::string_view::npos;
  char q = sq && !dq ? '"' : '\'';
  std::string out(1, q);
  size_t pos = 0;
  while (pos < s.size()) {
    size_t start = pos;
    uint32_t cp = decode_utf8(s, pos);
    if (cp == static_cast<uint32_t>(q) || cp == '\\') {
      out += '\\';
      out += static_cast<char>(cp);
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (!printable(cp)) {
      char buf[16];
      if (cp < 0x100)
        std::snprintf(buf, sizeof buf, "\\x%02x", cp);
      else if (cp < 0x10000)
        std::snprintf(buf, sizeof buf, "\\u%04x", cp);
      else
        std::snprintf(buf, sizeof buf, "\\U%08x", cp);
      out += buf;
    } else {
      out.append(s.substr(start, pos - start));
    }
  }
  out += q;
  return out;
}

static std::string repr_items(const Value& v) {
  std::string out;
  if (v.kind == Kind::Dict || v.kind == Kind::Namespace) {
    out = "{";
    bool first = true;
    for (auto& [k, x] : v.dict->items) {
      if (!first) out += ", ";
      first = false;
      out += repr(k) + ": " + repr(x);
    }
    return out + "}";
  }
  bool tuple = v.kind == Kind::Tuple;
  out = tuple ? "(" : "[";
  auto& items = v.list->items;
  for (size_t k = 0; k < items.size(); ++k) {
    if (k) out += ", ";
    out += repr(items[k]);
  }
  if (tuple && items.size() == 1) out += ",";
  return out + (tuple ? ")" : "]");
}

std::string repr(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined:
      return "Undefined";
    case Kind::String:
      return repr_string(*v.s);
    default:
      return to_str(v);
  }
}

std::string to_str(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined:
      return "";
    case Kind::None:
      return "None";
    case Kind::Bool:
      return v.i ? "True" : "False";
    case Kind::Int:
      return std::to_string(v.i);
    case Kind::Float:
      return repr_float(v.f);
    case Kind::String:
      return *v.s;
    case Kind::List:
    case Kind::Tuple:
    case Kind::Dict:
      return repr_items(v);
    case Kind::Func:
      return v.fn->repr;
    case Kind::Namespace:
      return "<Namespace " + repr_items(v) + ">";
    case Kind::Loop:
      return "<LoopContext " + std::to_string(v.i + 1) + "/" + std::to_string(v.list->items.size()) + ">";
  }
  return "";
}

std::string undefined_message(const Value& v) {
  return v.s ? *v.s : std::string("'undefined' is undefined");
}

std::vector<Value> iterate(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined:
      return {};
    case Kind::List:
    case Kind::Tuple:
      return v.list->items;
    case Kind::Dict: {
      std::vector<Value> keys;
      keys.reserve(v.dict->items.size());
      for (auto& kv : v.dict->items) keys.push_back(kv.first);
      return keys;
    }
    case Kind::String: {
      std::vector<Value> chars;
      for (auto c : utf8_chars(*v.s)) chars.push_back(Value::string(std::string(c)));
      return chars;
    }
    default:
      raise("'" + type_name(v) + "' object is not iterable");
  }
}

int64_t length(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined:
      return 0;
    case Kind::String:
      return static_cast<int64_t>(utf8_length(*v.s));
    case Kind::List:
    case Kind::Tuple:
      return static_cast<int64_t>(v.list->items.size());
    case Kind::Dict:
      return static_cast<int64_t>(v.dict->items.size());
    case Kind::Loop:
      return static_cast<int64_t>(v.list->items.size());
    default:
      raise("object of type '" + type_name(v) + "' has no len()");
  }
}

Value from_json(const nlohmann::ordered_json& j, uint32_t depth) {
  if (depth > kMaxValueDepth)
    raise("the context nests deeper than " + std::to_string(kMaxValueDepth) + " levels");
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return Value::none();
    case nlohmann::ordered_json::value_t::boolean:
      return Value::boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value::integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      uint64_t u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value::number(static_cast<double>(u));
      return Value::integer(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float:
      return Value::number(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value::string(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (auto& x : j) items.push_back(from_json(x, depth + 1));
      return Value::make_list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      std::vector<std::pair<Value, Value>> items;
      items.reserve(j.size());
      for (auto& [k, x] : j.items()) items.emplace_back(Value::string(k), from_json(x, depth + 1));
      return Value::make_dict(std::move(items));
    }
    default:
      return Value::none();
  }
}

static void json_string(std::string_view s, bool ascii, std::string& out) {
  out += '"';
  size_t pos = 0;
  while (pos < s.size()) {
    size_t start = pos;
    uint32_t cp = decode_utf8(s, pos);
    char buf[16];
    switch (cp) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (cp < 0x20 || (ascii && cp > 0x7e)) {
          if (cp >= 0x10000) {
            uint32_t c = cp - 0x10000;
            std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", 0xd800 + (c >> 10), 0xdc00 + (c & 0x3ff));
          } else {
            std::snprintf(buf, sizeof buf, "\\u%04x", cp);
          }
          out += buf;
        } else {
          out.append(s.substr(start, pos - start));
        }
    }
  }
  out += '"';
}

static std::string json_key(const Value& k) {
  switch (k.kind) {
    case Kind::String:
      return *k.s;
    case Kind::None:
      return "null";
    case Kind::Bool:
      return k.i ? "true" : "false";
    case Kind::Int:
    case Kind::Float:
      return to_str(k);
    default:
      raise("keys must be str, int, float, bool or None, not " + type_name(k));
  }
}

void dump_json(const Value& v, const JsonOptions& o, std::string& out, int level) {
  auto newline = [&](int lv) {
    if (!o.has_indent) return;
    out += '\n';
    for (int k = 0; k < lv; ++k) out += o.indent;
  };
  switch (v.kind) {
    case Kind::None:
      out += "null";
      return;
    case Kind::Bool:
      out += v.i ? "true" : "false";
      return;
    case Kind::Int:
      out += std::to_string(v.i);
      return;
    case Kind::Float:
      if (std::isnan(v.f))
        out += "NaN";
      else if (std::isinf(v.f))
        out += v.f < 0 ? "-Infinity" : "Infinity";
      else
        out += repr_float(v.f);
      return;
    case Kind::String:
      json_string(*v.s, o.ensure_ascii, out);
      return;
    case Kind::List:
    case Kind::Tuple: {
      auto& items = v.list->items;
      if (items.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t k = 0; k < items.size(); ++k) {
        if (k) out += o.item_sep;
        newline(level + 1);
        dump_json(items[k], o, out, level + 1);
      }
      newline(level);
      out += ']';
      return;
    }
    case Kind::Dict: {
      if (v.dict->items.empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<Value, Value>*> items;
      for (auto& kv : v.dict->items) items.push_back(&kv);
      if (o.sort_keys)
        std::stable_sort(items.begin(), items.end(),
                         [](auto* a, auto* b) { return compare(a->first, b->first, "<") < 0; });
      out += '{';
      bool first = true;
      for (auto* kv : items) {
        if (!first) out += o.item_sep;
        first = false;
        newline(level + 1);
        json_string(json_key(kv->first), o.ensure_ascii, out);
        out += o.key_sep;
        dump_json(kv->second, o, out, level + 1);
      }
      newline(level);
      out += '}';
      return;
    }
    default:
      raise("Object of type " + type_name(v) + " is not JSON serializable");
  }
}

uint32_t decode_utf8(std::string_view s, size_t& pos) {
  auto c = static_cast<unsigned char>(s[pos]);
  int n = c < 0x80 ? 0 : (c >> 5) == 6 ? 1 : (c >> 4) == 14 ? 2 : (c >> 3) == 30 ? 3 : -1;
  if (n <= 0 || pos + n >= s.size()) {
    ++pos;
    return c;
  }
  uint32_t cp = c & (0x3f >> n);
  for (int k = 1; k <= n; ++k) {
    auto d = static_cast<unsigned char>(s[pos + k]);
    if ((d & 0xc0) != 0x80) {
      ++pos;
      return c;
    }
    cp = (cp << 6) | (d & 0x3f);
  }
  pos += n + 1;
  return cp;
}

std::vector<std::string_view> utf8_chars(std::string_view s) {
  std::vector<std::string_view> out;
  size_t pos = 0;
  while (pos < s.size()) {
    size_t start = pos;
    decode_utf8(s, pos);
    out.push_back(s.substr(start, pos - start));
  }
  return out;
}

size_t utf8_length(std::string_view s) {
  size_t n = 0, pos = 0;
  for (; pos < s.size(); ++n) decode_utf8(s, pos);
  return n;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xc0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xe0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  }
}

}  // namespace tessera::jinja
