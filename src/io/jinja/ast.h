// The parsed template: expression and statement nodes, and the lexer's tokens.
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "io/jinja/value.h"

namespace tessera::jinja {

// ---- tokens ----
enum class Tok : uint8_t { Data, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, Eof };
struct Token {
  Tok type;
  std::string text;  // Data: the text; Name; String: the decoded value; Op: the operator; numbers: the digits
  int line;
};
// Splits `source` into tokens (trim_blocks, lstrip_blocks, keep_trailing_newline=False). Throws
// RenderError with the line set.
std::vector<Token> tokenize(std::string_view source);

// ---- expressions ----
struct Expr;
using ExprP = std::unique_ptr<Expr>;
using FilterFn = Value (*)(Interp&, Value&, CallArgs&);
using TestFn = bool (*)(Interp&, const Value&, CallArgs&);

enum class EK : uint8_t {
  Const,
  Name,
  List,
  Tuple,
  Dict,
  Getattr,
  Getitem,
  Slice,
  Call,
  Filter,
  Test,
  Not,
  Neg,
  Pos,
  Binary,
  And,
  Or,
  Compare,
  Cond
};
struct Expr {
  EK kind;
  int line = 0;
  std::string name;                                   // Name, Getattr, Filter, Test; Binary: the operator
  Value value;                                        // Const
  ExprP a, b, c;                                      // operands (Filter: a may be null in a filter block)
  std::vector<ExprP> args;                            // items, call args; Compare: the right operands
  std::vector<std::pair<std::string, ExprP>> kwargs;  // keyword args
  std::vector<std::string> ops;                       // Compare operators
  FilterFn filter = nullptr;
  TestFn test = nullptr;
};

// ---- statements ----
struct Stmt;
using StmtP = std::unique_ptr<Stmt>;
using Body = std::vector<StmtP>;

enum class SK : uint8_t {
  Output,
  Print,
  If,
  For,
  Set,
  SetBlock,
  Macro,
  CallBlock,
  FilterBlock,
  With,
  Break,
  Continue,
  Block
};
struct Param {
  std::string name;
  ExprP def;  // null: required
};
struct Stmt {
  SK kind;
  int line = 0;
  std::string text;                  // Output; Macro: name; Set with ns: the attribute
  ExprP expr;                        // Print, Set, For (iterable), CallBlock (the call), SetBlock (filter)
  ExprP cond;                        // For: the `if` filter
  std::vector<std::string> targets;  // For, Set, SetBlock: the names assigned
  bool tuple_target = false;         // for a, b in ... / set a, b = ...
  bool recursive = false;            // for ... recursive
  bool uses_varargs = false;  // Macro: the body reads varargs / kwargs (else extra arguments are errors)
  bool uses_kwargs = false;
  std::vector<std::pair<ExprP, Body>> branches;  // If: (condition, body)
  Body body, else_body;
  std::vector<Param> params;   // Macro, CallBlock; With: the assignments (name = expr)
  std::vector<ExprP> filters;  // FilterBlock: the filter chain (Filter nodes with no input)
};

struct Program {
  Body body;
};
// Parses a template. Throws RenderError with the line set.
Program parse(std::string_view source);

FilterFn find_filter(std::string_view name);
TestFn find_test(std::string_view name);

}  // namespace tessera::jinja
