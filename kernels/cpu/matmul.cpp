// Register-blocked fp32 matmul for kiln's cpu backend: C[M,N] = A[M,K] @ B[K,N],
// row-major. BM, BN and BK are the config's parameters (defined by kiln).
//
// A program instance computes one BM x BN tile of C. It steps over K in BK
// chunks; for each, it copies the BK x BN panel of B into a buffer of its
// thread, in strips NR columns wide, so a strip is read contiguously and stays
// in L1 while every MR-row strip of A's tile runs against it. The micro-kernel
// keeps an MR x NR block of C in vector registers: per k, it loads NR values
// of B and broadcasts MR values of A (read in place, one row each) into
// MR * NR / 16 fused multiply-adds on 16-float vectors. Edges (M or N not a
// multiple of the micro-tile) run smaller instances of the same micro-kernel.
//
// The micro-tile follows the vector registers the target has: 8 x 32 (16
// accumulators) where AVX-512 gives 32 registers, 6 x 16 (12 two-register
// accumulators) on AVX2's 16.
#include <cstring>

typedef float kiln_vf __attribute__((vector_size(64)));

#if defined(MR) && defined(NV)
// A spec that tunes the micro-tile too (matmul_search.toml): MR rows, NV vectors.
constexpr int64_t kMR = MR, kNR = 16 * NV;
#elif defined(__AVX512F__)
constexpr int64_t kMR = 8, kNR = 32;
#else
constexpr int64_t kMR = 6, kNR = 16;
#endif
static_assert(kNR % 16 == 0, "the micro-tile is a whole number of 16-float vectors");

// B[0..kb, 0..nb) (row stride N) into strips of kNR columns: strip s holds, for
// each k, kNR values (zero past nb).
static inline void pack_b(float* __restrict dst, const float* __restrict B, int64_t N, int64_t nb, int64_t kb) {
  for (int64_t j0 = 0; j0 < nb; j0 += kNR) {
    const int64_t c = nb - j0 < kNR ? nb - j0 : kNR;
    for (int64_t k = 0; k < kb; ++k) {
      const float* src = B + k * N + j0;
      float* d = dst + k * kNR;
      if (c == kNR) {
        std::memcpy(d, src, kNR * sizeof(float));
      } else {
        for (int64_t j = 0; j < c; ++j) d[j] = src[j];
        for (int64_t j = c; j < kNR; ++j) d[j] = 0.f;
      }
    }
    dst += kb * kNR;
  }
}

// C[0..R, 0..nr) (row stride ldc) = (first ? 0 : C) + A[0..R, 0..kb) @ strip,
// where A's rows are lda apart and the strip is packed as above. V vectors of
// 16 columns are computed; nr <= 16 * V.
template <int64_t R, int64_t V>
static inline void micro(const float* __restrict a, int64_t lda, const float* __restrict b, int64_t kb,
                         float* __restrict C, int64_t ldc, int64_t nr, bool first) {
  kiln_vf acc[R][V];
  for (int64_t i = 0; i < R; ++i)
    for (int64_t v = 0; v < V; ++v) acc[i][v] = kiln_vf{};
  const float* row[R];
  for (int64_t i = 0; i < R; ++i) row[i] = a + i * lda;
  for (int64_t k = 0; k < kb; ++k) {
    kiln_vf bv[V];
    for (int64_t v = 0; v < V; ++v) std::memcpy(&bv[v], b + k * kNR + 16 * v, sizeof(kiln_vf));
    for (int64_t i = 0; i < R; ++i) {
      const kiln_vf av = row[i][k] - kiln_vf{};  // a broadcast (x - 0 is x, so it folds into the load)
      for (int64_t v = 0; v < V; ++v) acc[i][v] += av * bv[v];
    }
  }
  if (nr == 16 * V) {
    for (int64_t i = 0; i < R; ++i)
      for (int64_t v = 0; v < V; ++v) {
        float* c = C + i * ldc + 16 * v;
        kiln_vf cv = acc[i][v];
        if (!first) {
          kiln_vf old;
          std::memcpy(&old, c, sizeof old);
          cv += old;
        }
        std::memcpy(c, &cv, sizeof cv);
      }
  } else {
    alignas(64) float t[R][16 * V];
    std::memcpy(t, acc, sizeof t);
    for (int64_t i = 0; i < R; ++i)
      for (int64_t j = 0; j < nr; ++j) C[i * ldc + j] = first ? t[i][j] : C[i * ldc + j] + t[i][j];
  }
}

// One strip of kNR (or fewer) columns against `rows` rows of A, in micro-tiles
// of kMR rows and a smaller one for what is left.
template <int64_t V>
static inline void strip(const float* a, int64_t lda, const float* b, int64_t kb, float* C, int64_t ldc, int64_t rows,
                         int64_t nr, bool first) {
  int64_t i = 0;
  for (; i + kMR <= rows; i += kMR) micro<kMR, V>(a + i * lda, lda, b, kb, C + i * ldc, ldc, nr, first);
  for (; i + 4 <= rows; i += 4) micro<4, V>(a + i * lda, lda, b, kb, C + i * ldc, ldc, nr, first);
  for (; i + 2 <= rows; i += 2) micro<2, V>(a + i * lda, lda, b, kb, C + i * ldc, ldc, nr, first);
  for (; i < rows; ++i) micro<1, V>(a + i * lda, lda, b, kb, C + i * ldc, ldc, nr, first);
}

void matmul(kiln::program_id pid, const float* A, const float* B, float* C,
            int64_t M, int64_t N, int64_t K) {
  // BN rounded up to whole strips; one panel per thread, reused by its tiles.
  constexpr int64_t kPanelCols = (BN + kNR - 1) / kNR * kNR;
  alignas(64) static thread_local float panel[BK * kPanelCols];
  const int64_t m0 = pid.x * BM, n0 = pid.y * BN;
  const int64_t mb = M - m0 < BM ? M - m0 : BM;
  const int64_t nb = N - n0 < BN ? N - n0 : BN;
  if (K == 0) {
    for (int64_t i = 0; i < mb; ++i)
      for (int64_t j = 0; j < nb; ++j) C[(m0 + i) * N + n0 + j] = 0.f;
    return;
  }
  for (int64_t k0 = 0; k0 < K; k0 += BK) {
    const int64_t kb = K - k0 < BK ? K - k0 : BK;
    pack_b(panel, B + k0 * N + n0, N, nb, kb);
    for (int64_t j0 = 0; j0 < nb; j0 += kNR) {
      const int64_t nr = nb - j0 < kNR ? nb - j0 : kNR;
      const float* a = A + m0 * K + k0;
      float* c = C + m0 * N + n0 + j0;
      const float* b = panel + j0 * kb;
      if (kNR > 16 && nr <= 16) strip<1>(a, K, b, kb, c, N, mb, nr, k0 == 0);
      else strip<kNR / 16>(a, K, b, kb, c, N, mb, nr, k0 == 0);
    }
  }
}
