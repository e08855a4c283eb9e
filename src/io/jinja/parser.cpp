// The parser: jinja2's grammar (jinja2/parser.py), to the nodes of ast.h.
#include <cstdlib>
#include <initializer_list>

#include "io/jinja/ast.h"

namespace tessera::jinja {
namespace {

constexpr int kMaxParseDepth = 600;  // guard increments (about 3 per parenthesis level)

bool body_uses(const Body& body, const std::string& name);

class Parser {
 public:
  explicit Parser(std::vector<Token> toks) : t_(std::move(toks)) {}

  Program run() {
    Program p;
    p.body = subparse({});
    if (cur().type != Tok::Eof) fail_unexpected_tag();
    return p;
  }

 private:
  std::vector<Token> t_;
  size_t i_ = 0;
  int depth_ = 0;
  int loops_ = 0;                  // enclosing for loops (for break / continue)
  std::vector<std::string> open_;  // the open block tags, innermost last

  struct Guard {
    Parser& p;
    explicit Guard(Parser& parser) : p(parser) {
      if (++p.depth_ > kMaxParseDepth) p.fail("the template nests too deeply");
    }
    ~Guard() { --p.depth_; }
  };

  const Token& cur() const { return t_[i_]; }
  const Token& look() const { return t_[i_ + 1 < t_.size() ? i_ + 1 : i_]; }
  const Token& next() { return t_[i_ < t_.size() - 1 ? i_++ : i_]; }
  [[noreturn]] void fail(std::string msg) const { throw RenderError{std::move(msg), cur().line}; }
  bool is_op(const char* op) const { return cur().type == Tok::Op && cur().text == op; }
  bool is_name(const char* n) const { return cur().type == Tok::Name && cur().text == n; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(const char* n) {
    if (!is_name(n)) return false;
    next();
    return true;
  }
  static std::string describe(const Token& t) {
    switch (t.type) {
      case Tok::Data:
        return "template data";
      case Tok::VarBegin:
        return "begin of print statement";
      case Tok::VarEnd:
        return "end of print statement";
      case Tok::BlockBegin:
        return "begin of statement block";
      case Tok::BlockEnd:
        return "end of statement block";
      case Tok::Eof:
        return "end of template";
      case Tok::String:
        return "string";
      default:
        return t.text;
    }
  }
  [[noreturn]] void fail_expected(const char* what) const {
    fail(std::string("expected '") + what + "', got '" + describe(cur()) + "'");
  }
  void expect_op(const char* op) {
    if (!skip_op(op)) fail_expected(op);
  }
  std::string expect_name() {
    if (cur().type != Tok::Name) fail("expected a name, got '" + describe(cur()) + "'");
    return next().text;
  }
  void expect_block_end() {
    if (cur().type != Tok::BlockEnd) fail("expected end of statement block, got '" + describe(cur()) + "'");
    next();
  }
  ExprP node(EK kind, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }

  // ---- statements ----

  // Parses until a block tag named in `ends` (left at that name) or the end of the template.
  Body subparse(std::initializer_list<const char*> ends) {
    Guard g(*this);
    Body body;
    while (true) {
      const Token& tk = cur();
      if (tk.type == Tok::Eof) {
        if (ends.size()) fail("unexpected end of template: '" + open_.back() + "' is not closed");
        return body;
      }
      if (tk.type == Tok::Data) {
        auto s = std::make_unique<Stmt>();
        s->kind = SK::Output;
        s->line = tk.line;
        s->text = tk.text;
        body.push_back(std::move(s));
        next();
      } else if (tk.type == Tok::VarBegin) {
        next();
        auto s = std::make_unique<Stmt>();
        s->kind = SK::Print;
        s->line = cur().line;
        s->expr = parse_tuple(true, false);
        if (cur().type != Tok::VarEnd) fail("expected end of print statement, got '" + describe(cur()) + "'");
        next();
        body.push_back(std::move(s));
      } else if (tk.type == Tok::BlockBegin) {
        next();
        if (cur().type != Tok::Name) fail("tag name expected");
        for (const char* e : ends)
          if (cur().text == e) return body;
        body.push_back(parse_statement());
      } else {
        fail("unexpected '" + describe(tk) + "'");
      }
    }
  }

  [[noreturn]] void fail_unexpected_tag() {
    const std::string& name = cur().text;
    bool closing = name.rfind("end", 0) == 0 || name == "else" || name == "elif";
    if (!closing) fail("unknown tag '" + name + "'");
    if (open_.empty()) {
      std::string opener = name.rfind("end", 0) == 0 ? name.substr(3) : "if' or 'for";
      fail("unexpected '" + name + "' (no open '" + opener + "')");
    }
    fail("unexpected '" + name + "' (the innermost open block is '" + open_.back() + "')");
  }

  StmtP make(SK kind, int line) {
    auto s = std::make_unique<Stmt>();
    s->kind = kind;
    s->line = line;
    return s;
  }

  // After a subparse stopped at `name`: consumes "name %}".
  void end_tag() {
    next();
    expect_block_end();
  }

  StmtP parse_statement() {
    const Token& tk = cur();
    std::string tag = tk.text;
    int line = tk.line;
    static const char* const known[] = {"if",   "for",   "set",      "macro",      "call",  "filter",
                                        "with", "break", "continue", "generation", "block", "print"};
    bool is_known = false;
    for (const char* k : known) is_known = is_known || tag == k;
    if (!is_known) fail_unexpected_tag();
    next();
    open_.push_back(tag);
    StmtP s;
    if (tag == "if") {
      s = make(SK::If, line);
      while (true) {
        ExprP cond = parse_tuple(false, false);
        expect_block_end();
        Body b = subparse({"elif", "else", "endif"});
        s->branches.emplace_back(std::move(cond), std::move(b));
        if (cur().text == "elif") {
          next();
          continue;
        }
        if (cur().text == "else") {
          end_tag();
          s->else_body = subparse({"endif"});
        }
        end_tag();
        break;
      }
    } else if (tag == "for") {
      s = make(SK::For, line);
      parse_targets(*s, "in");
      if (!skip_name("in")) fail_expected("in");
      s->expr = parse_tuple(false, false, "recursive");
      if (skip_name("if")) s->cond = parse_expression(true);
      s->recursive = skip_name("recursive");
      expect_block_end();
      ++loops_;
      s->body = subparse({"endfor", "else"});
      --loops_;
      if (cur().text == "else") {
        end_tag();
        s->else_body = subparse({"endfor"});
      }
      end_tag();
    } else if (tag == "set") {
      if (cur().type == Tok::Name && look().type == Tok::Op && look().text == ".") {
        s = make(SK::Set, line);
        s->targets.push_back(next().text);
        next();
        s->text = expect_name();
        expect_op("=");
        s->expr = parse_tuple(true, false);
        expect_block_end();
      } else {
        auto target = std::make_unique<Stmt>();
        parse_targets(*target, "=");
        if (skip_op("=")) {
          s = std::move(target);
          s->kind = SK::Set;
          s->line = line;
          s->expr = parse_tuple(true, false);
          expect_block_end();
        } else {
          s = std::move(target);
          s->kind = SK::SetBlock;
          s->line = line;
          if (s->tuple_target) fail("a block set assigns one name");
          if (is_op("|")) s->expr = parse_filter(nullptr, false);
          expect_block_end();
          s->body = subparse({"endset"});
          end_tag();
        }
      }
    } else if (tag == "macro") {
      s = make(SK::Macro, line);
      s->text = expect_name();
      parse_params(*s);
      expect_block_end();
      int saved = loops_;
      loops_ = 0;
      s->body = subparse({"endmacro"});
      loops_ = saved;
      s->uses_varargs = body_uses(s->body, "varargs");
      s->uses_kwargs = body_uses(s->body, "kwargs");
      end_tag();
    } else if (tag == "call") {
      s = make(SK::CallBlock, line);
      if (is_op("(")) parse_params(*s);
      s->expr = parse_expression(true);
      if (s->expr->kind != EK::Call) fail("expected call");
      expect_block_end();
      int saved = loops_;
      loops_ = 0;
      s->body = subparse({"endcall"});
      loops_ = saved;
      s->uses_varargs = s->uses_kwargs = true;
      end_tag();
    } else if (tag == "filter") {
      s = make(SK::FilterBlock, line);
      s->expr = parse_filter(nullptr, true);
      expect_block_end();
      s->body = subparse({"endfilter"});
      end_tag();
    } else if (tag == "with") {
      s = make(SK::With, line);
      while (cur().type != Tok::BlockEnd) {
        if (!s->params.empty()) expect_op(",");
        Param p;
        p.name = expect_name();
        expect_op("=");
        p.def = parse_expression(true);
        s->params.push_back(std::move(p));
      }
      expect_block_end();
      s->body = subparse({"endwith"});
      end_tag();
    } else if (tag == "break" || tag == "continue") {
      if (loops_ == 0) fail("'" + tag + "' outside a loop");
      s = make(tag == "break" ? SK::Break : SK::Continue, line);
      expect_block_end();
    } else if (tag == "generation" || tag == "block") {
      s = make(SK::Block, line);
      if (tag == "block") expect_name();
      expect_block_end();
      s->body = subparse({tag == "block" ? "endblock" : "endgeneration"});
      next();
      if (tag == "block" && cur().type == Tok::Name) next();
      expect_block_end();
    } else {  // print
      s = make(SK::Print, line);
      s->expr = parse_tuple(true, false);
      expect_block_end();
    }
    open_.pop_back();
    return s;
  }

  // Assignment targets: one name or names separated by commas (optionally in parentheses).
  void parse_targets(Stmt& s, const char* end) {
    bool paren = skip_op("(");
    while (true) {
      s.targets.push_back(expect_name());
      if (!skip_op(",")) break;
      s.tuple_target = true;
      if ((cur().type == Tok::Name && cur().text == end) || is_op(end) || is_op(")")) break;
    }
    if (paren) {
      expect_op(")");
      s.tuple_target = true;
    }
  }

  void parse_params(Stmt& s) {
    expect_op("(");
    while (!is_op(")")) {
      if (!s.params.empty()) expect_op(",");
      Param p;
      p.name = expect_name();
      if (skip_op("=")) {
        p.def = parse_expression(true);
      } else if (!s.params.empty() && s.params.back().def) {
        fail("non-default argument follows default argument");
      }
      s.params.push_back(std::move(p));
    }
    next();
  }

  // ---- expressions ----

  bool is_tuple_end(const char* extra) const {
    if (cur().type == Tok::VarEnd || cur().type == Tok::BlockEnd || cur().type == Tok::Eof || is_op(")"))
      return true;
    return extra && cur().type == Tok::Name && cur().text == extra;
  }

  ExprP parse_tuple(bool with_condexpr, bool explicit_parens, const char* extra_end = nullptr) {
    int line = cur().line;
    std::vector<ExprP> args;
    bool is_tuple = false;
    while (true) {
      if (!args.empty()) expect_op(",");
      if (is_tuple_end(extra_end)) break;
      args.push_back(parse_expression(with_condexpr));
      if (is_op(","))
        is_tuple = true;
      else
        break;
    }
    if (!is_tuple) {
      if (!args.empty()) return std::move(args[0]);
      if (!explicit_parens) fail("expected an expression, got '" + describe(cur()) + "'");
    }
    auto e = node(EK::Tuple, line);
    e->args = std::move(args);
    return e;
  }

  ExprP parse_expression(bool with_condexpr) {
    Guard g(*this);
    if (!with_condexpr) return parse_or();
    int line = cur().line;
    ExprP expr1 = parse_or();
    while (skip_name("if")) {
      ExprP expr2 = parse_or();
      ExprP expr3;
      if (skip_name("else")) expr3 = parse_expression(true);
      auto e = node(EK::Cond, line);
      e->a = std::move(expr2);
      e->b = std::move(expr1);
      e->c = std::move(expr3);
      expr1 = std::move(e);
      line = cur().line;
    }
    return expr1;
  }

  ExprP binary(EK kind, ExprP l, ExprP r, int line, std::string op = {}) {
    auto e = node(kind, line);
    e->a = std::move(l);
    e->b = std::move(r);
    e->name = std::move(op);
    return e;
  }

  ExprP parse_or() {
    int line = cur().line;
    ExprP l = parse_and();
    while (skip_name("or")) l = binary(EK::Or, std::move(l), parse_and(), line);
    return l;
  }
  ExprP parse_and() {
    int line = cur().line;
    ExprP l = parse_not();
    while (skip_name("and")) l = binary(EK::And, std::move(l), parse_not(), line);
    return l;
  }
  ExprP parse_not() {
    Guard g(*this);
    if (is_name("not")) {
      int line = next().line;
      auto e = node(EK::Not, line);
      e->a = parse_not();
      return e;
    }
    return parse_compare();
  }
  ExprP parse_compare() {
    int line = cur().line;
    ExprP expr = parse_math1();
    ExprP cmp;
    while (true) {
      std::string op;
      if (cur().type == Tok::Op && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                    cur().text == ">" || cur().text == "<=" || cur().text == ">=")) {
        op = next().text;
      } else if (skip_name("in")) {
        op = "in";
      } else if (is_name("not") && look().type == Tok::Name && look().text == "in") {
        next();
        next();
        op = "notin";
      } else {
        break;
      }
      if (!cmp) {
        cmp = node(EK::Compare, line);
        cmp->a = std::move(expr);
      }
      cmp->ops.push_back(op);
      cmp->args.push_back(parse_math1());
    }
    return cmp ? std::move(cmp) : std::move(expr);
  }
  ExprP parse_math1() {
    int line = cur().line;
    ExprP l = parse_concat();
    while (is_op("+") || is_op("-")) {
      std::string op = next().text;
      l = binary(EK::Binary, std::move(l), parse_concat(), line, op);
    }
    return l;
  }
  ExprP parse_concat() {
    int line = cur().line;
    ExprP l = parse_math2();
    while (skip_op("~")) l = binary(EK::Binary, std::move(l), parse_math2(), line, "~");
    return l;
  }
  ExprP parse_math2() {
    int line = cur().line;
    ExprP l = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      std::string op = next().text;
      l = binary(EK::Binary, std::move(l), parse_pow(), line, op);
    }
    return l;
  }
  ExprP parse_pow() {
    int line = cur().line;
    ExprP l = parse_unary(true);
    while (skip_op("**")) l = binary(EK::Binary, std::move(l), parse_unary(true), line, "**");
    return l;
  }
  ExprP parse_unary(bool with_filter) {
    Guard g(*this);
    int line = cur().line;
    ExprP n;
    if (is_op("-") || is_op("+")) {
      bool neg = next().text == "-";
      n = node(neg ? EK::Neg : EK::Pos, line);
      n->a = parse_unary(false);
    } else {
      n = parse_primary();
    }
    n = parse_postfix(std::move(n));
    if (with_filter) n = parse_filter_expr(std::move(n));
    return n;
  }

  ExprP parse_primary() {
    const Token& tk = cur();
    int line = tk.line;
    if (tk.type == Tok::Name) {
      next();
      if (tk.text == "true" || tk.text == "True" || tk.text == "false" || tk.text == "False") {
        auto e = node(EK::Const, line);
        e->value = Value::boolean(tk.text[0] == 't' || tk.text[0] == 'T');
        return e;
      }
      if (tk.text == "none" || tk.text == "None") {
        auto e = node(EK::Const, line);
        e->value = Value::none();
        return e;
      }
      auto e = node(EK::Name, line);
      e->name = tk.text;
      return e;
    }
    if (tk.type == Tok::String) {
      std::string s;
      while (cur().type == Tok::String) s += next().text;
      auto e = node(EK::Const, line);
      e->value = Value::string(std::move(s));
      return e;
    }
    if (tk.type == Tok::Int || tk.type == Tok::Float) {
      next();
      auto e = node(EK::Const, line);
      if (tk.type == Tok::Float) {
        e->value = Value::number(std::strtod(tk.text.c_str(), nullptr));
      } else {
        errno = 0;
        long long v = std::strtoll(tk.text.c_str(), nullptr, 10);
        if (errno == ERANGE) fail("integer literal out of range: " + tk.text);
        e->value = Value::integer(v);
      }
      return e;
    }
    if (skip_op("(")) {
      ExprP e = parse_tuple(true, true);
      expect_op(")");
      return e;
    }
    if (skip_op("[")) {
      auto e = node(EK::List, line);
      while (!is_op("]")) {
        if (!e->args.empty()) expect_op(",");
        if (is_op("]")) break;
        e->args.push_back(parse_expression(true));
      }
      next();
      return e;
    }
    if (skip_op("{")) {
      auto e = node(EK::Dict, line);
      while (!is_op("}")) {
        if (!e->args.empty()) expect_op(",");
        if (is_op("}")) break;
        e->args.push_back(parse_expression(true));
        expect_op(":");
        e->args.push_back(parse_expression(true));
      }
      next();
      return e;
    }
    fail("unexpected '" + describe(tk) + "'");
  }

  ExprP parse_postfix(ExprP n) {
    while (true) {
      if (is_op(".") || is_op("[")) {
        n = parse_subscript(std::move(n));
      } else if (is_op("(")) {
        n = parse_call(std::move(n));
      } else {
        return n;
      }
    }
  }

  ExprP parse_filter_expr(ExprP n) {
    while (true) {
      if (is_op("|")) {
        n = parse_filter(std::move(n), false);
      } else if (is_name("is")) {
        n = parse_test(std::move(n));
      } else if (is_op("(")) {
        n = parse_call(std::move(n));
      } else {
        return n;
      }
    }
  }

  ExprP parse_subscript(ExprP n) {
    const Token& tk = next();
    int line = tk.line;
    if (tk.text == ".") {
      const Token& attr = next();
      if (attr.type == Tok::Name) {
        auto e = node(EK::Getattr, line);
        e->a = std::move(n);
        e->name = attr.text;
        return e;
      }
      if (attr.type != Tok::Int) fail("expected name or number");
      auto e = node(EK::Getitem, line);
      e->a = std::move(n);
      e->b = node(EK::Const, line);
      e->b->value = Value::integer(std::strtoll(attr.text.c_str(), nullptr, 10));
      return e;
    }
    std::vector<ExprP> args;
    while (!is_op("]")) {
      if (!args.empty()) expect_op(",");
      args.push_back(parse_subscribed());
    }
    next();
    auto e = node(EK::Getitem, line);
    e->a = std::move(n);
    if (args.size() == 1) {
      e->b = std::move(args[0]);
    } else {
      e->b = node(EK::Tuple, line);
      e->b->args = std::move(args);
    }
    return e;
  }

  ExprP parse_subscribed() {
    int line = cur().line;
    auto sl = node(EK::Slice, line);
    if (!skip_op(":")) {
      ExprP e = parse_expression(true);
      if (!skip_op(":")) return e;
      sl->a = std::move(e);
    }
    if (!is_op(":") && !is_op("]") && !is_op(",")) sl->b = parse_expression(true);
    if (skip_op(":") && !is_op("]") && !is_op(",")) sl->c = parse_expression(true);
    return sl;
  }

  void parse_call_args(Expr& e) {
    expect_op("(");
    bool require_comma = false;
    while (!is_op(")")) {
      if (require_comma) {
        expect_op(",");
        if (is_op(")")) break;
      }
      if (is_op("*") || is_op("**")) fail("*args / **kwargs in calls are not supported");
      if (cur().type == Tok::Name && look().type == Tok::Op && look().text == "=") {
        std::string key = next().text;
        next();
        e.kwargs.emplace_back(key, parse_expression(true));
      } else {
        if (!e.kwargs.empty()) fail("invalid syntax for function call expression");
        e.args.push_back(parse_expression(true));
      }
      require_comma = true;
    }
    next();
  }

  ExprP parse_call(ExprP n) {
    auto e = node(EK::Call, cur().line);
    e->a = std::move(n);
    parse_call_args(*e);
    return e;
  }

  ExprP parse_filter(ExprP n, bool start_inline) {
    while (is_op("|") || start_inline) {
      if (!start_inline) next();
      start_inline = false;
      int line = cur().line;
      std::string name = expect_name();
      while (skip_op(".")) name += "." + expect_name();
      auto e = node(EK::Filter, line);
      e->filter = find_filter(name);  // unknown: an error at parse time or run time (check_names)
      e->name = name;
      e->a = std::move(n);
      if (is_op("(")) parse_call_args(*e);
      n = std::move(e);
    }
    return n;
  }

  ExprP parse_test(ExprP n) {
    int line = next().line;
    bool negated = skip_name("not");
    std::string name = expect_name();
    while (skip_op(".")) name += "." + expect_name();
    auto e = node(EK::Test, line);
    e->test = find_test(name);
    e->name = name;
    e->a = std::move(n);
    if (is_op("(")) {
      parse_call_args(*e);
    } else if ((cur().type == Tok::Name || cur().type == Tok::String || cur().type == Tok::Int ||
                cur().type == Tok::Float || is_op("[") || is_op("{")) &&
               !is_name("else") && !is_name("or") && !is_name("and")) {
      if (is_name("is")) fail("You cannot chain multiple tests with is");
      e->args.push_back(parse_postfix(parse_primary()));
    }
    if (!negated) return e;
    auto n2 = node(EK::Not, line);
    n2->a = std::move(e);
    return n2;
  }
};

bool expr_uses(const Expr* e, const std::string& name) {
  if (!e) return false;
  if (e->kind == EK::Name && e->name == name) return true;
  if (expr_uses(e->a.get(), name) || expr_uses(e->b.get(), name) || expr_uses(e->c.get(), name)) return true;
  for (auto& x : e->args)
    if (expr_uses(x.get(), name)) return true;
  for (auto& kv : e->kwargs)
    if (expr_uses(kv.second.get(), name)) return true;
  return false;
}

bool body_uses(const Body& body, const std::string& name) {
  for (auto& s : body) {
    if (expr_uses(s->expr.get(), name) || expr_uses(s->cond.get(), name)) return true;
    for (auto& [c, b] : s->branches)
      if (expr_uses(c.get(), name) || body_uses(b, name)) return true;
    for (auto& p : s->params)
      if (expr_uses(p.def.get(), name)) return true;
    if (body_uses(s->body, name) || body_uses(s->else_body, name)) return true;
  }
  return false;
}

// jinja2 rejects an unknown filter or test when it compiles the template, except inside an `if` (its test
// and bodies) or a conditional expression, where the error waits until the filter / test runs.
void check_expr(const Expr* e, bool soft) {
  if (!e) return;
  if (e->kind == EK::Cond) soft = true;
  if (!soft && e->kind == EK::Filter && !e->filter)
    throw RenderError{"No filter named '" + e->name + "'.", e->line};
  if (!soft && e->kind == EK::Test && !e->test)
    throw RenderError{"No test named '" + e->name + "'.", e->line};
  check_expr(e->a.get(), soft);
  check_expr(e->b.get(), soft);
  check_expr(e->c.get(), soft);
  for (auto& x : e->args) check_expr(x.get(), soft);
  for (auto& kv : e->kwargs) check_expr(kv.second.get(), soft);
}

void check_body(const Body& body, bool soft) {
  for (auto& s : body) {
    check_expr(s->expr.get(), soft && s->kind != SK::FilterBlock);
    switch (s->kind) {
      case SK::If:
        for (auto& [cond, b] : s->branches) {
          check_expr(cond.get(), true);
          check_body(b, true);
        }
        check_body(s->else_body, true);
        break;
      case SK::For:
        check_expr(s->cond.get(), false);
        check_body(s->body, false);
        check_body(s->else_body, false);
        break;
      case SK::SetBlock:
      case SK::Block:
        check_body(s->body, soft);
        break;
      default:
        for (auto& p : s->params) check_expr(p.def.get(), false);
        check_body(s->body, false);
    }
  }
}

}  // namespace

Program parse(std::string_view source) {
  Program p = Parser(tokenize(source)).run();
  check_body(p.body, false);
  return p;
}

}  // namespace tessera::jinja
