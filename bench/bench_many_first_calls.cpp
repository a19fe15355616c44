// The first calls of many distinct kernels in one fresh process: a handle is
// made for each spec given, its arguments are allocated with random inputs,
// and each is called once; the time from the start of main() to the last
// result, synchronised, is printed. Run it once with KILN_FIRST_CALL=wait to
// tune them all, then again warm: the warm run compiles and times nothing
// (it says how much it did).
// Usage: kiln_bench_many_first_calls --set NAME=VALUE ... SPEC...
// Prints: "<seconds from main> <kernels> handles+first-calls=<seconds> compiled=<n> timed=<n> cache_hits=<n>"
// (the second time: from the handles' making, once the inputs are on the device).
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kiln/device_args.hpp"
#include "kiln/kernel.hpp"
#include "kiln/runtime.hpp"

using namespace kiln;

int main(int argc, char** argv) {
  auto t0 = std::chrono::steady_clock::now();
  std::vector<std::pair<std::string, std::string>> sets;
  std::vector<std::string> specs;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--set") == 0 && i + 1 < argc) {
      std::string s = argv[++i];
      auto eq = s.find('=');
      if (eq == std::string::npos) {
        std::fprintf(stderr, "kiln_bench_many_first_calls: --set %s: expected NAME=VALUE\n", s.c_str());
        return 2;
      }
      sets.push_back({s.substr(0, eq), s.substr(eq + 1)});
    } else {
      specs.push_back(argv[i]);
    }
  }
  if (specs.empty()) {
    std::fprintf(stderr, "usage: kiln_bench_many_first_calls --set NAME=VALUE ... SPEC...\n");
    return 2;
  }
  try {
    Options opts = Options::from_env();
    opts.quiet = true;
    Runtime rt(opts);
    std::vector<std::unique_ptr<Kernel>> ks;
    std::vector<std::unique_ptr<DeviceArgs>> args;
    std::vector<KernelSpec> loaded;
    Device* dev = nullptr;
    // The application's part: its specs read and its data on the device.
    for (const auto& p : specs) {
      loaded.push_back(load_spec(p));
      dev = &rt.device(loaded.back().backend);
      args.push_back(std::make_unique<DeviceArgs>(loaded.back(), parse_scalars(loaded.back(), sets), *dev));
      args.back()->fill_random(1);
    }
    auto t1 = std::chrono::steady_clock::now();
    // kiln's part: a handle each, and each one's first call.
    for (auto& s : loaded) ks.push_back(std::make_unique<Kernel>(rt, std::move(s)));
    for (size_t i = 0; i < ks.size(); ++i) ks[i]->launch(args[i]->params());
    dev->sync(nullptr);
    auto t2 = std::chrono::steady_clock::now();
    double secs = std::chrono::duration<double>(t2 - t0).count();
    double calls = std::chrono::duration<double>(t2 - t1).count();
    Runtime::Stats st = rt.stats();
    std::printf("%.4f %zu handles+first-calls=%.4f compiled=%llu timed=%llu cache_hits=%llu\n", secs, ks.size(), calls,
                static_cast<unsigned long long>(st.compiled), static_cast<unsigned long long>(st.configs_timed),
                static_cast<unsigned long long>(st.compile_cache_hits));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kiln_bench_many_first_calls: %s\n", e.what());
    return 1;
  }
  return 0;
}
