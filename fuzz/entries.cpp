#include "entries.hpp"

#include <cstdio>
#include <string>

#include "kiln/expr.hpp"
#include "kiln/spec.hpp"

namespace kiln::fuzz {

namespace {
[[noreturn]] void broken(const char* what, const std::string& input) {
  std::fprintf(stderr, "fuzz: %s for input '%s'\n", what, input.c_str());
  __builtin_trap();
}
}  // namespace

void expr_one(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  Expr e;
  try {
    e = Expr::parse(text);
  } catch (const ExprError& err) {
    if (err.column() < 1 || static_cast<size_t>(err.column()) > text.size() + 1) broken("column out of range", text);
    return;
  }
  std::string printed = e.str();
  Expr back;
  try {
    back = Expr::parse(printed);
  } catch (const Error&) {
    broken("printed text does not parse", text);
  }
  if (!(back == e)) broken("print/parse changed the tree", text);
  if (back.str() != printed) broken("print/parse/print changed the text", text);
  int64_t slots[4] = {7, -3, 1 << 20, 0};
  try {
    auto c = CompiledExpr::compile(e, [](std::string_view s) -> std::optional<SymbolBinding> {
      return SymbolBinding::slot(static_cast<int64_t>(s.size() % 4));
    });
    (void)c.eval(slots);
  } catch (const Error&) {
  }
}

void spec_one(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  try {
    KernelSpec s = parse_spec(text, "fuzz.toml", [](const std::filesystem::path&) -> std::optional<std::string> {
      return std::string("void k() {}");
    });
    for (const auto& g : s.grid) (void)g.str();
    if (s.space.size() <= 64) (void)s.space.all();
    auto pts = s.tuning.hint_point_list();
    (void)pts;
    (void)s.space.hash();
  } catch (const Error&) {
  } catch (const std::exception& e) {
    broken(e.what(), text);
  }
}

}  // namespace kiln::fuzz
