// Time to the first launch in a fresh process: a handle is made for a spec
// (a kernel or a multi-kernel), its arguments are allocated with random
// inputs, and the first call runs (compiling, tuning or reading the caches
// as needed) and is waited for. Run it twice against one KILN_CACHE_DIR:
// the first run is cold (empty caches), the second warm.
// Usage: kiln_bench_first_call SPEC [--size-hint] [--wait-tuned] [--no-library] --set NAME=VALUE ...
// (--size-hint: a SizeHintMultiKernel, tuned at the spec's hint points,
// instead of a Kernel tuned at the call's shape. --wait-tuned: after the
// first call, call the kernel in a loop until the background tuning is in
// use (KILN_FIRST_CALL=swap) and say when. --no-library: the spec's library
// choices are left out.)
// Prints one line: "<seconds to first launch> <what the first call ran> (<source>) kiln=<seconds>"
// (kiln=: from the handle's making, once the device and the inputs are ready, to the first result);
// with --wait-tuned a second: "tuned <seconds from start> <choice> (<source>) <calls meanwhile>".
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "kiln/device_args.hpp"
#include "kiln/kernel.hpp"
#include "kiln/multi_kernel.hpp"
#include "kiln/runtime.hpp"

using namespace kiln;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: kiln_bench_first_call SPEC --set NAME=VALUE ...\n");
    return 2;
  }
  std::vector<std::pair<std::string, std::string>> sets;
  bool size_hint = false, wait_tuned = false, no_library = false;
  for (int i = 2; i < argc; ++i) {
    if (std::strcmp(argv[i], "--wait-tuned") == 0) {
      wait_tuned = true;
    } else if (std::strcmp(argv[i], "--no-library") == 0) {
      no_library = true;
    } else if (std::strcmp(argv[i], "--size-hint") == 0) {
      size_hint = true;
    } else if (std::strcmp(argv[i], "--set") == 0 && i + 1 < argc) {
      std::string s = argv[++i];
      if (s.find('=') == std::string::npos) {
        std::fprintf(stderr, "kiln_bench_first_call: --set %s: expected NAME=VALUE\n", s.c_str());
        return 2;
      }
      sets.push_back({s.substr(0, s.find('=')), s.substr(s.find('=') + 1)});
    } else {
      std::fprintf(stderr, "kiln_bench_first_call: unexpected argument '%s'\n", argv[i]);
      return 2;
    }
  }
  try {
    auto t0 = std::chrono::steady_clock::now();
    Options opts = Options::from_env();
    opts.quiet = true;
    Runtime rt(opts);
    std::string what;
    if (is_multi_spec(argv[1])) {
      MultiKernelSpec m = load_multi_spec(argv[1]);
      KernelSpec shape;
      shape.name = m.name;
      shape.args = m.args;
      MultiKernel k(rt, m);
      Device& dev = rt.device(m.backend);
      DeviceArgs a(shape, parse_scalars(shape, sets), dev);
      a.fill_random(1);
      k.launch(a.params());
      dev.sync(nullptr);
      auto p = k.pick(a.params());
      what = "variant " + std::to_string(p.variant) + " (" + choice_source_name(p.source) + ")";
    } else if (size_hint) {
      KernelSpec s = load_spec(argv[1]);
      SizeHintMultiKernel k(rt, s);
      Device& dev = rt.device(s.backend);
      DeviceArgs a(s, parse_scalars(s, sets), dev);
      a.fill_random(1);
      k.launch(a.params());
      dev.sync(nullptr);
      what = k.config_for(a.params()).str() + " (size hints)";
    } else {
      KernelSpec s = load_spec(argv[1]);
      if (no_library) s.libraries.clear();
      // The application's part first (its device and its data), then kiln's:
      // the handle and its first call, timed on their own as well.
      Device& dev = rt.device(s.backend);
      DeviceArgs a(s, parse_scalars(s, sets), dev);
      a.fill_random(1);
      auto t1 = std::chrono::steady_clock::now();
      Kernel k(rt, s);
      k.launch(a.params());
      dev.sync(nullptr);
      auto t2 = std::chrono::steady_clock::now();
      const Choice* first = &k.choice(a.params());
      what = first->config.str() + " (" + choice_source_name(first->source) + ")";
      std::printf("%.3f %s kiln=%.4f\n", std::chrono::duration<double>(t2 - t0).count(), what.c_str(),
                  std::chrono::duration<double>(t2 - t1).count());
      if (wait_tuned) {
        // Calls go on while the tuning runs, as an application's would (one a millisecond).
        size_t calls = 0;
        while (&k.choice(a.params()) == first && rt.tunings_pending() > 0) {
          k.launch(a.params());
          dev.sync(nullptr);
          ++calls;
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        rt.wait_tuned();
        const Choice& c = k.choice(a.params());
        std::printf("tuned %.3f %s (%s) %zu\n",
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
                    c.config.str().c_str(), choice_source_name(c.source), calls);
      }
      std::fflush(stdout);
      return 0;
    }
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("%.3f %s\n", secs, what.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kiln_bench_first_call: %s\n", e.what());
    return 1;
  }
  return 0;
}
