// An application that ships its kernels: it loads a packed artifact (made by
// `kiln pack kernels/cpu/matmul.toml --hints -o app.kiln`), takes the matmul
// spec from it, and runs matmuls at several shapes. Every shape the artifact
// covers runs with nothing compiled and nothing tuned; the program says what
// it did and exits 1 if it had to compile or tune anything.
//
//   matmul_app app.kiln [M,N,K ...]      (default: the artifact's packed shapes)
#include <kiln/kiln.hpp>

#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s app.kiln [M,N,K ...]\n", argv[0]);
    return 2;
  }
  try {
    auto t0 = std::chrono::steady_clock::now();
    kiln::Options opts = kiln::Options::from_env();
    opts.artifact = argv[1];
    opts.quiet = true;
    kiln::Runtime rt(opts);  // loads and checks the artifact: all of it, or an error

    // The spec comes from the artifact's sources, so the application needs no kernel files.
    kiln::Artifact art = kiln::Artifact::read(argv[1]);
    std::filesystem::path src = std::filesystem::temp_directory_path() / ("matmul_app-" + std::to_string(::getpid()));
    std::filesystem::create_directories(src);
    kiln::Kernel matmul(rt, art.spec("matmul", src));

    std::vector<std::array<int64_t, 3>> shapes;
    for (int i = 2; i < argc; ++i) {
      long long m, n, k;
      if (std::sscanf(argv[i], "%lld,%lld,%lld", &m, &n, &k) != 3 || m < 1 || n < 1 || k < 1) {
        std::fprintf(stderr, "bad shape '%s': write M,N,K\n", argv[i]);
        return 2;
      }
      shapes.push_back({m, n, k});
    }
    if (shapes.empty())
      for (const auto& kern : art.manifest().kernels)
        if (kern.name == "matmul")
          for (const auto& key : kern.keys) {
            long long m, n, k;
            if (std::sscanf(key.c_str(), "M=%lld N=%lld K=%lld", &m, &n, &k) == 3) shapes.push_back({m, n, k});
          }

    std::mt19937 rng(1);
    std::uniform_real_distribution<float> d(-1, 1);
    int bad = 0;
    for (auto [M, N, K] : shapes) {
      std::vector<float> A(M * K), B(K * N), C(M * N);
      for (auto& x : A) x = d(rng);
      for (auto& x : B) x = d(rng);
      matmul(A.data(), B.data(), C.data(), M, N, K);
      // Check a few rows against a plain loop.
      double worst = 0;
      for (int64_t i = 0; i < M; i += std::max<int64_t>(1, M / 4))
        for (int64_t j = 0; j < N; ++j) {
          double s = 0;
          for (int64_t k = 0; k < K; ++k) s += double(A[i * K + k]) * B[k * N + j];
          worst = std::max(worst, std::abs(s - C[i * N + j]));
        }
      bool ok = worst < 1e-3 * K;
      bad += !ok;
      std::printf("matmul %lldx%lldx%lld: %s (max error %.2g)\n", (long long)M, (long long)N, (long long)K,
                  ok ? "ok" : "WRONG", worst);
    }
    // A shape the artifact lacks ran a safe choice and is tuned behind it
    // (KILN_FIRST_CALL=swap): wait for that, so the report counts it.
    rt.wait_tuned();
    std::filesystem::remove_all(src);
    kiln::Runtime::Stats st = rt.stats();
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("kiln %s: %llu compiled, %llu configs timed, %llu records from the artifact, %llu binaries from it or "
                "the cache; %.3f s in all\n",
                kiln::kiln_version(), (unsigned long long)st.compiled, (unsigned long long)st.configs_timed,
                (unsigned long long)st.records_artifact, (unsigned long long)st.compile_cache_hits, secs);
    if (bad) return 1;
    if (st.compiled || st.configs_timed) {
      std::printf("the artifact did not cover these shapes: something was compiled or tuned\n");
      return 1;
    }
    return 0;
  } catch (const kiln::Error& e) {
    std::fprintf(stderr, "matmul_app: %s\n", e.what());
    return 1;
  }
}
