// What the tensor-core attention kernels share (attn_prefill.cu, attn_split.cu): PTX
// wrappers for cp.async, ldmatrix and mma.sync m16n8k16 (bf16 in, fp32 accumulate), and
// the layout of their shared tiles: rows of 128 bf16 (256 bytes), the 16-byte chunks of
// row r XOR-swizzled by r % 8, so that ldmatrix (8 rows at one chunk) and the cp.async
// writes hit distinct banks without padding.
#pragma once
#include <cuda_bf16.h>

#define AP_INF __int_as_float(0x7f800000)

__device__ __forceinline__ unsigned ap_smem(const void* p) { return static_cast<unsigned>(__cvta_generic_to_shared(p)); }

// Byte offset of 16-byte chunk c (0..15) of row r in a swizzled tile of 256-byte rows.
__device__ __forceinline__ unsigned ap_off(int r, int c) { return r * 256 + ((c ^ (r & 7)) << 4); }

__device__ __forceinline__ void ap_cp16(unsigned dst, const void* src, bool valid) {
  // src-size 0: nothing is read and the 16 bytes are zero-filled.
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void ap_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void ap_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }
__device__ __forceinline__ void ap_wait_one() { asm volatile("cp.async.wait_group 1;\n" ::: "memory"); }

__device__ __forceinline__ void ap_ldsm4(unsigned addr, unsigned& a, unsigned& b, unsigned& c, unsigned& d) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(a), "=r"(b), "=r"(c), "=r"(d)
               : "r"(addr));
}
__device__ __forceinline__ void ap_ldsm4t(unsigned addr, unsigned& a, unsigned& b, unsigned& c, unsigned& d) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(a), "=r"(b), "=r"(c), "=r"(d)
               : "r"(addr));
}
// c += a . b for one m16n8k16 tile.
__device__ __forceinline__ void ap_mma(float* c, const unsigned* a, unsigned b0, unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ unsigned ap_pack(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<unsigned*>(&v);
}

// The scores of 16 query rows (their A fragments `qf`, 8 k16 steps over the 128 dims)
// against NB keys (rows 0 .. NB-1 of the swizzled tile at `kt`): s[n] is keys 8n .. 8n+7.
template <int NB>
__device__ __forceinline__ void ap_scores(float (&s)[NB / 8][4], const unsigned (&qf)[8][4], unsigned kt, int lane) {
#pragma unroll
  for (int n = 0; n < NB / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
  for (int kk = 0; kk < 8; ++kk)
#pragma unroll
    for (int n = 0; n < NB / 8; n += 2) {
      unsigned b0, b1, b2, b3;
      ap_ldsm4(kt + ap_off(n * 8 + (lane & 7) + ((lane >> 4) << 3), kk * 2 + ((lane >> 3) & 1)), b0, b1, b2, b3);
      ap_mma(s[n], qf[kk], b0, b1);
      ap_mma(s[n + 1], qf[kk], b2, b3);
    }
}

// acc (16 rows x 128 dims, n8 tiles) += P . V: P the probabilities in s (the accumulator
// layout of two n8 tiles is the A layout of one k16 step), V rows 0 .. NB-1 at `vt`.
template <int NB>
__device__ __forceinline__ void ap_pv(float (&acc)[16][4], const float (&s)[NB / 8][4], unsigned vt, int lane) {
#pragma unroll
  for (int kk = 0; kk < NB / 16; ++kk) {
    const unsigned a[4] = {ap_pack(s[2 * kk][0], s[2 * kk][1]), ap_pack(s[2 * kk][2], s[2 * kk][3]),
                           ap_pack(s[2 * kk + 1][0], s[2 * kk + 1][1]), ap_pack(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
    for (int j = 0; j < 16; j += 2) {
      unsigned b0, b1, b2, b3;
      ap_ldsm4t(vt + ap_off(kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3), j + (lane >> 4)), b0, b1, b2, b3);
      ap_mma(acc[j], a, b0, b1);
      ap_mma(acc[j + 1], a, b2, b3);
    }
  }
}

// One step of the online softmax for a thread's two rows (lane / 4 and lane / 4 + 8):
// s holds scores in log2 units (masked ones -inf); on return, s holds exp2(s - max), mx
// the running maxima, sum the thread's partial running sums, acc rescaled.
template <int NB>
__device__ __forceinline__ void ap_softmax_step(float (&s)[NB / 8][4], float (&mx)[2], float (&sum)[2],
                                                float (&acc)[16][4]) {
  float tmax[2] = {-AP_INF, -AP_INF};
#pragma unroll
  for (int n = 0; n < NB / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) tmax[e >> 1] = fmaxf(tmax[e >> 1], s[n][e]);
  float corr[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    tmax[r] = fmaxf(tmax[r], __shfl_xor_sync(0xffffffffu, tmax[r], 1));
    tmax[r] = fmaxf(tmax[r], __shfl_xor_sync(0xffffffffu, tmax[r], 2));
    const float mnew = fmaxf(mx[r], tmax[r]);
    // A row that has seen no key yet (its max still -inf) subtracts 0, not -inf.
    const float base = mnew == -AP_INF ? 0.f : mnew;
    corr[r] = exp2f(mx[r] - base);
    mx[r] = mnew;
    tmax[r] = base;
  }
  float tsum[2] = {0.f, 0.f};
#pragma unroll
  for (int n = 0; n < NB / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float p = exp2f(s[n][e] - tmax[e >> 1]);
      s[n][e] = p;
      tsum[e >> 1] += p;
    }
#pragma unroll
  for (int r = 0; r < 2; ++r) sum[r] = sum[r] * corr[r] + tsum[r];  // quad-partial; reduced by the caller
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    acc[j][0] *= corr[0], acc[j][1] *= corr[0];
    acc[j][2] *= corr[1], acc[j][3] *= corr[1];
  }
}
