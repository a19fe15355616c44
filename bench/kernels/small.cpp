void small(kiln::program_id pid, float* x, int64_t n) {
  for (int64_t i = pid.x * BLOCK; i < (pid.x + 1) * BLOCK && i < n; ++i) x[i] += 1.0f;
}
