// A kernel that does nothing: what a launch through kiln costs on the host.
extern "C" __global__ void empty_cuda(float* x, long long n) {
  if (V == 2) x[n] = 0;  // never true: keeps the parameters used
}
