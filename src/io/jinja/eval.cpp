// The evaluator: statements and expressions with jinja2's scoping and Python's operators.
#include <algorithm>
#include <cmath>

#include "io/jinja/interp.h"

namespace tessera::jinja {

const Value* Frame::find(std::string_view name) const {
  for (const Frame* f = this; f; f = f->parent.get())
    for (auto& [k, v] : f->vars)
      if (k == name) return &v;
  return nullptr;
}

void Frame::set(const std::string& name, Value v) {
  for (auto& [k, x] : vars)
    if (k == name) {
      x = std::move(v);
      return;
    }
  vars.emplace_back(name, std::move(v));
}

Interp::~Interp() {
  for (auto& ns : namespaces_) ns->items.clear();
  for (auto& f : closures_) f->vars.clear();
}

// ---- statements ----

Flow Interp::exec(const Body& body, const FrameP& f, std::string& out) {
  for (auto& s : body) {
    Flow flow = exec_stmt(*s, f, out);
    if (flow != Flow::Normal) return flow;
  }
  return Flow::Normal;
}

static void append_out(const Interp& in, std::string& out, std::string_view s) {
  in.check_size(out.size() + s.size());
  out.append(s);
}

Flow Interp::exec_stmt(const Stmt& s, const FrameP& f, std::string& out) {
  try {
    step();
    switch (s.kind) {
      case SK::Output:
        append_out(*this, out, s.text);
        return Flow::Normal;
      case SK::Print: {
        Value v = eval(*s.expr, f);
        if (v.kind == Kind::String)
          append_out(*this, out, *v.s);
        else
          append_out(*this, out, str_of(v));
        return Flow::Normal;
      }
      case SK::If:
        for (auto& [cond, body] : s.branches)
          if (truthy(eval(*cond, f))) return exec(body, f, out);
        return exec(s.else_body, f, out);
      case SK::For:
        return exec_for(s, f, out);
      case SK::Set:
        if (!s.text.empty()) {  // set ns.attr = value
          const Value* ns = f->find(s.targets[0]);
          if (!ns || ns->kind != Kind::Namespace) raise("cannot assign attribute on non-namespace object");
          ns->dict->set(Value::string(s.text), eval(*s.expr, f));
        } else {
          assign(s, f, eval(*s.expr, f));
        }
        return Flow::Normal;
      case SK::SetBlock: {
        std::string body;
        auto inner = std::make_shared<Frame>(Frame{{}, f});
        exec(s.body, inner, body);
        Value v = Value::string(std::move(body));
        if (s.expr) {
          Value saved = std::move(block_input_);
          block_input_ = std::move(v);
          v = eval(*s.expr, f);
          block_input_ = std::move(saved);
        }
        assign(s, f, std::move(v));
        return Flow::Normal;
      }
      case SK::Macro:
        f->set(s.text, make_macro(s, f, s.body, s.params, s.text));
        return Flow::Normal;
      case SK::CallBlock: {
        Value caller = make_macro(s, f, s.body, s.params, "caller");
        const Expr& call = *s.expr;
        Value fn = eval(*call.a, f);
        CallArgs args = eval_args(call, f);
        args.kw.emplace_back("caller", std::move(caller));
        append_out(*this, out, str_of(this->call(fn, args)));
        return Flow::Normal;
      }
      case SK::FilterBlock: {
        std::string body;
        auto inner = std::make_shared<Frame>(Frame{{}, f});
        exec(s.body, inner, body);
        Value saved = std::move(block_input_);
        block_input_ = Value::string(std::move(body));
        Value v = eval(*s.expr, f);
        block_input_ = std::move(saved);
        append_out(*this, out, str_of(v));
        return Flow::Normal;
      }
      case SK::With: {
        auto inner = std::make_shared<Frame>(Frame{{}, f});
        for (auto& p : s.params) inner->set(p.name, eval(*p.def, f));
        return exec(s.body, inner, out);
      }
      case SK::Break:
        return Flow::Break;
      case SK::Continue:
        return Flow::Continue;
      case SK::Block:
        return exec(s.body, f, out);
    }
    return Flow::Normal;
  } catch (RenderError& e) {
    if (!e.line) e.line = s.line;
    throw;
  }
}

void Interp::assign(const Stmt& s, const FrameP& f, Value v) {
  if (!s.tuple_target) {
    f->set(s.targets[0], std::move(v));
    return;
  }
  std::vector<Value> items = iterate(v);
  if (items.size() != s.targets.size())
    raise(items.size() < s.targets.size()
              ? "not enough values to unpack (expected " + std::to_string(s.targets.size()) + ", got " +
                    std::to_string(items.size()) + ")"
              : "too many values to unpack (expected " + std::to_string(s.targets.size()) + ")");
  for (size_t k = 0; k < items.size(); ++k) f->set(s.targets[k], std::move(items[k]));
}

Flow Interp::exec_for(const Stmt& s, const FrameP& f, std::string& out) {
  std::vector<Value> all = iterate(eval(*s.expr, f));
  std::vector<Value> items;
  if (s.cond) {
    for (auto& v : all) {
      step();
      auto probe = std::make_shared<Frame>(Frame{{}, f});
      assign(s, probe, v);
      if (truthy(eval(*s.cond, probe))) items.push_back(std::move(v));
    }
  } else {
    items = std::move(all);
  }
  if (items.empty()) {
    exec(s.else_body, f, out);
    return Flow::Normal;
  }
  const int64_t n = static_cast<int64_t>(items.size());
  auto shared = std::make_shared<ListObj>(ListObj{std::move(items), 1});
  for (int64_t k = 0; k < n; ++k) {
    step();
    auto inner = std::make_shared<Frame>(Frame{{}, f});
    Value loop;
    loop.kind = Kind::Loop;
    loop.i = k;
    loop.list = shared;
    inner->set("loop", std::move(loop));
    assign(s, inner, shared->items[k]);
    if (exec(s.body, inner, out) == Flow::Break) break;
  }
  return Flow::Normal;
}

Value Interp::make_macro(const Stmt& s, const FrameP& f, const Body& body, const std::vector<Param>& params,
                         std::string name) {
  const Body* b = &body;
  const std::vector<Param>* ps = &params;
  closures_.push_back(f);
  return Value::func("<Macro '" + name + "'>", [this, b, ps, f, name, uses_varargs = s.uses_varargs,
                                                uses_kwargs = s.uses_kwargs](Interp&, CallArgs& args) {
    if (call_depth_ >= limits_.max_depth)
      raise("macro calls nest deeper than " + std::to_string(limits_.max_depth) + " levels");
    auto inner = std::make_shared<Frame>(Frame{{}, f});
    size_t np = ps->size();
    std::vector<Value> varargs;
    for (size_t k = 0; k < args.pos.size(); ++k) {
      if (k < np)
        inner->set((*ps)[k].name, std::move(args.pos[k]));
      else
        varargs.push_back(std::move(args.pos[k]));
    }
    std::vector<std::pair<Value, Value>> kwargs;
    for (auto& [key, v] : args.kw) {
      bool param = false;
      for (size_t k = 0; k < np; ++k)
        if ((*ps)[k].name == key) {
          if (k < args.pos.size())
            raise("macro '" + name + "' got multiple values for argument '" + key + "'");
          param = true;
        }
      if (param || key == "caller")
        inner->set(key, std::move(v));
      else
        kwargs.emplace_back(Value::string(key), std::move(v));
    }
    for (size_t k = args.pos.size(); k < np; ++k) {
      auto& p = (*ps)[k];
      bool given = false;
      for (auto& kv : inner->vars) given = given || kv.first == p.name;
      if (!given)
        inner->set(p.name, p.def ? eval(*p.def, inner)
                                 : Value::undefined("parameter '" + p.name + "' was not provided"));
    }
    if (!varargs.empty() && !uses_varargs)
      raise("macro '" + name + "' takes not more than " + std::to_string(np) + " argument(s)");
    if (!kwargs.empty() && !uses_kwargs)
      raise("macro '" + name + "' takes no keyword argument '" + *kwargs[0].first.s + "'");
    inner->set("varargs", Value::tuple(std::move(varargs)));
    inner->set("kwargs", Value::make_dict(std::move(kwargs)));
    std::string out;
    ++call_depth_;
    try {
      exec(*b, inner, out);
    } catch (...) {
      --call_depth_;
      throw;
    }
    --call_depth_;
    return Value::string(std::move(out));
  });
}

// ---- expressions ----

Value Interp::eval(const Expr& e, const FrameP& f) {
  try {
    step();
    return eval_inner(e, f);
  } catch (RenderError& err) {
    if (!err.line) err.line = e.line;
    throw;
  }
}

CallArgs Interp::eval_args(const Expr& e, const FrameP& f) {
  CallArgs a;
  a.pos.reserve(e.args.size());
  for (auto& x : e.args) a.pos.push_back(eval(*x, f));
  for (auto& [k, x] : e.kwargs) a.kw.emplace_back(k, eval(*x, f));
  return a;
}

static int64_t slice_index(const Value& v) {
  if (v.is_integral()) return v.i;
  raise("slice indices must be integers or None");
}

static Value do_slice(const Value& obj, const std::optional<Value>& start, const std::optional<Value>& stop,
                      const std::optional<Value>& step) {
  int64_t st = step ? slice_index(*step) : 1;
  if (st == 0) raise("slice step cannot be zero");
  std::vector<std::string_view> chars;
  int64_t n;
  if (obj.kind == Kind::String) {
    chars = utf8_chars(*obj.s);
    n = static_cast<int64_t>(chars.size());
  } else if (obj.is_seq()) {
    n = static_cast<int64_t>(obj.list->items.size());
  } else if (obj.is_undefined()) {
    raise(undefined_message(obj));
  } else {
    raise("'" + type_name(obj) + "' object is not subscriptable");
  }
  auto adjust = [&](const std::optional<Value>& v, int64_t def) {
    if (!v) return def;
    int64_t x = slice_index(*v);
    if (x < 0) {
      x += n;
      if (x < 0) x = st < 0 ? -1 : 0;
    } else if (x >= n) {
      x = st < 0 ? n - 1 : n;
    }
    return x;
  };
  int64_t a = adjust(start, st < 0 ? n - 1 : 0), b = adjust(stop, st < 0 ? -1 : n);
  std::string s;
  std::vector<Value> items;
  for (int64_t k = a; st > 0 ? k < b : k > b; k += st) {
    if (obj.kind == Kind::String)
      s.append(chars[k]);
    else
      items.push_back(obj.list->items[k]);
  }
  if (obj.kind == Kind::String) return Value::string(std::move(s));
  return Value::make_list(std::move(items), obj.kind);
}

Value Interp::eval_inner(const Expr& e, const FrameP& f) {
  switch (e.kind) {
    case EK::Const:
      return e.value;
    case EK::Name: {
      const Value* v = f->find(e.name);
      if (v) return *v;
      return Value::undefined("'" + e.name + "' is undefined");
    }
    case EK::List:
    case EK::Tuple: {
      std::vector<Value> items;
      items.reserve(e.args.size());
      for (auto& x : e.args) items.push_back(eval(*x, f));
      return Value::make_list(std::move(items), e.kind == EK::List ? Kind::List : Kind::Tuple);
    }
    case EK::Dict: {
      auto d = Value::make_dict({});
      for (size_t k = 0; k + 1 < e.args.size(); k += 2) {
        Value key = eval(*e.args[k], f);
        if (key.is_seq() && key.kind == Kind::List) raise("unhashable type: 'list'");
        if (key.kind == Kind::Dict) raise("unhashable type: 'dict'");
        d.dict->set(std::move(key), eval(*e.args[k + 1], f));
      }
      return d;
    }
    case EK::Getattr:
      return getattr(eval(*e.a, f), e.name);
    case EK::Getitem: {
      Value obj = eval(*e.a, f);
      if (e.b->kind == EK::Slice) {
        auto opt = [&](const ExprP& x) -> std::optional<Value> {
          if (!x) return std::nullopt;
          Value v = eval(*x, f);
          if (v.is_none()) return std::nullopt;
          return v;
        };
        auto a = opt(e.b->a), b = opt(e.b->b), c = opt(e.b->c);
        return do_slice(obj, a, b, c);
      }
      return getitem(obj, eval(*e.b, f));
    }
    case EK::Slice:
      raise("a slice outside a subscript");
    case EK::Call: {
      Value fn = eval(*e.a, f);
      CallArgs args = eval_args(e, f);
      return call(fn, args);
    }
    case EK::Filter: {
      Value v = e.a ? eval(*e.a, f) : block_input_;
      CallArgs args = eval_args(e, f);
      if (!e.filter) raise("No filter named '" + e.name + "' found.");
      return e.filter(*this, v, args);
    }
    case EK::Test: {
      Value v = eval(*e.a, f);
      CallArgs args = eval_args(e, f);
      if (!e.test) raise("No test named '" + e.name + "' found.");
      return Value::boolean(e.test(*this, v, args));
    }
    case EK::Not:
      return Value::boolean(!truthy(eval(*e.a, f)));
    case EK::Neg:
    case EK::Pos: {
      Value v = eval(*e.a, f);
      if (v.is_undefined()) raise(undefined_message(v));
      if (!v.is_number())
        raise("bad operand type for unary " + std::string(e.kind == EK::Neg ? "-" : "+") + ": '" +
              type_name(v) + "'");
      if (e.kind == EK::Pos) return v.kind == Kind::Bool ? Value::integer(v.i) : v;
      if (v.kind == Kind::Float) return Value::number(-v.f);
      return Value::integer(-v.i);
    }
    case EK::Binary:
      return binary(e.name, eval(*e.a, f), eval(*e.b, f));
    case EK::And: {
      Value a = eval(*e.a, f);
      return truthy(a) ? eval(*e.b, f) : a;
    }
    case EK::Or: {
      Value a = eval(*e.a, f);
      return truthy(a) ? a : eval(*e.b, f);
    }
    case EK::Compare: {
      Value left = eval(*e.a, f);
      for (size_t k = 0; k < e.ops.size(); ++k) {
        Value right = eval(*e.args[k], f);
        if (!compare_op(e.ops[k], left, right)) return Value::boolean(false);
        left = std::move(right);
      }
      return Value::boolean(true);
    }
    case EK::Cond:
      if (truthy(eval(*e.a, f))) return eval(*e.b, f);
      if (e.c) return eval(*e.c, f);
      return Value::undefined("the inline if-expression on line " + std::to_string(e.line) +
                              " evaluated to false and no else section was defined.");
  }
  return Value::undefined();
}

bool Interp::compare_op(const std::string& op, const Value& a, const Value& b) {
  if (op == "==") return equals(a, b);
  if (op == "!=") return !equals(a, b);
  if (op == "in") return contains(b, a);
  if (op == "notin") return !contains(b, a);
  int c = compare(a, b, op.c_str());
  if (op == "<") return c < 0;
  if (op == ">") return c > 0;
  if (op == "<=") return c <= 0;
  return c >= 0;
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind) {
    case Kind::Undefined:
      return false;
    case Kind::String:
      if (item.kind != Kind::String)
        raise("'in <string>' requires string as left operand, not " + type_name(item));
      return container.s->find(*item.s) != std::string::npos;
    case Kind::List:
    case Kind::Tuple:
      for (auto& x : container.list->items)
        if (equals(x, item)) return true;
      return false;
    case Kind::Dict:
      return container.dict->find(item) != nullptr;
    default:
      raise("argument of type '" + type_name(container) + "' is not iterable");
  }
}

static int64_t add_checked(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) raise("integer overflow");
  return r;
}
static int64_t sub_checked(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_sub_overflow(a, b, &r)) raise("integer overflow");
  return r;
}
static int64_t mul_checked(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) raise("integer overflow");
  return r;
}

Value Interp::binary(const std::string& op, const Value& a, const Value& b) {
  if (op == "~") {
    std::string s = str_of(a);
    std::string t = str_of(b);
    check_size(s.size() + t.size());
    return Value::string(s + t);
  }
  if (a.is_undefined()) raise(undefined_message(a));
  if (b.is_undefined()) raise(undefined_message(b));
  auto unsupported = [&]() -> Value {
    raise("unsupported operand type(s) for " + op + ": '" + type_name(a) + "' and '" + type_name(b) + "'");
  };
  char c = op[0];
  if (a.is_number() && b.is_number()) {
    bool fl = a.kind == Kind::Float || b.kind == Kind::Float;
    double x = a.as_double(), y = b.as_double();
    if (op == "+") return fl ? Value::number(x + y) : Value::integer(add_checked(a.i, b.i));
    if (op == "-") return fl ? Value::number(x - y) : Value::integer(sub_checked(a.i, b.i));
    if (op == "*") return fl ? Value::number(x * y) : Value::integer(mul_checked(a.i, b.i));
    if (op == "/") {
      if (y == 0) raise("division by zero");
      return Value::number(x / y);
    }
    if (op == "//" || op == "%") {
      if (y == 0) raise(fl ? "float modulo" : "integer division or modulo by zero");
      if (fl) {
        double mod = std::fmod(x, y), div = (x - mod) / y;
        if (mod != 0) {
          if ((y < 0) != (mod < 0)) {
            mod += y;
            div -= 1.0;
          }
        } else {
          mod = std::copysign(0.0, y);
        }
        if (op == "%") return Value::number(mod);
        double fd = std::copysign(0.0, x / y);
        if (div != 0) {
          fd = std::floor(div);
          if (div - fd > 0.5) fd += 1.0;
        }
        return Value::number(fd);
      }
      if (a.i == INT64_MIN && b.i == -1) raise("integer overflow");
      int64_t q = a.i / b.i, m = a.i % b.i;
      if (m != 0 && ((m < 0) != (b.i < 0))) {
        --q;
        m += b.i;
      }
      return Value::integer(op == "//" ? q : m);
    }
    if (op == "**") {
      if (!fl && b.i >= 0) {
        int64_t base = a.i, result = 1, e = b.i;
        while (e > 0) {
          if (e & 1) result = mul_checked(result, base);
          e >>= 1;
          if (e) base = mul_checked(base, base);
        }
        return Value::integer(result);
      }
      if (x == 0 && y < 0) raise("0.0 cannot be raised to a negative power");
      return Value::number(std::pow(x, y));
    }
    return unsupported();
  }
  if (c == '+' && a.kind == Kind::String && b.kind == Kind::String) {
    check_size(a.s->size() + b.s->size());
    return Value::string(*a.s + *b.s);
  }
  if (c == '+' && a.is_seq() && a.kind == b.kind) {
    std::vector<Value> items = a.list->items;
    items.insert(items.end(), b.list->items.begin(), b.list->items.end());
    return Value::make_list(std::move(items), a.kind);
  }
  if (op == "*" && (a.is_integral() || b.is_integral()) &&
      (a.kind == Kind::String || a.is_seq() || b.kind == Kind::String || b.is_seq())) {
    const Value& seq = a.is_integral() ? b : a;
    int64_t n = std::max<int64_t>(0, a.is_integral() ? a.i : b.i);
    if (seq.kind == Kind::String) {
      check_size(static_cast<size_t>(n) * seq.s->size());
      std::string s;
      for (int64_t k = 0; k < n; ++k) s += *seq.s;
      return Value::string(std::move(s));
    }
    check_size(static_cast<size_t>(n) * seq.list->items.size());
    std::vector<Value> items;
    for (int64_t k = 0; k < n; ++k) {
      step();
      items.insert(items.end(), seq.list->items.begin(), seq.list->items.end());
    }
    return Value::make_list(std::move(items), seq.kind);
  }
  if (op == "%" && a.kind == Kind::String) return Value::string(percent_format(*a.s, b));
  if (c == '+' && (a.kind == Kind::String || a.kind == Kind::List))
    raise("can only concatenate " + type_name(a) + " (not \"" + type_name(b) + "\") to " + type_name(a));
  return unsupported();
}

// ---- calls, attributes, items ----

Value Interp::call(const Value& fn, CallArgs& args) {
  if (fn.kind == Kind::Func) return fn.fn->fn(*this, args);
  if (fn.is_undefined()) raise(undefined_message(fn));
  raise("'" + type_name(fn) + "' object is not callable");
}

static std::string object_desc(const Value& obj) {
  return obj.is_none() ? "None" : type_name(obj) + " object";
}

static Value no_attribute(const Value& obj, const std::string& name) {
  return Value::undefined("'" + object_desc(obj) + "' has no attribute '" + name + "'");
}

Value Interp::getattr(const Value& obj, const std::string& name) {
  switch (obj.kind) {
    case Kind::Undefined:
      raise(undefined_message(obj));
    case Kind::String: {
      Value m = str_method(obj, name);
      return m.is_undefined() && !m.s ? no_attribute(obj, name) : m;
    }
    case Kind::Dict: {
      Value m = dict_method(obj, name);
      if (!m.is_undefined() || m.s) return m;
      if (const Value* v = obj.dict->find(name)) return *v;
      return no_attribute(obj, name);
    }
    case Kind::List:
    case Kind::Tuple: {
      Value m = list_method(obj, name);
      return m.is_undefined() && !m.s ? no_attribute(obj, name) : m;
    }
    case Kind::Namespace:
      if (const Value* v = obj.dict->find(name)) return *v;
      return no_attribute(obj, name);
    case Kind::Loop: {
      int64_t k = obj.i, n = static_cast<int64_t>(obj.list->items.size());
      if (name == "cycle") {
        return Value::func("<bound method LoopContext.cycle>", [k](Interp&, CallArgs& a) {
          if (a.pos.empty()) raise("no items for cycling given");
          return a.pos[static_cast<size_t>(k) % a.pos.size()];
        });
      }
      if (name == "index") return Value::integer(k + 1);
      if (name == "index0") return Value::integer(k);
      if (name == "revindex") return Value::integer(n - k);
      if (name == "revindex0") return Value::integer(n - k - 1);
      if (name == "first") return Value::boolean(k == 0);
      if (name == "last") return Value::boolean(k == n - 1);
      if (name == "length") return Value::integer(n);
      if (name == "depth") return Value::integer(1);
      if (name == "depth0") return Value::integer(0);
      if (name == "previtem")
        return k > 0 ? obj.list->items[k - 1] : Value::undefined("there is no previous item");
      if (name == "nextitem")
        return k + 1 < n ? obj.list->items[k + 1] : Value::undefined("there is no next item");
      return no_attribute(obj, name);
    }
    default:
      return no_attribute(obj, name);
  }
}

Value Interp::getitem(const Value& obj, const Value& key) {
  switch (obj.kind) {
    case Kind::Undefined:
      raise(undefined_message(obj));
    case Kind::Dict:
      if (const Value* v = obj.dict->find(key)) return *v;
      break;
    case Kind::List:
    case Kind::Tuple:
    case Kind::String:
      if (key.is_integral()) {
        int64_t n = obj.kind == Kind::String ? length(obj) : static_cast<int64_t>(obj.list->items.size());
        int64_t k = key.i < 0 ? key.i + n : key.i;
        if (k < 0 || k >= n)
          return Value::undefined(type_name(obj) + " object has no element " + std::to_string(key.i));
        if (obj.kind != Kind::String) return obj.list->items[k];
        return Value::string(std::string(utf8_chars(*obj.s)[k]));
      }
      break;
    default:
      break;
  }
  if (key.kind == Kind::String) return getattr(obj, *key.s);
  if (obj.is_none()) return Value::undefined("None has no element " + repr(key));
  return Value::undefined(type_name(obj) + " object has no element " + repr(key));
}

Value Interp::attr_path(const Value& v, const std::string& path) {
  Value cur = v;
  size_t start = 0;
  while (true) {
    size_t dot = path.find('.', start);
    std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    bool digits =
        !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    cur = digits ? getitem(cur, Value::integer(std::stoll(part))) : getitem(cur, Value::string(part));
    if (dot == std::string::npos) return cur;
    start = dot + 1;
  }
}

std::string str_of(const Value& v) {
  return to_str(v);
}

}  // namespace tessera::jinja
