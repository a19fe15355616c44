// kiln backends [--json]: each backend, whether it can run here and why not,
// its device, its compiler's and driver's versions, and the libraries it calls.
#include <cstdio>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "backends/cuda/cuda_backend.hpp"
#include "backends/serialize.hpp"
#include "commands.hpp"
#include "kiln/ext/library.hpp"
#include "kiln/runtime.hpp"

namespace kiln::cli {

namespace {

nlohmann::json describe_cpu(const Options& opts) {
  auto b = make_backend("cpu", opts);
  const DeviceInfo& i = b->device().info();
  nlohmann::json j = {{"backend", "cpu"}, {"available", true}, {"reason", nullptr}};
  j["device"] = {{"name", i.name}, {"threads", i.multiprocessors}, {"llc_bytes", i.l2_bytes}, {"memory_bytes", i.memory_bytes}};
  try {
    std::string id = b->toolchain_identity();
    j["compiler"] = id.substr(0, id.find("\nflags"));
  } catch (const Error& e) {
    j["available"] = false;
    j["reason"] = e.what();
  }
  return j;
}

// The libraries a backend calls for library choices, and whether each can be used here.
nlohmann::json libraries_of(const std::string& backend, const Options& opts) {
  nlohmann::json out = nlohmann::json::array();
  auto b = make_backend(backend, opts);
  for (Library* l : b->libraries()) {
    const std::string why = l->unavailable();
    out.push_back({{"name", l->name()}, {"ranked", l->ranked()}, {"available", why.empty()},
                   {"reason", why.empty() ? nlohmann::json(nullptr) : nlohmann::json(why)}});
  }
  return out;
}

// `backend_reason`: why the backend cannot run here, said once above, not per library.
std::string libraries_text(const nlohmann::json& libs, const nlohmann::json& backend_reason) {
  std::string t;
  for (const auto& l : libs) {
    std::string why = l["available"].get<bool>() ? "available" : l["reason"].get<std::string>();
    if (backend_reason.is_string() && why == backend_reason.get<std::string>()) why = "not without the backend";
    t += fmt::format("{}{} ({})", t.empty() ? "" : ", ", l["name"].get<std::string>(), why);
  }
  return t.empty() ? "none" : t;
}

std::string gib(int64_t b) { return fmt::format("{:.1f} GiB", static_cast<double>(b) / (1 << 30)); }

}  // namespace

void add_backends(CLI::App& app, Globals&) {
  auto* cmd = app.add_subcommand("backends", "Show each backend: whether it can run here (and why not), its device, "
                                             "compiler and driver versions");
  auto json = std::make_shared<bool>(false);
  cmd->add_flag("--json", *json, "Print one JSON object");
  cmd->callback([json] {
    isolate_stdout();
    Options opts = Options::from_env();
    nlohmann::json cpu = describe_cpu(opts), cuda = describe_cuda(opts);
    cpu["libraries"] = libraries_of("cpu", opts);
    cuda["libraries"] = libraries_of("cuda", opts);
    if (*json) {
      std::fprintf(out(), "%s\n", dump_json(nlohmann::json{{"backends", {cpu, cuda}}}, 2).c_str());
      return;
    }
    std::fprintf(out(), "cpu   available: %s\n", cpu["device"]["name"].get<std::string>().c_str());
    std::fprintf(out(), "      %d threads run a grid, last-level cache %s, memory %s\n",
                 cpu["device"]["threads"].get<int>(), gib(cpu["device"]["llc_bytes"].get<int64_t>()).c_str(),
                 gib(cpu["device"]["memory_bytes"].get<int64_t>()).c_str());
    std::fprintf(out(), "      libraries: %s\n", libraries_text(cpu["libraries"], cpu["reason"]).c_str());
    if (cuda["available"].get<bool>()) {
      const auto& d = cuda["device"];
      std::fprintf(out(), "cuda  available: GPU %d, %s (%s), %d SMs, L2 %s, memory %s\n", d["ordinal"].get<int>(),
                   d["name"].get<std::string>().c_str(), d["arch"].get<std::string>().c_str(),
                   d["multiprocessors"].get<int>(), gib(d["l2_bytes"].get<int64_t>()).c_str(),
                   gib(d["memory_bytes"].get<int64_t>()).c_str());
    } else {
      std::fprintf(out(), "cuda  not available: %s\n", cuda["reason"].get<std::string>().c_str());
    }
    std::fprintf(out(), "      NVRTC %s, driver %s%s\n",
                 cuda["nvrtc"].is_null() ? "not found" : cuda["nvrtc"].get<std::string>().c_str(),
                 cuda["driver"].is_null() ? "not found" : cuda["driver"].get<std::string>().c_str(),
                 cuda["nvrtc"].is_null() ? "" : (cuda["available"].get<bool>() ? "" : "; compiling works with KILN_CUDA_ARCH set"));
    std::fprintf(out(), "      libraries: %s\n", libraries_text(cuda["libraries"], cuda["reason"]).c_str());
  });
}

}  // namespace kiln::cli
