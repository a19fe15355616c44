// RoPE and the KV cache write of a decoder layer, fp32 on the cpu (the cpu
// form of kernels/cuda/rope.cu). qkv [T, (HQ + 2 HKV) 128]: each row the
// query heads, then the key heads, then the value heads (one GEMM's output).
// Token t is at position S + t; dimensions d and d + 64 of a head turn by the
// angle pos * theta^(-d / 64) (rotate-half), the angle reduced modulo 2 pi in
// double before its sine and cosine are taken in float. q gets the turned
// queries; rows S + t of the caches [CAP, HKV, 128] get the turned keys and
// the values.
#include <cmath>

void rope_cache(kiln::program_id pid, const float* qkv, float* q, float* kc, float* vc, int64_t T, int64_t S_arg,
                int64_t CAP, int64_t HQ, int64_t HKV, float theta) {
  (void)CAP;
  const int64_t S = kiln_cell(S_arg);  // a program's cell holds it where the launch is sized for its bucket
  const int64_t t = pid.x;
  if (t >= T) return;
  const int64_t W = (HQ + 2 * HKV) * 128;
  const float* row = qkv + t * W;
  float c[64], s[64];
  for (int d = 0; d < 64; ++d) {
    const double a = std::remainder(static_cast<double>(S + t) * std::pow(static_cast<double>(theta), -d / 64.0),
                                    2 * M_PI);
    c[d] = std::cos(static_cast<float>(a));
    s[d] = std::sin(static_cast<float>(a));
  }
  auto turn = [&](const float* in, float* out) {
    for (int d = 0; d < 64; ++d) {
      const float x0 = in[d], x1 = in[d + 64];
      out[d] = x0 * c[d] - x1 * s[d];
      out[d + 64] = x1 * c[d] + x0 * s[d];
    }
  };
  for (int64_t h = 0; h < HQ; ++h) turn(row + h * 128, q + (t * HQ + h) * 128);
  for (int64_t h = 0; h < HKV; ++h) {
    turn(row + (HQ + h) * 128, kc + ((S + t) * HKV + h) * 128);
    for (int d = 0; d < 128; ++d) vc[((S + t) * HKV + h) * 128 + d] = row[(HQ + HKV + h) * 128 + d];
  }
}
