#include "backends/serialize.hpp"

#include "core/format.hpp"

namespace kiln {

using nlohmann::json;

namespace {
DType dtype_from(const std::string& s) {
  if (auto d = dtype_from_name(s)) return *d;
  fail(Errc::internal, "unknown dtype '{}' in a serialized request", s);
}
}  // namespace

json to_json(const CompileRequest& r) {
  json args = json::array();
  for (const auto& a : r.args) args.push_back({{"name", a.name}, {"dtype", dtype_name(a.dtype)}, {"pointer", a.pointer}});
  json defines = json::array();
  for (const auto& [n, v] : r.defines) defines.push_back({n, v});
  return {{"backend", r.backend},         {"kernel", r.kernel},         {"config", r.config_text},
          {"entry", r.entry},             {"source_name", r.source_name}, {"source_text", r.source_text},
          {"include_dirs", r.include_dirs}, {"defines", defines},       {"args", args},
          {"tensor_maps", r.tensor_maps}, {"workspace", r.workspace}, {"cflags", r.cflags}, {"pdl", r.pdl}};
}

CompileRequest compile_request_from_json(const json& j) {
  CompileRequest r;
  r.backend = j.at("backend").get<std::string>();
  r.kernel = j.at("kernel").get<std::string>();
  r.config_text = j.at("config").get<std::string>();
  r.entry = j.at("entry").get<std::string>();
  r.source_name = j.at("source_name").get<std::string>();
  r.source_text = j.at("source_text").get<std::string>();
  r.include_dirs = j.at("include_dirs").get<std::vector<std::string>>();
  for (const auto& d : j.at("defines")) r.defines.push_back({d.at(0).get<std::string>(), d.at(1).get<int64_t>()});
  for (const auto& a : j.at("args"))
    r.args.push_back({a.at("name").get<std::string>(), dtype_from(a.at("dtype").get<std::string>()),
                      a.at("pointer").get<bool>()});
  r.tensor_maps = j.at("tensor_maps").get<int>();
  r.pdl = j.value("pdl", false);
  r.workspace = j.value("workspace", false);
  if (r.tensor_maps < 0 || r.tensor_maps > 4) fail(Errc::internal, "a compile request with {} tensor maps", r.tensor_maps);
  r.cflags = j.at("cflags").get<std::vector<std::string>>();
  return r;
}

json to_json(const KernelMeta& m) {
  return {{"symbol", m.symbol},           {"target", m.target},           {"registers", m.registers},
          {"static_shared", m.static_shared}, {"local_bytes", m.local_bytes}, {"spill_bytes", m.spill_bytes},
          {"max_threads", m.max_threads}, {"tensor_maps", m.tensor_maps}, {"workspace", m.workspace}};
}

KernelMeta kernel_meta_from_json(const json& j) {
  KernelMeta m;
  m.symbol = j.at("symbol").get<std::string>();
  m.target = j.at("target").get<std::string>();
  m.registers = j.at("registers").get<int>();
  m.static_shared = j.at("static_shared").get<int>();
  m.local_bytes = j.at("local_bytes").get<int>();
  m.spill_bytes = j.at("spill_bytes").get<int>();
  m.max_threads = j.at("max_threads").get<int>();
  m.tensor_maps = j.value("tensor_maps", 0);  // absent from binaries stored before tensor maps
  m.workspace = j.value("workspace", false);  // (and before workspaces)
  if (m.symbol.empty() || m.registers < 0 || m.static_shared < 0 || m.local_bytes < 0 || m.max_threads < 0 ||
      m.tensor_maps < 0 || m.tensor_maps > 4)
    fail(Errc::launch, "a binary's launch metadata is missing or inconsistent");
  return m;
}

json binary_meta_to_json(const Binary& b) {
  return {{"key", b.key},       {"backend", b.backend},
          {"kernel", b.kernel}, {"config", b.config_text},
          {"entry", b.entry},   {"compile_seconds", b.compile_seconds},
          {"log", b.log},       {"size", b.bytes.size()},
          {"meta", to_json(b.meta)}};
}

std::string dump_json(const json& j, int indent) {
  return j.dump(indent, ' ', false, json::error_handler_t::replace);
}

Binary binary_from_meta_json(const json& j) {
  Binary b;
  b.key = j.at("key").get<std::string>();
  b.backend = j.at("backend").get<std::string>();
  b.kernel = j.at("kernel").get<std::string>();
  b.config_text = j.at("config").get<std::string>();
  b.entry = j.at("entry").get<std::string>();
  b.compile_seconds = j.at("compile_seconds").get<double>();
  b.log = j.at("log").get<std::string>();
  b.meta = kernel_meta_from_json(j.at("meta"));
  return b;
}

}  // namespace kiln
