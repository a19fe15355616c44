// Hopper's PTX for the kernels built on wgmma and TMA (gemm_wgmma.cu, the GEMM families; attn_prefill_wg.cu,
// prefill attention): mbarriers, the async-proxy fence, named barriers, the wgmma fence, commit and
// wait, shared-memory matrix descriptors (SWIZZLE_128B), the accumulator operand lists of wgmma's
// inline asm, and TMA tile loads from a tensor map kiln encodes (docs/spec.md, "Tensor maps").
// sm_90a only. GEMM_WGMMA_WAIT_LIMIT (a debugging aid): an mbarrier wait traps after that many polls.
#pragma once

__device__ __forceinline__ unsigned wg_smem_u32(const void* p) { return static_cast<unsigned>(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void wg_mbar_init(unsigned bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// An arrive-on of `bar` once all of this thread's earlier cp.async copies have landed;
// .noinc: the arrival counts against the count the barrier was initialised with.
__device__ __forceinline__ void wg_cp_async_arrive(unsigned bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void wg_mbar_arrive(unsigned bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ bool wg_mbar_try_wait(unsigned bar, unsigned parity) {
  unsigned ok;
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(ok)
      : "r"(bar), "r"(parity)
      : "memory");
  return ok != 0;
}
// As wg_mbar_try_wait, with a suspend-time hint (in ns): a thread whose phase has not completed
// may be suspended until it does, or for up to about 10 ms, instead of the system's own,
// shorter limit. (Under GEMM_WGMMA_WAIT_LIMIT each poll may then take up to that long.)
__device__ __forceinline__ bool wg_mbar_try_wait_sleep(unsigned bar, unsigned parity) {
  unsigned ok;
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2, %3;\nselp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(ok)
      : "r"(bar), "r"(parity), "r"(10000000u)
      : "memory");
  return ok != 0;
}
// Polls until ready() (with GEMM_WGMMA_WAIT_LIMIT: traps after that many polls).
template <class F>
__device__ __forceinline__ void wg_poll(F&& ready) {
#ifdef GEMM_WGMMA_WAIT_LIMIT
  long long n = 0;
  while (!ready())
    if (++n > (long long)(GEMM_WGMMA_WAIT_LIMIT)) __trap();
#else
  while (!ready()) {
  }
#endif
}
// Waits until the phase of parity `parity` of `bar` has completed.
__device__ __forceinline__ void wg_mbar_wait(unsigned bar, unsigned parity) {
  wg_poll([&] { return wg_mbar_try_wait(bar, parity); });
}
// The same for a thread with nothing else to do while it waits (a producer): it sleeps in the
// wait rather than spin, leaving the issue slots to the warps beside it.
__device__ __forceinline__ void wg_mbar_wait_sleep(unsigned bar, unsigned parity) {
  wg_poll([&] { return wg_mbar_try_wait_sleep(bar, parity); });
}
__device__ __forceinline__ void wg_fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
template <int ID, int THREADS>
__device__ __forceinline__ void wg_named_bar() {  // immediate ids: ptxas then reserves only those
  asm volatile("bar.sync %0, %1;\n" ::"n"(ID), "n"(THREADS) : "memory");
}
template <int ID, int THREADS>
__device__ __forceinline__ void wg_named_arrive() {  // arrives without waiting
  asm volatile("bar.arrive %0, %1;\n" ::"n"(ID), "n"(THREADS) : "memory");
}
__device__ __forceinline__ void wg_mma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_mma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wg_mma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving accesses of an accumulator across the wgmma waits.
__device__ __forceinline__ void wg_fence_reg(float& r) { asm volatile("" : "+f"(r)::"memory"); }

// Shared-memory matrix descriptor, SWIZZLE_128B (bits 62-63 = 1), base offset 0:
// start address >> 4 in bits 0-13, LBO >> 4 in 16-29, SBO >> 4 in 32-45.
__device__ __forceinline__ unsigned long long wg_desc(unsigned addr, unsigned lbo, unsigned sbo) {
  const unsigned lo = ((addr & 0x3FFFFu) >> 4) | ((lbo >> 4) << 16);
  const unsigned hi = (sbo >> 4) | (1u << 30);
  return (static_cast<unsigned long long>(hi) << 32) | lo;
}
// The descriptor of `bytes` past d's start: the start address (its 14-bit field, bits 4..17 of
// the shared address) moved on, the rest kept, for an address that stays below 256 KiB (a
// shared address always does). Loops make a descriptor once and step it with this.
__device__ __forceinline__ unsigned long long wg_desc_plus(unsigned long long d, unsigned bytes) {
  return (d & 0xFFFFFFFF00000000ull) | (static_cast<unsigned>(d) + (bytes >> 4));
}

// The accumulator operands of a wgmma's inline asm, in groups of 8: WG_Rn names operands 0 ..
// 8n - 1 in the instruction's text, and WG_On binds them to d[0 .. 8n - 1] ("+f"), for an
// m64nN instruction with N = 16n (its N / 2 fp32 accumulators a thread); the asm's other
// operands are numbered from 8n on.
#define WG_S8(a, b, c, d, e, f, g, h) "%" #a ", %" #b ", %" #c ", %" #d ", %" #e ", %" #f ", %" #g ", %" #h
#define WG_R1 WG_S8(0, 1, 2, 3, 4, 5, 6, 7)
#define WG_R2 WG_R1 ", " WG_S8(8, 9, 10, 11, 12, 13, 14, 15)
#define WG_R3 WG_R2 ", " WG_S8(16, 17, 18, 19, 20, 21, 22, 23)
#define WG_R4 WG_R3 ", " WG_S8(24, 25, 26, 27, 28, 29, 30, 31)
#define WG_R5 WG_R4 ", " WG_S8(32, 33, 34, 35, 36, 37, 38, 39)
#define WG_R6 WG_R5 ", " WG_S8(40, 41, 42, 43, 44, 45, 46, 47)
#define WG_R7 WG_R6 ", " WG_S8(48, 49, 50, 51, 52, 53, 54, 55)
#define WG_R8 WG_R7 ", " WG_S8(56, 57, 58, 59, 60, 61, 62, 63)
#define WG_R9 WG_R8 ", " WG_S8(64, 65, 66, 67, 68, 69, 70, 71)
#define WG_R10 WG_R9 ", " WG_S8(72, 73, 74, 75, 76, 77, 78, 79)
#define WG_R11 WG_R10 ", " WG_S8(80, 81, 82, 83, 84, 85, 86, 87)
#define WG_R12 WG_R11 ", " WG_S8(88, 89, 90, 91, 92, 93, 94, 95)
#define WG_R13 WG_R12 ", " WG_S8(96, 97, 98, 99, 100, 101, 102, 103)
#define WG_R14 WG_R13 ", " WG_S8(104, 105, 106, 107, 108, 109, 110, 111)
#define WG_R15 WG_R14 ", " WG_S8(112, 113, 114, 115, 116, 117, 118, 119)
#define WG_R16 WG_R15 ", " WG_S8(120, 121, 122, 123, 124, 125, 126, 127)
#define WG_D8(i) "+f"(d[8 * (i)]), "+f"(d[8 * (i) + 1]), "+f"(d[8 * (i) + 2]), "+f"(d[8 * (i) + 3]), \
    "+f"(d[8 * (i) + 4]), "+f"(d[8 * (i) + 5]), "+f"(d[8 * (i) + 6]), "+f"(d[8 * (i) + 7])
#define WG_O1 WG_D8(0)
#define WG_O2 WG_O1, WG_D8(1)
#define WG_O3 WG_O2, WG_D8(2)
#define WG_O4 WG_O3, WG_D8(3)
#define WG_O5 WG_O4, WG_D8(4)
#define WG_O6 WG_O5, WG_D8(5)
#define WG_O7 WG_O6, WG_D8(6)
#define WG_O8 WG_O7, WG_D8(7)
#define WG_O9 WG_O8, WG_D8(8)
#define WG_O10 WG_O9, WG_D8(9)
#define WG_O11 WG_O10, WG_D8(10)
#define WG_O12 WG_O11, WG_D8(11)
#define WG_O13 WG_O12, WG_D8(12)
#define WG_O14 WG_O13, WG_D8(13)
#define WG_O15 WG_O14, WG_D8(14)
#define WG_O16 WG_O15, WG_D8(15)

// WG_MMA_SS(NAME, N, G, DA, DB, SC, TYPE, TRANS_B) defines NAME(d, da, db, sc): one m64nNk16
// wgmma, D[64 x N] (+)= A . B, both operands in shared memory (descriptors), fp32
// accumulators d[N / 2] (G = N / 16 groups of 8), element type TYPE ("bf16", "f16"), A and B
// scales 1, A K-major, B K-major (TRANS_B "0") or N-major ("1"); scale-d = sc (0: D = A . B).
// DA, DB and SC are the operand numbers of da, db and sc: N / 2, N / 2 + 1 and N / 2 + 2.
#define WG_MMA_SS(NAME, N, G, DA, DB, SC, TYPE, TRANS_B)                                                       \
  __device__ __forceinline__ void NAME(float (&d)[N / 2], unsigned long long da, unsigned long long db, int sc) { \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #SC ", 0;\n"                                            \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TYPE "." TYPE " "                           \
                 "{" WG_R##G "}, %" #DA ", %" #DB ", p, 1, 1, 0, " TRANS_B ";\n}\n"                          \
                 : WG_O##G                                                                                     \
                 : "l"(da), "l"(db), "r"(sc));                                                                 \
  }

struct __align__(64) wg_tmap {
  unsigned long long opaque[16];  // a CUtensorMap
};
__device__ __forceinline__ void wg_mbar_expect_tx(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// Box (c0, c1) of `map` (c0 the column, c1 the row, in elements) to shared address dst;
// its bytes count against `bar`'s transaction.
__device__ __forceinline__ void wg_tma_load(unsigned dst, const wg_tmap* map, unsigned bar, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n" ::"r"(dst),
      "l"(reinterpret_cast<unsigned long long>(map)), "r"(bar), "r"(c0), "r"(c1)
      : "memory");
}
__device__ __forceinline__ void wg_tma_prefetch(const wg_tmap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<unsigned long long>(map)) : "memory");
}
