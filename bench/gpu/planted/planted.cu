// y = 2x, with faults planted in some configs: MODE 1 writes far out of
// bounds, MODE 2 traps, MODE 3 never returns; MODE 0 and 4 are correct.
extern "C" __global__ void planted(const float* x, float* y, long long n) {
  const long long i = blockIdx.x * 256LL + threadIdx.x;
#if MODE == 1
  if (i == 0) y[1LL << 40] = 1.f;
#elif MODE == 2
  if (i == 0) __trap();
#elif MODE == 3
  if (i == 0) {
    volatile int k = 0;
    while (true) k = k + 1;
  }
#endif
  if (i < n) y[i] = x[i] * 2.f;
}
