// The kernel kiln::InputFiller (kiln/fill.hpp) fills a GPU's memory with.
#include "backends/cuda/fill_kernel.hpp"

namespace kiln {

namespace {

// The generator of kiln/fill.hpp, element by element, with the input's scale
// or constant: the same operations in the same order as fill_random and
// scale_fill on the host (IEEE double and float, round to nearest even; the
// compile contracts nothing into a fused multiply-add).
constexpr const char* kFillSource = R"(#include <cuda_fp16.h>
// DT: 0 f32, 1 f64, 2 i32, 3 i64, 4 f16, 5 bf16 (kiln's DType); MODE: 0 none, 1 scale c, 2 constant c.
__device__ unsigned short kiln_bf16_bits(float f) {
  unsigned int x = __float_as_uint(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((x >> 16) | 0x40);
  x += 0x7fffu + ((x >> 16) & 1u);
  return (unsigned short)(x >> 16);
}
extern "C" __global__ void kiln_fill(unsigned char* out, long long n, unsigned long long seed, int dt, int mode,
                                     double c) {
  const long long stride = (long long)gridDim.x * blockDim.x;
  for (long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x; j < n; j += stride) {
    unsigned long long z = seed + (unsigned long long)(j + 1) * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z = z ^ (z >> 31);
    const double u = (double)(z >> 11) * (1.0 / 9007199254740992.0);
    const double v = 2 * u - 1;
    switch (dt) {
      case 0: {
        float f = (float)v;
        if (mode == 1) f = (float)((double)f * c);
        if (mode == 2) f = (float)c;
        ((float*)out)[j] = f;
        break;
      }
      case 1: ((double*)out)[j] = mode == 1 ? v * c : mode == 2 ? c : v; break;
      case 2: {
        int i = (int)(z % 201) - 100;
        if (mode == 1) i = (int)((double)i * c);
        if (mode == 2) i = (int)c;
        ((int*)out)[j] = i;
        break;
      }
      case 3: {
        long long i = (long long)(z % 201) - 100;
        if (mode == 1) i = (long long)((double)i * c);
        if (mode == 2) i = (long long)c;
        ((long long*)out)[j] = i;
        break;
      }
      case 4: {
        __half h = __float2half_rn((float)v);
        if (mode == 1) h = __float2half_rn((float)((double)__half2float(h) * c));
        if (mode == 2) h = __float2half_rn((float)c);
        ((__half*)out)[j] = h;
        break;
      }
      case 5: {
        unsigned short h = kiln_bf16_bits((float)v);
        if (mode == 1) h = kiln_bf16_bits((float)((double)__uint_as_float((unsigned int)h << 16) * c));
        if (mode == 2) h = kiln_bf16_bits((float)c);
        ((unsigned short*)out)[j] = h;
        break;
      }
    }
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
