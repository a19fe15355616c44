// The floor of a GPU process's start: the CUDA driver opened, initialised,
// the device's primary context made current and a first allocation made
// (the context's lazy parts done), with nothing of kiln. Prints
//   context ready <s> s after exec (cuInit <s>, context <s>)
// where "after exec" counts from BENCH_EXEC_NS (the wall clock's nanoseconds
// when the process was started: `BENCH_EXEC_NS=$(date +%s%N) kiln_bench_context`),
// else from main(). bench/gpu/warm_start.sh sets a warm kiln process's start
// to its first token beside it.
#include <dlfcn.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

namespace {

double wall_s() {
  return static_cast<double>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                 std::chrono::system_clock::now().time_since_epoch())
                                 .count()) /
         1e9;
}

}  // namespace

int main() {
  const double main_s = wall_s();
  const char* e = std::getenv("BENCH_EXEC_NS");
  const double start_s = e ? std::strtod(e, nullptr) / 1e9 : main_s;
  void* h = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    std::fprintf(stderr, "kiln_bench_context: no CUDA driver (%s)\n", ::dlerror());
    return 1;
  }
  using Init = int (*)(unsigned);
  using DeviceGet = int (*)(int*, int);
  using Retain = int (*)(void**, int);
  using SetCurrent = int (*)(void*);
  using Alloc = int (*)(unsigned long long*, size_t);
  using Free = int (*)(unsigned long long);
  auto init = reinterpret_cast<Init>(::dlsym(h, "cuInit"));
  auto device_get = reinterpret_cast<DeviceGet>(::dlsym(h, "cuDeviceGet"));
  auto retain = reinterpret_cast<Retain>(::dlsym(h, "cuDevicePrimaryCtxRetain"));
  auto set_current = reinterpret_cast<SetCurrent>(::dlsym(h, "cuCtxSetCurrent"));
  auto alloc = reinterpret_cast<Alloc>(::dlsym(h, "cuMemAlloc_v2"));
  auto release = reinterpret_cast<Free>(::dlsym(h, "cuMemFree_v2"));
  if (!init || !device_get || !retain || !set_current || !alloc || !release) {
    std::fprintf(stderr, "kiln_bench_context: the CUDA driver lacks a function this uses\n");
    return 1;
  }
  const double t0 = wall_s();
  int dev = 0;
  void* ctx = nullptr;
  unsigned long long p = 0;
  if (init(0) != 0 || device_get(&dev, 0) != 0) {
    std::fprintf(stderr, "kiln_bench_context: no GPU\n");
    return 1;
  }
  const double t1 = wall_s();
  if (retain(&ctx, dev) != 0 || set_current(ctx) != 0 || alloc(&p, 256) != 0 || release(p) != 0) {
    std::fprintf(stderr, "kiln_bench_context: the context could not be made\n");
    return 1;
  }
  const double t2 = wall_s();
  std::printf("context ready %.3f s after exec (cuInit %.3f, context %.3f)\n", t2 - start_s, t1 - t0, t2 - t1);
  return 0;
}
