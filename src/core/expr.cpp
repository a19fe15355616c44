#include "kiln/expr.hpp"

#include <algorithm>
#include <cctype>
#include <limits>

#include "core/format.hpp"

namespace kiln {

namespace {

constexpr int kMaxNesting = 100;  // parser recursion bound: deep input is an error, not a crash

bool is_ident_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool is_ident_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

bool is_function(std::string_view n) { return n == "cdiv" || n == "min" || n == "max"; }

enum class Tok { End, Int, Ident, Plus, Minus, Star, SlashSlash, Percent, LParen, RParen, Comma,
                 Lt, Le, Gt, Ge, EqEq, Ne, AndAnd, OrOr };

struct Token {
  Tok kind = Tok::End;
  int column = 0;
  std::string_view text;
  int64_t value = 0;
};

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) { next(); }

  ExprNode parse_all() {
    if (tok_.kind == Tok::End) error(tok_.column, "empty expression");
    ExprNode n = logic_or();
    if (tok_.kind != Tok::End) {
      if (tok_.kind == Tok::RParen) error(tok_.column, "unbalanced ')'");
      error(tok_.column, fmt::format("unexpected '{}' after a complete expression", tok_.text));
    }
    return n;
  }

 private:
  [[noreturn]] void error(int column, const std::string& what) {
    throw ExprError(column, what, std::string(text_));
  }

  void next() {
    size_t i = pos_;
    while (i < text_.size() && (text_[i] == ' ' || text_[i] == '\t')) ++i;
    tok_ = Token{};
    tok_.column = static_cast<int>(i) + 1;
    if (i >= text_.size()) {
      tok_.kind = Tok::End;
      tok_.text = "end of expression";
      pos_ = i;
      return;
    }
    char c = text_[i];
    size_t start = i;
    auto two = [&](char second) { return i + 1 < text_.size() && text_[i + 1] == second; };
    if (std::isdigit(static_cast<unsigned char>(c))) {
      int64_t v = 0;
      while (i < text_.size() && std::isdigit(static_cast<unsigned char>(text_[i]))) {
        int d = text_[i] - '0';
        if (v > (std::numeric_limits<int64_t>::max() - d) / 10)
          error(tok_.column, "integer literal too large for 64 bits");
        v = v * 10 + d;
        ++i;
      }
      if (i < text_.size() && is_ident_char(text_[i]))
        error(static_cast<int>(i) + 1, "a number runs into a name; put an operator between them");
      tok_.kind = Tok::Int;
      tok_.value = v;
    } else if (is_ident_start(c)) {
      while (i < text_.size() && is_ident_char(text_[i])) ++i;
      tok_.kind = Tok::Ident;
    } else {
      switch (c) {
        case '+': tok_.kind = Tok::Plus; ++i; break;
        case '-': tok_.kind = Tok::Minus; ++i; break;
        case '*': tok_.kind = Tok::Star; ++i; break;
        case '%': tok_.kind = Tok::Percent; ++i; break;
        case '(': tok_.kind = Tok::LParen; ++i; break;
        case ')': tok_.kind = Tok::RParen; ++i; break;
        case ',': tok_.kind = Tok::Comma; ++i; break;
        case '/':
          if (!two('/')) error(tok_.column, "'/' is not an operator: use // for floor division");
          tok_.kind = Tok::SlashSlash;
          i += 2;
          break;
        case '<':
          if (two('=')) { tok_.kind = Tok::Le; i += 2; } else { tok_.kind = Tok::Lt; ++i; }
          break;
        case '>':
          if (two('=')) { tok_.kind = Tok::Ge; i += 2; } else { tok_.kind = Tok::Gt; ++i; }
          break;
        case '=':
          if (!two('=')) error(tok_.column, "'=' is not an operator: use == to compare");
          tok_.kind = Tok::EqEq;
          i += 2;
          break;
        case '!':
          if (!two('=')) error(tok_.column, "'!' is not an operator: use != to compare, or == 0 to negate");
          tok_.kind = Tok::Ne;
          i += 2;
          break;
        case '&':
          if (!two('&')) error(tok_.column, "'&' is not an operator: use && for 'and'");
          tok_.kind = Tok::AndAnd;
          i += 2;
          break;
        case '|':
          if (!two('|')) error(tok_.column, "'|' is not an operator: use || for 'or'");
          tok_.kind = Tok::OrOr;
          i += 2;
          break;
        default: {
          unsigned char uc = static_cast<unsigned char>(c);
          if (uc >= 0x20 && uc < 0x7f) error(tok_.column, fmt::format("unexpected character '{}'", c));
          error(tok_.column, fmt::format("unexpected byte 0x{:02x}", uc));
        }
      }
    }
    tok_.text = text_.substr(start, i - start);
    pos_ = i;
  }

  static ExprOp cmp_op(Tok t) {
    switch (t) {
      case Tok::Lt: return ExprOp::Lt;
      case Tok::Le: return ExprOp::Le;
      case Tok::Gt: return ExprOp::Gt;
      case Tok::Ge: return ExprOp::Ge;
      case Tok::EqEq: return ExprOp::Eq;
      default: return ExprOp::Ne;
    }
  }
  static bool is_cmp(Tok t) {
    return t == Tok::Lt || t == Tok::Le || t == Tok::Gt || t == Tok::Ge || t == Tok::EqEq ||
           t == Tok::Ne;
  }

  // A node over its kids, no taller than kMaxExprHeight: a flat chain of
  // ~300,000 terms would otherwise make a tree that every walker (printing,
  // compiling, emitting C++, even destroying it) recurses through once per term.
  ExprNode tall(ExprNode n) {
    n.height = 1;
    for (const auto& k : n.kids) n.height = std::max(n.height, k.height + 1);
    if (n.height > kMaxExprHeight)
      error(n.column, fmt::format("expression is more than {} operators deep; split it", kMaxExprHeight));
    return n;
  }

  ExprNode binary(ExprOp op, int column, ExprNode a, ExprNode b) {
    ExprNode n;
    n.op = op;
    n.column = column;
    n.kids.push_back(std::move(a));
    n.kids.push_back(std::move(b));
    return tall(std::move(n));
  }

  ExprNode logic_or() {
    ExprNode lhs = logic_and();
    while (tok_.kind == Tok::OrOr) {
      Token op = tok_;
      DepthGuard g(*this, op.column);
      next();
      ExprNode rhs = logic_and();
      lhs = binary(ExprOp::Or, op.column, std::move(lhs), std::move(rhs));
    }
    return lhs;
  }

  ExprNode logic_and() {
    ExprNode lhs = comparison();
    while (tok_.kind == Tok::AndAnd) {
      Token op = tok_;
      DepthGuard g(*this, op.column);
      next();
      ExprNode rhs = comparison();
      lhs = binary(ExprOp::And, op.column, std::move(lhs), std::move(rhs));
    }
    return lhs;
  }

  ExprNode comparison() {
    ExprNode lhs = additive();
    if (is_cmp(tok_.kind)) {
      Token op = tok_;
      next();
      ExprNode rhs = additive();
      if (is_cmp(tok_.kind))
        error(tok_.column, "comparisons do not chain: use parentheses");
      return binary(cmp_op(op.kind), op.column, std::move(lhs), std::move(rhs));
    }
    return lhs;
  }

  ExprNode additive() {
    ExprNode lhs = multiplicative();
    while (tok_.kind == Tok::Plus || tok_.kind == Tok::Minus) {
      Token op = tok_;
      next();
      ExprNode rhs = multiplicative();
      lhs = binary(op.kind == Tok::Plus ? ExprOp::Add : ExprOp::Sub, op.column, std::move(lhs),
                   std::move(rhs));
    }
    return lhs;
  }

  ExprNode multiplicative() {
    ExprNode lhs = unary();
    while (tok_.kind == Tok::Star || tok_.kind == Tok::SlashSlash || tok_.kind == Tok::Percent) {
      Token op = tok_;
      next();
      ExprNode rhs = unary();
      ExprOp o = op.kind == Tok::Star ? ExprOp::Mul
                 : op.kind == Tok::SlashSlash ? ExprOp::FloorDiv
                                              : ExprOp::Mod;
      lhs = binary(o, op.column, std::move(lhs), std::move(rhs));
    }
    return lhs;
  }

  struct DepthGuard {
    Parser& p;
    explicit DepthGuard(Parser& parser, int column) : p(parser) {
      if (++p.depth_ > kMaxNesting)
        p.error(column, fmt::format("expression nests deeper than {} levels", kMaxNesting));
    }
    ~DepthGuard() { --p.depth_; }
  };

  ExprNode unary() {
    if (tok_.kind == Tok::Minus) {
      DepthGuard g(*this, tok_.column);
      ExprNode n;
      n.op = ExprOp::Neg;
      n.column = tok_.column;
      next();
      n.kids.push_back(unary());
      return tall(std::move(n));
    }
    return primary();
  }

  ExprNode primary() {
    Token t = tok_;
    switch (t.kind) {
      case Tok::Int: {
        next();
        ExprNode n;
        n.op = ExprOp::Const;
        n.value = t.value;
        n.column = t.column;
        return n;
      }
      case Tok::Ident: {
        next();
        if (is_function(t.text)) {
          if (tok_.kind != Tok::LParen)
            error(t.column, fmt::format("'{}' is a function: call it as {}(a, b)", t.text, t.text));
          return call(t);
        }
        if (tok_.kind == Tok::LParen)
          error(t.column, fmt::format("unknown function '{}' (functions: cdiv, min, max)", t.text));
        ExprNode n;
        n.op = ExprOp::Var;
        n.name = std::string(t.text);
        n.column = t.column;
        return n;
      }
      case Tok::LParen: {
        DepthGuard g(*this, t.column);
        next();
        if (tok_.kind == Tok::RParen) error(tok_.column, "empty parentheses");
        ExprNode inner = logic_or();
        if (tok_.kind != Tok::RParen)
          error(tok_.column, fmt::format("expected ')' to close '(' at column {}, found {}", t.column,
                                         describe(tok_)));
        next();
        return inner;
      }
      default:
        error(t.column, fmt::format("expected a number, a name or '(', found {}", describe(t)));
    }
  }

  ExprNode call(const Token& fn) {
    DepthGuard g(*this, fn.column);
    next();  // '('
    ExprNode n;
    n.op = fn.text == "cdiv" ? ExprOp::Cdiv : fn.text == "min" ? ExprOp::Min : ExprOp::Max;
    n.column = fn.column;
    if (tok_.kind == Tok::RParen) error(tok_.column, fmt::format("{}() needs arguments", fn.text));
    for (;;) {
      n.kids.push_back(logic_or());
      if (n.kids.size() > 16) error(fn.column, fmt::format("{}() takes at most 16 arguments", fn.text));
      if (tok_.kind == Tok::Comma) {
        next();
        continue;
      }
      if (tok_.kind == Tok::RParen) break;
      error(tok_.column,
            fmt::format("expected ',' or ')' in the arguments of {}(), found {}", fn.text, describe(tok_)));
    }
    int close = tok_.column;
    next();
    if (n.op == ExprOp::Cdiv && n.kids.size() != 2)
      error(close, fmt::format("cdiv() takes 2 arguments, got {}", n.kids.size()));
    if (n.op != ExprOp::Cdiv && n.kids.size() < 2)
      error(close, fmt::format("{}() takes at least 2 arguments, got {}", fn.text, n.kids.size()));
    return tall(std::move(n));
  }

  static std::string describe(const Token& t) {
    if (t.kind == Tok::End) return "the end of the expression";
    return fmt::format("'{}'", t.text);
  }

  std::string_view text_;
  size_t pos_ = 0;
  Token tok_;
  int depth_ = 0;
};

constexpr int kCmpPrec = 3, kNegPrec = 6;
int precedence(const ExprNode& n) {
  switch (n.op) {
    case ExprOp::Or:
      return 1;
    case ExprOp::And:
      return 2;
    case ExprOp::Lt: case ExprOp::Le: case ExprOp::Gt: case ExprOp::Ge: case ExprOp::Eq:
    case ExprOp::Ne:
      return kCmpPrec;
    case ExprOp::Add: case ExprOp::Sub:
      return 4;
    case ExprOp::Mul: case ExprOp::FloorDiv: case ExprOp::Mod:
      return 5;
    case ExprOp::Neg:
      return kNegPrec;
    default:
      return 7;
  }
}

const char* op_text(ExprOp op) {
  switch (op) {
    case ExprOp::Add: return " + ";
    case ExprOp::Sub: return " - ";
    case ExprOp::Mul: return " * ";
    case ExprOp::FloorDiv: return " // ";
    case ExprOp::Mod: return " % ";
    case ExprOp::Lt: return " < ";
    case ExprOp::Le: return " <= ";
    case ExprOp::Gt: return " > ";
    case ExprOp::Ge: return " >= ";
    case ExprOp::Eq: return " == ";
    case ExprOp::Ne: return " != ";
    case ExprOp::And: return " && ";
    case ExprOp::Or: return " || ";
    case ExprOp::Cdiv: return "cdiv";
    case ExprOp::Min: return "min";
    case ExprOp::Max: return "max";
    default: return "?";
  }
}

void print(const ExprNode& n, std::string& out) {
  auto wrapped = [&](const ExprNode& k, bool paren) {
    if (paren) out += '(';
    print(k, out);
    if (paren) out += ')';
  };
  switch (n.op) {
    case ExprOp::Const:
      if (n.value < 0) {  // only built by hand; the parser never makes one
        out += fmt::format("({})", n.value);
      } else {
        out += std::to_string(n.value);
      }
      return;
    case ExprOp::Var:
      out += n.name;
      return;
    case ExprOp::Neg:
      out += '-';
      wrapped(n.kids[0], precedence(n.kids[0]) < kNegPrec);
      return;
    case ExprOp::Cdiv: case ExprOp::Min: case ExprOp::Max:
      out += op_text(n.op);
      out += '(';
      for (size_t i = 0; i < n.kids.size(); ++i) {
        if (i) out += ", ";
        print(n.kids[i], out);
      }
      out += ')';
      return;
    default: {
      int p = precedence(n);
      int lp = precedence(n.kids[0]);
      wrapped(n.kids[0], lp < p || (p == kCmpPrec && lp == kCmpPrec));
      out += op_text(n.op);
      wrapped(n.kids[1], precedence(n.kids[1]) <= p);
      return;
    }
  }
}

bool same(const ExprNode& a, const ExprNode& b) {
  if (a.op != b.op || a.kids.size() != b.kids.size()) return false;
  if (a.op == ExprOp::Const && a.value != b.value) return false;
  if (a.op == ExprOp::Var && a.name != b.name) return false;
  for (size_t i = 0; i < a.kids.size(); ++i)
    if (!same(a.kids[i], b.kids[i])) return false;
  return true;
}

const ExprNode* find_symbol(const ExprNode& n, const std::function<bool(std::string_view)>& known) {
  if (n.op == ExprOp::Var && !known(n.name)) return &n;
  for (const auto& k : n.kids)
    if (const ExprNode* f = find_symbol(k, known)) return f;
  return nullptr;
}

void collect(const ExprNode& n, std::vector<std::string>& out) {
  if (n.op == ExprOp::Var) {
    for (const auto& s : out)
      if (s == n.name) return;
    out.push_back(n.name);
  }
  for (const auto& k : n.kids) collect(k, out);
}

int64_t floordiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

int64_t pymod(int64_t a, int64_t b) {
  int64_t r = a % b;
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}

[[noreturn]] void eval_error(const std::string& text, const char* what) {
  fail(Errc::expr, "evaluating '{}': {}", text, what);
}

}  // namespace

ExprError::ExprError(int column, const std::string& what, const std::string& text)
    : Error(Errc::expr, fmt::format("column {}: {} (in '{}')", column, what, text)),
      column_(column),
      what_(what) {}

namespace {
std::shared_ptr<const std::string> text_of(const ExprNode& n) {
  std::string out;
  print(n, out);
  return std::make_shared<const std::string>(std::move(out));
}
}  // namespace

Expr::Expr() : root_(std::make_shared<const ExprNode>()) {
  static const std::shared_ptr<const std::string> zero = text_of(*root_);
  text_ = zero;
}
Expr::Expr(ExprNode root) : root_(std::make_shared<const ExprNode>(std::move(root))), text_(text_of(*root_)) {}

Expr Expr::parse(std::string_view text) {
  Parser p(text);
  return Expr(p.parse_all());
}


std::vector<std::string> Expr::symbols() const {
  std::vector<std::string> out;
  collect(*root_, out);
  return out;
}

void Expr::check_symbols(const std::function<bool(std::string_view)>& known,
                         std::string_view what_is_known) const {
  if (const ExprNode* n = find_symbol(*root_, known))
    throw ExprError(n->column, fmt::format("unknown symbol '{}' (known: {})", n->name, what_is_known),
                    str());
}

bool Expr::operator==(const Expr& o) const { return same(*root_, *o.root_); }

// ---- CompiledExpr ----

CompiledExpr::CompiledExpr() : code_{{ExprOp::Const, 0, 0}} {
  static const auto zero = std::make_shared<const std::string>("0");
  text_ = zero;
}

namespace {

struct Emitter {
  const CompiledExpr::Resolver& resolve;
  const std::string& text;
  int depth = 0;
  int max_depth = 0;

  template <class Ins>
  void emit(const ExprNode& n, std::vector<Ins>& code) {
    switch (n.op) {
      case ExprOp::Const:
        code.push_back({ExprOp::Const, 0, n.value});
        push();
        return;
      case ExprOp::Var: {
        std::optional<SymbolBinding> b = resolve(n.name);
        if (!b) throw ExprError(n.column, fmt::format("unknown symbol '{}'", n.name), text);
        if (b->is_slot) {
          code.push_back({ExprOp::Var, 0, b->value});
        } else {
          code.push_back({ExprOp::Const, 0, b->value});
        }
        push();
        return;
      }
      case ExprOp::And:
      case ExprOp::Or: {
        // a && b: a; jump to the end keeping 0 if it is 0, else drop it; b as 0 or 1.
        emit(n.kids[0], code);
        size_t jump = code.size();
        code.push_back({n.op == ExprOp::And ? ExprOp::JumpIfZero : ExprOp::JumpIfNonZero, 0, 0});
        --depth;
        emit(n.kids[1], code);
        code.push_back({ExprOp::ToBool, 0, 0});
        code[jump].arg = static_cast<int64_t>(code.size());
        return;
      }
      default:
        for (const auto& k : n.kids) emit(k, code);
        code.push_back({n.op, static_cast<uint8_t>(n.kids.size()), 0});
        depth -= static_cast<int>(n.kids.size()) - 1;
        return;
    }
  }
  void push() {
    ++depth;
    if (depth > max_depth) max_depth = depth;
  }
};

}  // namespace

CompiledExpr CompiledExpr::compile(const Expr& e, const Resolver& resolve) {
  CompiledExpr c;
  c.text_ = e.text_;
  c.code_.clear();
  Emitter em{resolve, *c.text_};
  em.emit(e.root(), c.code_);
  if (em.max_depth > kMaxStack)
    throw ExprError(1, fmt::format("expression needs more than {} stack slots", kMaxStack), *c.text_);
  bool constant = true;
  for (const auto& ins : c.code_)
    if (ins.op == ExprOp::Var) constant = false;
  if (constant && c.code_.size() > 1) {
    int64_t v = c.eval(nullptr);  // throws on a constant division by zero
    c.code_.assign(1, {ExprOp::Const, 0, v});
  }
  return c;
}

int64_t CompiledExpr::eval(const int64_t* slots) const {
  int64_t st[kMaxStack];
  int sp = 0;
  const size_t n = code_.size();
  for (size_t pc = 0; pc < n; ++pc) {
    const Ins& ins = code_[pc];
    switch (ins.op) {
      case ExprOp::JumpIfZero:
        if (st[sp - 1] == 0) pc = static_cast<size_t>(ins.arg) - 1;
        else --sp;
        break;
      case ExprOp::JumpIfNonZero:
        if (st[sp - 1] != 0) {
          st[sp - 1] = 1;
          pc = static_cast<size_t>(ins.arg) - 1;
        } else {
          --sp;
        }
        break;
      case ExprOp::ToBool: st[sp - 1] = st[sp - 1] != 0; break;
      case ExprOp::Const: st[sp++] = ins.arg; break;
      case ExprOp::Var: st[sp++] = slots[ins.arg]; break;
      case ExprOp::Neg:
        if (st[sp - 1] == std::numeric_limits<int64_t>::min()) eval_error(*text_, "overflow");
        st[sp - 1] = -st[sp - 1];
        break;
      case ExprOp::Min: case ExprOp::Max: {
        int n = ins.nargs;
        int64_t r = st[sp - n];
        for (int i = sp - n + 1; i < sp; ++i)
          r = ins.op == ExprOp::Min ? (st[i] < r ? st[i] : r) : (st[i] > r ? st[i] : r);
        sp -= n;
        st[sp++] = r;
        break;
      }
      default: {
        int64_t b = st[--sp];
        int64_t a = st[sp - 1];
        int64_t r = 0;
        switch (ins.op) {
          case ExprOp::Add: if (__builtin_add_overflow(a, b, &r)) eval_error(*text_, "overflow"); break;
          case ExprOp::Sub: if (__builtin_sub_overflow(a, b, &r)) eval_error(*text_, "overflow"); break;
          case ExprOp::Mul: if (__builtin_mul_overflow(a, b, &r)) eval_error(*text_, "overflow"); break;
          case ExprOp::FloorDiv: case ExprOp::Mod: case ExprOp::Cdiv:
            if (b == 0) eval_error(*text_, "division by zero");
            if (b == -1 && a == std::numeric_limits<int64_t>::min()) eval_error(*text_, "overflow");
            if (ins.op == ExprOp::FloorDiv) {
              r = floordiv(a, b);
            } else if (ins.op == ExprOp::Mod) {
              r = pymod(a, b);
            } else {
              // ceil(a / b) = -floor(-a / b); -a overflows only for INT64_MIN.
              if (a == std::numeric_limits<int64_t>::min()) eval_error(*text_, "overflow");
              r = -floordiv(-a, b);
            }
            break;
          case ExprOp::Lt: r = a < b; break;
          case ExprOp::Le: r = a <= b; break;
          case ExprOp::Gt: r = a > b; break;
          case ExprOp::Ge: r = a >= b; break;
          case ExprOp::Eq: r = a == b; break;
          case ExprOp::Ne: r = a != b; break;
          default: eval_error(*text_, "bad instruction");
        }
        st[sp - 1] = r;
      }
    }
  }
  return st[0];
}

}  // namespace kiln
