// Two row-softmax kernels for the softmax_multi multi-kernel.
#include "softmax_rows.h"

void softmax_rowwise(kiln::program_id pid, const float* X, float* Y, int64_t M, int64_t N) {
  alignas(64) static thread_local float buf[16384];
  const int64_t r1 = (pid.x + 1) * ROWS < M ? (pid.x + 1) * ROWS : M;
  for (int64_t r = pid.x * ROWS; r < r1; ++r) softmax_row_whole(X + r * N, Y + r * N, N, buf);
}

#ifdef BLOCK
void softmax_twopass(kiln::program_id pid, const float* X, float* Y, float* stats, int64_t M, int64_t N) {
  const int64_t r0 = pid.x * ROWS, r1 = r0 + ROWS < M ? r0 + ROWS : M;
  for (int64_t r = r0; r < r1; ++r) softmax_row_stats(X + r * N, N, BLOCK, &stats[2 * r], &stats[2 * r + 1]);
  for (int64_t r = r0; r < r1; ++r) softmax_row_write(X + r * N, Y + r * N, N, stats[2 * r], stats[2 * r + 1]);
}
#endif
