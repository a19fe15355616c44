// RMS norm over rows: y[t, :] = x[t, :] / sqrt(mean(x[t, :]^2) + eps) * g,
// fp32, ROWS rows a program instance.
#include <cmath>

void rmsnorm(kiln::program_id pid, const float* x, const float* g, float* y, int64_t T, int64_t H, float eps) {
  for (int64_t t = pid.x * ROWS; t < (pid.x + 1) * ROWS && t < T; ++t) {
    const float* xr = x + t * H;
    float* yr = y + t * H;
    double ss = 0;
    for (int64_t h = 0; h < H; ++h) ss += double(xr[h]) * xr[h];
    const float inv = 1.0f / std::sqrt(static_cast<float>(ss / double(H)) + eps);
    for (int64_t h = 0; h < H; ++h) yr[h] = xr[h] * inv * g[h];
  }
}
