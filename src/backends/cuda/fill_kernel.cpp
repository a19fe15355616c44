// The kernel kiln::InputFiller (kiln/fill.hpp) fills a GPU's memory with.
#include "backends/cuda/fill_kernel.hpp"

namespace kiln {

namespace {

// The generator of kiln/fill.hpp with the input's scale or constant: the same
// values as fill_random and scale_fill make on the host, bit for bit (IEEE
// double and float, round to nearest even; the compile contracts nothing into
// a fused multiply-add).
constexpr const char* kFillSource = R"(#include <cuda_fp16.h>
// DT: 0 f32, 1 f64, 2 i32, 3 i64, 4 f16, 5 bf16 (kiln's DType); MODE: 0 none, 1 scale c, 2 constant c.
// Each element's value is the generator's, bit for bit; how they are reached is
// cheaper than element by element in doubles: consecutive elements' counters
// differ by the increment, so a thread makes a run of them (16 bytes' worth,
// stored at once where the buffer is so aligned) from one product, and
// 2u - 1 = k * 2^-52 exactly (k = (r >> 11) - 2^52, an integer below 2^52 in
// magnitude), so its nearest float is float(k) * 2^-52 (one conversion; the
// scaling by a power of two is exact, k != 0 being at least 2^-52).
__device__ __forceinline__ unsigned short kiln_bf16_bits(float f) {
  unsigned int x = __float_as_uint(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((x >> 16) | 0x40);
  x += 0x7fffu + ((x >> 16) & 1u);
  return (unsigned short)(x >> 16);
}
__device__ __forceinline__ unsigned long long kiln_mix(unsigned long long z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
template <int DT> struct KilnBits { typedef unsigned int T; };
template <> struct KilnBits<1> { typedef unsigned long long T; };
template <> struct KilnBits<3> { typedef unsigned long long T; };
template <> struct KilnBits<4> { typedef unsigned short T; };
template <> struct KilnBits<5> { typedef unsigned short T; };
// Element r's bits (r: the mixed counter).
template <int DT, int MODE>
__device__ __forceinline__ typename KilnBits<DT>::T kiln_value(unsigned long long r, double c) {
  const long long k = (long long)(r >> 11) - (1ll << 52);
  if (DT == 0) {
    float f = (float)k * 0x1p-52f;
    if (MODE == 1) f = (float)((double)f * c);
    if (MODE == 2) f = (float)c;
    return __float_as_uint(f);
  } else if (DT == 1) {
    const double v = (double)k * 0x1p-52;
    return (unsigned long long)__double_as_longlong(MODE == 1 ? v * c : MODE == 2 ? c : v);
  } else if (DT == 2) {
    int i = (int)(r % 201) - 100;
    if (MODE == 1) i = (int)((double)i * c);
    if (MODE == 2) i = (int)c;
    return (unsigned int)i;
  } else if (DT == 3) {
    long long i = (long long)(r % 201) - 100;
    if (MODE == 1) i = (long long)((double)i * c);
    if (MODE == 2) i = (long long)c;
    return (unsigned long long)i;
  } else if (DT == 4) {
    __half h = __float2half_rn((float)k * 0x1p-52f);
    if (MODE == 1) h = __float2half_rn((float)((double)__half2float(h) * c));
    if (MODE == 2) h = __float2half_rn((float)c);
    return __half_as_ushort(h);
  } else {
    unsigned short h = kiln_bf16_bits((float)k * 0x1p-52f);
    if (MODE == 1) h = kiln_bf16_bits((float)((double)__uint_as_float((unsigned int)h << 16) * c));
    if (MODE == 2) h = kiln_bf16_bits((float)c);
    return h;
  }
}
template <int DT, int MODE>
__device__ void kiln_fill_all(unsigned char* out, long long n, unsigned long long seed, double c) {
  typedef typename KilnBits<DT>::T T;
  const int E = 16 / sizeof(T);
  const unsigned long long inc = 0x9e3779b97f4a7c15ull;
  const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  const long long stride = (long long)gridDim.x * blockDim.x;
  T* o = (T*)out;
  long long done = 0;
  if (((unsigned long long)out & 15) == 0) {
    const long long runs = n / E;
    for (long long g = first; g < runs; g += stride) {
      union {
        uint4 v;
        T e[16 / sizeof(T)];
      } u;
      unsigned long long z = seed + (unsigned long long)(g * E + 1) * inc;
#pragma unroll
      for (int i = 0; i < E; ++i, z += inc) u.e[i] = kiln_value<DT, MODE>(kiln_mix(z), c);
      ((uint4*)o)[g] = u.v;
    }
    done = runs * E;
  }
  for (long long j = done + first; j < n; j += stride)
    o[j] = kiln_value<DT, MODE>(kiln_mix(seed + (unsigned long long)(j + 1) * inc), c);
}
#define KILN_FILL_CASE(DT, MODE) \
  case DT * 3 + MODE: kiln_fill_all<DT, MODE>(out, n, seed, c); break;
extern "C" __global__ void kiln_fill(unsigned char* out, long long n, unsigned long long seed, int dt, int mode,
                                     double c) {
  switch (dt * 3 + mode) {
    KILN_FILL_CASE(0, 0) KILN_FILL_CASE(0, 1) KILN_FILL_CASE(0, 2)
    KILN_FILL_CASE(1, 0) KILN_FILL_CASE(1, 1) KILN_FILL_CASE(1, 2)
    KILN_FILL_CASE(2, 0) KILN_FILL_CASE(2, 1) KILN_FILL_CASE(2, 2)
    KILN_FILL_CASE(3, 0) KILN_FILL_CASE(3, 1) KILN_FILL_CASE(3, 2)
    KILN_FILL_CASE(4, 0) KILN_FILL_CASE(4, 1) KILN_FILL_CASE(4, 2)
    KILN_FILL_CASE(5, 0) KILN_FILL_CASE(5, 1) KILN_FILL_CASE(5, 2)
  }
}
)";

static_assert(static_cast<int>(DType::f32) == 0 && static_cast<int>(DType::f64) == 1 && static_cast<int>(DType::i32) == 2 &&
                  static_cast<int>(DType::i64) == 3 && static_cast<int>(DType::f16) == 4 && static_cast<int>(DType::bf16) == 5,
              "kFillSource numbers the dtypes as DType does");

}  // namespace

CompileRequest cuda_fill_request() {
  CompileRequest req;
  req.backend = "cuda";
  req.kernel = "kiln_fill";
  req.entry = "kiln_fill";
  req.source_name = "kiln_fill.cu";
  req.source_text = kFillSource;
  req.args = {{"out", DType::f32, true}, {"n", DType::i64, false},  {"seed", DType::i64, false},
              {"dt", DType::i32, false}, {"mode", DType::i32, false}, {"c", DType::f64, false}};
  req.cflags = {"--fmad=false"};
  return req;
}

}  // namespace kiln
