// Tiled fp32 matmul for kiln's cpu backend. BM, BN and BK are the config's
// parameters (defined by kiln); pid.x and pid.y pick the tile of C.

static inline void tile_update(float* __restrict acc, const float* __restrict a,
                               const float* __restrict B, int64_t N, int64_t kb, int64_t nb) {
  // acc[0..nb) += sum over k < kb of a[k] * B[k, 0..nb)
  if (nb == BN) {
    for (int64_t k = 0; k < kb; ++k) {
      const float av = a[k];
      const float* __restrict b = B + k * N;
      for (int64_t j = 0; j < BN; ++j) acc[j] += av * b[j];
    }
  } else {
    for (int64_t k = 0; k < kb; ++k) {
      const float av = a[k];
      const float* __restrict b = B + k * N;
      for (int64_t j = 0; j < nb; ++j) acc[j] += av * b[j];
    }
  }
}

void matmul(kiln::program_id pid, const float* A, const float* B, float* C,
            int64_t M, int64_t N, int64_t K) {
  const int64_t m0 = pid.x * BM, n0 = pid.y * BN;
  const int64_t mb = M - m0 < BM ? M - m0 : BM;
  const int64_t nb = N - n0 < BN ? N - n0 : BN;
  alignas(64) float acc[BM][BN] = {};
  for (int64_t k0 = 0; k0 < K; k0 += BK) {
    const int64_t kb = K - k0 < BK ? K - k0 : BK;
    for (int64_t i = 0; i < mb; ++i)
      tile_update(acc[i], A + (m0 + i) * K + k0, B + k0 * N + n0, N, kb, nb);
  }
  for (int64_t i = 0; i < mb; ++i)
    for (int64_t j = 0; j < nb; ++j) C[(m0 + i) * N + n0 + j] = acc[i][j];
}
