// Row softmax for kiln's cpu backend, in two variants chosen by the WHOLE param.
#include "softmax_rows.h"

void softmax(kiln::program_id pid, const float* X, float* Y, int64_t M, int64_t N) {
  const int64_t r0 = pid.x * ROWS;
  const int64_t r1 = r0 + ROWS < M ? r0 + ROWS : M;
  for (int64_t r = r0; r < r1; ++r) {
#if WHOLE
    alignas(64) float buf[16384];
    softmax_row_whole(X + r * N, Y + r * N, N, buf);
#else
    float m, inv;
    softmax_row_stats(X + r * N, N, BLOCK, &m, &inv);
    softmax_row_write(X + r * N, Y + r * N, N, m, inv);
#endif
  }
}
