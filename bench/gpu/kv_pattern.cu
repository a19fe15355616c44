// How fast a KV cache [S, HKV, 128] bf16 (K and V) can be read by two patterns, with the same
// bytes and the same loads in flight (issue 27, decode attention below the copy bandwidth):
//   head: block (h, c) reads KV head h's 256-byte rows of keys [c CH, (c+1) CH) of K and V
//         (rows at a stride of HKV * 256 bytes), as the split attention kernels do;
//   rows: block (c, part) reads whole rows (HKV * 256 contiguous bytes) of the same keys.
// Each lane sums its 16-byte loads (so nothing is optimised away), U loads in flight a lane.
// Timed with events, back to back over a ring of caches larger than L2, against a
// device-to-device copy (2N / t). Usage: nvcc -O3 -arch=sm_90 -o kv_pattern kv_pattern.cu && ./kv_pattern
#include <cuda_runtime.h>
#include <cstdio>
#include <vector>

constexpr int HKV = 8, D = 128, U = 8;

template <bool HEAD>
__global__ void read_kv(const uint4* __restrict__ k, const uint4* __restrict__ v, long long S, int CH,
                        unsigned* out) {
  // 16 chunks of 16 bytes a head's row, HKV * 16 a whole row
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  unsigned acc = 0;
  if (HEAD) {
    const int h = blockIdx.x;
    const long long k0 = static_cast<long long>(blockIdx.y) * CH, k1 = min(k0 + CH, S);
    // a warp: 2 rows an instruction (lanes 0-15 row r, 16-31 row r + 1)
    for (long long r = k0 + warp * 2 * U + (lane >> 4); r < k1; r += nw * 2 * U) {
      uint4 a[U], b[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const long long rr = r + 2 * u;
        const long long at = (rr * HKV + h) * 16 + (lane & 15);
        a[u] = rr < k1 ? __ldcs(k + at) : make_uint4(0, 0, 0, 0);
        b[u] = rr < k1 ? __ldcs(v + at) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int u = 0; u < U; ++u) acc += a[u].x ^ b[u].y ^ a[u].z ^ b[u].w;
    }
  } else {
    // block (c, part): part p of HKV reads 1 / HKV of the chunk's whole rows
    const long long k0 = static_cast<long long>(blockIdx.x) * CH, k1 = min(k0 + CH, S);
    const long long per = (k1 - k0 + HKV - 1) / HKV;
    const long long r0 = k0 + blockIdx.y * per, r1 = min(r0 + per, k1);
    const long long e0 = r0 * HKV * 16, e1 = r1 * HKV * 16;  // 16-byte chunks
    for (long long e = e0 + threadIdx.x; e < e1; e += static_cast<long long>(blockDim.x) * U) {
      uint4 a[U], b[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const long long ee = e + static_cast<long long>(u) * blockDim.x;
        a[u] = ee < e1 ? __ldcs(k + ee) : make_uint4(0, 0, 0, 0);
        b[u] = ee < e1 ? __ldcs(v + ee) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int u = 0; u < U; ++u) acc += a[u].x ^ b[u].y ^ a[u].z ^ b[u].w;
    }
  }
  if (acc == 0x12345678u) out[0] = acc;
}

int main() {
  const long long ring_bytes = 1ll << 30;
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  unsigned* out;
  cudaMalloc(&out, 4);
  // copy bandwidth
  void *src, *dst;
  cudaMalloc(&src, ring_bytes);
  cudaMalloc(&dst, ring_bytes);
  cudaMemcpy(dst, src, ring_bytes, cudaMemcpyDeviceToDevice);
  cudaEventRecord(e0);
  for (int i = 0; i < 5; ++i) cudaMemcpyAsync(dst, src, ring_bytes, cudaMemcpyDeviceToDevice);
  cudaEventRecord(e1);
  cudaEventSynchronize(e1);
  float ms;
  cudaEventElapsedTime(&ms, e0, e1);
  const double copy_bw = 2.0 * ring_bytes * 5 / (ms * 1e-3);
  cudaFree(dst);
  printf("copy bandwidth %.0f GB/s (2N / t, 1 GiB)\n", copy_bw / 1e9);
  printf("%8s %6s %5s %5s %10s %8s %10s %8s\n", "S", "CH", "warps", "U", "head us", "% copy", "rows us", "% copy");
  char* base = static_cast<char*>(src);
  for (long long S : {8192ll, 32768ll}) {
    const long long bytes = S * HKV * D * 2;  // K or V
    const int copies = static_cast<int>(ring_bytes / (2 * bytes));
    for (int CH : {256, 1024}) for (int nw : {4, 8}) {
      float t[2];
      for (int pat = 0; pat < 2; ++pat) {
        const dim3 grid = pat == 0 ? dim3(HKV, (S + CH - 1) / CH) : dim3((S + CH - 1) / CH, HKV);
        auto launch = [&](int i) {
          const uint4* k = reinterpret_cast<const uint4*>(base + (i % copies) * 2 * bytes);
          const uint4* v = reinterpret_cast<const uint4*>(base + (i % copies) * 2 * bytes + bytes);
          if (pat == 0) read_kv<true><<<grid, nw * 32>>>(k, v, S, CH, out);
          else read_kv<false><<<grid, nw * 32>>>(k, v, S, CH, out);
        };
        for (int i = 0; i < 20; ++i) launch(i);
        const int reps = 200;
        cudaEventRecord(e0);
        for (int i = 0; i < reps; ++i) launch(i);
        cudaEventRecord(e1);
        cudaEventSynchronize(e1);
        cudaEventElapsedTime(&ms, e0, e1);
        t[pat] = ms * 1e3f / reps;
      }
      const double b2 = 2.0 * bytes;
      printf("%8lld %6d %5d %5d %10.2f %8.1f %10.2f %8.1f\n", S, CH, nw, U, t[0], 100 * b2 / (t[0] * 1e-6) / copy_bw,
             t[1], 100 * b2 / (t[1] * 1e-6) / copy_bw);
    }
  }
  cudaError_t err = cudaGetLastError();
  printf("%s\n", err == cudaSuccess ? "ok" : cudaGetErrorString(err));
  return err == cudaSuccess ? 0 : 1;
}
