// Python's str / dict / list methods as templates call them, argument binding, and the globals.
#include <utf8proc.h>

#include <algorithm>
#include <ctime>
#include <memory>

#include "io/jinja/interp.h"

namespace tessera::jinja {

std::vector<std::optional<Value>> bind_args(CallArgs& a, std::initializer_list<const char*> names,
                                            std::string_view fname) {
  std::vector<std::optional<Value>> out(names.size());
  if (a.pos.size() > names.size())
    raise(std::string(fname) + "() takes at most " + std::to_string(names.size()) + " arguments (" +
          std::to_string(a.pos.size()) + " given)");
  for (size_t k = 0; k < a.pos.size(); ++k) out[k] = std::move(a.pos[k]);
  for (auto& [key, v] : a.kw) {
    size_t k = 0;
    for (const char* n : names) {
      if (key == n) break;
      ++k;
    }
    if (k == names.size()) raise(std::string(fname) + "() got an unexpected keyword argument '" + key + "'");
    if (out[k]) raise(std::string(fname) + "() got multiple values for argument '" + key + "'");
    out[k] = std::move(v);
  }
  return out;
}

int64_t to_int(const Value& v, const char* what) {
  if (v.is_integral()) return v.i;
  if (v.is_undefined()) raise(undefined_message(v));
  raise(std::string(what) + ": '" + type_name(v) + "' object cannot be interpreted as an integer");
}

static const std::string& want_str(const Value& v, const char* what) {
  if (v.kind == Kind::String) return *v.s;
  if (v.is_undefined()) raise(undefined_message(v));
  raise(std::string(what) + " must be str, not " + type_name(v));
}

// ---- Unicode helpers ----

bool py_isspace_cp(uint32_t cp) {
  if (cp == ' ' || (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x1f) || cp == 0x85) return true;
  if (cp < 0x80) return false;
  auto c = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
  return c == UTF8PROC_CATEGORY_ZS || c == UTF8PROC_CATEGORY_ZL || c == UTF8PROC_CATEGORY_ZP;
}

static std::string map_case(std::string_view s, int mode) {  // 0 lower, 1 upper
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  while (pos < s.size()) {
    uint32_t cp = decode_utf8(s, pos);
    if (cp < 0x80) {
      out += static_cast<char>(mode ? (cp >= 'a' && cp <= 'z' ? cp - 32 : cp)
                                    : (cp >= 'A' && cp <= 'Z' ? cp + 32 : cp));
    } else {
      auto c = static_cast<utf8proc_int32_t>(cp);
      append_utf8(out, static_cast<uint32_t>(mode ? utf8proc_toupper(c) : utf8proc_tolower(c)));
    }
  }
  return out;
}
std::string py_upper(std::string_view s) {
  return map_case(s, 1);
}
std::string py_lower(std::string_view s) {
  return map_case(s, 0);
}

static bool is_cased(uint32_t cp) {
  auto c = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
  return c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LL || c == UTF8PROC_CATEGORY_LT;
}

std::string py_capitalize(std::string_view s) {
  std::string out;
  size_t pos = 0;
  bool first = true;
  while (pos < s.size()) {
    size_t start = pos;
    decode_utf8(s, pos);
    std::string_view ch = s.substr(start, pos - start);
    out += first ? map_case(ch, 1) : map_case(ch, 0);
    first = false;
  }
  return out;
}

std::string py_title(std::string_view s) {
  std::string out;
  size_t pos = 0;
  bool prev_cased = false;
  while (pos < s.size()) {
    size_t start = pos;
    uint32_t cp = decode_utf8(s, pos);
    std::string_view ch = s.substr(start, pos - start);
    bool cased = is_cased(cp);
    out += cased ? map_case(ch, prev_cased ? 0 : 1) : std::string(ch);
    prev_cased = cased;
  }
  return out;
}

std::string py_strip(std::string_view s, const std::optional<Value>& chars, bool left, bool right) {
  std::vector<std::string_view> cs = utf8_chars(s);
  std::vector<std::string_view> set;
  bool ws = !chars || chars->is_none();
  if (!ws) set = utf8_chars(want_str(*chars, "strip arg"));
  auto strip_it = [&](std::string_view c) {
    if (ws) {
      size_t p = 0;
      return py_isspace_cp(decode_utf8(c, p));
    }
    return std::find(set.begin(), set.end(), c) != set.end();
  };
  size_t a = 0, b = cs.size();
  if (left)
    while (a < b && strip_it(cs[a])) ++a;
  if (right)
    while (b > a && strip_it(cs[b - 1])) --b;
  std::string out;
  for (size_t k = a; k < b; ++k) out.append(cs[k]);
  return out;
}

std::vector<std::string> py_split(std::string_view s, const std::optional<Value>& sep, int64_t maxsplit,
                                  bool right) {
  std::vector<std::string> out;
  if (!sep || sep->is_none()) {
    std::vector<std::string_view> cs = utf8_chars(s);
    auto space = [&](size_t k) {
      size_t p = 0;
      return py_isspace_cp(decode_utf8(cs[k], p));
    };
    std::vector<std::pair<size_t, size_t>> words;  // char ranges
    if (!right) {
      size_t k = 0;
      while (k < cs.size()) {
        while (k < cs.size() && space(k)) ++k;
        if (k == cs.size()) break;
        size_t st = k;
        if (maxsplit >= 0 && static_cast<int64_t>(words.size()) == maxsplit) {
          words.emplace_back(st, cs.size());
          break;
        }
        while (k < cs.size() && !space(k)) ++k;
        words.emplace_back(st, k);
      }
    } else {
      size_t k = cs.size();
      while (k > 0) {
        while (k > 0 && space(k - 1)) --k;
        if (k == 0) break;
        size_t e = k;
        if (maxsplit >= 0 && static_cast<int64_t>(words.size()) == maxsplit) {
          words.emplace_back(0, e);
          break;
        }
        while (k > 0 && !space(k - 1)) --k;
        words.emplace_back(k, e);
      }
      std::reverse(words.begin(), words.end());
    }
    for (auto [a, b] : words) {
      std::string w;
      for (size_t k = a; k < b; ++k) w.append(cs[k]);
      out.push_back(std::move(w));
    }
    return out;
  }
  const std::string& sp = want_str(*sep, "separator");
  if (sp.empty()) raise("empty separator");
  if (!right) {
    size_t start = 0;
    while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
      size_t p = s.find(sp, start);
      if (p == std::string_view::npos) break;
      out.emplace_back(s.substr(start, p - start));
      start = p + sp.size();
    }
    out.emplace_back(s.substr(start));
  } else {
    size_t end = s.size();
    while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
      if (end < sp.size()) break;
      size_t p = s.rfind(sp, end - sp.size());
      if (p == std::string_view::npos) break;
      out.emplace_back(s.substr(p + sp.size(), end - p - sp.size()));
      end = p;
    }
    out.emplace_back(s.substr(0, end));
    std::reverse(out.begin(), out.end());
  }
  return out;
}

std::vector<std::string> py_splitlines(std::string_view s) {
  std::vector<std::string> out;
  size_t start = 0, pos = 0;
  while (pos < s.size()) {
    size_t at = pos;
    uint32_t cp = decode_utf8(s, pos);
    bool brk = cp == '\n' || cp == '\r' || cp == '\v' || cp == '\f' || (cp >= 0x1c && cp <= 0x1e) ||
               cp == 0x85 || cp == 0x2028 || cp == 0x2029;
    if (!brk) continue;
    out.emplace_back(s.substr(start, at - start));
    if (cp == '\r' && pos < s.size() && s[pos] == '\n') ++pos;
    start = pos;
  }
  if (start < s.size()) out.emplace_back(s.substr(start));
  return out;
}

static Value str_list(std::vector<std::string> parts) {
  std::vector<Value> items;
  items.reserve(parts.size());
  for (auto& p : parts) items.push_back(Value::string(std::move(p)));
  return Value::make_list(std::move(items));
}

// Character index (code points) of a byte offset.
static int64_t char_index(std::string_view s, size_t byte) {
  return static_cast<int64_t>(utf8_length(s.substr(0, byte)));
}

static bool affix_match(const std::string& s, const Value& arg, bool start) {
  auto one = [&](const Value& v) {
    const std::string& a = want_str(v, start ? "startswith arg" : "endswith arg");
    if (a.size() > s.size()) return false;
    return start ? s.compare(0, a.size(), a) == 0 : s.compare(s.size() - a.size(), a.size(), a) == 0;
  };
  if (arg.is_seq() && arg.kind == Kind::Tuple) {
    for (auto& v : arg.list->items)
      if (one(v)) return true;
    return false;
  }
  return one(arg);
}

template <typename Pred>
static bool all_chars(const std::string& s, Pred pred) {
  if (s.empty()) return false;
  size_t pos = 0;
  while (pos < s.size())
    if (!pred(decode_utf8(s, pos))) return false;
  return true;
}

static bool cat_in(uint32_t cp, std::initializer_list<int> cats) {
  int c = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
  for (int x : cats)
    if (c == x) return true;
  return false;
}

Value str_method(const Value& self, const std::string& name) {
  using F = Value (*)(Interp&, const std::string&, CallArgs&);
  static const std::pair<const char*, F> methods[] = {
      {"startswith", [](Interp&, const std::string& s, CallArgs& a) {
         auto v = bind_args(a, {"prefix"}, "startswith");
         if (!v[0]) raise("startswith() takes at least 1 argument (0 given)");
         return Value::boolean(affix_match(s, *v[0], true));
       }},
      {"endswith", [](Interp&, const std::string& s, CallArgs& a) {
         auto v = bind_args(a, {"suffix"}, "endswith");
         if (!v[0]) raise("endswith() takes at least 1 argument (0 given)");
         return Value::boolean(affix_match(s, *v[0], false));
       }},
      {"strip", [](Interp&, const std::string& s, CallArgs& a) {
         return Value::string(py_strip(s, bind_args(a, {"chars"}, "strip")[0], true, true));
       }},
      {"lstrip", [](Interp&, const std::string& s, CallArgs& a) {
         return Value::string(py_strip(s, bind_args(a, {"chars"}, "lstrip")[0], true, false));
       }},
      {"rstrip", [](Interp&, const std::string& s, CallArgs& a) {
         return Value::string(py_strip(s, bind_args(a, {"chars"}, "rstrip")[0], false, true));
       }},
      {"split", [](Interp&, const std::string& s, CallArgs& a) {
         auto v = bind_args(a, {"sep", "maxsplit"}, "split");
         return str_list(py_split(s, v[0], v[1] ? to_int(*v[1], "maxsplit") : -1, false));
       }},
      {"rsplit", [](Interp&, const std::string& s, CallArgs& a) {
         auto v = bind_args(a, {"sep", "maxsplit"}, "rsplit");
         return str_list(py_split(s, v[0], v[1] ? to_int(*v[1], "maxsplit") : -1, true));
       }},
      {"splitlines", [](Interp&, const std::string& s, CallArgs& a) {
         bind_args(a, {}, "splitlines");
         return str_list(py_splitlines(s));
       }},
      {"replace", [](Interp& in, const std::string& s, CallArgs& a) {
         auto v = bind_args(a, {"old", "new", "count"}, "replace");
         if (!v[0] || !v[1]) raise("replace() takes at least 2 arguments");
         const std::string& from = want_str(*v[0], "replace() argument 1");
         const std::string& to = want_str(*v[1], "replace() argument 2");
         int64_t count = v[2] ? to_int(*v[2], "count") : -1;
         std::string out;
         if (from.empty()) {
           auto cs = utf8_chars(s);
           for (size_t k = 0; k <= cs.size(); ++k) {
             if (count < 0 || static_cast<int64_t>(k) < count) out += to;
             if (k < cs.size()) out.append(cs[k]);
             in.check_size(out.size());
           }
           return Value::string(std::move(out));
         }
         size_t start = 0;
         for (int64_t n = 0; count < 0 || n < count; ++n) {
           size_t p = s.find(from, start);
           if (p == std::string::npos) break;
           out.append(s, start, p - start);
           out += to;
           in.check_size(out.size());
           start = p + from.size();
         }
         out.append(s, start);
         return Value::string(std::move(out));
       }},
      {"upper", [](Interp&, const std::string& s, CallArgs&) { return Value::string(py_upper(s)); }},
      {"lower", [](Interp&, const std::string& s, CallArgs&) { return Value::string(py_lower(s)); }},
      {"title", [](Interp&, const std::string& s, CallArgs&) { return Value::string(py_title(s)); }},
      {"capitalize", [](Interp&, const std::string& s, CallArgs&) { return Value::string(py_capitalize(s)); }},
      {"find", [](Interp&, const std::string& s, CallArgs& a) {
         auto v = bind_args(a, {"sub"}, "find");
         size_t p = v[0] ? s.find(want_str(*v[0], "find arg")) : std::string::npos;
         return Value::integer(p == std::string::npos ? -1 : char_index(s, p));
       }},
      {"rfind", [](Interp&, const std::string& s, CallArgs& a) {
         auto v = bind_args(a, {"sub"}, "rfind");
         size_t p = v[0] ? s.rfind(want_str(*v[0], "rfind arg")) : std::string::npos;
         return Value::integer(p == std::string::npos ? -1 : char_index(s, p));
       }},
      {"index", [](Interp&, const std::string& s, CallArgs& a) {
         auto v = bind_args(a, {"sub"}, "index");
         size_t p = v[0] ? s.find(want_str(*v[0], "index arg")) : std::string::npos;
         if (p == std::string::npos) raise("substring not found");
         return Value::integer(char_index(s, p));
       }},
      {"count", [](Interp&, const std::string& s, CallArgs& a) {
         auto v = bind_args(a, {"sub"}, "count");
         if (!v[0]) raise("count() takes at least 1 argument (0 given)");
         const std::string& sub = want_str(*v[0], "count arg");
         if (sub.empty()) return Value::integer(static_cast<int64_t>(utf8_length(s)) + 1);
         int64_t n = 0;
         for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
         return Value::integer(n);
       }},
      {"join", [](Interp& in, const std::string& s, CallArgs& a) {
         auto v = bind_args(a, {"iterable"}, "join");
         std::string out;
         bool first = true;
         for (auto& x : iterate(v[0] ? *v[0] : Value::undefined())) {
           if (!first) out += s;
           first = false;
           out += want_str(x, "sequence item");
           in.check_size(out.size());
         }
         return Value::string(std::move(out));
       }},
      {"format", [](Interp& in, const std::string& s, CallArgs& a) { return Value::string(py_format(in, s, a)); }},
      {"isdigit", [](Interp&, const std::string& s, CallArgs&) {
         return Value::boolean(all_chars(s, [](uint32_t c) { return (c >= '0' && c <= '9') || (c >= 0x80 && cat_in(c, {UTF8PROC_CATEGORY_ND})); }));
       }},
      {"isnumeric", [](Interp&, const std::string& s, CallArgs&) {
         return Value::boolean(all_chars(s, [](uint32_t c) { return (c >= '0' && c <= '9') || (c >= 0x80 && cat_in(c, {UTF8PROC_CATEGORY_ND, UTF8PROC_CATEGORY_NL, UTF8PROC_CATEGORY_NO})); }));
       }},
      {"isalpha", [](Interp&, const std::string& s, CallArgs&) {
         return Value::boolean(all_chars(s, [](uint32_t c) {
           return cat_in(c, {UTF8PROC_CATEGORY_LU, UTF8PROC_CATEGORY_LL, UTF8PROC_CATEGORY_LT, UTF8PROC_CATEGORY_LM,
                             UTF8PROC_CATEGORY_LO});
         }));
       }},
      {"isalnum", [](Interp&, const std::string& s, CallArgs&) {
         return Value::boolean(all_chars(s, [](uint32_t c) {
           return cat_in(c, {UTF8PROC_CATEGORY_LU, UTF8PROC_CATEGORY_LL, UTF8PROC_CATEGORY_LT, UTF8PROC_CATEGORY_LM,
                             UTF8PROC_CATEGORY_LO, UTF8PROC_CATEGORY_ND, UTF8PROC_CATEGORY_NL, UTF8PROC_CATEGORY_NO});
         }));
       }},
      {"isspace", [](Interp&, const std::string& s, CallArgs&) { return Value::boolean(all_chars(s, py_isspace_cp)); }},
      {"islower", [](Interp&, const std::string& s, CallArgs&) {
         return Value::boolean(py_lower(s) == s && py_upper(s) != s);
       }},
      {"isupper", [](Interp&, const std::string& s, CallArgs&) {
         return Value::boolean(py_upper(s) == s && py_lower(s) != s);
       }},
  };
  for (auto& [n, fn] : methods) {
    if (name != n) continue;
    F f = fn;
    auto self_s = self.s;
    return Value::func("<built-in method " + name + " of str object>",
                       [f, self_s](Interp& in, CallArgs& a) { return f(in, *self_s, a); });
  }
  return Value::undefined();
}

static Value unsafe(const Value& self, const std::string& name) {
  return Value::undefined("access to attribute '" + name + "' of '" + type_name(self) +
                          "' object is unsafe.");
}

Value dict_method(const Value& self, const std::string& name) {
  auto d = self.dict;
  auto bound = [&](std::function<Value(Interp&, CallArgs&)> fn) {
    return Value::func("<built-in method " + name + " of dict object>", std::move(fn));
  };
  if (name == "items")
    return bound([d](Interp&, CallArgs& a) {
      bind_args(a, {}, "items");
      std::vector<Value> out;
      for (auto& [k, v] : d->items) out.push_back(Value::tuple({k, v}));
      return Value::make_list(std::move(out));
    });
  if (name == "keys" || name == "values") {
    bool keys = name == "keys";
    return bound([d, keys](Interp&, CallArgs& a) {
      bind_args(a, {}, keys ? "keys" : "values");
      std::vector<Value> out;
      for (auto& [k, v] : d->items) out.push_back(keys ? k : v);
      return Value::make_list(std::move(out));
    });
  }
  if (name == "get")
    return bound([d](Interp&, CallArgs& a) {
      auto v = bind_args(a, {"key", "default"}, "get");
      if (!v[0]) raise("get expected at least 1 argument, got 0");
      const Value* x = d->find(*v[0]);
      return x ? *x : v[1] ? *v[1] : Value::none();
    });
  if (name == "copy") return bound([d](Interp&, CallArgs&) { return Value::make_dict(d->items); });
  if (name == "pop" || name == "popitem" || name == "setdefault" || name == "update" || name == "clear")
    return unsafe(self, name);
  return Value::undefined();
}

Value list_method(const Value& self, const std::string& name) {
  auto l = self.list;
  if (name == "count" || name == "index") {
    bool count = name == "count";
    return Value::func("<built-in method " + name + ">", [l, count](Interp&, CallArgs& a) {
      auto v = bind_args(a, {"value"}, count ? "count" : "index");
      if (!v[0]) raise("expected 1 argument");
      int64_t n = 0;
      for (size_t k = 0; k < l->items.size(); ++k) {
        if (!equals(l->items[k], *v[0])) continue;
        if (!count) return Value::integer(static_cast<int64_t>(k));
        ++n;
      }
      if (!count) raise(repr(*v[0]) + " is not in list");
      return Value::integer(n);
    });
  }
  if (name == "copy" && self.kind == Kind::List)
    return Value::func("<built-in method copy>",
                       [l](Interp&, CallArgs&) { return Value::make_list(l->items); });
  if (self.kind == Kind::List && (name == "append" || name == "extend" || name == "insert" || name == "pop" ||
                                  name == "remove" || name == "reverse" || name == "sort" || name == "clear"))
    return unsafe(self, name);
  return Value::undefined();
}

// ---- formatting ----

std::string py_format(Interp& in, const std::string& fmt, CallArgs& args) {
  std::string out;
  size_t auto_index = 0;
  for (size_t k = 0; k < fmt.size(); ++k) {
    char c = fmt[k];
    if (c == '}') {
      if (k + 1 < fmt.size() && fmt[k + 1] == '}')
        ++k;
      else
        raise("Single '}' encountered in format string");
      out += '}';
      continue;
    }
    if (c != '{') {
      out += c;
      continue;
    }
    if (k + 1 < fmt.size() && fmt[k + 1] == '{') {
      out += '{';
      ++k;
      continue;
    }
    size_t e = fmt.find('}', k);
    if (e == std::string::npos) raise("Single '{' encountered in format string");
    std::string field = fmt.substr(k + 1, e - k - 1);
    if (field.find_first_of(":!") != std::string::npos)
      raise("format specs are not supported: {" + field + "}");
    const Value* v = nullptr;
    if (field.empty()) {
      if (auto_index >= args.pos.size())
        raise("Replacement index " + std::to_string(auto_index) + " out of range");
      v = &args.pos[auto_index++];
    } else if (std::all_of(field.begin(), field.end(), [](char d) { return d >= '0' && d <= '9'; })) {
      size_t idx = std::stoul(field);
      if (idx >= args.pos.size()) raise("Replacement index " + field + " out of range");
      v = &args.pos[idx];
    } else {
      for (auto& [key, x] : args.kw)
        if (key == field) v = &x;
      if (!v) raise("'" + field + "'");
    }
    out += to_str(*v);
    in.check_size(out.size());
    k = e;
  }
  return out;
}

std::string percent_format(const std::string& fmt, const Value& args) {
  std::vector<Value> items = args.kind == Kind::Tuple ? args.list->items : std::vector<Value>{args};
  std::string out;
  size_t next = 0;
  for (size_t k = 0; k < fmt.size(); ++k) {
    if (fmt[k] != '%') {
      out += fmt[k];
      continue;
    }
    if (++k >= fmt.size()) raise("incomplete format");
    char c = fmt[k];
    if (c == '%') {
      out += '%';
      continue;
    }
    if (next >= items.size()) raise("not enough arguments for format string");
    const Value& v = items[next++];
    if (c == 's') {
      out += to_str(v);
    } else if (c == 'r') {
      out += repr(v);
    } else if (c == 'd' || c == 'i') {
      if (!v.is_number()) raise("%d format: a real number is required, not " + type_name(v));
      out += std::to_string(v.kind == Kind::Float ? static_cast<int64_t>(v.f) : v.i);
    } else {
      raise(std::string("unsupported format character '") + c + "'");
    }
  }
  if (next < items.size()) raise("not all arguments converted during string formatting");
  return out;
}

// ---- globals ----

void install_globals(Frame& g) {
  g.set("range", Value::func("<class 'range'>", [](Interp& in, CallArgs& a) {
          if (!a.kw.empty()) raise("range() takes no keyword arguments");
          if (a.pos.empty() || a.pos.size() > 3)
            raise("range expected at most 3 arguments, got " + std::to_string(a.pos.size()));
          int64_t start = 0, stop, step = 1;
          if (a.pos.size() == 1) {
            stop = to_int(a.pos[0], "range");
          } else {
            start = to_int(a.pos[0], "range");
            stop = to_int(a.pos[1], "range");
            if (a.pos.size() == 3) step = to_int(a.pos[2], "range");
          }
          if (step == 0) raise("range() arg 3 must not be zero");
          int64_t n = step > 0 ? (stop > start ? (stop - start + step - 1) / step : 0)
                               : (start > stop ? (start - stop - step - 1) / -step : 0);
          if (n > 100000) raise("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
          std::vector<Value> items;
          items.reserve(static_cast<size_t>(n));
          for (int64_t k = 0; k < n; ++k) {
            in.step();
            items.push_back(Value::integer(start + k * step));
          }
          return Value::make_list(std::move(items));
        }));
  g.set("namespace", Value::func("<class 'jinja2.utils.Namespace'>", [](Interp& in, CallArgs& a) {
          Value ns = Value::make_dict({}, Kind::Namespace);
          if (a.pos.size() > 1) raise("namespace() takes at most 1 positional argument");
          if (!a.pos.empty()) {
            if (a.pos[0].kind != Kind::Dict) raise("namespace() argument must be a mapping");
            for (auto& [k, v] : a.pos[0].dict->items) ns.dict->set(k, v);
          }
          for (auto& [k, v] : a.kw) ns.dict->set(Value::string(k), std::move(v));
          in.track_namespace(ns);
          return ns;
        }));
  g.set("dict", Value::func("<class 'dict'>", [](Interp&, CallArgs& a) {
          Value d = Value::make_dict({});
          if (a.pos.size() > 1) raise("dict expected at most 1 argument");
          if (!a.pos.empty()) {
            if (a.pos[0].kind != Kind::Dict) raise("dict() argument must be a mapping");
            for (auto& [k, v] : a.pos[0].dict->items) d.dict->set(k, v);
          }
          for (auto& [k, v] : a.kw) d.dict->set(Value::string(k), std::move(v));
          return d;
        }));
  g.set("raise_exception", Value::func("<function raise_exception>", [](Interp&, CallArgs& a) -> Value {
          auto v = bind_args(a, {"message"}, "raise_exception");
          raise(v[0] ? to_str(*v[0]) : std::string());
        }));
  g.set("strftime_now", Value::func("<function strftime_now>", [](Interp&, CallArgs& a) {
          auto v = bind_args(a, {"format"}, "strftime_now");
          if (!v[0]) raise("strftime_now() missing 1 required positional argument: 'format'");
          const std::string& fmt = want_str(*v[0], "strftime() argument 1");
          std::time_t t = std::time(nullptr);
          std::tm tm{};
          localtime_r(&t, &tm);
          std::string buf(256 + fmt.size() * 8, '\0');
          size_t n = std::strftime(buf.data(), buf.size(), fmt.c_str(), &tm);
          buf.resize(n);
          return Value::string(std::move(buf));
        }));
  g.set("joiner", Value::func("<class 'jinja2.utils.Joiner'>", [](Interp&, CallArgs& a) {
          auto v = bind_args(a, {"sep"}, "joiner");
          std::string sep = v[0] ? to_str(*v[0]) : ", ";
          auto used = std::make_shared<bool>(false);
          return Value::func("<jinja2.utils.Joiner>", [sep, used](Interp&, CallArgs&) {
            if (!*used) {
              *used = true;
              return Value::string("");
            }
            return Value::string(sep);
          });
        }));
}

}  // namespace tessera::jinja
