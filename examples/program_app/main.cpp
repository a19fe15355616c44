// Runs the cpu MLP block through the C++ that `kiln emit` wrote for
// kernels/programs/mlp_cpu.toml, at a few token counts, and checks each
// result against a plain computation in double.
// Usage: program_app <folder of the program file> [T ...]
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "mlp_cpu_program.hpp"

namespace {
std::vector<float> random_values(size_t n, uint32_t seed, float scale) {
  std::vector<float> v(n);
  for (auto& x : v) {
    seed = seed * 1664525u + 1013904223u;
    x = (static_cast<float>(seed >> 8) / 16777216.0f * 2 - 1) * scale;
  }
  return v;
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: program_app <folder of mlp_cpu.toml> [T ...]\n");
    return 2;
  }
  const int64_t H = 256, I = 704;
  std::vector<int64_t> tokens;
  for (int i = 2; i < argc; ++i) tokens.push_back(std::atoll(argv[i]));
  if (tokens.empty()) tokens = {1, 5, 33};
  try {
    kiln::Runtime rt;
    mlp_cpu_program::Program mlp(rt, argv[1]);
    const std::vector<float> g = random_values(H, 1, 1), wg = random_values(I * H, 2, 0.1f),
                             wu = random_values(I * H, 3, 0.1f), wd = random_values(H * I, 4, 0.1f);
    for (int64_t T : tokens) {
      const std::vector<float> x = random_values(T * H, 5 + static_cast<uint32_t>(T), 1);
      std::vector<float> y(T * H, -1);
      mlp(x.data(), g.data(), wg.data(), wu.data(), wd.data(), y.data(), T);
      double err = 0, norm = 0;
      std::vector<double> n(H), h(I);
      for (int64_t t = 0; t < T; ++t) {
        double ss = 0;
        for (int64_t k = 0; k < H; ++k) ss += double(x[t * H + k]) * x[t * H + k];
        const double inv = 1 / std::sqrt(ss / H + 1e-5);
        for (int64_t k = 0; k < H; ++k) n[k] = x[t * H + k] * inv * g[k];
        for (int64_t i = 0; i < I; ++i) {
          double a = 0, b = 0;
          for (int64_t k = 0; k < H; ++k) a += wg[i * H + k] * n[k], b += wu[i * H + k] * n[k];
          h[i] = a / (1 + std::exp(-a)) * b;
        }
        for (int64_t j = 0; j < H; ++j) {
          double s = x[t * H + j];
          for (int64_t i = 0; i < I; ++i) s += wd[j * I + i] * h[i];
          err += (y[t * H + j] - s) * (y[t * H + j] - s);
          norm += s * s;
        }
      }
      const double rel = std::sqrt(err / norm);
      std::printf("T=%lld: relative error %.2e %s\n", static_cast<long long>(T), rel, rel < 1e-5 ? "ok" : "WRONG");
      if (!(rel < 1e-5)) return 1;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "program_app: %s\n", e.what());
    return 1;
  }
  return 0;
}
