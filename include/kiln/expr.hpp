// The expression language of sizes, grids and constraints:
//   integers, symbols, + - * // % (floor division and modulo, as in Python),
//   unary minus, parentheses, cdiv(a, b), min(a, b, ...), max(a, b, ...),
//   comparisons (< <= > >= == !=, value 0 or 1; they do not chain), and
//   && and || (value 0 or 1, short-circuit: `B == 0 || N % B == 0` is safe),
//   && binding tighter than ||, both looser than comparisons. A tree is at
//   most kMaxExprHeight tall (a flat chain a + b + c ... counts one level per
//   operator), so no walker of it recurses deeper than that. Parsed once
//   into a tree (Expr), compiled once into a flat program (CompiledExpr) that
//   evaluates without allocating.
// Thread-safety: a parsed Expr is immutable; eval may run on any number of threads.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/error.hpp"

namespace kiln {

// The tallest expression tree the parser makes; taller input is an ExprError.
constexpr int kMaxExprHeight = 100;

enum class ExprOp : uint8_t {
  Const, Var, Neg,
  Add, Sub, Mul, FloorDiv, Mod,
  Lt, Le, Gt, Ge, Eq, Ne,
  Cdiv, Min, Max,
  And, Or,
  // Instructions of a compiled program only, never in a tree:
  JumpIfZero,     // top == 0: keep it (0) and jump to arg; else pop
  JumpIfNonZero,  // top != 0: make it 1 and jump to arg; else pop
  ToBool,         // top = (top != 0)
};

struct ExprNode {
  ExprOp op = ExprOp::Const;
  int64_t value = 0;      // Const
  std::string name;       // Var
  int column = 0;         // 1-based column in the parsed text; 0 when built by hand
  std::vector<ExprNode> kids;
  int height = 1;         // 1 + the tallest kid's (kept by the parser, which bounds it)
};

// A parse or resolve error that knows where in the expression text it happened.
class ExprError : public Error {
 public:
  ExprError(int column, const std::string& what, const std::string& text);
  int column() const noexcept { return column_; }
  const std::string& what_only() const noexcept { return what_; }

 private:
  int column_;
  std::string what_;
};

class Expr {
 public:
  Expr();  // the constant 0
  explicit Expr(ExprNode root);

  // Parses `text`; throws ExprError (with the column) on bad input.
  static Expr parse(std::string_view text);

  const ExprNode& root() const { return *root_; }
  // Text that parses back to the same tree, with the fewest parentheses (made once).
  const std::string& str() const { return *text_; }
  // Distinct symbols, in order of first appearance.
  std::vector<std::string> symbols() const;
  // Throws ExprError naming the first symbol that `known` rejects.
  void check_symbols(const std::function<bool(std::string_view)>& known,
                     std::string_view what_is_known) const;
  // Structural equality (columns ignored).
  bool operator==(const Expr& o) const;

 private:
  std::shared_ptr<const ExprNode> root_;
  std::shared_ptr<const std::string> text_;  // str(), shared with the CompiledExprs made of it
  friend class CompiledExpr;
};

// How a symbol is bound when compiling: a slot of the value array passed to
// eval(), or a constant folded in (a config's parameter values, say).
struct SymbolBinding {
  bool is_slot = true;
  int64_t value = 0;  // slot index, or the constant
  static SymbolBinding slot(int64_t i) { return {true, i}; }
  static SymbolBinding constant(int64_t v) { return {false, v}; }
};

class CompiledExpr {
 public:
  static constexpr int kMaxStack = 64;
  using Resolver = std::function<std::optional<SymbolBinding>(std::string_view)>;

  CompiledExpr();  // the constant 0
  // Throws ExprError for a symbol the resolver does not know, or for
  // constant parts that cannot be evaluated (division by zero).
  static CompiledExpr compile(const Expr& e, const Resolver& resolve);

  // Evaluates with `slots` holding the slot values. Allocates nothing.
  // Throws Error(Errc::expr) on division by zero or overflow.
  int64_t eval(const int64_t* slots) const;

  bool is_constant() const { return code_.size() == 1 && code_[0].op == ExprOp::Const; }
  int64_t constant_value() const { return code_[0].arg; }
  const std::string& text() const { return *text_; }

 private:
  struct Ins {
    ExprOp op;
    uint8_t nargs;
    int64_t arg;  // constant, or slot index
  };
  std::vector<Ins> code_;
  std::shared_ptr<const std::string> text_;  // the expression's, shared with it
};

}  // namespace kiln
