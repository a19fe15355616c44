#include <gtest/gtest.h>

#include <limits>
#include <random>

#include "kiln/expr.hpp"

using namespace kiln;

namespace {

int64_t eval_text(const std::string& text, std::map<std::string, int64_t> vars = {}) {
  Expr e = Expr::parse(text);
  std::vector<int64_t> slots;
  std::map<std::string, int64_t> slot_of;
  for (auto& [n, v] : vars) {
    slot_of[n] = static_cast<int64_t>(slots.size());
    slots.push_back(v);
  }
  auto c = CompiledExpr::compile(e, [&](std::string_view s) -> std::optional<SymbolBinding> {
    auto it = slot_of.find(std::string(s));
    if (it == slot_of.end()) return std::nullopt;
    return SymbolBinding::slot(it->second);
  });
  return c.eval(slots.data());
}

int error_column(const std::string& text) {
  try {
    Expr::parse(text);
  } catch (const ExprError& e) {
    return e.column();
  }
  return -1;
}

}  // namespace

TEST(Expr, PrintsWithTheFewestParentheses) {
  EXPECT_EQ(Expr::parse("a+b*(c+d)").str(), "a + b * (c + d)");
  EXPECT_EQ(Expr::parse("(a+b)*(c+d)").str(), "(a + b) * (c + d)");
  EXPECT_NE(Expr::parse("a+b*(c+d)").str(), Expr::parse("(a+b)*(c+d)").str());
  EXPECT_EQ(Expr::parse("-(a-b)").str(), "-(a - b)");
  EXPECT_EQ(Expr::parse("a - (b - c)").str(), "a - (b - c)");
  EXPECT_EQ(Expr::parse("(a - b) - c").str(), "a - b - c");
  EXPECT_EQ(Expr::parse("a // (b * c)").str(), "a // (b * c)");
  EXPECT_EQ(Expr::parse("(a // b) * c").str(), "a // b * c");
  EXPECT_EQ(Expr::parse("--a").str(), "--a");
  EXPECT_EQ(Expr::parse("-a * b").str(), "-a * b");
  EXPECT_EQ(Expr::parse("-(a * b)").str(), "-(a * b)");
  EXPECT_EQ(Expr::parse("cdiv( M ,BM )").str(), "cdiv(M, BM)");
  EXPECT_EQ(Expr::parse("max(1,2,min(a,b))").str(), "max(1, 2, min(a, b))");
  EXPECT_EQ(Expr::parse("(a < b)").str(), "a < b");
  EXPECT_EQ(Expr::parse("(a < b) == 1").str(), "(a < b) == 1");
  EXPECT_EQ(Expr::parse("a + (b < c)").str(), "a + (b < c)");
}

TEST(Expr, EvaluatesLikePythonIntegers) {
  EXPECT_EQ(eval_text("7 // 2"), 3);
  EXPECT_EQ(eval_text("-7 // 2"), -4);
  EXPECT_EQ(eval_text("7 // -2"), -4);
  EXPECT_EQ(eval_text("-7 % 3"), 2);
  EXPECT_EQ(eval_text("7 % -3"), -2);
  EXPECT_EQ(eval_text("cdiv(7, 2)"), 4);
  EXPECT_EQ(eval_text("cdiv(8, 2)"), 4);
  EXPECT_EQ(eval_text("cdiv(-7, 2)"), -3);
  EXPECT_EQ(eval_text("cdiv(0, 5)"), 0);
  EXPECT_EQ(eval_text("min(5, 3, 9)"), 3);
  EXPECT_EQ(eval_text("max(5, 3, 9)"), 9);
  EXPECT_EQ(eval_text("2 + 3 * 4 - 1"), 13);
  EXPECT_EQ(eval_text("-2 * 3"), -6);
  EXPECT_EQ(eval_text("3 <= 3"), 1);
  EXPECT_EQ(eval_text("3 != 3"), 0);
  EXPECT_EQ(eval_text("cdiv(M, BM) * BM", {{"M", 100}, {"BM", 32}}), 128);
}

TEST(Expr, EvaluationErrorsAreErrorsNotCrashes) {
  EXPECT_THROW(eval_text("1 // (a - a)", {{"a", 3}}), Error);
  EXPECT_THROW(eval_text("1 % (a - a)", {{"a", 3}}), Error);
  EXPECT_THROW(eval_text("cdiv(1, a - a)", {{"a", 3}}), Error);
  EXPECT_THROW(eval_text("a * a", {{"a", std::numeric_limits<int64_t>::max()}}), Error);
  EXPECT_THROW(eval_text("a + 1", {{"a", std::numeric_limits<int64_t>::max()}}), Error);
  EXPECT_THROW(eval_text("-a - 2", {{"a", std::numeric_limits<int64_t>::max()}}), Error);
  // A constant division by zero is found when compiling.
  EXPECT_THROW(eval_text("1 // 0"), Error);
}

TEST(Expr, ParseErrorsNameTheColumn) {
  EXPECT_EQ(error_column("cdiv(M, BM"), 11);
  EXPECT_EQ(error_column("a + * b"), 5);
  EXPECT_EQ(error_column("a / b"), 3);
  EXPECT_EQ(error_column("foo(1)"), 1);
  EXPECT_EQ(error_column("1 < 2 < 3"), 7);
  EXPECT_EQ(error_column(""), 1);
  EXPECT_EQ(error_column("a b"), 3);
  EXPECT_EQ(error_column("(a))"), 4);
  EXPECT_EQ(error_column("cdiv(1)"), 7);
  EXPECT_EQ(error_column("min(1)"), 6);
  EXPECT_EQ(error_column("min"), 1);
  EXPECT_EQ(error_column("a = b"), 3);
  EXPECT_EQ(error_column("99999999999999999999"), 1);
  EXPECT_EQ(error_column("3x"), 2);
  EXPECT_EQ(error_column("a $ b"), 3);
  EXPECT_EQ(error_column("()"), 2);
}

TEST(Expr, DeepNestingIsAnErrorNotAStackOverflow) {
  std::string deep(100000, '(');
  EXPECT_THROW(Expr::parse(deep + "1"), ExprError);
  std::string minus(100000, '-');
  EXPECT_THROW(Expr::parse(minus + "1"), ExprError);
  std::string calls;
  for (int i = 0; i < 5000; ++i) calls += "min(1,";
  EXPECT_THROW(Expr::parse(calls), ExprError);
}

TEST(Expr, UnknownSymbolsAreNamedWithTheirColumn) {
  Expr e = Expr::parse("cdiv(M, Q) + N");
  try {
    e.check_symbols([](std::string_view s) { return s == "M" || s == "N"; }, "M, N");
    FAIL() << "no error";
  } catch (const ExprError& err) {
    EXPECT_EQ(err.column(), 9);
    EXPECT_NE(std::string(err.what()).find("'Q'"), std::string::npos);
  }
  EXPECT_EQ(e.symbols(), (std::vector<std::string>{"M", "Q", "N"}));
}

TEST(Expr, ConstantsFoldAndBindingsSubstitute) {
  Expr e = Expr::parse("cdiv(M, BM) * 2");
  auto c = CompiledExpr::compile(e, [](std::string_view s) -> std::optional<SymbolBinding> {
    if (s == "BM") return SymbolBinding::constant(32);
    if (s == "M") return SymbolBinding::constant(100);
    return std::nullopt;
  });
  EXPECT_TRUE(c.is_constant());
  EXPECT_EQ(c.constant_value(), 8);
  EXPECT_THROW(CompiledExpr::compile(e, [](std::string_view) { return std::nullopt; }), ExprError);
}

TEST(Expr, LogicalOperatorsShortCircuitAndBindLooserThanComparisons) {
  auto ev = [](const char* text, int64_t b, int64_t n) {
    auto c = CompiledExpr::compile(Expr::parse(text), [](std::string_view s) -> std::optional<SymbolBinding> {
      if (s == "B") return SymbolBinding::slot(0);
      if (s == "N") return SymbolBinding::slot(1);
      return std::nullopt;
    });
    int64_t slots[2] = {b, n};
    return c.eval(slots);
  };
  EXPECT_EQ(ev("B == 0 || N % B == 0", 0, 7), 1);  // no division by zero
  EXPECT_EQ(ev("B == 0 || N % B == 0", 3, 7), 0);
  EXPECT_EQ(ev("B != 0 && N % B == 0", 0, 7), 0);
  EXPECT_EQ(ev("B != 0 && N % B == 0", 7, 14), 1);
  EXPECT_EQ(ev("B == 1 || B == 2 && N == 3", 1, 0), 1);   // && binds tighter
  EXPECT_EQ(ev("(B == 1 || B == 2) && N == 3", 1, 0), 0);
  EXPECT_EQ(ev("N && B", 5, 2), 1);                       // values as truth, results 0 or 1
  EXPECT_EQ(Expr::parse("a < b || c && d").str(), "a < b || c && d");
  EXPECT_EQ(Expr::parse("(a || b) && c").str(), "(a || b) && c");
  EXPECT_THROW(Expr::parse("a & b"), ExprError);
  EXPECT_THROW(Expr::parse("a | b"), ExprError);
  EXPECT_THROW(Expr::parse("a ||"), ExprError);
}

// ---- property test: random trees print, parse back, and evaluate the same ----

namespace {

ExprNode random_tree(std::mt19937_64& rng, int depth) {
  std::uniform_int_distribution<int> pick(0, depth <= 0 ? 1 : 12);
  ExprNode n;
  int k = pick(rng);
  static const char* names[] = {"a", "b", "M", "BM", "x_1"};
  if (k == 0) {
    n.op = ExprOp::Const;
    n.value = std::uniform_int_distribution<int64_t>(0, 100)(rng);
    return n;
  }
  if (k == 1) {
    n.op = ExprOp::Var;
    n.name = names[std::uniform_int_distribution<int>(0, 4)(rng)];
    return n;
  }
  static const ExprOp binops[] = {ExprOp::Add, ExprOp::Sub, ExprOp::Mul, ExprOp::FloorDiv, ExprOp::Mod,
                                  ExprOp::Lt,  ExprOp::Ge,  ExprOp::Eq,  ExprOp::And,      ExprOp::Or};
  if (k == 2 || k == 3) {
    n.op = ExprOp::Neg;
    n.kids.push_back(random_tree(rng, depth - 1));
    return n;
  }
  if (k == 4) {
    static const ExprOp fns[] = {ExprOp::Cdiv, ExprOp::Min, ExprOp::Max};
    n.op = fns[std::uniform_int_distribution<int>(0, 2)(rng)];
    int args = n.op == ExprOp::Cdiv ? 2 : std::uniform_int_distribution<int>(2, 4)(rng);
    for (int i = 0; i < args; ++i) n.kids.push_back(random_tree(rng, depth - 1));
    return n;
  }
  n.op = binops[std::uniform_int_distribution<int>(0, 9)(rng)];
  n.kids.push_back(random_tree(rng, depth - 1));
  n.kids.push_back(random_tree(rng, depth - 1));
  return n;
}

// A direct tree evaluator, independent of the compiled program.
std::optional<int64_t> eval_tree(const ExprNode& n, const std::map<std::string, int64_t>& vars) {
  auto floordiv = [](int64_t a, int64_t b) {
    int64_t q = a / b;
    if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
    return q;
  };
  if (n.op == ExprOp::And || n.op == ExprOp::Or) {  // short-circuit: the right side may be an error
    auto a = eval_tree(n.kids[0], vars);
    if (!a) return std::nullopt;
    if ((n.op == ExprOp::And) == (*a == 0)) return n.op == ExprOp::And ? 0 : 1;
    auto b = eval_tree(n.kids[1], vars);
    if (!b) return std::nullopt;
    return *b != 0 ? 1 : 0;
  }
  std::vector<int64_t> v;
  for (const auto& k : n.kids) {
    auto x = eval_tree(k, vars);
    if (!x) return std::nullopt;
    v.push_back(*x);
  }
  __int128 r = 0;
  switch (n.op) {
    case ExprOp::Const: return n.value;
    case ExprOp::Var: return vars.at(n.name);
    case ExprOp::Neg: r = -static_cast<__int128>(v[0]); break;
    case ExprOp::Add: r = static_cast<__int128>(v[0]) + v[1]; break;
    case ExprOp::Sub: r = static_cast<__int128>(v[0]) - v[1]; break;
    case ExprOp::Mul: r = static_cast<__int128>(v[0]) * v[1]; break;
    case ExprOp::FloorDiv:
    case ExprOp::Mod:
    case ExprOp::Cdiv:
      if (v[1] == 0) return std::nullopt;
      if (v[1] == -1 && v[0] == std::numeric_limits<int64_t>::min()) return std::nullopt;
      if (n.op == ExprOp::FloorDiv) r = floordiv(v[0], v[1]);
      else if (n.op == ExprOp::Mod) r = v[0] - floordiv(v[0], v[1]) * v[1];
      else {
        if (v[0] == std::numeric_limits<int64_t>::min()) return std::nullopt;
        r = -floordiv(-v[0], v[1]);
      }
      break;
    case ExprOp::Lt: r = v[0] < v[1]; break;
    case ExprOp::Le: r = v[0] <= v[1]; break;
    case ExprOp::Gt: r = v[0] > v[1]; break;
    case ExprOp::Ge: r = v[0] >= v[1]; break;
    case ExprOp::Eq: r = v[0] == v[1]; break;
    case ExprOp::Ne: r = v[0] != v[1]; break;
    case ExprOp::Min: r = *std::min_element(v.begin(), v.end()); break;
    case ExprOp::Max: r = *std::max_element(v.begin(), v.end()); break;
    default: return std::nullopt;
  }
  if (r > std::numeric_limits<int64_t>::max() || r < std::numeric_limits<int64_t>::min()) return std::nullopt;
  return static_cast<int64_t>(r);
}

}  // namespace

TEST(Expr, PropertyPrintParsePrintRoundTripsAndEvaluatesAlike) {
  std::mt19937_64 rng(12345);
  int compared = 0;
  for (int iter = 0; iter < 5000; ++iter) {
    Expr e(random_tree(rng, 6));
    std::string text = e.str();
    Expr back = Expr::parse(text);
    ASSERT_TRUE(back == e) << "tree changed through '" << text << "' -> '" << back.str() << "'";
    ASSERT_EQ(back.str(), text);

    std::map<std::string, int64_t> vars;
    std::vector<int64_t> slots;
    for (const char* n : {"a", "b", "M", "BM", "x_1"}) {
      int64_t v = std::uniform_int_distribution<int64_t>(-50, 50)(rng);
      vars[n] = v;
      slots.push_back(v);
    }
    std::optional<int64_t> want = eval_tree(e.root(), vars);
    std::optional<int64_t> got;
    try {
      auto c = CompiledExpr::compile(back, [](std::string_view s) -> std::optional<SymbolBinding> {
        static const char* names[] = {"a", "b", "M", "BM", "x_1"};
        for (int i = 0; i < 5; ++i)
          if (s == names[i]) return SymbolBinding::slot(i);
        return std::nullopt;
      });
      got = c.eval(slots.data());
    } catch (const Error&) {
      got = std::nullopt;
    }
    ASSERT_EQ(want.has_value(), got.has_value()) << text;
    if (want) {
      ASSERT_EQ(*want, *got) << text;
      ++compared;
    }
  }
  EXPECT_GT(compared, 1000);
}
