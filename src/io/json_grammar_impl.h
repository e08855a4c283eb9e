// The internals of the JSON grammar matcher (io/json_grammar.h), shared by the matcher
// (json_grammar.cpp) and the schema compiler (json_schema.cpp): the value classes, the per-frame lexers
// and the compiled schema nodes with the pushdown automaton over them.
#pragma once
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/json_grammar.h"

namespace tessera::json_grammar_detail {

using ojson = nlohmann::ordered_json;

constexpr size_t kInf = size_t{1} << 60;
constexpr uint32_t kDepthLimit = 32;
constexpr uint32_t kMaxWs = 8;
constexpr size_t kMaxAlts = 256;
constexpr uint32_t kNoMax = UINT32_MAX;
constexpr uint16_t kExtra = 0xFFFF;
constexpr uint32_t kAny = 0, kNever = 1;  // node ids present in every grammar

enum : uint8_t {
  T_OBJ = 1,
  T_ARR = 2,
  T_STR = 4,
  T_INT = 8,
  T_FLT = 16,
  T_BOOL = 32,
  T_NULL = 64,
  T_ALL = 127
};
enum : uint8_t { C_OBJ, C_ARR, C_STR, C_NUM, C_LIT, C_N };  // value classes (by first byte)
enum : uint8_t { K_ROOT, K_OBJ, K_ARR, K_STR, K_NUM, K_LIT, K_ENUM };
enum : uint8_t { R_BEFORE, R_IN, R_AFTER };
enum : uint8_t { O_START, O_KEY, O_COLON, O_VAL, O_IN, O_AFTER, O_COMMA };
enum : uint8_t { A_START, A_IN, A_AFTER, A_COMMA };
enum : uint8_t { N_MINUS, N_ZERO, N_INT, N_DOT, N_FRAC, N_E, N_ESIGN, N_EXP };
enum : uint8_t { L_NORM, L_UTF8, L_ESC, L_U, L_NEEDBS, L_NEEDU, L_LOW };
constexpr std::string_view kLits[3] = {"true", "false", "null"};

inline size_t add(size_t a, size_t b) {
  return std::min(kInf, a + b);
}
inline bool is_ws(uint8_t c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}
inline int hexval(uint8_t c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Narrows [lo, hi) (sorted strings sharing their first n bytes) to those whose byte n is c.
inline void narrow(const std::vector<std::string>& v, uint32_t& lo, uint32_t& hi, uint32_t n, uint8_t c) {
  uint32_t a = lo;
  if (a < hi && v[a].size() == n) ++a;
  auto b = v.begin() + a, e = v.begin() + hi;
  auto first = std::lower_bound(b, e, c, [n](const std::string& s, uint8_t x) { return uint8_t(s[n]) < x; });
  auto last =
      std::upper_bound(first, e, c, [n](uint8_t x, const std::string& s) { return x < uint8_t(s[n]); });
  lo = uint32_t(first - v.begin());
  hi = uint32_t(last - v.begin());
}

// The string lexer (fields of Frame). Returns -1: refused, 0: consumed, 1: the closing quote.
inline int lex_step(Frame& t, uint8_t c, uint32_t max_len) {
  switch (t.lex) {
    case L_NORM:
      if (c == '"') return 1;
      if (c < 0x20 || t.n >= max_len) return -1;
      ++t.n;
      if (c == '\\') {
        t.lex = L_ESC;
        t.esc = 1;
        return 0;
      }
      if (c < 0x80) return 0;
      t.lo8 = 0x80, t.hi8 = 0xBF;
      if (c >= 0xC2 && c <= 0xDF) {
        t.rem = 1;
      } else if (c >= 0xE0 && c <= 0xEF) {
        t.rem = 2;
        if (c == 0xE0) t.lo8 = 0xA0;
        if (c == 0xED) t.hi8 = 0x9F;
      } else if (c >= 0xF0 && c <= 0xF4) {
        t.rem = 3;
        if (c == 0xF0) t.lo8 = 0x90;
        if (c == 0xF4) t.hi8 = 0x8F;
      } else {
        return -1;
      }
      t.lex = L_UTF8;
      return 0;
    case L_UTF8:
      if (c < t.lo8 || c > t.hi8) return -1;
      t.lo8 = 0x80, t.hi8 = 0xBF;
      if (--t.rem == 0) t.lex = L_NORM;
      return 0;
    case L_ESC:
      if (c == 'u') {
        t.lex = L_U, t.u = 0, t.ud = 0;
        return 0;
      }
      if (std::string_view("\"\\/bfnrt").find(char(c)) == std::string_view::npos) return -1;
      t.lex = L_NORM;
      return 0;
    case L_U:
    case L_LOW: {
      int h = hexval(c);
      if (h < 0) return -1;
      t.u = uint16_t(t.u * 16 + h);
      ++t.ud;
      if (t.lex == L_U && t.ud == 2 && t.u >= 0xDC && t.u <= 0xDF) return -1;  // lone low surrogate
      if (t.lex == L_LOW && t.ud == 1 && t.u != 0xD) return -1;
      if (t.lex == L_LOW && t.ud == 2 && (t.u < 0xDC || t.u > 0xDF)) return -1;
      if (t.ud == 4) t.lex = (t.lex == L_U && t.u >= 0xD800 && t.u <= 0xDBFF) ? L_NEEDBS : L_NORM;
      return 0;
    }
    case L_NEEDBS:
      if (c != '\\') return -1;
      t.lex = L_NEEDU;
      return 0;
    case L_NEEDU:
      if (c != 'u') return -1;
      t.lex = L_LOW, t.u = 0, t.ud = 0;
      return 0;
  }
  return -1;
}

// Bytes that finish the character being written (not the closing quote).
inline size_t lex_close(const Frame& t) {
  switch (t.lex) {
    case L_UTF8:
      return t.rem;
    case L_ESC:
      return 1;
    case L_U: {
      bool high = t.ud >= 2 && ((t.u >> ((t.ud - 2) * 4)) & 0xFC) == 0xD8;
      return 4 - t.ud + (high ? 6 : 0);
    }
    case L_NEEDBS:
      return 6;
    case L_NEEDU:
      return 5;
    case L_LOW:
      return 4 - t.ud;
    default:
      return 0;
  }
}

enum { NUM_TAKEN, NUM_DONE, NUM_BAD };
inline int num_step(Frame& t, uint8_t c, bool flt) {
  bool digit = c >= '0' && c <= '9';
  switch (t.st) {
    case N_MINUS:
      if (!digit) return NUM_BAD;
      t.st = c == '0' ? N_ZERO : N_INT;
      return NUM_TAKEN;
    case N_ZERO:
    case N_INT:
      if (digit && t.st == N_INT) return NUM_TAKEN;
      if (flt && c == '.') return t.st = N_DOT, NUM_TAKEN;
      if (flt && (c == 'e' || c == 'E')) return t.st = N_E, NUM_TAKEN;
      return NUM_DONE;
    case N_DOT:
      if (!digit) return NUM_BAD;
      return t.st = N_FRAC, NUM_TAKEN;
    case N_FRAC:
      if (digit) return NUM_TAKEN;
      if (c == 'e' || c == 'E') return t.st = N_E, NUM_TAKEN;
      return NUM_DONE;
    case N_E:
      if (c == '+' || c == '-') return t.st = N_ESIGN, NUM_TAKEN;
      [[fallthrough]];
    case N_ESIGN:
      if (!digit) return NUM_BAD;
      return t.st = N_EXP, NUM_TAKEN;
    case N_EXP:
      return digit ? NUM_TAKEN : NUM_DONE;
  }
  return NUM_BAD;
}

struct Node {
  enum Kind : uint8_t { Concrete, Alias, AnyOf } kind = Concrete;
  uint8_t types = T_ALL;
  uint32_t target = 0;         // Alias
  std::vector<uint32_t> alts;  // AnyOf
  bool has_enum = false;       // the value is one of lits (compact JSON texts, sorted)
  std::vector<std::string> lits;
  uint32_t clone = 0;             // has_enum: this node without its enum (to filter lits)
  std::vector<std::string> keys;  // object: declared names as JSON strings, sorted
  std::vector<uint32_t> key_nodes;
  uint64_t required = 0;
  uint32_t additional = kAny;
  std::string extra_key = "\"\"";  // the shortest undeclared key
  std::vector<uint32_t> prefix;    // array
  uint32_t items = kAny, min_items = 0, max_items = kNoMax;
  uint32_t min_len = 0, max_len = kNoMax;  // string
  // Derived.
  std::vector<uint32_t> flat;  // the concrete nodes this node stands for
  size_t m[C_N] = {kInf, kInf, kInf, kInf, kInf};
  uint32_t d[C_N] = {0, 0, 0, 0, 0};
  size_t vmin = kInf;  // shortest value
  uint32_t vdep = 0;   // least nesting any finite value needs
  uint32_t elem(uint32_t i) const { return i < prefix.size() ? prefix[i] : items; }
};

struct Impl {
  std::vector<Node> nodes;
  uint32_t root = 0;

  bool feasible(uint32_t n, size_t frames) const {
    return nodes[n].vmin < kInf && frames - 1 + nodes[n].vdep <= kDepthLimit;
  }
  bool extra_ok(const Node& N, size_t frames, bool esc) const {
    return feasible(N.additional, frames) && (N.keys.empty() || !esc);
  }
  size_t pair(const Node& N, uint32_t i) const {
    return add(N.keys[i].size() + 2, nodes[N.key_nodes[i]].vmin);
  }
  size_t rest(const Node& N, uint64_t seen) const {
    size_t r = 1;
    for (uint64_t miss = N.required & ~seen; miss; miss &= miss - 1)
      r = add(r, pair(N, __builtin_ctzll(miss)));
    return r;
  }
  size_t elems(const Node& N, uint32_t from, uint32_t to) const {  // shortest elements [from, to)
    size_t r = 0;
    for (uint32_t i = from; i < to && i < N.prefix.size(); ++i) r = add(r, nodes[N.prefix[i]].vmin);
    uint32_t beyond = to - std::max<uint32_t>(from, std::min<uint32_t>(to, uint32_t(N.prefix.size())));
    if (beyond) r = add(r, nodes[N.items].vmin >= kInf ? kInf : beyond * nodes[N.items].vmin);
    return r;
  }

  static int cls(uint8_t c) {
    if (c == '{') return C_OBJ;
    if (c == '[') return C_ARR;
    if (c == '"') return C_STR;
    if (c == '-' || (c >= '0' && c <= '9')) return C_NUM;
    if (c == 't' || c == 'f' || c == 'n') return C_LIT;
    return -1;
  }
  bool accepts(uint32_t a, uint8_t c, size_t frames) const {
    const Node& N = nodes[a];
    if (N.has_enum) {
      uint32_t lo = 0, hi = uint32_t(N.lits.size());
      narrow(N.lits, lo, hi, 0, c);
      return lo < hi;
    }
    int k = cls(c);
    if (k < 0 || N.m[k] >= kInf || frames - 1 + N.d[k] > kDepthLimit) return false;
    if (k == C_LIT) return (N.types & (c == 'n' ? T_NULL : T_BOOL)) != 0;
    return true;
  }
  void push_value(Stack& s, uint32_t a, uint8_t c) const {
    const Node& N = nodes[a];
    Frame f;
    f.node = a;
    if (N.has_enum) {
      f.kind = K_ENUM, f.lo = 0, f.hi = uint32_t(N.lits.size()), f.n = 1;
      narrow(N.lits, f.lo, f.hi, 0, c);
    } else if (c == '{') {
      f.kind = K_OBJ, f.st = O_START;
    } else if (c == '[') {
      f.kind = K_ARR, f.st = A_START;
    } else if (c == '"') {
      f.kind = K_STR;
    } else if (c == 't' || c == 'f' || c == 'n') {
      f.kind = K_LIT, f.lo = c == 't' ? 0 : c == 'f' ? 1 : 2, f.n = 1;
    } else {
      f.kind = K_NUM, f.st = c == '-' ? N_MINUS : c == '0' ? N_ZERO : N_INT;
    }
    s.f.push_back(f);
  }
  // Starts a value of node n with byte c (the parent's state already says so); forks for anyOf.
  bool dispatch(Stack& s, uint32_t n, uint8_t c, std::vector<Stack>& forks) const {
    const auto& fl = nodes[n].flat;
    int first = -1;
    for (uint32_t a : fl) {
      if (!accepts(a, c, s.f.size())) continue;
      if (first < 0) {
        first = int(a);
      } else {
        forks.push_back(s);
        push_value(forks.back(), a, c);
      }
    }
    if (first < 0) return false;
    push_value(s, uint32_t(first), c);
    return true;
  }
  static void pop(Stack& s) {
    s.f.pop_back();
    Frame& p = s.f.back();
    p.st = uint8_t(p.kind == K_ROOT  ? uint8_t(R_AFTER)
                   : p.kind == K_OBJ ? uint8_t(O_AFTER)
                                     : uint8_t(A_AFTER));
  }
  static bool ws_ok(Stack& s) { return ++s.ws <= kMaxWs; }

  bool can_add_key(const Frame& t, const Node& N, size_t frames) const {
    if (extra_ok(N, frames, false)) return true;
    for (uint32_t i = 0; i < N.keys.size(); ++i)
      if (!(t.seen >> i & 1) && feasible(N.key_nodes[i], frames)) return true;
    return false;
  }
  bool key_step(Frame& t, const Node& N, uint8_t c, size_t frames) const {
    if (t.lo < t.hi) narrow(N.keys, t.lo, t.hi, t.kp, c);
    int r = lex_step(t, c, kNoMax);
    if (r < 0) return false;
    ++t.kp;
    if (r == 1) {
      if (t.lo < t.hi && N.keys[t.lo].size() == t.kp) {
        if ((t.seen >> t.lo & 1) || !feasible(N.key_nodes[t.lo], frames)) return false;
        t.cur = uint16_t(t.lo);
        t.seen |= uint64_t{1} << t.lo;
      } else {
        if (!extra_ok(N, frames, t.esc)) return false;
        t.cur = kExtra;
      }
      t.st = O_COLON;  // clear the key lexer so that equal alternatives compare equal
      t.lex = t.rem = t.lo8 = t.hi8 = t.ud = t.esc = 0, t.u = 0, t.n = t.kp = t.lo = t.hi = 0;
      return true;
    }
    if (extra_ok(N, frames, t.esc)) return true;
    for (uint32_t i = t.lo; i < t.hi; ++i)
      if (!(t.seen >> i & 1) && feasible(N.key_nodes[i], frames)) return true;
    return false;
  }
  bool obj_step(Stack& s, uint8_t c, std::vector<Stack>& forks) const {
    Frame& t = s.f.back();
    const Node& N = nodes[t.node];
    if (t.st == O_KEY) return key_step(t, N, c, s.f.size());
    if (is_ws(c)) return ws_ok(s);
    switch (t.st) {
      case O_START:
      case O_COMMA:
        if (c == '"') {
          if (!can_add_key(t, N, s.f.size())) return false;
          t.st = O_KEY, t.lex = L_NORM, t.esc = 0, t.n = 0, t.kp = 1, t.lo = 0,
          t.hi = uint32_t(N.keys.size());
          return true;
        }
        if (c != '}' || t.st != O_START || (N.required & ~t.seen)) return false;
        pop(s);
        return true;
      case O_COLON:
        if (c != ':') return false;
        t.st = O_VAL;
        return true;
      case O_VAL: {
        t.st = O_IN;
        uint32_t vn = t.cur == kExtra ? N.additional : N.key_nodes[t.cur];
        return dispatch(s, vn, c, forks);
      }
      case O_AFTER:
        if (c == ',') {
          if (!can_add_key(t, N, s.f.size())) return false;
          t.st = O_COMMA;
          return true;
        }
        if (c != '}' || (N.required & ~t.seen)) return false;
        pop(s);
        return true;
    }
    return false;
  }
  bool arr_step(Stack& s, uint8_t c, std::vector<Stack>& forks) const {
    Frame& t = s.f.back();
    const Node& N = nodes[t.node];
    if (is_ws(c)) return ws_ok(s);
    if (c == ']' && t.st != A_COMMA) {
      if (t.n < N.min_items) return false;
      pop(s);
      return true;
    }
    if (t.st == A_AFTER) {
      if (c != ',' || t.n >= N.max_items || !feasible(N.elem(t.n), s.f.size())) return false;
      t.st = A_COMMA;
      return true;
    }
    if (t.n >= N.max_items) return false;
    t.st = A_IN;
    uint32_t e = N.elem(t.n++);
    return dispatch(s, e, c, forks);
  }

  bool step(Stack& s, uint8_t c, std::vector<Stack>& forks) const {
    if (!is_ws(c)) s.ws = 0;
    for (;;) {
      Frame& t = s.f.back();
      switch (t.kind) {
        case K_ROOT:
          if (is_ws(c)) return ws_ok(s);
          if (t.st != R_BEFORE) return false;
          t.st = R_IN;
          return dispatch(s, t.node, c, forks);
        case K_OBJ:
          return obj_step(s, c, forks);
        case K_ARR:
          return arr_step(s, c, forks);
        case K_STR: {
          const Node& N = nodes[t.node];
          int r = lex_step(t, c, N.max_len);
          if (r < 0) return false;
          if (r == 1) {
            if (t.n < N.min_len) return false;
            pop(s);
          }
          return true;
        }
        case K_NUM: {
          int r = num_step(t, c, nodes[t.node].types & T_FLT);
          if (r == NUM_BAD) return false;
          if (r == NUM_TAKEN) return true;
          pop(s);
          continue;
        }
        case K_LIT:
          if (uint8_t(kLits[t.lo][t.n]) != c) return false;
          if (++t.n == kLits[t.lo].size()) pop(s);
          return true;
        case K_ENUM: {
          const Node& N = nodes[t.node];
          uint32_t lo = t.lo, hi = t.hi;
          narrow(N.lits, lo, hi, t.n, c);
          if (lo < hi) {
            t.lo = lo, t.hi = hi, ++t.n;
            return true;
          }
          if (N.lits[t.lo].size() != t.n) return false;
          pop(s);
          continue;
        }
      }
      return false;
    }
  }

  size_t key_cost(const Frame& t, const Node& N, size_t frames) const {
    size_t best = kInf;
    for (uint32_t i = t.lo; i < t.hi; ++i) {
      if ((t.seen >> i & 1) || !feasible(N.key_nodes[i], frames)) continue;
      size_t c = add(N.keys[i].size() - t.kp + 1, nodes[N.key_nodes[i]].vmin);
      best = std::min(best, add(c, rest(N, t.seen | uint64_t{1} << i)));
    }
    if (extra_ok(N, frames, t.esc)) {
      bool collides = t.lex == L_NORM && t.lo < t.hi && N.keys[t.lo].size() == t.kp + 1;
      size_t c = lex_close(t) + 2 + (collides ? 1 : 0);
      best = std::min(best, add(add(c, nodes[N.additional].vmin), rest(N, t.seen)));
    }
    return best;
  }
  size_t frame_cost(const Stack& s, size_t i) const {
    const Frame& t = s.f[i];
    const Node& N = nodes[t.node];
    switch (t.kind) {
      case K_ROOT:
        return t.st == R_BEFORE ? N.vmin : 0;
      case K_OBJ: {
        size_t frames = i + 1;
        uint32_t vn = t.cur == kExtra ? N.additional : t.cur < N.key_nodes.size() ? N.key_nodes[t.cur] : kAny;
        bool missing = (N.required & ~t.seen) != 0;
        switch (t.st) {
          case O_START:
            return missing ? rest(N, t.seen) - 1 : 1;
          case O_KEY:
            return key_cost(t, N, frames);
          case O_COLON:
            return add(1 + nodes[vn].vmin, rest(N, t.seen));
          case O_VAL:
            return add(nodes[vn].vmin, rest(N, t.seen));
          case O_COMMA: {
            if (missing) return rest(N, t.seen) - 1;
            size_t best =
                extra_ok(N, frames, false) ? add(N.extra_key.size() + 1, nodes[N.additional].vmin) : kInf;
            for (uint32_t k = 0; k < N.keys.size(); ++k)
              if (!(t.seen >> k & 1) && feasible(N.key_nodes[k], frames))
                best = std::min(best, pair(N, k) - 1);
            return add(best, 1);
          }
          default:
            return rest(N, t.seen);
        }
      }
      case K_ARR: {
        uint32_t mi = N.min_items, k = t.n;
        if (t.st == A_START) return mi == 0 ? 1 : add(elems(N, 0, mi), mi);
        if (t.st == A_COMMA) {
          uint32_t need = std::max(mi, k + 1);
          return add(elems(N, k, need), need - k);
        }
        return mi > k ? add(elems(N, k, mi), mi - k + 1) : 1;
      }
      case K_STR:
        return lex_close(t) + (N.min_len > t.n ? N.min_len - t.n : 0) + 1;
      case K_NUM:
        return (t.st == N_MINUS || t.st == N_DOT || t.st == N_E || t.st == N_ESIGN) ? 1 : 0;
      case K_LIT:
        return kLits[t.lo].size() - t.n;
      case K_ENUM: {
        size_t best = kInf;
        for (uint32_t k = t.lo; k < t.hi; ++k) best = std::min(best, N.lits[k].size() - t.n);
        return best;
      }
    }
    return kInf;
  }
  size_t cost(const Stack& s) const {
    size_t r = 0;
    for (size_t i = 0; i < s.f.size(); ++i) r = add(r, frame_cost(s, i));
    return r;
  }
  static bool done(const Impl& g, const Stack& s) {
    if (s.f.size() == 1) return s.f[0].st == R_AFTER;
    if (s.f.size() != 2) return false;
    const Frame& t = s.f[1];
    if (t.kind == K_NUM) return t.st == N_ZERO || t.st == N_INT || t.st == N_FRAC || t.st == N_EXP;
    return t.kind == K_ENUM && g.nodes[t.node].lits[t.lo].size() == t.n;
  }

  JsonGrammar::State start_at(uint32_t node) const {
    JsonGrammar::State st;
    st.g_ = this;
    Frame f;
    f.kind = K_ROOT, f.st = R_BEFORE, f.node = node;
    st.alts_.push_back(Stack{{f}, 0});
    return st;
  }

  // Derived data: flattened alternatives, shortest lengths and depths (least fixpoints).
  void flatten(uint32_t n, std::vector<uint32_t>& out, std::vector<char>& on) const {
    if (on[n]) return;
    on[n] = 1;
    const Node& N = nodes[n];
    if (N.kind == Node::Alias) {
      flatten(N.target, out, on);
    } else if (N.kind == Node::AnyOf) {
      for (uint32_t a : N.alts) flatten(a, out, on);
    } else if (std::find(out.begin(), out.end(), n) == out.end()) {
      out.push_back(n);
    }
    on[n] = 0;
  }
  void derive() {
    for (uint32_t n = 0; n < nodes.size(); ++n) {
      std::vector<char> on(nodes.size(), 0);
      std::vector<uint32_t> out;
      flatten(n, out, on);
      nodes[n].flat = std::move(out);
    }
    for (auto& N : nodes) {
      std::fill(std::begin(N.m), std::end(N.m), kInf);
      std::fill(std::begin(N.d), std::end(N.d), 0u);
      N.vmin = kInf, N.vdep = 0;
    }
    for (bool changed = true; changed;) {
      changed = false;
      for (auto& N : nodes) {
        size_t m[C_N] = {kInf, kInf, kInf, kInf, kInf};
        size_t v = kInf;
        if (N.kind != Node::Concrete) {
          for (uint32_t a : N.flat) v = std::min(v, nodes[a].vmin);
        } else if (N.has_enum) {
          for (auto& l : N.lits) v = std::min(v, l.size());
        } else {
          if (N.types & T_OBJ) m[C_OBJ] = N.required ? rest(N, 0) : 2;
          if ((N.types & T_ARR) && N.min_items <= N.max_items)
            m[C_ARR] = N.min_items ? add(elems(N, 0, N.min_items), N.min_items + 1) : 2;
          if ((N.types & T_STR) && N.min_len <= N.max_len) m[C_STR] = size_t{2} + N.min_len;
          if (N.types & (T_INT | T_FLT)) m[C_NUM] = 1;
          if (N.types & (T_BOOL | T_NULL)) m[C_LIT] = 4;
          for (int k = 0; k < C_N; ++k) v = std::min(v, m[k]);
          std::copy(m, m + C_N, N.m);
        }
        if (v < N.vmin) N.vmin = v, changed = true;
      }
    }
    for (auto& N : nodes) N.vdep = N.vmin < kInf ? kDepthLimit + 1 : 0;
    for (bool changed = true; changed;) {
      changed = false;
      for (auto& N : nodes) {
        if (N.vmin >= kInf) continue;
        uint32_t v = kDepthLimit + 1;
        if (N.kind != Node::Concrete) {
          for (uint32_t a : N.flat)
            if (nodes[a].vmin < kInf) v = std::min(v, nodes[a].vdep);
        } else if (N.has_enum) {
          v = 0;
        } else {
          uint32_t o = 1, a = 1;
          for (uint64_t r = N.required; r; r &= r - 1)
            o = std::max(o, 1 + nodes[N.key_nodes[__builtin_ctzll(r)]].vdep);
          for (uint32_t i = 0; i < N.min_items && i <= N.prefix.size(); ++i)
            a = std::max(a, 1 + nodes[N.elem(i)].vdep);
          N.d[C_OBJ] = std::min(o, kDepthLimit + 1), N.d[C_ARR] = std::min(a, kDepthLimit + 1);
          for (int k = 0; k < C_N; ++k)
            if (N.m[k] < kInf) v = std::min(v, N.d[k]);
        }
        if (v != N.vdep) N.vdep = v, changed = true;
      }
    }
  }
  void finish() {
    for (uint32_t n = 0; n < nodes.size(); ++n) {
      if (!nodes[n].has_enum) continue;
      Node c = nodes[n];
      c.has_enum = false;
      c.lits.clear();
      nodes.push_back(std::move(c));
      nodes[n].clone = uint32_t(nodes.size() - 1);
    }
    derive();
    for (bool changed = true; changed;) {  // enum values must satisfy the node's other keywords too
      changed = false;
      for (auto& N : nodes) {
        if (!N.has_enum) continue;
        std::vector<std::string> keep;
        for (auto& l : N.lits) {
          auto st = start_at(N.clone);
          if (st.feed(l) && st.complete()) keep.push_back(l);
        }
        if (keep.size() != N.lits.size()) N.lits = std::move(keep), changed = true;
      }
      if (changed) derive();
    }
  }
};

}  // namespace tessera::json_grammar_detail
