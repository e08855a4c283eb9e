// jinja2's builtin filters and tests (jinja2/filters.py, jinja2/tests.py), tojson as transformers has it.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "io/jinja/interp.h"

namespace tessera::jinja {
namespace {

using Args = std::vector<std::optional<Value>>;

Value arg_or(const Args& a, size_t k, Value def) {
  return k < a.size() && a[k] ? *a[k] : def;
}
bool flag(const Args& a, size_t k) {
  return k < a.size() && a[k] && truthy(*a[k]);
}

Value seq_of(std::vector<Value> items) {
  return Value::make_list(std::move(items));
}

// The sort / unique key: strings case folded unless case_sensitive.
Value fold(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.kind == Kind::String) return Value::string(py_lower(*v.s));
  return v;
}

std::vector<std::string> split_attrs(const Value& attr) {
  std::vector<std::string> out;
  if (attr.kind == Kind::Int) return {std::to_string(attr.i)};
  std::string s = to_str(attr);
  size_t start = 0;
  while (true) {
    size_t c = s.find(',', start);
    out.push_back(s.substr(start, c == std::string::npos ? std::string::npos : c - start));
    if (c == std::string::npos) return out;
    start = c + 1;
  }
}

Value f_length(Interp&, Value& v, CallArgs& a) {
  bind_args(a, {}, "length");
  return Value::integer(length(v));
}
Value f_trim(Interp&, Value& v, CallArgs& a) {
  auto x = bind_args(a, {"chars"}, "trim");
  return Value::string(py_strip(to_str(v), x[0], true, true));
}
Value f_upper(Interp&, Value& v, CallArgs&) {
  return Value::string(py_upper(to_str(v)));
}
Value f_lower(Interp&, Value& v, CallArgs&) {
  return Value::string(py_lower(to_str(v)));
}
Value f_capitalize(Interp&, Value& v, CallArgs&) {
  return Value::string(py_capitalize(to_str(v)));
}
Value f_title(Interp&, Value& v, CallArgs&) {
  // jinja2's own: each piece between [-\s({[<]+ gets its first character upper, the rest lower.
  std::string s = to_str(v), out;
  auto chars = utf8_chars(s);
  bool start = true;
  for (auto c : chars) {
    size_t p = 0;
    uint32_t cp = decode_utf8(c, p);
    bool sep = py_isspace_cp(cp) || cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<';
    if (sep) {
      out.append(c);
      start = true;
    } else {
      out += start ? py_upper(c) : py_lower(c);
      start = false;
    }
  }
  return Value::string(std::move(out));
}
Value f_string(Interp&, Value& v, CallArgs&) {
  return v.kind == Kind::String ? v : Value::string(to_str(v));
}
Value f_safe(Interp&, Value& v, CallArgs&) {
  return v.kind == Kind::String ? v : Value::string(to_str(v));
}
Value f_escape(Interp& in, Value& v, CallArgs&) {
  std::string s = to_str(v), out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  in.check_size(out.size());
  return Value::string(std::move(out));
}
Value f_replace(Interp& in, Value& v, CallArgs& a) {
  Value s = Value::string(to_str(v));
  return in.call(str_method(s, "replace"), a);
}
Value f_default(Interp&, Value& v, CallArgs& a) {
  auto x = bind_args(a, {"default_value", "boolean"}, "default");
  if (v.is_undefined() || (flag(x, 1) && !truthy(v))) return arg_or(x, 0, Value::string(""));
  return v;
}
Value f_join(Interp& in, Value& v, CallArgs& a) {
  auto x = bind_args(a, {"d", "attribute"}, "join");
  std::string sep = x[0] ? to_str(*x[0]) : "", out;
  bool first = true;
  for (auto& item : iterate(v)) {
    if (!first) out += sep;
    first = false;
    out += to_str(x[1] ? in.attr_path(item, to_str(*x[1])) : item);
    in.check_size(out.size());
  }
  return Value::string(std::move(out));
}
Value f_items(Interp&, Value& v, CallArgs&) {
  if (v.is_undefined()) return seq_of({});
  if (v.kind != Kind::Dict) raise("Can only get item pairs from a mapping.");
  std::vector<Value> out;
  for (auto& [k, x] : v.dict->items) out.push_back(Value::tuple({k, x}));
  return seq_of(std::move(out));
}
Value f_list(Interp&, Value& v, CallArgs&) {
  return seq_of(iterate(v));
}
Value f_first(Interp&, Value& v, CallArgs&) {
  auto items = iterate(v);
  if (items.empty()) return Value::undefined("No first item, sequence was empty.");
  return items.front();
}
Value f_last(Interp&, Value& v, CallArgs&) {
  auto items = iterate(v);
  if (items.empty()) return Value::undefined("No last item, sequence was empty.");
  return items.back();
}
Value f_reverse(Interp&, Value& v, CallArgs&) {
  if (v.kind == Kind::String) {
    auto cs = utf8_chars(*v.s);
    std::string out;
    for (size_t k = cs.size(); k-- > 0;) out.append(cs[k]);
    return Value::string(std::move(out));
  }
  auto items = iterate(v);
  std::reverse(items.begin(), items.end());
  return seq_of(std::move(items));
}
Value f_tojson(Interp& in, Value& v, CallArgs& a) {
  auto x = bind_args(a, {"ensure_ascii", "indent", "separators", "sort_keys"}, "tojson");
  JsonOptions o;
  o.ensure_ascii = flag(x, 0);
  o.sort_keys = flag(x, 3);
  if (x[1] && !x[1]->is_none()) {
    o.has_indent = true;
    o.item_sep = ",";
    if (x[1]->kind == Kind::String)
      o.indent = *x[1]->s;
    else
      o.indent = std::string(static_cast<size_t>(std::max<int64_t>(0, to_int(*x[1], "indent"))), ' ');
  }
  if (x[2] && !x[2]->is_none()) {
    auto seps = iterate(*x[2]);
    if (seps.size() != 2) raise("separators must be a pair of strings");
    o.item_sep = to_str(seps[0]);
    o.key_sep = to_str(seps[1]);
  }
  std::string out;
  dump_json(v, o, out);
  in.check_size(out.size());
  return Value::string(std::move(out));
}
Value f_int(Interp&, Value& v, CallArgs& a) {
  auto x = bind_args(a, {"default", "base"}, "int");
  Value def = arg_or(x, 0, Value::integer(0));
  int base = x[1] ? static_cast<int>(to_int(*x[1], "base")) : 10;
  if (v.is_integral()) return Value::integer(v.i);
  if (v.kind == Kind::Float) {
    if (!std::isfinite(v.f)) return def;
    return Value::integer(static_cast<int64_t>(v.f));
  }
  if (v.kind == Kind::String) {
    std::string s = py_strip(*v.s, std::nullopt, true, true);
    std::string digits;
    for (char c : s)
      if (c != '_') digits += c;
    if (!digits.empty()) {
      char* end = nullptr;
      errno = 0;
      long long r = std::strtoll(digits.c_str(), &end, base);
      if (*end == 0 && errno == 0) return Value::integer(r);
      double d = std::strtod(digits.c_str(), &end);
      if (*end == 0 && std::isfinite(d)) return Value::integer(static_cast<int64_t>(d));
    }
  }
  return def;
}
Value f_float(Interp&, Value& v, CallArgs& a) {
  auto x = bind_args(a, {"default"}, "float");
  if (v.is_number()) return Value::number(v.as_double());
  if (v.kind == Kind::String) {
    std::string s = py_strip(*v.s, std::nullopt, true, true);
    char* end = nullptr;
    double d = std::strtod(s.c_str(), &end);
    if (!s.empty() && *end == 0) return Value::number(d);
  }
  return arg_or(x, 0, Value::number(0.0));
}
Value f_abs(Interp&, Value& v, CallArgs&) {
  if (v.kind == Kind::Float) return Value::number(std::fabs(v.f));
  if (v.is_integral()) return Value::integer(v.i < 0 ? -v.i : v.i);
  raise("bad operand type for abs(): '" + type_name(v) + "'");
}
Value f_round(Interp&, Value& v, CallArgs& a) {
  auto x = bind_args(a, {"precision", "method"}, "round");
  int64_t prec = x[0] ? to_int(*x[0], "precision") : 0;
  std::string method = x[1] ? to_str(*x[1]) : "common";
  if (method != "common" && method != "ceil" && method != "floor")
    raise("method must be common, ceil or floor");
  if (!v.is_number()) raise("type " + type_name(v) + " doesn't define __round__ method");
  if (method == "common") {
    if (v.is_integral()) return Value::integer(v.i);
    if (!std::isfinite(v.f) || prec > 300) return Value::number(v.f);
    if (prec < 0) {
      double p = std::pow(10.0, static_cast<double>(-prec));
      return Value::number(std::nearbyint(v.f / p) * p);
    }
    char buf[512];
    std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(prec), v.f);
    return Value::number(std::strtod(buf, nullptr));
  }
  double p = std::pow(10.0, static_cast<double>(prec));
  double r = (method == "ceil" ? std::ceil(v.as_double() * p) : std::floor(v.as_double() * p)) / p;
  return Value::number(r);
}
Value f_unique(Interp& in, Value& v, CallArgs& a) {
  auto x = bind_args(a, {"case_sensitive", "attribute"}, "unique");
  std::vector<Value> out, seen;
  for (auto& item : iterate(v)) {
    Value key = fold(x[1] ? in.attr_path(item, to_str(*x[1])) : item, flag(x, 0));
    bool dup = false;
    for (auto& s : seen) dup = dup || equals(s, key);
    if (dup) continue;
    seen.push_back(key);
    out.push_back(item);
  }
  return seq_of(std::move(out));
}
Value f_sort(Interp& in, Value& v, CallArgs& a) {
  auto x = bind_args(a, {"reverse", "case_sensitive", "attribute"}, "sort");
  bool rev = flag(x, 0), cs = flag(x, 1);
  std::vector<std::string> attrs;
  if (x[2] && !x[2]->is_none()) attrs = split_attrs(*x[2]);
  std::vector<std::pair<std::vector<Value>, Value>> keyed;
  for (auto& item : iterate(v)) {
    std::vector<Value> key;
    if (attrs.empty())
      key.push_back(fold(item, cs));
    else
      for (auto& at : attrs) key.push_back(fold(in.attr_path(item, at), cs));
    keyed.emplace_back(std::move(key), item);
  }
  auto less = [](const std::vector<Value>& p, const std::vector<Value>& q) {
    for (size_t k = 0; k < p.size(); ++k) {
      int c = compare(p[k], q[k], "<");
      if (c) return c < 0;
    }
    return false;
  };
  std::stable_sort(keyed.begin(), keyed.end(),
                   [&](auto& p, auto& q) { return rev ? less(q.first, p.first) : less(p.first, q.first); });
  std::vector<Value> out;
  for (auto& kv : keyed) out.push_back(std::move(kv.second));
  return seq_of(std::move(out));
}
Value f_dictsort(Interp&, Value& v, CallArgs& a) {
  auto x = bind_args(a, {"case_sensitive", "by", "reverse"}, "dictsort");
  if (v.kind != Kind::Dict) raise("dictsort: a mapping is required");
  bool cs = flag(x, 0), rev = flag(x, 2);
  std::string by = x[1] ? to_str(*x[1]) : "key";
  if (by != "key" && by != "value") raise("You can only sort by either 'key' or 'value'");
  std::vector<std::pair<Value, Value>> items = v.dict->items;
  std::stable_sort(items.begin(), items.end(), [&](auto& p, auto& q) {
    const Value& l = by == "key" ? p.first : p.second;
    const Value& r = by == "key" ? q.first : q.second;
    int c = compare(fold(l, cs), fold(r, cs), "<");
    return rev ? c > 0 : c < 0;
  });
  std::vector<Value> out;
  for (auto& kv : items) out.push_back(Value::tuple({kv.first, kv.second}));
  return seq_of(std::move(out));
}
Value f_indent(Interp& in, Value& v, CallArgs& a) {
  auto x = bind_args(a, {"width", "first", "blank"}, "indent");
  std::string ind =
      x[0] && x[0]->kind == Kind::String
          ? *x[0]->s
          : std::string(static_cast<size_t>(std::max<int64_t>(0, x[0] ? to_int(*x[0], "width") : 4)), ' ');
  std::string s = to_str(v) + "\n";
  auto lines = py_splitlines(s);
  std::string out;
  if (flag(x, 2)) {
    for (size_t k = 0; k < lines.size(); ++k) out += (k ? "\n" + ind : "") + lines[k];
  } else {
    out = lines.empty() ? "" : lines[0];
    for (size_t k = 1; k < lines.size(); ++k) out += "\n" + (lines[k].empty() ? "" : ind + lines[k]);
  }
  if (flag(x, 1)) out = ind + out;
  in.check_size(out.size());
  return Value::string(std::move(out));
}
Value f_wordcount(Interp&, Value& v, CallArgs&) {
  std::string s = to_str(v);
  int64_t n = 0;
  bool in_word = false;
  size_t pos = 0;
  while (pos < s.size()) {
    uint32_t cp = decode_utf8(s, pos);
    bool w = (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || cp == '_' ||
             (cp >= 0x80 && !py_isspace_cp(cp));
    if (w && !in_word) ++n;
    in_word = w;
  }
  return Value::integer(n);
}
Value f_center(Interp& in, Value& v, CallArgs& a) {
  auto x = bind_args(a, {"width"}, "center");
  std::string s = to_str(v);
  int64_t width = x[0] ? to_int(*x[0], "width") : 80, len = static_cast<int64_t>(utf8_length(s));
  if (width <= len) return Value::string(s);
  in.check_size(static_cast<size_t>(width) + s.size());
  int64_t marg = width - len, left = marg / 2 + (marg & width & 1);
  return Value::string(std::string(left, ' ') + s + std::string(marg - left, ' '));
}
Value f_batch(Interp&, Value& v, CallArgs& a) {
  auto x = bind_args(a, {"linecount", "fill_with"}, "batch");
  int64_t n = x[0] ? to_int(*x[0], "linecount") : 0;
  if (n <= 0) raise("batch: linecount must be positive");
  std::vector<Value> out, cur;
  for (auto& item : iterate(v)) {
    cur.push_back(item);
    if (static_cast<int64_t>(cur.size()) == n) out.push_back(seq_of(std::move(cur))), cur.clear();
  }
  if (!cur.empty()) {
    if (x[1])
      while (static_cast<int64_t>(cur.size()) < n) cur.push_back(*x[1]);
    out.push_back(seq_of(std::move(cur)));
  }
  return seq_of(std::move(out));
}
Value minmax(Interp& in, Value& v, CallArgs& a, bool max) {
  auto x = bind_args(a, {"case_sensitive", "attribute"}, max ? "max" : "min");
  auto items = iterate(v);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  size_t best = 0;
  Value best_key;
  for (size_t k = 0; k < items.size(); ++k) {
    Value key = fold(x[1] ? in.attr_path(items[k], to_str(*x[1])) : items[k], flag(x, 0));
    if (k == 0 || (max ? compare(key, best_key, ">") > 0 : compare(key, best_key, "<") < 0)) {
      best = k;
      best_key = key;
    }
  }
  return items[best];
}
Value f_min(Interp& in, Value& v, CallArgs& a) {
  return minmax(in, v, a, false);
}
Value f_max(Interp& in, Value& v, CallArgs& a) {
  return minmax(in, v, a, true);
}
Value f_sum(Interp& in, Value& v, CallArgs& a) {
  auto x = bind_args(a, {"attribute", "start"}, "sum");
  Value total = arg_or(x, 1, Value::integer(0));
  for (auto& item : iterate(v)) {
    Value val = x[0] ? in.attr_path(item, to_str(*x[0])) : item;
    if (!total.is_number() || !val.is_number())
      raise("unsupported operand type(s) for +: '" + type_name(total) + "' and '" + type_name(val) + "'");
    if (total.kind == Kind::Float || val.kind == Kind::Float)
      total = Value::number(total.as_double() + val.as_double());
    else
      total = Value::integer(total.i + val.i);
  }
  return total;
}
Value f_format(Interp&, Value& v, CallArgs& a) {
  if (!a.kw.empty()) raise("format: keyword arguments are not supported");
  Value args = Value::tuple(a.pos);
  return Value::string(percent_format(to_str(v), args));
}
Value f_attr(Interp& in, Value& v, CallArgs& a) {
  auto x = bind_args(a, {"name"}, "attr");
  return in.getattr(v, x[0] ? to_str(*x[0]) : "");
}
Value f_count_words(Interp& in, Value& v, CallArgs& a) {
  return f_wordcount(in, v, a);
}

// select / reject / selectattr / rejectattr: the test and its arguments follow the fixed ones.
Value select_impl(Interp& in, Value& v, CallArgs& a, bool attr, bool keep) {
  size_t k = 0;
  std::string attribute;
  if (attr) {
    if (a.pos.empty()) raise("Missing parameter for attribute name");
    attribute = to_str(a.pos[k++]);
  }
  std::string test;
  bool has_test = k < a.pos.size();
  if (has_test) test = to_str(a.pos[k++]);
  CallArgs targs;
  targs.pos.assign(a.pos.begin() + static_cast<std::ptrdiff_t>(k), a.pos.end());
  targs.kw = a.kw;
  std::vector<Value> out;
  for (auto& item : iterate(v)) {
    Value x = attr ? in.attr_path(item, attribute) : item;
    bool ok = has_test ? in.test(test, x, targs) : truthy(x);
    if (ok == keep) out.push_back(item);
  }
  return seq_of(std::move(out));
}
Value f_select(Interp& in, Value& v, CallArgs& a) {
  return select_impl(in, v, a, false, true);
}
Value f_reject(Interp& in, Value& v, CallArgs& a) {
  return select_impl(in, v, a, false, false);
}
Value f_selectattr(Interp& in, Value& v, CallArgs& a) {
  return select_impl(in, v, a, true, true);
}
Value f_rejectattr(Interp& in, Value& v, CallArgs& a) {
  return select_impl(in, v, a, true, false);
}
Value f_map(Interp& in, Value& v, CallArgs& a) {
  std::vector<Value> out;
  if (a.pos.empty()) {
    std::optional<Value> attribute, def;
    for (auto& [k, x] : a.kw) {
      if (k == "attribute")
        attribute = x;
      else if (k == "default")
        def = x;
      else
        raise("Unexpected keyword argument '" + k + "'");
    }
    if (!attribute) raise("map requires a filter argument");
    for (auto& item : iterate(v)) {
      Value x = in.attr_path(item, to_str(*attribute));
      out.push_back(def && x.is_undefined() ? *def : x);
    }
    return seq_of(std::move(out));
  }
  std::string name = to_str(a.pos[0]);
  CallArgs fargs;
  fargs.pos.assign(a.pos.begin() + 1, a.pos.end());
  fargs.kw = a.kw;
  for (auto& item : iterate(v)) out.push_back(in.filter(name, item, fargs));
  return seq_of(std::move(out));
}

// ---- tests ----

bool t_defined(Interp&, const Value& v, CallArgs&) {
  return !v.is_undefined();
}
bool t_undefined(Interp&, const Value& v, CallArgs&) {
  return v.is_undefined();
}
bool t_none(Interp&, const Value& v, CallArgs&) {
  return v.is_none();
}
bool t_boolean(Interp&, const Value& v, CallArgs&) {
  return v.kind == Kind::Bool;
}
bool t_true(Interp&, const Value& v, CallArgs&) {
  return v.kind == Kind::Bool && v.i;
}
bool t_false(Interp&, const Value& v, CallArgs&) {
  return v.kind == Kind::Bool && !v.i;
}
bool t_integer(Interp&, const Value& v, CallArgs&) {
  return v.kind == Kind::Int;
}
bool t_float(Interp&, const Value& v, CallArgs&) {
  return v.kind == Kind::Float;
}
bool t_number(Interp&, const Value& v, CallArgs&) {
  return v.is_number();
}
bool t_string(Interp&, const Value& v, CallArgs&) {
  return v.kind == Kind::String;
}
bool t_mapping(Interp&, const Value& v, CallArgs&) {
  return v.kind == Kind::Dict;
}
bool t_sequence(Interp&, const Value& v, CallArgs&) {
  return v.is_seq() || v.kind == Kind::String || v.kind == Kind::Dict || v.is_undefined();
}
bool t_iterable(Interp&, const Value& v, CallArgs&) {
  return v.is_seq() || v.kind == Kind::String || v.kind == Kind::Dict || v.is_undefined();
}
bool t_callable(Interp&, const Value& v, CallArgs&) {
  return v.kind == Kind::Func;
}
bool t_escaped(Interp&, const Value&, CallArgs&) {
  return false;
}
int64_t mod_of(const Value& v, int64_t m) {
  if (v.is_integral()) return ((v.i % m) + m) % m;
  if (v.kind == Kind::Float)
    return static_cast<int64_t>(
        std::fmod(std::fmod(v.f, static_cast<double>(m)) + m, static_cast<double>(m)) != 0);
  if (v.is_undefined()) raise(undefined_message(v));
  raise("unsupported operand type(s) for %: '" + type_name(v) + "' and 'int'");
}
bool t_odd(Interp&, const Value& v, CallArgs&) {
  return mod_of(v, 2) == 1;
}
bool t_even(Interp&, const Value& v, CallArgs&) {
  return mod_of(v, 2) == 0;
}
bool t_divisibleby(Interp&, const Value& v, CallArgs& a) {
  auto x = bind_args(a, {"num"}, "divisibleby");
  int64_t n = x[0] ? to_int(*x[0], "divisibleby") : 0;
  if (n == 0) raise("integer division or modulo by zero");
  return mod_of(v, n < 0 ? -n : n) == 0;
}
const Value& one_arg(CallArgs& a, const char* name) {
  if (a.pos.size() != 1 || !a.kw.empty()) raise(std::string(name) + "() takes exactly one argument");
  return a.pos[0];
}
bool t_eq(Interp&, const Value& v, CallArgs& a) {
  return equals(v, one_arg(a, "eq"));
}
bool t_ne(Interp&, const Value& v, CallArgs& a) {
  return !equals(v, one_arg(a, "ne"));
}
bool t_lt(Interp&, const Value& v, CallArgs& a) {
  return compare(v, one_arg(a, "lt"), "<") < 0;
}
bool t_le(Interp&, const Value& v, CallArgs& a) {
  return compare(v, one_arg(a, "le"), "<=") <= 0;
}
bool t_gt(Interp&, const Value& v, CallArgs& a) {
  return compare(v, one_arg(a, "gt"), ">") > 0;
}
bool t_ge(Interp&, const Value& v, CallArgs& a) {
  return compare(v, one_arg(a, "ge"), ">=") >= 0;
}
bool t_in(Interp&, const Value& v, CallArgs& a) {
  return contains(one_arg(a, "in"), v);
}
bool t_sameas(Interp&, const Value& v, CallArgs& a) {
  const Value& o = one_arg(a, "sameas");
  if (v.kind != o.kind) return false;
  switch (v.kind) {
    case Kind::None:
    case Kind::Undefined:
      return true;
    case Kind::Bool:
    case Kind::Int:
      return v.i == o.i;
    case Kind::Float:
      return v.f == o.f;
    case Kind::String:
      return v.s == o.s || *v.s == *o.s;
    case Kind::List:
    case Kind::Tuple:
      return v.list == o.list;
    case Kind::Func:
      return v.fn == o.fn;
    default:
      return v.dict == o.dict;
  }
}
bool t_lower(Interp&, const Value& v, CallArgs&) {
  std::string s = to_str(v);
  return py_lower(s) == s && py_upper(s) != s;
}
bool t_upper(Interp&, const Value& v, CallArgs&) {
  std::string s = to_str(v);
  return py_upper(s) == s && py_lower(s) != s;
}
bool t_filter(Interp&, const Value& v, CallArgs&) {
  return v.kind == Kind::String && find_filter(*v.s);
}
bool t_test(Interp&, const Value& v, CallArgs&) {
  return v.kind == Kind::String && find_test(*v.s);
}

}  // namespace

FilterFn find_filter(std::string_view name) {
  static const std::pair<const char*, FilterFn> table[] = {
      {"length", f_length},
      {"count", f_length},
      {"trim", f_trim},
      {"upper", f_upper},
      {"lower", f_lower},
      {"capitalize", f_capitalize},
      {"title", f_title},
      {"string", f_string},
      {"safe", f_safe},
      {"escape", f_escape},
      {"e", f_escape},
      {"forceescape", f_escape},
      {"replace", f_replace},
      {"default", f_default},
      {"d", f_default},
      {"join", f_join},
      {"items", f_items},
      {"list", f_list},
      {"first", f_first},
      {"last", f_last},
      {"reverse", f_reverse},
      {"tojson", f_tojson},
      {"int", f_int},
      {"float", f_float},
      {"abs", f_abs},
      {"round", f_round},
      {"unique", f_unique},
      {"sort", f_sort},
      {"dictsort", f_dictsort},
      {"indent", f_indent},
      {"wordcount", f_count_words},
      {"center", f_center},
      {"batch", f_batch},
      {"min", f_min},
      {"max", f_max},
      {"sum", f_sum},
      {"format", f_format},
      {"attr", f_attr},
      {"select", f_select},
      {"reject", f_reject},
      {"selectattr", f_selectattr},
      {"rejectattr", f_rejectattr},
      {"map", f_map},
  };
  for (auto& [n, f] : table)
    if (name == n) return f;
  return nullptr;
}

TestFn find_test(std::string_view name) {
  static const std::pair<const char*, TestFn> table[] = {
      {"defined", t_defined},
      {"undefined", t_undefined},
      {"none", t_none},
      {"boolean", t_boolean},
      {"true", t_true},
      {"false", t_false},
      {"integer", t_integer},
      {"float", t_float},
      {"number", t_number},
      {"string", t_string},
      {"mapping", t_mapping},
      {"sequence", t_sequence},
      {"iterable", t_iterable},
      {"callable", t_callable},
      {"escaped", t_escaped},
      {"odd", t_odd},
      {"even", t_even},
      {"divisibleby", t_divisibleby},
      {"eq", t_eq},
      {"equalto", t_eq},
      {"==", t_eq},
      {"ne", t_ne},
      {"!=", t_ne},
      {"lt", t_lt},
      {"lessthan", t_lt},
      {"<", t_lt},
      {"le", t_le},
      {"<=", t_le},
      {"gt", t_gt},
      {"greaterthan", t_gt},
      {">", t_gt},
      {"ge", t_ge},
      {">=", t_ge},
      {"in", t_in},
      {"sameas", t_sameas},
      {"lower", t_lower},
      {"upper", t_upper},
      {"filter", t_filter},
      {"test", t_test},
  };
  for (auto& [n, f] : table)
    if (name == n) return f;
  return nullptr;
}

Value Interp::filter(std::string_view name, Value v, CallArgs args) {
  FilterFn f = find_filter(name);
  if (!f) raise("No filter named '" + std::string(name) + "'.");
  return f(*this, v, args);
}

bool Interp::test(std::string_view name, const Value& v, CallArgs args) {
  TestFn t = find_test(name);
  if (!t) raise("No test named '" + std::string(name) + "'.");
  return t(*this, v, args);
}

}  // namespace tessera::jinja
