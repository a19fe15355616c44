// fp32 matmul on the CUDA cores (FFMA, no TF32): C[M,N] = A[M,K] @ B[K,N],
// row-major, any M, N, K.
//
// A block computes a BM x BN tile of C with NT threads; each warp a WM x WN
// part of it, as WMITER x WNITER sub-tiles of which each thread computes
// TM x TN. Tiles of A (transposed, so a thread reads TM consecutive values)
// and of B are staged in shared memory, double-buffered: while the current
// BK-deep tiles are multiplied, the next ones are loaded from global memory
// into registers, then stored into the other buffer; one barrier a step.
//
// VEC == 4: 16-byte loads and stores (the config is specialised on 16-byte
// aligned A, B, C and on K and N divisible by 4; see the spec's constraint).
// VEC == 1: scalar loads and stores, any arguments.
// SPLIT > 1: K is split over blockIdx.z, and each block adds its partial
// tile into C (which kiln zeroes before the launch) with atomics: for
// shapes with few output tiles and a long K.
#define NT ((BM / WM) * (BN / WN) * 32)
#define WMITER ((WM * WN) / (32 * TM * TN * WNITER))
#define WSUBM (WM / WMITER)
#define WSUBN (WN / WNITER)
#define A_LOADS ((BM * BK) / (4 * NT))
#define B_LOADS ((BK * BN) / (4 * NT))

extern "C" __global__ void __launch_bounds__(NT)
    matmul(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C, long long M, long long N,
           long long K) {
  extern __shared__ __align__(16) float smem[];
  float* const As = smem;                // [2][BK][BM]
  float* const Bs = smem + 2 * BK * BM;  // [2][BK][BN]

  const int tid = threadIdx.x;
  const int warp = tid >> 5, lane = tid & 31;
  const int warp_row = warp / (BN / WN), warp_col = warp % (BN / WN);
  const int t_row = lane / (WSUBN / TN), t_col = lane % (WSUBN / TN);
  const long long bm = static_cast<long long>(blockIdx.y) * BM;
  const long long bn = static_cast<long long>(blockIdx.x) * BN;
  // This block's part of K: whole BK steps.
  const long long kchunk = ((K + SPLIT - 1) / SPLIT + BK - 1) / BK * BK;
  const long long kbeg = static_cast<long long>(blockIdx.z) * kchunk;
  const long long kend = kbeg + kchunk < K ? kbeg + kchunk : K;
  if (kbeg >= kend && SPLIT > 1) return;  // an empty slice adds nothing

  float4 ra[A_LOADS], rb[B_LOADS];
  // Global memory → registers: the A tile (BM x BK) and the B tile (BK x BN)
  // starting at k0, zero beyond the matrices' edges.
  auto load = [&](long long k0) {
#pragma unroll
    for (int i = 0; i < A_LOADS; ++i) {
      const int f = tid + i * NT;
      const int row = f / (BK / 4), c4 = (f % (BK / 4)) * 4;
      const long long gm = bm + row, gk = k0 + c4;
      if (VEC == 4 && gm < M && gk + 3 < kend) {
        ra[i] = *reinterpret_cast<const float4*>(A + gm * K + gk);
      } else {
        const float* a = A + gm * K + gk;
        ra[i].x = gm < M && gk + 0 < kend ? a[0] : 0.f;
        ra[i].y = gm < M && gk + 1 < kend ? a[1] : 0.f;
        ra[i].z = gm < M && gk + 2 < kend ? a[2] : 0.f;
        ra[i].w = gm < M && gk + 3 < kend ? a[3] : 0.f;
      }
    }
#pragma unroll
    for (int i = 0; i < B_LOADS; ++i) {
      const int f = tid + i * NT;
      const int row = f / (BN / 4), c4 = (f % (BN / 4)) * 4;
      const long long gk = k0 + row, gn = bn + c4;
      if (VEC == 4 && gk < kend && gn + 3 < N) {
        rb[i] = *reinterpret_cast<const float4*>(B + gk * N + gn);
      } else {
        const float* b = B + gk * N + gn;
        rb[i].x = gk < kend && gn + 0 < N ? b[0] : 0.f;
        rb[i].y = gk < kend && gn + 1 < N ? b[1] : 0.f;
        rb[i].z = gk < kend && gn + 2 < N ? b[2] : 0.f;
        rb[i].w = gk < kend && gn + 3 < N ? b[3] : 0.f;
      }
    }
  };
  // Registers → shared buffer `buf` (A transposed).
  auto store = [&](int buf) {
    float* as = As + buf * BK * BM;
    float* bs = Bs + buf * BK * BN;
#pragma unroll
    for (int i = 0; i < A_LOADS; ++i) {
      const int f = tid + i * NT;
      const int row = f / (BK / 4), c4 = (f % (BK / 4)) * 4;
      as[(c4 + 0) * BM + row] = ra[i].x;
      as[(c4 + 1) * BM + row] = ra[i].y;
      as[(c4 + 2) * BM + row] = ra[i].z;
      as[(c4 + 3) * BM + row] = ra[i].w;
    }
#pragma unroll
    for (int i = 0; i < B_LOADS; ++i) {
      const int f = tid + i * NT;
      const int row = f / (BN / 4), c4 = (f % (BN / 4)) * 4;
      *reinterpret_cast<float4*>(bs + row * BN + c4) = rb[i];
    }
  };

  float acc[WMITER * TM][WNITER * TN];
#pragma unroll
  for (int i = 0; i < WMITER * TM; ++i)
#pragma unroll
    for (int j = 0; j < WNITER * TN; ++j) acc[i][j] = 0.f;
  float rm[WMITER * TM], rn[WNITER * TN];

  auto compute = [&](int buf) {
    const float* as = As + buf * BK * BM + warp_row * WM + t_row * TM;
    const float* bs = Bs + buf * BK * BN + warp_col * WN + t_col * TN;
#pragma unroll
    for (int k = 0; k < BK; ++k) {
#pragma unroll
      for (int wm = 0; wm < WMITER; ++wm)
#pragma unroll
        for (int i = 0; i < TM; i += 4) {
          const float4 v = *reinterpret_cast<const float4*>(as + k * BM + wm * WSUBM + i);
          rm[wm * TM + i + 0] = v.x;
          rm[wm * TM + i + 1] = v.y;
          rm[wm * TM + i + 2] = v.z;
          rm[wm * TM + i + 3] = v.w;
        }
#pragma unroll
      for (int wn = 0; wn < WNITER; ++wn)
#pragma unroll
        for (int j = 0; j < TN; j += 4) {
          const float4 v = *reinterpret_cast<const float4*>(bs + k * BN + wn * WSUBN + j);
          rn[wn * TN + j + 0] = v.x;
          rn[wn * TN + j + 1] = v.y;
          rn[wn * TN + j + 2] = v.z;
          rn[wn * TN + j + 3] = v.w;
        }
#pragma unroll
      for (int i = 0; i < WMITER * TM; ++i)
#pragma unroll
        for (int j = 0; j < WNITER * TN; ++j) acc[i][j] = fmaf(rm[i], rn[j], acc[i][j]);
    }
  };

  int buf = 0;
  if (kbeg < kend) {
    load(kbeg);
    store(0);
  }
  __syncthreads();
  for (long long k0 = kbeg; k0 < kend; k0 += BK) {
    const bool more = k0 + BK < kend;
    if (more) load(k0 + BK);
    compute(buf);
    if (more) store(buf ^ 1);
    __syncthreads();
    buf ^= 1;
  }

  // The tile back to C.
#pragma unroll
  for (int wm = 0; wm < WMITER; ++wm)
#pragma unroll
    for (int i = 0; i < TM; ++i) {
      const long long gm = bm + warp_row * WM + wm * WSUBM + t_row * TM + i;
      if (gm >= M) continue;
#pragma unroll
      for (int wn = 0; wn < WNITER; ++wn)
#pragma unroll
        for (int j = 0; j < TN; j += 4) {
          const long long gn = bn + warp_col * WN + wn * WSUBN + t_col * TN + j;
          const float* v = &acc[wm * TM + i][wn * TN + j];
          float* c = C + gm * N + gn;
          if (SPLIT == 1 && VEC == 4 && gn + 3 < N) {
            *reinterpret_cast<float4*>(c) = make_float4(v[0], v[1], v[2], v[3]);
          } else {
#pragma unroll
            for (int jj = 0; jj < 4; ++jj)
              if (gn + jj < N) {
                if (SPLIT == 1) c[jj] = v[jj];
                else atomicAdd(c + jj, v[jj]);
              }
          }
        }
    }
}
