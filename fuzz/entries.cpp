#include "entries.hpp"

#include <cstdio>
#include <string>

#include <map>

#include "compile/code_cache.hpp"
#include "kiln/memory_plan.hpp"
#include "kiln/artifact.hpp"
#include "kiln/hash.hpp"
#include "core/format.hpp"
#include "kiln/expr.hpp"
#include "kiln/program.hpp"
#include "emit.hpp"
#include "kiln/spec.hpp"
#include "kiln/tuning.hpp"

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
  // A plain spec, then the text as a kernel family's members (a plain spec refuses a member at once).
  for (const char* member : {"", "f32_nt", "bf16_nt_gated", "f32_nt_residual", "bf16_nn"}) {
    try {
      KernelSpec s = parse_spec(
          text, "fuzz.toml", [](const std::filesystem::path&) -> std::optional<std::string> { return std::string("void k() {}"); },
          member);
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
}

void program_one(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  try {
    ProgramSpec p = parse_program(text, std::filesystem::path(KILN_SOURCE_DIR) / "kernels/programs/fuzz.toml");
    (void)p.str();
    (void)p.lower();
    for (int64_t v : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{3037000500}}) {
      std::map<std::string, int64_t> values;
      for (const auto& s : p.symbols) values[s] = v;
      std::vector<int64_t> bytes;
      std::vector<std::pair<int, int>> live;
      try {
        for (const auto& t : p.buffers) {
          bytes.push_back(std::min<int64_t>(p.elements(t, values), int64_t{1} << 40));
          live.push_back({0, static_cast<int>(bytes.size())});
        }
        (void)plan_memory(bytes, live);
      } catch (const Error&) {
      }
    }
    const std::string code = emit_program_cpp(p);
    // Program text reaches the C++ only escaped: no literal runs over a line
    // end, and no byte outside printable ASCII but the line ends.
    bool in_string = false, escaped = false;
    for (char c : code) {
      const unsigned char u = static_cast<unsigned char>(c);
      if (c == '\n') {
        if (in_string) broken("a string literal in the emitted C++ runs over a line end", text);
        continue;
      }
      if (u < 0x20 || u >= 0x7f) broken("the emitted C++ holds a byte outside printable ASCII", text);
      if (in_string) {
        if (escaped) escaped = false;
        else if (c == '\\') escaped = true;
        else if (c == '"') in_string = false;
      } else if (c == '"') {
        in_string = true;
      }
    }
  } catch (const Error&) {
  } catch (const std::exception& e) {
    broken(e.what(), text);
  }
}

namespace {
void artifact_bytes(const std::string& bytes);
}

// As given, and with its header's length and checksum made to fit the body
// (else nearly every mutation stops at the checksum, and the entries, the
// manifest and what they hold would go unfuzzed).
void artifact_one(const uint8_t* data, size_t size) {
  std::string bytes(reinterpret_cast<const char*>(data), size);
  artifact_bytes(bytes);
  const size_t eol = bytes.find('\n');
  if (bytes.rfind("kiln-artifact ", 0) == 0 && eol != std::string::npos && eol < 200) {
    const std::string body = bytes.substr(eol + 1);
    artifact_bytes(fmt::format("kiln-artifact {} {:016x} {}\n", ArtifactManifest::kFormat,
                               hash64(body.data(), body.size()), body.size()) +
                   body);
  }
}

namespace {
void artifact_bytes(const std::string& bytes) {
  try {
    Artifact a = Artifact::parse(bytes, "fuzz");
    for (const auto& [name, d] : a.entries()) {
      if (name.compare(0, 9, "binaries/") == 0) {
        std::string key = std::filesystem::path(name).stem().string();
        (void)CodeCache::decode(d, key);
      }
    }
    TuningKey any;
    for (const auto& r : a.record_texts()) (void)record_from_text(r, any);
    (void)a.manifest().kernels.size();
  } catch (const Error&) {
  } catch (const std::exception& e) {
    broken(e.what(), "(an artifact)");
  }
}
}  // namespace

}  // namespace kiln::fuzz
