#include "backends/cuda/cuda_backend.hpp"

#include <dlfcn.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <future>
#include <mutex>
#include <sstream>
#include <thread>

#include "backends/cuda/cuda_api.hpp"
#include "backends/cuda/cuda_libraries.hpp"
#include "core/format.hpp"
#include "core/log.hpp"

namespace kiln {

using namespace cuda;

namespace {

// Bump when the generated source around a kernel changes: old binaries no longer fit.
constexpr int kCudaAbiVersion = 3;

// The largest shared memory a block can opt in to, by architecture, for
// pruning when there is no device to ask.
int64_t arch_shared_optin(const std::string& arch) {
  int cc = 0;
  std::sscanf(arch.c_str(), "sm_%d", &cc);
  if (cc >= 100) return 232448;
  if (cc >= 90) return 232448;
  if (cc == 80 || cc == 87) return 166912;
  if (cc >= 86) return 101376;
  if (cc >= 75) return 65536;
  if (cc >= 70) return 98304;
  return 49152;
}

// SM_COUNT with no device to ask (compiling ahead, pruning): the SMs of the
// architecture's data-centre part (H100 SXM and H200: 132; A100: 108; B200:
// 148); 0, unknown, elsewhere. A device's own count replaces it when there is one.
int64_t arch_sm_count(const std::string& arch) {
  int cc = 0;
  std::sscanf(arch.c_str(), "sm_%d", &cc);
  if (cc == 90) return 132;
  if (cc == 80) return 108;
  if (cc == 100) return 148;
  return 0;
}

LaunchLimits arch_limits(const std::string& arch) {
  LaunchLimits l;
  l.grid[0] = (int64_t{1} << 31) - 1;
  l.grid[1] = l.grid[2] = 65535;
  l.block[0] = l.block[1] = 1024;
  l.block[2] = 64;
  l.block_threads = 1024;
  l.shared = arch_shared_optin(arch);
  l.multiprocessors = arch_sm_count(arch);
  return l;
}

// The most threads per block a kernel using `regs` registers a thread can
// have (registers are given out 256 to a warp; 64K a block).
int max_threads_for(int regs) {
  if (regs <= 0) return 1024;
  int per_warp = (regs * 32 + 255) / 256 * 256;
  int warps = 65536 / per_warp;
  return std::min(1024, warps * 32);
}

// The ptxas resource lines NVRTC logs for one entry function.
std::optional<KernelMeta> parse_resources(const std::string& log, const std::string& lowered) {
  std::string head = "Compiling entry function '" + lowered + "'";
  size_t at = log.find(head);
  if (at == std::string::npos) return std::nullopt;
  size_t end = log.find("Compiling entry function '", at + head.size());
  std::string part = log.substr(at, end == std::string::npos ? std::string::npos : end - at);
  KernelMeta m;
  m.symbol = lowered;
  bool have_regs = false, have_frame = false;
  std::istringstream in(part);
  std::string line;
  while (std::getline(in, line)) {
    int a = 0, b = 0, c = 0;
    if (auto p = line.find("bytes stack frame"); p != std::string::npos) {
      if (std::sscanf(line.c_str() + line.find('.') + 1, " %d bytes stack frame, %d bytes spill stores, %d bytes spill loads",
                      &a, &b, &c) == 3) {
        m.local_bytes = a;
        m.spill_bytes = b + c;
        have_frame = true;
      }
    }
    if (auto p = line.find("Used "); p != std::string::npos) {
      if (std::sscanf(line.c_str() + p, "Used %d registers", &a) == 1) {
        m.registers = a;
        have_regs = true;
      }
      if (auto s = line.find(" bytes smem"); s != std::string::npos) {
        size_t k = line.rfind(", ", s);
        if (k != std::string::npos) m.static_shared = std::atoi(line.c_str() + k + 2);
      }
    }
  }
  if (!have_regs || !have_frame) return std::nullopt;
  m.max_threads = max_threads_for(m.registers);
  return m;
}

template <class T>
bool read_at(const std::vector<uint8_t>& b, size_t off, T* out) {
  if (off > b.size() || b.size() - off < sizeof(T)) return false;
  std::memcpy(out, b.data() + off, sizeof(T));
  return true;
}

}  // namespace

// The launch metadata of kernel `symbol` read from a cubin (an ELF file):
// registers (.nv.info attribute 0x2f), stack frame (0x11) and launch bounds
// (0x05) per function, and the size of its .nv.shared section (which, where
// the architecture reserves shared memory for the system, as sm_90 does,
// includes that reserved kilobyte). Spills are not recorded in a cubin.
std::optional<KernelMeta> cubin_meta(const std::vector<uint8_t>& b, const std::string& symbol) {
  struct Sec {
    uint32_t name, type;
    uint64_t off, size;
    uint32_t link, info;
  };
  uint64_t shoff = 0;
  uint16_t shentsize = 0, shnum = 0, shstrndx = 0;
  if (b.size() < 64 || std::memcmp(b.data(), "\x7f" "ELF", 4) != 0 || b[4] != 2) return std::nullopt;
  if (!read_at(b, 0x28, &shoff) || !read_at(b, 0x3A, &shentsize) || !read_at(b, 0x3C, &shnum) ||
      !read_at(b, 0x3E, &shstrndx) || shentsize < 64 || shstrndx >= shnum)
    return std::nullopt;
  std::vector<Sec> secs(shnum);
  for (uint16_t i = 0; i < shnum; ++i) {
    size_t o = shoff + static_cast<size_t>(i) * shentsize;
    Sec& x = secs[i];
    if (!read_at(b, o, &x.name) || !read_at(b, o + 4, &x.type) || !read_at(b, o + 24, &x.off) ||
        !read_at(b, o + 32, &x.size) || !read_at(b, o + 40, &x.link) || !read_at(b, o + 44, &x.info))
      return std::nullopt;
  }
  auto cstr = [&](uint64_t off) -> std::string {
    if (off >= b.size()) return "";
    const char* p = reinterpret_cast<const char*>(b.data() + off);
    size_t n = strnlen(p, b.size() - off);
    return std::string(p, n);
  };
  auto name_of = [&](const Sec& x) { return cstr(secs[shstrndx].off + x.name); };
  // The symbol table, to find the function's index.
  int64_t sym_index = -1;
  bool reserved = false;
  int64_t shared_section = -1;
  for (const Sec& x : secs) {
    std::string n = name_of(x);
    if (n == ".nv.shared.reserved.0") reserved = true;
    if (n == ".nv.shared." + symbol) shared_section = static_cast<int64_t>(x.size);
    if (x.type != 2 || x.link >= secs.size()) continue;  // SHT_SYMTAB
    const Sec& strs = secs[x.link];
    for (uint64_t j = 0; j * 24 + 24 <= x.size; ++j) {
      uint32_t st_name = 0;
      if (!read_at(b, x.off + j * 24, &st_name)) break;
      if (cstr(strs.off + st_name) == symbol) sym_index = static_cast<int64_t>(j);
    }
  }
  if (sym_index < 0) return std::nullopt;
  KernelMeta m;
  m.symbol = symbol;
  bool have_regs = false;
  auto scan = [&](const Sec& x, bool per_function) {
    uint64_t o = x.off, end = x.off + x.size;
    while (o + 4 <= end && end <= b.size()) {
      uint8_t fmt = b[o], attr = b[o + 1];
      uint16_t size = 0;
      read_at(b, o + 2, &size);
      if (fmt != 0x04) {  // a value in the size field, or none
        o += 4;
        continue;
      }
      uint32_t a = 0, v = 0;
      if (!per_function && size == 8 && read_at(b, o + 4, &a) && read_at(b, o + 8, &v) && a == sym_index) {
        if (attr == 0x2f) m.registers = static_cast<int>(v), have_regs = true;
        if (attr == 0x11) m.local_bytes = static_cast<int>(v);
      }
      if (per_function && attr == 0x05 && size == 12 && read_at(b, o + 4, &a)) {
        uint32_t y = 1, z = 1;
        read_at(b, o + 8, &y);
        read_at(b, o + 12, &z);
        m.max_threads = static_cast<int>(a * y * z);
      }
      o += 4 + size;
    }
  };
  for (const Sec& x : secs) {
    std::string n = name_of(x);
    if (n == ".nv.info") scan(x, false);
    if (n == ".nv.info." + symbol) scan(x, true);
  }
  if (!have_regs) return std::nullopt;
  if (shared_section > 0) m.static_shared = static_cast<int>(shared_section - (reserved ? 1024 : 0));
  int by_regs = max_threads_for(m.registers);
  m.max_threads = m.max_threads > 0 ? std::min(m.max_threads, by_regs) : by_regs;
  return m;
}

namespace {

// A graph's kernel launches as they are captured (their nodes recorded, in order) or
// as they are replayed into an instantiated graph to update it (Graph::update): set
// for the thread while the work runs; launches on `stream` only.
// A captured kernel node and what it was last set to launch: its dims and
// its parameters' bytes (empty where the sizes are unknown), so that an
// update sets only the nodes whose launch changed. A node kiln did not
// launch (a library's kernel, a fill) has no kernel: an update can keep it,
// never set it.
struct GraphNode {
  CUgraphNode node;
  CUkernel kernel;
  std::array<unsigned, 7> dims{};  // grid, block, shared bytes
  std::vector<unsigned char> args;
};

struct GraphRecording {
  CUstream stream = nullptr;
  bool update = false;
  std::vector<GraphNode>* nodes = nullptr;
  size_t cursor = 0;
  CUgraphExec exec = nullptr;
  bool ok = true;
};
thread_local GraphRecording* t_recording = nullptr;
// A capture's words (Device::write_word): their nodes, in order, for Graph::set_word.
struct WordNode {
  CUgraphNode node;
  CUdeviceptr dst;
  CUkernel kernel;  // the word kernel's node, or null: a memset's (never set in place)
};
// kiln_word(p, v): *p = v, one thread (PTX the driver compiles for any GPU since Volta).
constexpr char kKilnWordPtx[] = R"(.version 7.0
.target sm_70
.address_size 64
.visible .entry kiln_word(.param .u64 kiln_p, .param .u32 kiln_v)
{
  .reg .b32 %r<2>;
  .reg .b64 %rd<3>;
  ld.param.u64 %rd1, [kiln_p];
  ld.param.u32 %r1, [kiln_v];
  cvta.to.global.u64 %rd2, %rd1;
  st.global.u32 [%rd2], %r1;
  ret;
}
)";
// kiln_hold(flag, ticket, limit): spins until the 64-bit word at flag (pinned host memory the
// GPU reads, at system scope) is at least `ticket`, or `limit` nanoseconds of %globaltimer
// have passed, so that what a benchmark enqueues behind it runs back to back once the host
// lets it go (KILN_BENCH_HOLD); the limit bounds a host that never does. Each hold has its
// own ticket and the host only raises the word, so a release lets go of its own hold and of
// none enqueued later.
constexpr char kKilnHoldPtx[] = R"(.version 7.0
.target sm_70
.address_size 64
.visible .entry kiln_hold(.param .u64 kiln_flag, .param .u64 kiln_ticket, .param .u64 kiln_limit)
{
  .reg .pred %p<3>;
  .reg .b64 %rd<8>;
  ld.param.u64 %rd1, [kiln_flag];
  ld.param.u64 %rd6, [kiln_ticket];
  ld.param.u64 %rd2, [kiln_limit];
  cvta.to.global.u64 %rd1, %rd1;
  mov.u64 %rd3, %globaltimer;
kiln_spin:
  ld.relaxed.sys.global.u64 %rd7, [%rd1];
  setp.ge.u64 %p1, %rd7, %rd6;
  @%p1 bra kiln_out;
  mov.u64 %rd4, %globaltimer;
  sub.u64 %rd5, %rd4, %rd3;
  setp.ge.u64 %p2, %rd5, %rd2;
  @%p2 bra kiln_out;
  nanosleep.u32 500;
  bra kiln_spin;
kiln_out:
  ret;
}
)";
// kiln_touch(p, n, out): reads n 16-byte chunks from p (a grid-stride loop) and stores their
// xor to out only where it equals a value the flush buffer's chunks never give (each chunk is
// four equal words: their xor is 0), so the loads cannot be dropped and nothing is written.
// An L2 flush by reading (KILN_BENCH_L2_FLUSH=read) leaves L2 holding clean lines.
constexpr char kKilnTouchPtx[] = R"(.version 7.0
.target sm_70
.address_size 64
.visible .entry kiln_touch(.param .u64 kiln_p, .param .u64 kiln_n, .param .u64 kiln_out)
{
  .reg .pred %p<3>;
  .reg .b32 %r<10>;
  .reg .b64 %rd<10>;
  ld.param.u64 %rd1, [kiln_p];
  ld.param.u64 %rd2, [kiln_n];
  ld.param.u64 %rd3, [kiln_out];
  cvta.to.global.u64 %rd1, %rd1;
  mov.u32 %r1, %ctaid.x;
  mov.u32 %r2, %ntid.x;
  mov.u32 %r3, %tid.x;
  mov.u32 %r4, %nctaid.x;
  mul.wide.u32 %rd4, %r1, %r2;
  cvt.u64.u32 %rd5, %r3;
  add.u64 %rd4, %rd4, %rd5;
  mul.wide.u32 %rd6, %r4, %r2;
  mov.u32 %r5, 0;
kiln_loop:
  setp.ge.u64 %p1, %rd4, %rd2;
  @%p1 bra kiln_done;
  shl.b64 %rd7, %rd4, 4;
  add.u64 %rd8, %rd1, %rd7;
  ld.global.v4.u32 {%r6, %r7, %r8, %r9}, [%rd8];
  xor.b32 %r5, %r5, %r6;
  xor.b32 %r5, %r5, %r7;
  xor.b32 %r5, %r5, %r8;
  xor.b32 %r5, %r5, %r9;
  add.u64 %rd4, %rd4, %rd6;
  bra kiln_loop;
kiln_done:
  setp.ne.u32 %p2, %r5, 0x9e3779b9;
  @%p2 bra kiln_end;
  cvta.to.global.u64 %rd9, %rd3;
  st.global.u32 [%rd9], %r5;
kiln_end:
  ret;
}
)";
thread_local std::vector<WordNode>* t_words = nullptr;
// A word was written on this thread since its last launch: the next launch does not overlap
// what came before it (a kernel's programmatic edge is to the kernel before it, not a memset).
thread_local bool t_after_word = false;
// This thread holds a stream (Device::hold_stream): timed runs queue behind it, and none may
// overlap the run before it.
thread_local bool t_held = false;

struct RecordingScope {
  GraphRecording* prev;
  explicit RecordingScope(GraphRecording* r) : prev(t_recording) { t_recording = r; }
  ~RecordingScope() { t_recording = prev; }
};

// The compile log without ptxas' resource report (kept as the binary's warnings): the front
// end's messages, and ptxas' warnings and numbered advisories, which come among the report's
// lines, as "ptxas info    : (C7513) Potential Performance Loss: wgmma.mma_async instructions
// are serialized ..." (a kernel whose tensor-core work then runs one wgmma at a time).
std::string warnings_only(const std::string& log) {
  std::istringstream in(log);
  std::string line, out;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    if (line.rfind("ptxas", 0) == 0) {
      const size_t colon = line.find(':');
      const bool advisory = colon != std::string::npos && line.compare(colon, 4, ": (C") == 0;
      if (!advisory && line.find("warning") == std::string::npos && line.find("error") == std::string::npos) continue;
    }
    out += line + "\n";
  }
  return out;
}

class CudaDevice;

class CudaKernel final : public LoadedKernel {
 public:
  CudaKernel(std::string key, KernelMeta meta, CudaDevice& dev, CUlibrary lib, CUkernel k, std::string what);
  ~CudaKernel() override;
  void launch(void* const* params, const LaunchDims& d, Stream s) override;
  void* native_handle() const override { return k_; }

 private:
  [[noreturn]] void failed(CUresult r, const LaunchDims& d);
  void raise_shared(int64_t bytes);
  const CUtensorMap& tensor_map(const TensorMapDims& m, CUdeviceptr p);
  // The workspace of at least `bytes` (the spec's workspace) of the launches on stream s (of
  // this thread's, for the per-thread and the legacy default streams), made on first use.
  CUdeviceptr workspace(int64_t bytes, CUstream s);
  // A launch's parameters as the bytes the kernel receives; false where their sizes are unknown.
  bool param_bytes(void* const* kp, int n, std::vector<unsigned char>& out);
  CudaDevice& dev_;
  const Driver* drv_;
  CUlibrary lib_;
  CUkernel k_;
  std::string what_;
  std::atomic<int64_t> raised_{48 * 1024};
  std::mutex raise_m_;
  std::once_flag sizes_once_;
  std::vector<size_t> param_sizes_;  // per parameter, from the driver; empty if it cannot tell
  // Workspaces, one for each stream the kernel is launched on, and for each thread that
  // launches it on a default stream (a launch owns its workspace while it runs: launches in
  // one stream never overlap, and a stream-K kernel's flags would be read by another launch's);
  // every one is kept until the kernel is unloaded (a graph captured with one may replay it),
  // a larger one replacing a stream's for its later launches.
  struct Workspace {
    uint64_t thread;  // a default stream's thread's serial (never reused, unlike a std::thread::id); else 0
    CUstream stream;
    CUdeviceptr ptr;
    int64_t bytes;
  };
  std::mutex ws_m_;
  std::vector<Workspace> ws_;
  const uint64_t serial_;  // tells this kernel from a later one at the same address
};

class CudaTimer final : public Timer {
 public:
  CudaTimer(const Driver* d, CudaDevice& dev);
  ~CudaTimer() override;
  void start(Stream s) override;
  void stop(Stream s) override;
  double elapsed_ns() override;

 private:
  const Driver* d_;
  CudaDevice& dev_;
  CUevent a_ = nullptr, b_ = nullptr;
};

CUstream stream_of(Stream s) { return s ? static_cast<CUstream>(s) : per_thread_stream(); }

class CudaDevice final : public Device {
 public:
  CudaDevice(const Driver* d, int ordinal, bool pdl, bool flush_read)
      : d_(d), ordinal_(ordinal), flush_read_(flush_read) {
    check(d_->cuDeviceGet(&dev_, ordinal), "getting the device");
    check(d_->cuDevicePrimaryCtxRetain(&ctx_, dev_), "retaining the device's primary context");
    char name[256] = {};
    d_->cuDeviceGetName(name, sizeof name, dev_);
    info_.name = name;
    info_.ordinal = ordinal;
    int major = attr(COMPUTE_CAPABILITY_MAJOR), minor = attr(COMPUTE_CAPABILITY_MINOR);
    info_.arch = fmt::format("sm_{}{}", major, minor);
    // Programmatic dependent launch: Hopper on, with the extended launch and a driver that
    // captures it into graphs (CUDA 12.3).
    pdl_ = pdl && major >= 9 && d_->cuLaunchKernelEx && d_->version >= 12030;
    info_.multiprocessors = attr(MULTIPROCESSOR_COUNT);
    info_.l2_bytes = attr(L2_CACHE_SIZE);
    size_t mem = 0;
    d_->cuDeviceTotalMem(&mem, dev_);
    info_.memory_bytes = static_cast<int64_t>(mem);
    info_.driver = fmt::format("CUDA driver {}.{}", d_->version / 1000, d_->version % 1000 / 10);
    LaunchLimits& l = info_.limits;
    l.grid[0] = attr(MAX_GRID_DIM_X);
    l.grid[1] = attr(MAX_GRID_DIM_Y);
    l.grid[2] = attr(MAX_GRID_DIM_Z);
    l.block[0] = attr(MAX_BLOCK_DIM_X);
    l.block[1] = attr(MAX_BLOCK_DIM_Y);
    l.block[2] = attr(MAX_BLOCK_DIM_Z);
    l.block_threads = attr(MAX_THREADS_PER_BLOCK);
    l.shared = attr(MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
    l.multiprocessors = info_.multiprocessors;
    info_.registers_per_block = attr(MAX_REGISTERS_PER_BLOCK);
  }
  ~CudaDevice() override {
    if (flush_) d_->cuMemFree(flush_);
    if (hold_flag_) d_->cuMemFreeHost(hold_flag_);
    if (hold_lib_) d_->cuLibraryUnload(hold_lib_);
    if (capture_) d_->cuStreamDestroy(capture_);
    if (aux_) d_->cuStreamDestroy(aux_);
    for (CUstream s : capture_streams_) d_->cuStreamDestroy(s);
    if (word_lib_) d_->cuLibraryUnload(word_lib_);
    if (touch_lib_) d_->cuLibraryUnload(touch_lib_);
    d_->cuDevicePrimaryCtxRelease(dev_);
  }

  const Driver* driver() const { return d_; }
  CUdevice handle() const { return dev_; }
  int ordinal() const { return ordinal_; }
  // Whether a spec's pdl launches overlap the kernel before them (KILN_PDL, the device, the driver).
  bool pdl() const { return pdl_; }

  // The context every call of kiln's needs: the caller's current one if it
  // has one, else this device's primary context. Cheap: a thread-local read.
  void ensure_current() {
    CUcontext cur = nullptr;
    d_->cuCtxGetCurrent(&cur);
    if (!cur) check(d_->cuCtxSetCurrent(ctx_), "making the device's context current");
  }

  // Throws Error(Errc::launch) for a failed call; notes a fault that took the context down.
  void check(CUresult r, const char* what) {
    if (r == CUDA_SUCCESS) return;
    std::string text = d_->error_text(r);
    if (sticky(r)) {
      std::lock_guard<std::mutex> g(m_);
      if (fault_.empty()) fault_ = text;
    }
    if (r == CUDA_ERROR_OUT_OF_MEMORY) fail(Errc::io, "{} on GPU {}: {}", what, ordinal_, text);
    fail(Errc::launch, "{} on GPU {}: {}{}", what, ordinal_, text,
         sticky(r) ? " (a kernel faulted; this process's context on the GPU can no longer be used)" : "");
  }

  const DeviceInfo& info() override { return info_; }
  bool host_addressable() const override { return false; }

  // Device memory of `bytes` (whole 256s, at least one), zeroed on stream s before this
  // returns; on an error nothing is kept, and `zeroing` says whether it was the zeroing's.
  CUresult alloc_zeroed(size_t bytes, CUstream s, CUdeviceptr* p, bool* zeroing) {
    const size_t n = bytes == 0 ? 256 : (bytes + 255) / 256 * 256;
    *zeroing = false;
    CUresult r = d_->cuMemAlloc(p, n);
    if (r != CUDA_SUCCESS) return r;
    *zeroing = true;
    r = d_->cuMemsetD8Async(*p, 0, n, s);
    if (r == CUDA_SUCCESS) r = d_->cuStreamSynchronize(s);
    if (r != CUDA_SUCCESS) {
      d_->cuMemFree(*p);
      *p = 0;
    }
    return r;
  }
  void* alloc(size_t bytes) override {
    ensure_current();
    CUdeviceptr p = 0;
    bool zeroing = false;
    const CUresult r = alloc_zeroed(bytes, per_thread_stream(), &p, &zeroing);
    check(r, zeroing ? "zeroing new memory" : fmt::format("allocating {} bytes", bytes).c_str());
    return reinterpret_cast<void*>(p);
  }
  // Streams to capture graphs on, one a live graph (the mark of its launches when it is
  // updated): a graph's is taken back when the graph ends, for the next capture, so a kernel's
  // workspace of that stream (a stream's own, CudaKernel::workspace) serves one live graph at a
  // time, and the workspaces of a program that captures anew as its buffers change stay as
  // many as its live graphs.
  CUstream take_capture_stream() {
    {
      std::lock_guard<std::mutex> g(aux_m_);
      if (!capture_streams_.empty()) {
        CUstream s = capture_streams_.back();
        capture_streams_.pop_back();
        return s;
      }
    }
    CUstream s = nullptr;
    check(d_->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), "creating a stream to capture on");
    return s;
  }
  void put_capture_stream(CUstream s) noexcept {
    std::lock_guard<std::mutex> g(aux_m_);
    capture_streams_.push_back(s);
  }
  // A kernel's workspace (`what` names the kernel): device memory zeroed before this returns.
  // It may be asked for while this thread captures a graph (the first launch of the kernel on
  // this thread being captured): the allocation and the zeroing then stay out of the graph.
  CUdeviceptr alloc_workspace(size_t bytes, const std::string& what) {
    ensure_current();
    int mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    const bool exchanged =
        d_->cuThreadExchangeStreamCaptureMode && d_->cuThreadExchangeStreamCaptureMode(&mode) == CUDA_SUCCESS;
    CUdeviceptr p = 0;
    CUresult r = CUDA_SUCCESS;
    {
      std::lock_guard<std::mutex> g(aux_m_);
      if (!aux_) r = d_->cuStreamCreate(&aux_, CU_STREAM_NON_BLOCKING);
      bool zeroing = false;
      if (r == CUDA_SUCCESS) r = alloc_zeroed(bytes, aux_, &p, &zeroing);
    }
    if (exchanged) d_->cuThreadExchangeStreamCaptureMode(&mode);
    check(r, fmt::format("making the {} bytes of workspace of {}", bytes, what).c_str());
    return p;
  }
  void free(void* p) noexcept override {
    if (!p) return;
    CUcontext cur = nullptr;
    d_->cuCtxGetCurrent(&cur);
    if (!cur) d_->cuCtxSetCurrent(ctx_);
    d_->cuMemFree(reinterpret_cast<CUdeviceptr>(p));
  }
  void to_device(void* dst, const void* src, size_t bytes, Stream s) override {
    if (!bytes) return;
    ensure_current();
    check(d_->cuMemcpyHtoDAsync(reinterpret_cast<CUdeviceptr>(dst), src, bytes, stream_of(s)), "copying to the GPU");
  }
  void to_host(void* dst, const void* src, size_t bytes, Stream s) override {
    if (!bytes) return;
    ensure_current();
    check(d_->cuMemcpyDtoHAsync(dst, reinterpret_cast<CUdeviceptr>(src), bytes, stream_of(s)), "copying from the GPU");
    check(d_->cuStreamSynchronize(stream_of(s)), "waiting for a copy from the GPU");
  }
  void copy(void* dst, const void* src, size_t bytes, Stream s) override {
    if (!bytes) return;
    ensure_current();
    check(d_->cuMemcpyDtoDAsync(reinterpret_cast<CUdeviceptr>(dst), reinterpret_cast<CUdeviceptr>(src), bytes,
                                stream_of(s)),
          "copying on the GPU");
  }
  void fill(void* dst, uint32_t pattern, int pattern_bytes, size_t count, Stream s) override {
    if (!count) return;
    ensure_current();
    auto p = reinterpret_cast<CUdeviceptr>(dst);
    CUresult r = pattern_bytes == 1   ? d_->cuMemsetD8Async(p, static_cast<unsigned char>(pattern), count, stream_of(s))
                 : pattern_bytes == 2 ? d_->cuMemsetD16Async(p, static_cast<unsigned short>(pattern), count, stream_of(s))
                                      : d_->cuMemsetD32Async(p, pattern, count, stream_of(s));
    check(r, "filling GPU memory");
  }
  // A word is written by a one-thread kernel (kKilnWordPtx, loaded at its first use): in a
  // graph, its node is set in place as cheaply as the program's own kernels' (a decode loop
  // whose graphs began with a memset node set in place ran about 25 times slower on the host,
  // bench/gpu/results/issue27-cells).
  CUkernel word_kernel() {
    std::call_once(word_once_, [&] {
      word_kernel_ = load_ptx_kernel(kKilnWordPtx, "kiln_word", &word_lib_);
      if (!word_kernel_) log::debug("cuda: the word kernel does not load here; words are written by memsets");
    });
    return word_kernel_;
  }
  // A kernel of kiln's own PTX (the driver compiles it for this GPU); null where it does not load.
  CUkernel load_ptx_kernel(const char* ptx, const char* name, CUlibrary* lib_out) {
    CUlibrary lib = nullptr;
    CUkernel k = nullptr;
    if (d_->cuLibraryLoadData(&lib, ptx, nullptr, nullptr, 0, nullptr, nullptr, 0) == CUDA_SUCCESS &&
        d_->cuLibraryGetKernel(&k, lib, name) == CUDA_SUCCESS) {
      *lib_out = lib;
      return k;
    }
    if (lib) d_->cuLibraryUnload(lib);
    return nullptr;
  }
  // The reading flush's kernel (kKilnTouchPtx), loaded at its first use; null where it does
  // not load (a flush asked to read then fails, rather than time with another flush).
  CUkernel touch_kernel() {
    std::call_once(touch_once_, [&] {
      touch_kernel_ = load_ptx_kernel(kKilnTouchPtx, "kiln_touch", &touch_lib_);
      if (!touch_kernel_) log::debug("cuda: the reading flush's kernel does not load here");
    });
    return touch_kernel_;
  }
  // The held stream's kernel (kKilnHoldPtx) and its flag in pinned host memory the GPU reads,
  // made at the first hold; false where either cannot be (then no stream is held).
  bool hold_ready() {
    std::call_once(hold_once_, [&] {
      if (!d_->cuMemHostAlloc || !d_->cuMemHostGetDevicePointer || !d_->cuMemFreeHost) return;
      void* h = nullptr;
      CUdeviceptr dp = 0;
      // CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP: every context, and a device address
      if (d_->cuMemHostAlloc(&h, 4096, 0x01 | 0x02) != CUDA_SUCCESS) return;
      if (d_->cuMemHostGetDevicePointer(&dp, h, 0) != CUDA_SUCCESS) {
        d_->cuMemFreeHost(h);
        return;
      }
      hold_kernel_ = load_ptx_kernel(kKilnHoldPtx, "kiln_hold", &hold_lib_);
      if (!hold_kernel_) {
        d_->cuMemFreeHost(h);
        log::debug("cuda: the held stream's kernel does not load here; timed runs are not held");
        return;
      }
      hold_flag_ = static_cast<uint64_t*>(h);
      *hold_flag_ = 0;
      hold_dev_ = dp;
    });
    return hold_kernel_ != nullptr;
  }
  uint64_t hold_stream(Stream s, double limit_ms) override {
    ensure_current();
    if (!hold_ready()) return 0;
    CUdeviceptr p = hold_dev_;
    uint64_t ticket = ++hold_tickets_;
    uint64_t limit = static_cast<uint64_t>(std::max(0.0, limit_ms) * 1e6);
    void* params[] = {&p, &ticket, &limit};
    check(d_->cuLaunchKernel(reinterpret_cast<CUfunction>(hold_kernel_), 1, 1, 1, 1, 1, 1, 0, stream_of(s), params,
                             nullptr),
          "holding a stream");
    t_held = true;  // no launch overlaps the one before it while the runs queue up
    return ticket;
  }
  void release_stream(uint64_t hold) override {
    t_held = false;
    if (!hold_flag_ || hold == 0) return;
    std::atomic_ref<uint64_t> flag(*hold_flag_);  // raised to `hold`, never lowered
    uint64_t now = flag.load(std::memory_order_seq_cst);
    while (now < hold && !flag.compare_exchange_weak(now, hold, std::memory_order_seq_cst)) {
    }
  }
  void write_word(void* dst, int32_t value, Stream s) override {
    ensure_current();
    auto p = reinterpret_cast<CUdeviceptr>(dst);
    const CUkernel k = word_kernel();
    if (k) {
      void* params[] = {&p, &value};
      check(d_->cuLaunchKernel(reinterpret_cast<CUfunction>(k), 1, 1, 1, 1, 1, 1, 0, stream_of(s), params, nullptr),
            "writing a word on the GPU");
    } else {
      check(d_->cuMemsetD32Async(p, static_cast<unsigned>(value), 1, stream_of(s)), "writing a word on the GPU");
    }
    t_after_word = true;
    if (!t_words) return;
    int status = 0;
    unsigned long long id = 0;
    CUgraph g = nullptr;
    const CUgraphNode* deps = nullptr;
    size_t n = 0;
    const bool found = d_->can_query_capture() &&
                       d_->capture_info(stream_of(s), &status, &id, &g, &deps, &n) == CUDA_SUCCESS && n == 1;
    t_words->push_back({found ? deps[0] : nullptr, p, k});
  }
  void sync(Stream s) override {
    ensure_current();
    check(d_->cuStreamSynchronize(stream_of(s)), "waiting for the GPU");
  }
  std::unique_ptr<Timer> timer() override {
    ensure_current();
    return std::make_unique<CudaTimer>(d_, *this);
  }
  size_t flush_caches(Stream s) override {
    ensure_current();
    std::lock_guard<std::mutex> g(m_);
    const bool first = !flush_;
    if (first) {
      flush_bytes_ = static_cast<size_t>(std::max<int64_t>(info_.l2_bytes * 2, 8 << 20));
      check(d_->cuMemAlloc(&flush_, flush_bytes_), "allocating the L2 flush buffer");
    }
    // By writing (the default), L2 is left holding dirty lines, written back as the timed kernel
    // evicts them; by reading (KILN_BENCH_L2_FLUSH=read), the buffer, written once, is read
    // whole, so L2 holds its clean lines and the timed kernel evicts them for free.
    if (flush_read_ && !touch_kernel())
      fail(Errc::usage, "KILN_BENCH_L2_FLUSH=read: kiln's reading kernel does not load on this GPU ({}); "
                        "unset it to flush the L2 by writing",
           info_.name);
    if (first || !flush_read_)
      check(d_->cuMemsetD32Async(flush_, ++flush_value_, flush_bytes_ / 4, stream_of(s)), "flushing the L2");
    if (flush_read_) {
      CUdeviceptr p = flush_;
      uint64_t n = flush_bytes_ / 16;
      void* params[] = {&p, &n, &p};
      const unsigned blocks = static_cast<unsigned>(std::max(1, info_.multiprocessors) * 4);
      check(d_->cuLaunchKernel(reinterpret_cast<CUfunction>(touch_kernel_), blocks, 1, 1, 256, 1, 1, 0, stream_of(s),
                               params, nullptr),
            "flushing the L2 (reading)");
      t_after_word = true;  // the timed kernel after it does not overlap it (as after a word)
    }
    return flush_bytes_;
  }

  // A handle: the 64-byte IPC handle of the allocation, then the offset of
  // the pointer inside it (8 bytes).
  std::string export_buffer(const void* p, std::string* why) override {
    ensure_current();
    CUdeviceptr base = 0;
    size_t size = 0;
    CUresult r = d_->cuMemGetAddressRange(&base, &size, reinterpret_cast<CUdeviceptr>(p));
    CUipcMemHandle h{};
    if (r == CUDA_SUCCESS) r = d_->cuIpcGetMemHandle(&h, base);
    if (r != CUDA_SUCCESS) {
      if (why)
        *why = fmt::format("the buffer cannot be shared with another process ({}; memory from a stream-ordered pool, "
                           "managed or host memory cannot be)",
                           d_->error_text(r));
      return "";
    }
    uint64_t off = reinterpret_cast<CUdeviceptr>(p) - base;
    std::string out(reinterpret_cast<const char*>(h.data), sizeof h.data);
    out.append(reinterpret_cast<const char*>(&off), sizeof off);
    return out;
  }
  void* import_buffer(const std::string& handle) override {
    if (handle.size() != 72) fail(Errc::worker, "a shared GPU buffer handle of {} bytes (72 expected)", handle.size());
    ensure_current();
    std::lock_guard<std::mutex> g(m_);
    std::string key = handle.substr(0, 64);
    uint64_t off = 0;
    std::memcpy(&off, handle.data() + 64, sizeof off);
    auto it = imports_.find(key);
    if (it == imports_.end()) {
      CUipcMemHandle h{};
      std::memcpy(h.data, key.data(), 64);
      CUdeviceptr base = 0;
      check(d_->cuIpcOpenMemHandle(&base, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS), "opening a shared GPU buffer");
      it = imports_.emplace(key, Import{base, 0}).first;
    }
    ++it->second.refs;
    void* p = reinterpret_cast<void*>(it->second.base + off);
    import_of_[p] = key;
    return p;
  }
  void close_import(void* p) noexcept override {
    std::lock_guard<std::mutex> g(m_);
    auto k = import_of_.find(p);
    if (k == import_of_.end()) return;
    auto it = imports_.find(k->second);
    import_of_.erase(k);
    if (it == imports_.end() || --it->second.refs > 0) return;
    d_->cuIpcCloseMemHandle(it->second.base);
    imports_.erase(it);
  }
  void bind() override { ensure_current(); }

  double replay_ns(const std::function<void(Stream)>& launch, int count) override {
    ensure_current();
    if (!capture_) check(d_->cuStreamCreate(&capture_, CU_STREAM_NON_BLOCKING), "creating a stream");
    CUgraph graph = nullptr;
    CUgraphExec exec = nullptr;
    check(d_->cuStreamBeginCapture(capture_, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), "capturing a graph");
    try {
      for (int i = 0; i < count; ++i) launch(reinterpret_cast<Stream>(capture_));
    } catch (...) {
      d_->cuStreamEndCapture(capture_, &graph);
      if (graph) d_->cuGraphDestroy(graph);
      throw;
    }
    check(d_->cuStreamEndCapture(capture_, &graph), "capturing a graph");
    CUresult r = d_->cuGraphInstantiate(&exec, graph, 0);
    d_->cuGraphDestroy(graph);
    check(r, "instantiating a graph");
    struct Exec {
      const Driver* d;
      CUgraphExec e;
      ~Exec() { d->cuGraphExecDestroy(e); }
    } held{d_, exec};
    check(d_->cuGraphLaunch(exec, capture_), "replaying a graph");  // warm
    CudaTimer t(d_, *this);
    t.start(reinterpret_cast<Stream>(capture_));
    check(d_->cuGraphLaunch(exec, capture_), "replaying a graph");
    t.stop(reinterpret_cast<Stream>(capture_));
    return t.elapsed_ns() / count;
  }

  // A graph whose nodes are all kernels kiln launched (their nodes recorded in
  // order as they were captured) can be updated in place: Graph::update replays
  // the work's launches into it (on the stream it was captured on, which it
  // keeps as the mark of its launches) instead of capturing anew.
  std::unique_ptr<Graph> capture(const std::function<void(Stream)>& work) override {
    ensure_current();
    struct CudaGraph final : Graph {
      CudaDevice& dev;
      CUstream s = nullptr;
      CUgraph g = nullptr;
      CUgraphExec e = nullptr;
      std::vector<GraphNode> nodes;
      std::vector<WordNode> words;
      bool updatable = false;
      explicit CudaGraph(CudaDevice& d) : dev(d) {}
      ~CudaGraph() override {
        if (e) dev.d_->cuGraphExecDestroy(e);
        if (g) dev.d_->cuGraphDestroy(g);
        if (s) dev.put_capture_stream(s);
      }
      void launch(Stream st) override {
        dev.ensure_current();
        dev.check(dev.d_->cuGraphLaunch(e, stream_of(st)), "replaying a graph");
      }
      bool update(const std::function<void(Stream)>& w) override {
        if (!updatable) return false;
        dev.ensure_current();
        GraphRecording r;
        r.stream = s;
        r.update = true;
        r.nodes = &nodes;
        r.exec = e;
        {
          RecordingScope scope(&r);
          w(reinterpret_cast<Stream>(s));
        }
        return r.ok && r.cursor == nodes.size();
      }
      bool set_word(size_t k, int32_t value) override {
        if (k >= words.size() || !words[k].node) return false;
        dev.ensure_current();
        WordNode& w = words[k];
        // A memset's node (no word kernel here) is not set: its graph is then captured no more with
        // cells, as setting one held the next launch back (bench/gpu/results/issue27-cells).
        if (!w.kernel || !dev.d_->cuGraphExecKernelNodeSetParams) return false;
        void* params[] = {&w.dst, &value};
        const CudaKernelNodeParams np{nullptr, 1, 1, 1, 1, 1, 1, 0, params, nullptr, w.kernel, nullptr};
        return dev.d_->cuGraphExecKernelNodeSetParams(e, w.node, &np) == CUDA_SUCCESS;
      }
    };
    auto graph = std::make_unique<CudaGraph>(*this);
    graph->s = take_capture_stream();
    const bool can_update = d_->can_query_capture() && d_->cuGraphExecKernelNodeSetParams && d_->cuGraphGetNodes;
    GraphRecording rec;
    rec.stream = graph->s;
    rec.nodes = &graph->nodes;
    check(d_->cuStreamBeginCapture(graph->s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), "capturing a graph");
    std::vector<WordNode>* const outer_words = t_words;
    try {
      RecordingScope scope(can_update ? &rec : nullptr);
      t_words = &graph->words;
      work(reinterpret_cast<Stream>(graph->s));
      t_words = outer_words;
    } catch (...) {
      t_words = outer_words;
      CUgraph g = nullptr;
      d_->cuStreamEndCapture(graph->s, &g);
      if (g) d_->cuGraphDestroy(g);
      throw;
    }
    check(d_->cuStreamEndCapture(graph->s, &graph->g), "capturing a graph");
    check(d_->cuGraphInstantiate(&graph->e, graph->g, 0), "instantiating a graph");
    if (can_update && rec.ok) {
      // Every node accounted for, in order: kiln's kernels as recorded, the rest
      // (a library's, fills) counted where the work measured its pieces, or last.
      size_t n = 0;
      if (d_->cuGraphGetNodes(graph->g, nullptr, &n) == CUDA_SUCCESS && n >= graph->nodes.size()) {
        graph->nodes.resize(n, GraphNode{nullptr, nullptr, {}, {}});
        graph->updatable = true;
      }
    }
    return graph;
  }

  std::string fault() const override {
    std::lock_guard<std::mutex> g(m_);
    return fault_;
  }

  size_t graph_nodes(Stream st) override {
    GraphRecording* rec = t_recording && t_recording->stream == stream_of(st) ? t_recording : nullptr;
    if (!rec) return 0;
    if (rec->update) return rec->cursor;
    // Capturing: the nodes that appeared since the last kernel kiln recorded are
    // another's (a library's, a fill): counted in their place.
    int status = 0;
    unsigned long long id = 0;
    CUgraph g = nullptr;
    const CUgraphNode* deps = nullptr;
    size_t ndeps = 0, n = 0;
    if (d_->capture_info(stream_of(st), &status, &id, &g, &deps, &ndeps) != CUDA_SUCCESS || !g ||
        d_->cuGraphGetNodes(g, nullptr, &n) != CUDA_SUCCESS || n < rec->nodes->size()) {
      rec->ok = false;
      return rec->nodes->size();
    }
    rec->nodes->resize(n, GraphNode{nullptr, nullptr, {}, {}});
    return n;
  }

  bool graph_keep(Stream st, size_t n) override {
    GraphRecording* rec = t_recording && t_recording->stream == stream_of(st) ? t_recording : nullptr;
    if (!rec || !rec->update || !rec->ok || rec->cursor + n > rec->nodes->size()) {
      if (rec) rec->ok = false;
      return false;
    }
    rec->cursor += n;
    return true;
  }

 private:
  int attr(int a) {
    int v = 0;
    d_->cuDeviceGetAttribute(&v, a, dev_);
    return v;
  }
  struct Import {
    CUdeviceptr base;
    int refs;
  };
  const Driver* d_;
  int ordinal_;
  bool pdl_ = false;
  CUdevice dev_ = 0;
  CUcontext ctx_ = nullptr;
  DeviceInfo info_;
  mutable std::mutex m_;
  std::string fault_;
  CUdeviceptr flush_ = 0;
  size_t flush_bytes_ = 0;
  unsigned flush_value_ = 0;
  bool flush_read_ = false;
  std::once_flag touch_once_;
  CUlibrary touch_lib_ = nullptr;
  CUkernel touch_kernel_ = nullptr;
  std::once_flag hold_once_;
  CUlibrary hold_lib_ = nullptr;
  CUkernel hold_kernel_ = nullptr;
  uint64_t* hold_flag_ = nullptr;  // pinned host memory: the highest hold released
  CUdeviceptr hold_dev_ = 0;
  std::atomic<uint64_t> hold_tickets_{0};  // the last hold's ticket
  CUstream capture_ = nullptr;
  std::mutex aux_m_;
  CUstream aux_ = nullptr;  // zeroes workspaces, outside any stream a thread may be capturing
  std::vector<CUstream> capture_streams_;  // (take_capture_stream)
  std::once_flag word_once_;
  CUlibrary word_lib_ = nullptr;
  CUkernel word_kernel_ = nullptr;
  std::map<std::string, Import> imports_;
  std::map<void*, std::string> import_of_;
};

CudaTimer::CudaTimer(const Driver* d, CudaDevice& dev) : d_(d), dev_(dev) {
  dev_.check(d_->cuEventCreate(&a_, 0), "creating an event");
  dev_.check(d_->cuEventCreate(&b_, 0), "creating an event");
}
CudaTimer::~CudaTimer() {
  if (a_) d_->cuEventDestroy(a_);
  if (b_) d_->cuEventDestroy(b_);
}
void CudaTimer::start(Stream s) { dev_.check(d_->cuEventRecord(a_, stream_of(s)), "recording an event"); }
void CudaTimer::stop(Stream s) { dev_.check(d_->cuEventRecord(b_, stream_of(s)), "recording an event"); }
double CudaTimer::elapsed_ns() {
  dev_.check(d_->cuEventSynchronize(b_), "waiting for the GPU");
  float ms = 0;
  dev_.check(d_->cuEventElapsedTime(&ms, a_, b_), "reading a timer");
  return static_cast<double>(ms) * 1e6;
}

namespace {
std::atomic<uint64_t> g_kernel_serial{0};
std::atomic<uint64_t> g_thread_serial{0};
uint64_t thread_serial() {
  thread_local const uint64_t serial = ++g_thread_serial;
  return serial;
}
}  // namespace

CudaKernel::CudaKernel(std::string key, KernelMeta meta, CudaDevice& dev, CUlibrary lib, CUkernel k, std::string what)
    : LoadedKernel(std::move(key), std::move(meta)), dev_(dev), drv_(dev.driver()), lib_(lib), k_(k),
      what_(std::move(what)), serial_(++g_kernel_serial) {}

CudaKernel::~CudaKernel() {
  for (const Workspace& w : ws_) dev_.free(reinterpret_cast<void*>(w.ptr));
  if (lib_) drv_->cuLibraryUnload(lib_);
}

CUdeviceptr CudaKernel::workspace(int64_t bytes, CUstream s) {
  if (bytes <= 0) return 0;
  // The workspaces this thread used last, a slot a kernel (direct-mapped by its serial), so
  // that a steady call takes no lock, also where a program's steps take turns.
  struct Last {
    uint64_t kernel = 0;
    CUstream stream = nullptr;
    CUdeviceptr ptr = 0;
    int64_t bytes = 0;
  };
  thread_local std::array<Last, 16> recent;
  Last& last = recent[serial_ % recent.size()];
  if (last.kernel == serial_ && last.stream == s && last.bytes >= bytes) return last.ptr;
  std::lock_guard<std::mutex> g(ws_m_);
  // (the legacy stream is 0 or 1, the per-thread stream 2: handles every thread shares)
  const uint64_t me = reinterpret_cast<uintptr_t>(s) <= 2 ? thread_serial() : 0;
  CUdeviceptr found = 0;
  int64_t found_bytes = 0;
  for (const Workspace& w : ws_)
    if (w.thread == me && w.stream == s && w.bytes >= bytes && (!found || w.bytes > found_bytes))
      found = w.ptr, found_bytes = w.bytes;
  if (!found) {
    found = dev_.alloc_workspace(static_cast<size_t>(bytes), what_);
    found_bytes = bytes;
    ws_.push_back({me, s, found, bytes});
  }
  last = {serial_, s, found, found_bytes};
  return found;
}

void CudaKernel::raise_shared(int64_t bytes) {
  std::lock_guard<std::mutex> g(raise_m_);
  if (bytes <= raised_.load()) return;
  CUresult r = drv_->cuKernelSetAttribute(FUNC_MAX_DYNAMIC_SHARED_SIZE_BYTES, static_cast<int>(bytes), k_,
                                          dev_.handle());
  if (r != CUDA_SUCCESS)
    fail(Errc::launch, "{}: raising its dynamic shared memory to {} bytes: {}", what_, bytes, drv_->error_text(r));
  raised_.store(bytes);
}

namespace {
// Encoded tensor maps, a table a thread, direct-mapped by a hash of the buffer's address
// and the view: a map is encoded on the first launch with that buffer and view and kept
// while no other hashes to its slot, so a steady call (or a graph's capture) encodes nothing.
struct TensorMapSlot {
  CUtensorMap map;
  TensorMapDims dims;
  CUdeviceptr ptr = 0;
  bool used = false;
};
struct TensorMapCache {
  static constexpr size_t kSlots = 128;
  TensorMapSlot slot[kSlots];
};
int tensor_map_type(DType t) {
  switch (t) {
    case DType::f16: return 6;   // CU_TENSOR_MAP_DATA_TYPE_FLOAT16
    case DType::f32: return 7;   // FLOAT32
    case DType::bf16: return 9;  // BFLOAT16
    case DType::i32: return 3;   // INT32
    default: return -1;
  }
}
}  // namespace

const CUtensorMap& CudaKernel::tensor_map(const TensorMapDims& m, CUdeviceptr p) {
  thread_local std::unique_ptr<TensorMapCache> cache = std::make_unique<TensorMapCache>();
  uint64_t h = p * 0x9E3779B97F4A7C15ull;
  for (int64_t v : {m.rows, m.cols, m.pitch, m.box_rows, m.box_cols, int64_t(m.swizzle), int64_t(m.dtype)})
    h = (h ^ static_cast<uint64_t>(v)) * 0x100000001B3ull;
  TensorMapSlot& e = cache->slot[(h >> 17) % TensorMapCache::kSlots];
  auto same_view = [&](const TensorMapDims& a) {
    return a.dtype == m.dtype && a.swizzle == m.swizzle && a.rows == m.rows && a.cols == m.cols &&
           a.pitch == m.pitch && a.box_rows == m.box_rows && a.box_cols == m.box_cols;
  };
  if (e.used && e.ptr == p && same_view(e.dims)) return e.map;
  const int64_t esize = static_cast<int64_t>(dtype_size(m.dtype));
  const int type = tensor_map_type(m.dtype);
  auto refuse = [&](const std::string& why) {
    fail(Errc::launch, "{}: the tensor map of argument {} ({} x {} elements, pitch {}, box {} x {}, swizzle {}): {}",
         what_, m.arg, m.rows, m.cols, m.pitch, m.box_rows, m.box_cols, m.swizzle, why);
  };
  if (type < 0) refuse(fmt::format("{} elements cannot be viewed", dtype_name(m.dtype)));
  if (m.rows < 1 || m.cols < 1 || m.pitch < m.cols || m.pitch > (int64_t(1) << 40) || m.rows > (int64_t(1) << 40))
    refuse("an empty view, a pitch shorter than a row, or a view past 2^40 elements a side");
  if (m.swizzle != 0 && m.swizzle != 32 && m.swizzle != 64 && m.swizzle != 128) refuse("a swizzle of 0, 32, 64 or 128 bytes");
  if (p % 16 != 0 || (m.pitch * esize) % 16 != 0)
    refuse("the buffer's address and the pitch in bytes must be multiples of 16");
  if (m.box_rows < 1 || m.box_rows > 256 || m.box_cols < 1 || m.box_cols > 256 ||
      (m.swizzle > 0 && m.box_cols * esize > m.swizzle) || (m.box_cols * esize) % 16 != 0)
    refuse("a box side out of 1..256, a box row not a multiple of 16 bytes, or wider than the swizzle");
  const unsigned long long dims[2] = {static_cast<unsigned long long>(m.cols), static_cast<unsigned long long>(m.rows)};
  const unsigned long long strides[1] = {static_cast<unsigned long long>(m.pitch * esize)};
  const unsigned box[2] = {static_cast<unsigned>(m.box_cols), static_cast<unsigned>(m.box_rows)};
  const unsigned elem[2] = {1, 1};
  const int swz = m.swizzle == 0 ? 0 : m.swizzle == 32 ? 1 : m.swizzle == 64 ? 2 : 3;
  // No interleave; L2 promotion of 256 bytes; out-of-bounds elements read as zeros.
  CUresult r = drv_->cuTensorMapEncodeTiled(&e.map, type, 2, reinterpret_cast<void*>(p), dims, strides, box, elem, 0,
                                            swz, 3, 0);
  if (r != CUDA_SUCCESS) {
    e.used = false;
    refuse(drv_->error_text(r));
  }
  e.ptr = p;
  e.dims = m;
  e.used = true;
  return e.map;
}

void CudaKernel::launch(void* const* params, const LaunchDims& d, Stream s) {
  if (d.empty()) return;
  CellParams cell_room;
  params = with_cells(params, d, cell_room);
  dev_.ensure_current();
  if (d.shared > raised_.load(std::memory_order_relaxed)) raise_shared(d.shared);
  GraphRecording* rec = t_recording && t_recording->stream == stream_of(s) ? t_recording : nullptr;
  if (rec && rec->update && (d.nzero > 0 || !rec->ok)) {
    rec->ok = false;  // a fill before the kernel (a node the graph does not update), or out of step already
    return;
  }
  for (int i = 0; i < d.nzero; ++i) {
    auto p = *static_cast<const CUdeviceptr*>(params[d.zero_arg[i]]);
    size_t bytes = static_cast<size_t>(d.zero_bytes[i]);
    CUresult r = bytes % 4 == 0 && p % 4 == 0 ? drv_->cuMemsetD32Async(p, 0, bytes / 4, stream_of(s))
                                              : drv_->cuMemsetD8Async(p, 0, bytes, stream_of(s));
    if (r != CUDA_SUCCESS) failed(r, d);
  }
  // Tensor maps follow the arguments: copied out of the cache into this frame, which
  // outlives the launch (the driver copies the parameters before it returns).
  constexpr int kMaxArgs = 64;
  alignas(128) CUtensorMap maps[4];
  void* with_maps[kMaxArgs + 5];
  void** kp = const_cast<void**>(params);
  if (d.ntmap != meta().tensor_maps)
    fail(Errc::launch, "{}: the launch passes {} tensor maps, but the entry takes {}", what_, d.ntmap, meta().tensor_maps);
  if ((d.workspace >= 0) != meta().workspace)
    fail(Errc::launch, "{}: the launch passes {}workspace, but the entry takes {}", what_, d.workspace >= 0 ? "a " : "no ",
         meta().workspace ? "one" : "none");
  CUdeviceptr ws = 0;
  const int nparams = d.nargs + d.ntmap + (meta().workspace ? 1 : 0);  // (where d.nargs is set)
  if (d.ntmap > 0 || meta().workspace) {
    if (d.nargs > kMaxArgs || d.ntmap > 4 || d.nargs < 0)
      fail(Errc::launch, "{}: {} arguments and {} tensor maps (at most {} and 4)", what_, d.nargs, d.ntmap, kMaxArgs);
    for (int j = 0; j < d.ntmap; ++j)
      if (d.tmap[j].arg < 0 || d.tmap[j].arg >= d.nargs)
        fail(Errc::launch, "{}: tensor map {} views argument {} of {}", what_, j, d.tmap[j].arg, d.nargs);
    for (int i = 0; i < d.nargs; ++i) with_maps[i] = params[i];
    for (int j = 0; j < d.ntmap; ++j) {
      maps[j] = tensor_map(d.tmap[j], *static_cast<const CUdeviceptr*>(params[d.tmap[j].arg]));
      with_maps[d.nargs + j] = &maps[j];
    }
    if (meta().workspace) {
      ws = workspace(d.workspace, stream_of(s));
      with_maps[d.nargs + d.ntmap] = &ws;
    }
    kp = with_maps;
  }
  const std::array<unsigned, 7> dims{static_cast<unsigned>(d.grid.x),  static_cast<unsigned>(d.grid.y),
                                      static_cast<unsigned>(d.grid.z),  static_cast<unsigned>(d.block.x),
                                      static_cast<unsigned>(d.block.y), static_cast<unsigned>(d.block.z),
                                      static_cast<unsigned>(d.shared)};
  if (rec && rec->update) {
    // The graph's next node is this kernel's: its launch set in place (the driver copies
    // the arguments) unless it is the launch the node already holds.
    if (rec->cursor >= rec->nodes->size() || (*rec->nodes)[rec->cursor].kernel != k_) {
      rec->ok = false;
      return;
    }
    GraphNode& node = (*rec->nodes)[rec->cursor];
    thread_local std::vector<unsigned char> bytes;
    const bool known = param_bytes(kp, nparams, bytes);
    if (known && !node.args.empty() && node.dims == dims && node.args == bytes) {
      ++rec->cursor;
      return;
    }
    const CudaKernelNodeParams np{nullptr,
                                  static_cast<unsigned>(d.grid.x),
                                  static_cast<unsigned>(d.grid.y),
                                  static_cast<unsigned>(d.grid.z),
                                  static_cast<unsigned>(d.block.x),
                                  static_cast<unsigned>(d.block.y),
                                  static_cast<unsigned>(d.block.z),
                                  static_cast<unsigned>(d.shared),
                                  kp,
                                  nullptr,
                                  k_,
                                  nullptr};
    if (drv_->cuGraphExecKernelNodeSetParams(rec->exec, node.node, &np) != CUDA_SUCCESS) {
      rec->ok = false;
      node.args.clear();  // what the node holds is unknown now
    } else {
      node.dims = dims;
      if (known)
        node.args.assign(bytes.begin(), bytes.end());
      else
        node.args.clear();
    }
    ++rec->cursor;
    return;
  }
  CUresult r;
  const bool after_word = t_after_word || t_held;
  t_after_word = false;
  // (may_overlap first: it takes a serial scope's first launch, whatever this one is)
  const bool early_ok = may_overlap(params, d, s);
  if (early_ok && d.pdl && d.nzero == 0 && dev_.pdl() && !after_word) {
    // The kernel waits for the previous one itself (griddepcontrol.wait): it may be
    // scheduled once that kernel's blocks have all started or asked for it
    // (griddepcontrol.launch_dependents). Captured, the edge is a programmatic one.
    CUlaunchAttribute attr{};
    attr.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attr.value.programmatic_serialization_allowed = 1;
    const CUlaunchConfig cfg{dims[0], dims[1], dims[2], dims[3], dims[4], dims[5], dims[6], stream_of(s), &attr, 1};
    r = drv_->cuLaunchKernelEx(&cfg, reinterpret_cast<CUfunction>(k_), kp, nullptr);
  } else {
    r = drv_->cuLaunchKernel(reinterpret_cast<CUfunction>(k_), dims[0], dims[1], dims[2], dims[3], dims[4], dims[5],
                             dims[6], stream_of(s), kp, nullptr);
  }
  if (r != CUDA_SUCCESS) failed(r, d);
  if (rec) {
    // Captured: the node just added is what the stream's next work would depend on.
    int status = 0;
    unsigned long long id = 0;
    CUgraph g = nullptr;
    const CUgraphNode* deps = nullptr;
    size_t n = 0;
    if (drv_->capture_info(stream_of(s), &status, &id, &g, &deps, &n) == CUDA_SUCCESS && n == 1)
    {
      // Nodes added since the last one recorded (this launch's fills, a library's
      // kernels) are counted in their places first.
      size_t total = 0;
      if (g && drv_->cuGraphGetNodes(g, nullptr, &total) == CUDA_SUCCESS && total > rec->nodes->size() + 1)
        rec->nodes->resize(total - 1, GraphNode{nullptr, nullptr, {}, {}});
      GraphNode node{deps[0], k_, dims, {}};
      if (!param_bytes(kp, nparams, node.args)) node.args.clear();
      rec->nodes->push_back(std::move(node));
    }
    else
      rec->ok = false;
  }
}

bool CudaKernel::param_bytes(void* const* kp, int n, std::vector<unsigned char>& out) {
  std::call_once(sizes_once_, [&] {
    if (!drv_->cuKernelGetParamInfo) return;
    std::vector<size_t> sizes;
    for (size_t i = 0;; ++i) {
      size_t offset = 0, size = 0;
      if (drv_->cuKernelGetParamInfo(k_, i, &offset, &size) != CUDA_SUCCESS) break;
      sizes.push_back(size);
    }
    param_sizes_ = std::move(sizes);
  });
  out.clear();
  if (n <= 0 || static_cast<size_t>(n) != param_sizes_.size()) return false;
  for (int i = 0; i < n; ++i) {
    const auto* p = static_cast<const unsigned char*>(kp[i]);
    out.insert(out.end(), p, p + param_sizes_[static_cast<size_t>(i)]);
  }
  return true;
}

void CudaKernel::failed(CUresult r, const LaunchDims& d) {
  std::string text = drv_->error_text(r);
  if (sticky(r)) dev_.check(r, "launching");
  fail(Errc::launch, "{}: the launch with grid ({}, {}, {}), block ({}, {}, {}) and {} bytes of dynamic shared memory "
       "failed: {}",
       what_, d.grid.x, d.grid.y, d.grid.z, d.block.x, d.block.y, d.block.z, d.shared, text);
}

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const Options& o) : opts_(o) {}
  ~CudaBackend() override {
    warm_stop_ = true;
    if (warm_.joinable()) warm_.join();
  }
  const char* name() const override { return "cuda"; }

  std::string unavailable_reason() override {
    std::string why;
    const Driver* d = Driver::get(&why);
    if (!d) return why;
    int n = 0;
    d->cuDeviceGetCount(&n);
    if (opts_.cuda_device >= n)
      return n == 0 ? "no GPU: the CUDA driver found no device"
                    : fmt::format("KILN_CUDA_DEVICE={} but there are {} GPUs (0 to {})", opts_.cuda_device, n, n - 1);
    return "";
  }

  // The architecture kiln compiles for: KILN_CUDA_ARCH, else the device's.
  std::string arch() {
    if (!opts_.cuda_arch.empty()) return opts_.cuda_arch;
    std::string why = unavailable_reason();
    if (!why.empty())
      fail(Errc::compile, "the cuda backend has no GPU to take the architecture from ({}): set KILN_CUDA_ARCH "
           "(e.g. sm_90) to compile without one",
           why);
    return cuda_device().info().arch;
  }

  const Nvrtc& nvrtc() {
    std::string why;
    const Nvrtc* n = Nvrtc::get(&why);
    if (!n) fail(Errc::compile, "the cuda backend cannot compile: {}", why);
    return *n;
  }

  std::string toolchain_identity() override {
    const Nvrtc& n = nvrtc();
    return fmt::format("cuda-abi {}\nnvrtc {}.{}\narch {}\nflags {}\nheaders {}", kCudaAbiVersion, n.major, n.minor,
                       arch(), fmt::join(fixed_flags(), " "), n.include_dir);
  }

  std::string device_identity() override {
    if (!unavailable_reason().empty()) return fmt::format("cuda (no device) {}", arch());
    const DeviceInfo& i = cuda_device().info();
    return fmt::format("cuda {} {} sms={} mem={}MiB", i.name, i.arch, i.multiprocessors, i.memory_bytes >> 20);
  }

  std::vector<std::string> fixed_flags() { return {"-std=c++17", "--ptxas-options=-v", "-lineinfo"}; }

  // The source NVRTC compiles: parameter defines, the user's source (with
  // #line so messages name it), and compile-time checks that the entry's
  // parameters match the spec's arguments in number, pointer-ness and size.
  std::string generate_source(const CompileRequest& req) {
    std::string s = fmt::format("// generated by kiln: kernel {}, config {}\n", req.kernel, req.config_text);
    for (const auto& [n, v] : req.defines) s += fmt::format("#define {} {}\n", n, v);
    // kiln's device functions, for any kernel (docs/program.md, "Overlapping launches"):
    // kiln_wait_prior() returns once the kernels before this one in its stream have ended and
    // their writes are visible (at once unless the launch may overlap them: the spec's pdl);
    // kiln_start_next() lets the next kernel, when it may overlap this one, be scheduled now.
    // kiln_cell(v) is a `cell = true` argument's value: v itself, or where the launch passes a
    // cell (minus the address of a 32-bit word on the device), the word (docs/program.md, "Cells").
    // (Marked unused: a kernel that calls none of them draws no note of the compiler; the code is
    // the same, so binaries made before stay valid.)
    s += R"(static __device__ __forceinline__ __attribute__((unused)) void kiln_wait_prior() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
static __device__ __forceinline__ __attribute__((unused)) void kiln_start_next() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
static __device__ __forceinline__ __attribute__((unused)) long long kiln_cell(long long kiln_v) {
  return kiln_v >= 0 ? kiln_v : static_cast<long long>(*reinterpret_cast<const int*>(static_cast<unsigned long long>(-kiln_v)));
}
)";
    s += fmt::format("#line 1 \"{}\"\n", c_escape(req.source_name));
    s += req.source_text;
    if (!req.source_text.empty() && req.source_text.back() != '\n') s += '\n';
    s += fmt::format("#line 1 \"<kiln entry check for {}>\"\n", c_escape(req.kernel));
    // Every name here starts with kiln_: a param's #define (say T or R)
    // must not rewrite the check.
    s += R"(namespace kiln_check {
template <class kiln_T> struct kiln_is_ptr { static constexpr bool kiln_value = false; };
template <class kiln_T> struct kiln_is_ptr<kiln_T*> { static constexpr bool kiln_value = true; };
template <class kiln_F> struct kiln_sig_of;
template <class... kiln_P> struct kiln_sig_of<void (*)(kiln_P...)> {
  static constexpr int kiln_count = sizeof...(kiln_P);
  template <int kiln_I, class kiln_T, class... kiln_R> struct kiln_at {
    using kiln_type = typename kiln_at<kiln_I - 1, kiln_R...>::kiln_type;
  };
  template <class kiln_T, class... kiln_R> struct kiln_at<0, kiln_T, kiln_R...> { using kiln_type = kiln_T; };
  template <int kiln_I> using kiln_arg = typename kiln_at<kiln_I, kiln_P..., void>::kiln_type;
};
}  // namespace kiln_check
)";
    s += fmt::format("using kiln_sig = kiln_check::kiln_sig_of<decltype(&{})>;\n", req.entry);
    s += fmt::format("static_assert(kiln_sig::kiln_count == {}, \"kiln: the entry '{}' does not take the {} arguments the "
                     "spec lists{}{}\");\n",
                     req.args.size() + req.tensor_maps + (req.workspace ? 1 : 0), req.entry, req.args.size(),
                     req.tensor_maps > 0 ? fmt::format(" and then its {} tensor maps", req.tensor_maps) : "",
                     req.workspace ? " and then its workspace pointer" : "");
    if (req.workspace)
      s += fmt::format("static_assert(kiln_check::kiln_is_ptr<kiln_sig::kiln_arg<{}>>::kiln_value, \"kiln: parameter {} "
                       "of the entry is not a pointer (the spec's workspace)\");\n",
                       req.args.size() + req.tensor_maps, req.args.size() + req.tensor_maps);
    for (int j = 0; j < req.tensor_maps; ++j)
      s += fmt::format("static_assert(sizeof(kiln_sig::kiln_arg<{}>) == 128 && alignof(kiln_sig::kiln_arg<{}>) % 64 == 0 && "
                       "!kiln_check::kiln_is_ptr<kiln_sig::kiln_arg<{}>>::kiln_value, \"kiln: parameter {} of the entry is "
                       "not a 128-byte tensor map aligned to 64 (the spec's tensor_maps[{}], passed as const "
                       "__grid_constant__ CUtensorMap)\");\n",
                       req.args.size() + j, req.args.size() + j, req.args.size() + j, req.args.size() + j, j);
    for (size_t i = 0; i < req.args.size(); ++i) {
      const ArgSig& a = req.args[i];
      s += fmt::format("static_assert(kiln_check::kiln_is_ptr<kiln_sig::kiln_arg<{}>>::kiln_value == {} && "
                       "sizeof(kiln_sig::kiln_arg<{}>) "
                       "== {}, \"kiln: argument {} ('{}') of the spec is {}{}, which the entry's parameter {} does not "
                       "match\");\n",
                       i, a.pointer ? "true" : "false", i, a.pointer ? 8 : dtype_size(a.dtype), i, a.name,
                       dtype_name(a.dtype), a.pointer ? "*" : "", i);
    }
    return s;
  }

  Binary compile(const CompileRequest& req, const std::string& key) override {
    const Nvrtc& n = nvrtc();
    // A spec's `target` (a --gpu-architecture flag) replaces the default architecture.
    std::string target;
    for (const auto& f : req.cflags)
      if (f.rfind("--gpu-architecture=", 0) == 0) target = f.substr(19);
    const bool own_target = !target.empty();
    if (!own_target) target = arch();
    auto t0 = std::chrono::steady_clock::now();
    std::string src = generate_source(req);
    nvrtcProgram prog = nullptr;
    int rc = n.nvrtcCreateProgram(&prog, src.c_str(), req.source_name.c_str(), 0, nullptr, nullptr);
    if (rc != 0) fail(Errc::compile, "kernel '{}': NVRTC cannot create a program: {}", req.kernel, n.nvrtcGetErrorString(rc));
    struct Destroy {
      const Nvrtc& n;
      nvrtcProgram* p;
      ~Destroy() { n.nvrtcDestroyProgram(p); }
    } destroy{n, &prog};
    std::string expr = "&" + req.entry;
    n.nvrtcAddNameExpression(prog, expr.c_str());
    std::vector<std::string> opts;
    if (!own_target) opts.push_back("--gpu-architecture=" + target);
    for (const auto& f : fixed_flags()) opts.push_back(f);
    for (const auto& d : req.include_dirs) opts.push_back("-I" + d);
    if (!n.include_dir.empty()) opts.push_back("-I" + n.include_dir);
    for (const auto& f : req.cflags) opts.push_back(f);
    std::vector<const char*> argv;
    for (const auto& o : opts) argv.push_back(o.c_str());
    rc = n.nvrtcCompileProgram(prog, static_cast<int>(argv.size()), argv.data());
    size_t log_size = 0;
    n.nvrtcGetProgramLogSize(prog, &log_size);
    std::string log(log_size, '\0');
    if (log_size) n.nvrtcGetProgramLog(prog, log.data());
    while (!log.empty() && (log.back() == '\0' || log.back() == '\n')) log.pop_back();
    if (rc != 0)
      fail(Errc::compile, "kernel '{}' (config {}) failed to compile with NVRTC {}.{} for {}:\n{}\noptions: {}",
           req.kernel, req.config_text, n.major, n.minor, target, warnings_only(log), fmt::join(opts, " "));
    const char* lowered = nullptr;
    if (n.nvrtcGetLoweredName(prog, expr.c_str(), &lowered) != 0 || !lowered)
      fail(Errc::compile, "kernel '{}' (config {}): NVRTC found no __global__ function '{}' to launch", req.kernel,
           req.config_text, req.entry);
    // A kernel launched to overlap the one before it must wait for it: one that never
    // calls kiln_wait_prior() would read that kernel's output before it is written. (A
    // wait in the code does not prove every thread reaches it: docs/program.md's rule.)
    // Below sm_90 no launch overlaps, and the wait compiles to nothing.
    const int sm = target.rfind("sm_", 0) == 0 ? std::atoi(target.c_str() + 3) : 0;
    if (req.pdl && sm >= 90 && n.nvrtcGetPTXSize && n.nvrtcGetPTX) {
      size_t ptx_size = 0;
      if (n.nvrtcGetPTXSize(prog, &ptx_size) == 0 && ptx_size > 0) {
        std::string ptx(ptx_size, '\0');
        if (n.nvrtcGetPTX(prog, ptx.data()) == 0 && ptx.find("griddepcontrol.wait") == std::string::npos)
          fail(Errc::compile, "kernel '{}' (config {}): its spec says pdl = true, but its code never calls "
               "kiln_wait_prior(): launched to overlap the kernel before it, it would read that kernel's output "
               "before it is written (call it before touching what earlier kernels write, or drop pdl)",
               req.kernel, req.config_text);
      }
    }
    size_t size = 0;
    n.nvrtcGetCUBINSize(prog, &size);
    if (size == 0)
      fail(Errc::compile, "kernel '{}' (config {}): NVRTC made no cubin for {} (an architecture such as sm_90 is "
           "needed, not compute_90)",
           req.kernel, req.config_text, target);
    Binary b;
    b.bytes.resize(size);
    n.nvrtcGetCUBIN(prog, reinterpret_cast<char*>(b.bytes.data()));
    // The metadata comes from the cubin itself; ptxas' report, when NVRTC
    // logs one (it does not when a compile is answered from a compute cache),
    // adds the spill counts and must agree.
    std::optional<KernelMeta> meta = cubin_meta(b.bytes, lowered);
    if (!meta)
      fail(Errc::compile, "kernel '{}' (config {}): the cubin NVRTC made has no resource attributes for '{}', "
           "which kiln needs (registers, shared memory)",
           req.kernel, req.config_text, lowered);
    if (std::optional<KernelMeta> reported = parse_resources(log, lowered)) {
      if (reported->registers != meta->registers || reported->static_shared != meta->static_shared ||
          reported->local_bytes != meta->local_bytes)
        fail(Errc::compile, "kernel '{}' (config {}): ptxas reports {} registers, {} bytes shared, {} bytes local, "
             "but the cubin says {}, {}, {}; kiln will not guess which is right",
             req.kernel, req.config_text, reported->registers, reported->static_shared, reported->local_bytes,
             meta->registers, meta->static_shared, meta->local_bytes);
      meta->spill_bytes = reported->spill_bytes;
    }
    meta->target = target;
    meta->tensor_maps = req.tensor_maps;
    meta->workspace = req.workspace;
    b.key = key;
    b.backend = "cuda";
    b.kernel = req.kernel;
    b.config_text = req.config_text;
    b.entry = req.entry;
    b.meta = *meta;
    b.log = warnings_only(log);
    b.compile_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return b;
  }

  CudaDevice& cuda_device() {
    std::lock_guard<std::mutex> g(m_);
    if (!device_) {
      std::string why;
      const Driver* d = Driver::get(&why);
      if (!d) fail(Errc::launch, "the cuda backend cannot run here: {}", why);
      int n = 0;
      d->cuDeviceGetCount(&n);
      if (opts_.cuda_device >= n)
        fail(Errc::launch, "the cuda backend cannot run here: {}",
             n == 0 ? std::string("no GPU: the CUDA driver found no device")
                    : fmt::format("KILN_CUDA_DEVICE={} but there are {} GPUs", opts_.cuda_device, n));
      const auto t0 = std::chrono::steady_clock::now();
      // cuBLASLt opened beside the context's making and readied once it is made, on a
      // thread of its own: a first call that chooses it finds that done.
      std::promise<CudaDevice*> made;
      if (opts_.cuda_warm_libraries && !warm_.joinable()) {
        cublaslt_readying(true);  // a first call that chose it runs kiln's own choice meanwhile
        try {
          warm_ = std::thread([this, f = made.get_future().share(), first = opts_.cuda_device != 0] {
            struct Done {
              ~Done() { cublaslt_readying(false); }
            } done;
            // A backend going away stops it between its parts (a short process does not wait for the product).
            if (open_cublaslt() && !warm_stop_)
              ready_cublaslt([&]() -> Device* { return warm_stop_ ? nullptr : f.get(); }, first);
          });
        } catch (const std::exception& e) {
          cublaslt_readying(false);
          log::debug("cuda: cuBLASLt is not readied beside the context (no thread: {})", e.what());
        }
      }
      try {
        device_ = std::make_unique<CudaDevice>(d, opts_.cuda_device, opts_.cuda_pdl, opts_.cuda_flush_read);
      } catch (...) {
        made.set_value(nullptr);
        throw;
      }
      made.set_value(device_.get());
      log::debug("cuda: GPU {}'s context made in {:.1f} ms", opts_.cuda_device, log::ms_since(t0));
    }
    return *device_;
  }
  Device& device() override { return cuda_device(); }

  std::vector<Library*> libraries() override {
    std::call_once(libraries_once_, [&] {
      CudaLibraryHost host;
      host.unavailable = [this] { return unavailable_reason(); };
      host.device = [this]() -> Device& { return cuda_device(); };
      host.arch = [this] { return unavailable_reason().empty() ? cuda_device().info().arch : std::string("no device"); };
      libraries_.push_back(make_cublas(host));
      libraries_.push_back(make_cublaslt(host));
      libraries_.push_back(make_cudnn(host));
    });
    std::vector<Library*> out;
    for (const auto& l : libraries_) out.push_back(l.get());
    return out;
  }

  std::shared_ptr<LoadedKernel> load(const Binary& bin) override {
    if (bin.backend != "cuda")
      fail(Errc::launch, "kernel '{}': a {} binary cannot be loaded by the cuda backend", bin.kernel, bin.backend);
    if (is_library_binary(bin)) return load_library(bin);
    std::string what = fmt::format("kernel '{}' (config {})", bin.kernel, bin.config_text);
    if (bin.meta.symbol.empty() || bin.meta.target.empty())
      fail(Errc::launch, "{}: its binary has no launch metadata (entry symbol, target)", what);
    CudaDevice& dev = cuda_device();
    const std::string& arch = dev.info().arch;
    if (bin.meta.target != arch && bin.meta.target != arch + "a")
      fail(Errc::launch, "{}: its binary is for {}, but GPU {} is {}", what, bin.meta.target, dev.ordinal(), arch);
    dev.ensure_current();
    const auto t0 = std::chrono::steady_clock::now();
    const Driver* d = dev.driver();
    CUlibrary lib = nullptr;
    dev.check(d->cuLibraryLoadData(&lib, bin.bytes.data(), nullptr, nullptr, 0, nullptr, nullptr, 0),
              ("loading " + what).c_str());
    CUkernel k = nullptr;
    CUresult r = d->cuLibraryGetKernel(&k, lib, bin.meta.symbol.c_str());
    if (r != CUDA_SUCCESS) {
      d->cuLibraryUnload(lib);
      fail(Errc::launch, "{}: its binary has no kernel '{}': {}", what, bin.meta.symbol, d->error_text(r));
    }
    // The driver's word on what was compiled must match what was stored.
    auto get = [&](int a) {
      int v = 0;
      d->cuKernelGetAttribute(&v, a, k, dev.handle());
      return v;
    };
    int regs = get(FUNC_NUM_REGS), smem = get(FUNC_SHARED_SIZE_BYTES), local = get(FUNC_LOCAL_SIZE_BYTES);
    if (regs != bin.meta.registers || smem != bin.meta.static_shared || local != bin.meta.local_bytes) {
      d->cuLibraryUnload(lib);
      fail(Errc::launch, "{}: its stored metadata ({} registers, {} bytes shared, {} bytes local) does not match the "
           "binary ({}, {}, {}); the cache entry is inconsistent",
           what, bin.meta.registers, bin.meta.static_shared, bin.meta.local_bytes, regs, smem, local);
    }
    // A kernel compiled for clusters of more than 8 blocks (the portable size) launches only
    // once it is allowed to; where the GPU cannot place such a cluster, its launch fails and the
    // config is passed over like any that does not run.
    const int cluster = std::max(get(FUNC_REQUIRED_CLUSTER_WIDTH), 1) * std::max(get(FUNC_REQUIRED_CLUSTER_HEIGHT), 1) *
                        std::max(get(FUNC_REQUIRED_CLUSTER_DEPTH), 1);
    if (cluster > 8) {
      r = d->cuKernelSetAttribute(FUNC_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1, k, dev.handle());
      if (r != CUDA_SUCCESS) {
        d->cuLibraryUnload(lib);
        fail(Errc::launch, "{}: allowing its cluster of {} blocks: {}", what, cluster, d->error_text(r));
      }
    }
    KernelMeta meta = bin.meta;
    meta.max_threads = get(FUNC_MAX_THREADS_PER_BLOCK);
    log::debug("cuda: {} loaded in {:.2f} ms", what, log::ms_since(t0));
    return std::make_shared<CudaKernel>(bin.key, meta, dev, lib, k, what);
  }

  bool compiles_out_of_process() const override { return false; }
  int max_threads_for_registers(int registers) const override { return max_threads_for(registers); }

  LaunchLimits limits() override {
    if (unavailable_reason().empty()) return cuda_device().info().limits;
    return arch_limits(opts_.cuda_arch.empty() ? "sm_90" : opts_.cuda_arch);
  }

  std::string check_resources(const KernelMeta& meta, const LaunchDims& dims) override {
    std::string why = Backend::check_resources(meta, dims);
    if (!why.empty() || dims.empty()) return why;
    int64_t threads = dims.block.x * dims.block.y * dims.block.z;
    int64_t per_block = unavailable_reason().empty() ? cuda_device().info().registers_per_block : 65536;
    if (meta.registers > 0 && int64_t(meta.registers) * threads > per_block)
      return fmt::format("{} threads of {} registers each need more than the {} registers a block has", threads,
                         meta.registers, per_block);
    return "";
  }

 private:
  Options opts_;
  std::mutex m_;
  std::unique_ptr<CudaDevice> device_;
  std::atomic<bool> warm_stop_{false};
  std::thread warm_;  // readies cuBLASLt beside the device's making; joined before the device goes
  std::once_flag libraries_once_;
  std::vector<std::unique_ptr<Library>> libraries_;  // before the device goes
};

}  // namespace

std::shared_ptr<Backend> make_cuda_backend(const Options& opts) { return std::make_shared<CudaBackend>(opts); }

nlohmann::json describe_cuda(const Options& opts) {
  nlohmann::json j = {{"backend", "cuda"}};
  std::string why;
  const Nvrtc* n = Nvrtc::get(&why);
  j["nvrtc"] = n ? nlohmann::json(fmt::format("{}.{}", n->major, n->minor)) : nlohmann::json(nullptr);
  j["nvrtc_path"] = n ? nlohmann::json(n->path) : nlohmann::json(nullptr);
  if (!n) j["nvrtc_unavailable"] = why;
  why.clear();
  const Driver* d = Driver::get(&why);
  j["driver"] = d ? nlohmann::json(fmt::format("{}.{}", d->version / 1000, d->version % 1000 / 10)) : nlohmann::json(nullptr);
  auto backend = make_cuda_backend(opts);
  std::string reason = backend->unavailable_reason();
  j["available"] = reason.empty();
  j["reason"] = reason.empty() ? nlohmann::json(nullptr) : nlohmann::json(reason);
  j["compile_arch"] = opts.cuda_arch.empty() ? nlohmann::json(nullptr) : nlohmann::json(opts.cuda_arch);
  if (reason.empty()) {
    const DeviceInfo& i = backend->device().info();
    j["device"] = {{"ordinal", i.ordinal},
                   {"name", i.name},
                   {"arch", i.arch},
                   {"multiprocessors", i.multiprocessors},
                   {"l2_bytes", i.l2_bytes},
                   {"memory_bytes", i.memory_bytes},
                   {"max_shared_per_block", i.limits.shared},
                   {"registers_per_block", i.registers_per_block}};
  }
  return j;
}

bool cuda_graph_update_declines(Stream s) {
  GraphRecording* rec = t_recording;
  if (!rec || !rec->update || rec->stream != stream_of(s)) return false;
  rec->ok = false;
  return true;
}

}  // namespace kiln
