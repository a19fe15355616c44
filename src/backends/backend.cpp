#include "kiln/backend.hpp"

#include "backends/cpu/cpu_backend.hpp"
#include "core/format.hpp"
#include "kiln/args.hpp"

namespace kiln {

CompileRequest make_compile_request(const KernelSpec& spec, const Config& config) {
  CompileRequest r;
  r.backend = spec.backend;
  r.kernel = spec.name;
  r.config_text = config.str();
  r.entry = spec.entry;
  std::error_code ec;
  auto abs = std::filesystem::absolute(spec.source_path, ec);
  r.source_name = (ec ? spec.source_path : abs.lexically_normal()).string();
  r.source_text = spec.source_text;
  r.include_dirs.push_back(std::filesystem::path(r.source_name).parent_path().string());
  for (const auto& d : spec.include_dirs) r.include_dirs.push_back(d.string());
  r.defines = config.values;
  for (const auto& a : spec.args) r.args.push_back({a.name, a.dtype, a.pointer});
  r.cflags = spec.cflags;
  return r;
}

GridPlan::GridPlan(const KernelSpec& spec, const Config& config) {
  for (const auto& e : spec.grid) dims_.push_back(compile_expr(spec, e, &config));
}

std::shared_ptr<Backend> make_backend(const std::string& name, const Options& opts) {
  if (name == "cpu") return std::make_shared<CpuBackend>(opts);
  if (name == "cuda")
    fail(Errc::usage, "the cuda backend is not built into this kiln yet; use backend = \"cpu\"");
  fail(Errc::usage, "unknown backend '{}' (known: cpu, cuda)", name);
}

}  // namespace kiln
