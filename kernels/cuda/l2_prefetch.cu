// Asks L2 for the first `n` 2-byte elements of a buffer and waits for none of it: a program step
// placed before kernels that leave the memory idle (a decode step's RoPE and attention) so
// that the weights of the kernel after them (the O projection) stream in meanwhile.
// Each thread asks for one piece of PF_PIECE bytes (cp.async.bulk.prefetch.L2, sm_90);
// a piece shorter than 16 bytes at the end is not asked for. A prefetch cannot make anything
// read stale data: every write lands in L2, so a line fetched before a write is updated by it.
// Launched with pdl, it issues its prefetches at once and then waits for the kernel before
// it, so that the kernel after it, which waits for this one, is ordered after both.
#define PF_PIECE 4096

extern "C" __global__ void __launch_bounds__(256) l2_prefetch(const unsigned short* __restrict__ w, long long n) {
  kiln_start_next();  // launched with pdl: the next kernel may be scheduled now
  const unsigned char* p = reinterpret_cast<const unsigned char*>(w);
  const long long bytes = n * 2;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x * PF_PIECE;
  for (long long off = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) * PF_PIECE; off < bytes;
       off += stride) {
    const long long left = bytes - off;
    const unsigned size = static_cast<unsigned>((left < PF_PIECE ? left : PF_PIECE) & ~15LL);
    if (size > 0) asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(p + off), "r"(size) : "memory");
  }
#endif
  kiln_wait_prior();  // ... and this one ends only after the kernel before it has ended
}
