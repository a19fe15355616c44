// Plain kernels in double, for programs' references (kiln run --check,
// docs/program.md): each written the obvious way, so that a reference
// built from them repeats none of the tuned kernels' tricks (fusion, tiles,
// reduced precision). One source, several entries: each spec names its own.
#include <cmath>

// Each spec sets its own entry's parameter; the others' take these values.
#ifndef COLS
#define COLS 8
#endif
#ifndef BLOCK
#define BLOCK 4096
#endif

// y[t, :] = x[t, :] / sqrt(mean(x[t, :]^2) + eps) * g, a row a program instance.
void ref_rmsnorm(kiln::program_id pid, const double* x, const double* g, double* y, int64_t T, int64_t H, double eps) {
  const int64_t t = pid.x;
  if (t >= T) return;
  double ss = 0;
  for (int64_t h = 0; h < H; ++h) ss += x[t * H + h] * x[t * H + h];
  const double inv = 1 / std::sqrt(ss / static_cast<double>(H) + eps);
  for (int64_t h = 0; h < H; ++h) y[t * H + h] = x[t * H + h] * inv * g[h];
}

// C = A . B^T (A: M x K, B: N x K, as a linear layer stores its weights):
// COLS columns of C for every row a program instance, so B is read once.
void ref_linear_nt(kiln::program_id pid, const double* A, const double* B, double* C, int64_t M, int64_t N,
                   int64_t K) {
  // Row by row, the block's columns for each (A's row is then read from memory once a block,
  // not once a column: at T = 4096 the weights' GEMMs were bound by rereading A).
  const int64_t n0 = pid.x * COLS, n1 = n0 + COLS < N ? n0 + COLS : N;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = n0; n < n1; ++n) {
      // Four partial sums (the compiler may not reorder one sum of doubles):
      // a plain dot product that runs at a few GFLOP/s, not one at a time.
      double s[4] = {0, 0, 0, 0};
      int64_t k = 0;
      for (; k + 4 <= K; k += 4)
        for (int j = 0; j < 4; ++j) s[j] += A[m * K + k + j] * B[n * K + k + j];
      for (; k < K; ++k) s[0] += A[m * K + k] * B[n * K + k];
      C[m * N + n] = (s[0] + s[1]) + (s[2] + s[3]);
    }
}

// h = silu(a) * b, elementwise.
void ref_silu_mul(kiln::program_id pid, const double* a, const double* b, double* h, int64_t n) {
  for (int64_t i = pid.x * BLOCK; i < (pid.x + 1) * BLOCK && i < n; ++i) h[i] = a[i] / (1 + std::exp(-a[i])) * b[i];
}

// y = a + b, elementwise.
void ref_add(kiln::program_id pid, const double* a, const double* b, double* y, int64_t n) {
  for (int64_t i = pid.x * BLOCK; i < (pid.x + 1) * BLOCK && i < n; ++i) y[i] = a[i] + b[i];
}

// RoPE and the cache write, plainly. qkv [T, (HQ + 2 HKV) 128]: each row the
// query heads, then the key heads, then the value heads. Token t is at
// position S + t; dimensions d and d + 64 of a head turn by the angle
// pos * theta^(-d / 64) (rotate-half). q gets the turned queries; rows
// S + t of the caches [CAP, HKV, 128] get the turned keys and the values.
void ref_rope_cache(kiln::program_id pid, const double* qkv, double* q, double* kc, double* vc, int64_t T, int64_t S,
                    int64_t CAP, int64_t HQ, int64_t HKV, double theta) {
  (void)CAP;
  const int64_t t = pid.x;
  if (t >= T) return;
  const int64_t W = (HQ + 2 * HKV) * 128;
  const double* row = qkv + t * W;
  const double pos = static_cast<double>(S + t);
  auto turn = [&](const double* in, double* out) {
    for (int64_t d = 0; d < 64; ++d) {
      const double a = pos * std::pow(theta, -static_cast<double>(d) / 64.0);
      const double c = std::cos(a), s = std::sin(a);
      out[d] = in[d] * c - in[d + 64] * s;
      out[d + 64] = in[d + 64] * c + in[d] * s;
    }
  };
  for (int64_t h = 0; h < HQ; ++h) turn(row + h * 128, q + (t * HQ + h) * 128);
  for (int64_t h = 0; h < HKV; ++h) {
    turn(row + (HQ + h) * 128, kc + ((S + t) * HKV + h) * 128);
    for (int64_t d = 0; d < 128; ++d) vc[((S + t) * HKV + h) * 128 + d] = row[(HQ + HKV + h) * 128 + d];
  }
}

// Causal grouped-query attention over the cache, plainly: row (t, hq) of o
// is softmax(q . k_j / sqrt(128)) . v_j over the keys j = 0 .. S + t of KV
// head hq / (HQ / HKV); a program instance a row.
void ref_attention(kiln::program_id pid, const double* q, const double* kc, const double* vc, double* o, int64_t T,
                   int64_t S, int64_t CAP, int64_t HQ, int64_t HKV) {
  (void)CAP;
  const int64_t r = pid.x;
  if (r >= T * HQ) return;
  const int64_t t = r / HQ, hq = r % HQ, h = hq / (HQ / HKV), n = S + t + 1;
  double* s = new double[static_cast<size_t>(n)];
  double m = -1e300;
  for (int64_t j = 0; j < n; ++j) {
    double dot = 0;
    for (int64_t d = 0; d < 128; ++d) dot += q[r * 128 + d] * kc[(j * HKV + h) * 128 + d];
    s[j] = dot / std::sqrt(128.0);
    m = s[j] > m ? s[j] : m;
  }
  double den = 0;
  for (int64_t j = 0; j < n; ++j) den += (s[j] = std::exp(s[j] - m));
  // V row by row (each dimension's sum still in the order of the keys): a dimension at a time
  // read the cache with a stride of HKV rows, 128 times over.
  double acc[128] = {};
  for (int64_t j = 0; j < n; ++j)
    for (int64_t d = 0; d < 128; ++d) acc[d] += s[j] * vc[(j * HKV + h) * 128 + d];
  for (int64_t d = 0; d < 128; ++d) o[r * 128 + d] = acc[d] / den;
  delete[] s;
}
