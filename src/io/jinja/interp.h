// The evaluator's state and the helpers its filters, tests and methods share.
#pragma once
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "io/jinja/ast.h"
#include "io/jinja/jinja.h"
#include "io/jinja/value.h"

namespace tessera::jinja {

struct Frame {
  std::vector<std::pair<std::string, Value>> vars;
  std::shared_ptr<Frame> parent;
  const Value* find(std::string_view name) const;
  void set(const std::string& name, Value v);
};
using FrameP = std::shared_ptr<Frame>;

enum class Flow : uint8_t { Normal, Break, Continue };

class Interp {
 public:
  Interp(const Limits& limits, FrameP globals) : limits_(limits), globals_(std::move(globals)) {}
  ~Interp();

  const Limits& limits() const { return limits_; }
  void step() {
    if (++steps_ > limits_.max_steps)
      raise("the template ran past " + std::to_string(limits_.max_steps) + " steps");
  }
  void check_size(size_t n) const {
    if (n > limits_.max_output)
      raise("the template built a string of more than " + std::to_string(limits_.max_output) + " bytes");
  }

  Flow exec(const Body& body, const FrameP& f, std::string& out);
  Value eval(const Expr& e, const FrameP& f);
  Value call(const Value& fn, CallArgs& args);
  Value getattr(const Value& obj, const std::string& name);
  Value getitem(const Value& obj, const Value& key);
  Value filter(std::string_view name, Value v, CallArgs args);  // a filter by name (map, select)
  bool test(std::string_view name, const Value& v, CallArgs args);
  // Python's sorted() key: case folded strings unless case_sensitive; attribute paths "a.b", "0".
  Value attr_path(const Value& v, const std::string& path);
  void track_namespace(const Value& ns) { namespaces_.push_back(ns.dict); }

 private:
  const Limits& limits_;
  FrameP globals_;
  uint64_t steps_ = 0;
  int call_depth_ = 0;
  Value block_input_;                                 // the rendered body a filter block filters
  std::vector<std::shared_ptr<DictObj>> namespaces_;  // emptied at the end: a namespace may hold itself
  std::vector<FrameP> closures_;                      // frames macros close over, emptied at the end

  Flow exec_stmt(const Stmt& s, const FrameP& f, std::string& out);
  Flow exec_for(const Stmt& s, const FrameP& f, std::string& out);
  void assign(const Stmt& s, const FrameP& f, Value v);
  Value make_macro(const Stmt& s, const FrameP& f, const Body& body, const std::vector<Param>& params,
                   std::string name);
  Value eval_inner(const Expr& e, const FrameP& f);
  CallArgs eval_args(const Expr& e, const FrameP& f);
  Value binary(const std::string& op, const Value& a, const Value& b);
  bool compare_op(const std::string& op, const Value& a, const Value& b);
};

// Argument binding for builtins: the values of `names` in order, from positional then keyword arguments.
std::vector<std::optional<Value>> bind_args(CallArgs& a, std::initializer_list<const char*> names,
                                            std::string_view fname);
bool contains(const Value& container, const Value& item);
std::string str_of(const Value& v);  // str(), raising on an undefined that carries an error (unsafe access)
Value str_method(const Value& self, const std::string& name);   // a bound str method, or undefined
Value dict_method(const Value& self, const std::string& name);  // a bound dict method, or undefined
Value list_method(const Value& self, const std::string& name);  // a bound list method, or undefined
void install_globals(Frame& f);
std::string py_format(Interp& in, const std::string& fmt, CallArgs& args);  // str.format
std::string percent_format(const std::string& fmt, const Value& args);      // str % args
// Python's str methods on UTF-8 text.
std::string py_upper(std::string_view s);
std::string py_lower(std::string_view s);
std::string py_capitalize(std::string_view s);
std::string py_title(std::string_view s);
std::string py_strip(std::string_view s, const std::optional<Value>& chars, bool left, bool right);
std::vector<std::string> py_split(std::string_view s, const std::optional<Value>& sep, int64_t maxsplit,
                                  bool right);
std::vector<std::string> py_splitlines(std::string_view s);
bool py_isspace_cp(uint32_t cp);
int64_t to_int(const Value& v, const char* what);

}  // namespace tessera::jinja
