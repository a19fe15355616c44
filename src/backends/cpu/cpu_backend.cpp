#include "backends/cpu/cpu_backend.hpp"
#include "core/memory.hpp"
#include "backends/cpu/cpu_libraries.hpp"

#include <dlfcn.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <sstream>
#include <vector>

#include "core/format.hpp"
#include "core/fsutil.hpp"
#include "core/log.hpp"
#include "core/process.hpp"

namespace kiln {

namespace fs = std::filesystem;

namespace {

// Bump when the generated prelude or entry changes: old binaries no longer fit.
constexpr int kCpuAbiVersion = 3;

std::string find_in_path(const std::string& prog) {
  if (prog.find('/') != std::string::npos) return prog;
  const char* path = std::getenv("PATH");
  std::stringstream ss(path ? path : "/usr/bin:/bin");
  std::string dir;
  while (std::getline(ss, dir, ':')) {
    if (dir.empty()) dir = ".";
    fs::path p = fs::path(dir) / prog;
    if (::access(p.c_str(), X_OK) == 0) return p.string();
  }
  return prog;
}

}  // namespace

std::string cpu_model() {
  // Read once: every tuning key and binary key names it.
  static const std::string once = [] {
  std::string model = "unknown cpu", flags;
  if (auto info = read_file("/proc/cpuinfo")) {
    std::stringstream ss(*info);
    std::string line;
    while (std::getline(ss, line)) {
      auto value = [&] {
        auto c = line.find(':');
        return c == std::string::npos ? std::string() : line.substr(c + (c + 1 < line.size() ? 2 : 1));
      };
      if (line.rfind("model name", 0) == 0 && model == "unknown cpu") model = value();
      if (line.rfind("flags", 0) == 0 && flags.empty()) flags = value();
    }
  }
  return fmt::format("{} (flags {})", model, hash_bytes(flags).hex().substr(0, 12));
  }();
  return once;
}

namespace {

// A kernel's library, loaded from a memory file by the name "/proc/self/fd/N". dlopen answers a
// name it has loaded before with that library, before it opens any file: so N must not name
// another kernel while this one is loaded. The memory file stays open while it is, and past
// dlclose when the loader keeps the library (a kernel's thread_local objects with destructors
// still due on the pool's live threads keep it): a later kernel loaded through a reused N would
// otherwise be answered with this one (seen as "loading binary A gave binary B"). Such files are
// kept in a list and closed by a later load once the loader has let their library go (its
// threads ended), so they do not pile up.
class KeptFiles {
 public:
  void keep(UniqueFd fd, std::string name) {
    std::lock_guard<std::mutex> g(m_);
    kept_.emplace_back(std::move(fd), std::move(name));
  }
  // Closes the files whose library is no longer loaded.
  void sweep() {
    std::lock_guard<std::mutex> g(m_);
    std::erase_if(kept_, [](const auto& k) {
      void* still = ::dlopen(k.second.c_str(), RTLD_NOW | RTLD_NOLOAD);
      if (still) ::dlclose(still);
      return still == nullptr;
    });
  }

 private:
  std::mutex m_;
  std::vector<std::pair<UniqueFd, std::string>> kept_;
};
KeptFiles& kept_files() {
  static KeptFiles* k = new KeptFiles;  // (never destroyed: libraries may be dropped at exit)
  return *k;
}

class DlHandle {
 public:
  DlHandle(void* h, UniqueFd memfd, std::string name) : h_(h), memfd_(std::move(memfd)), name_(std::move(name)) {}
  ~DlHandle() {
    if (!h_) return;
    ::dlclose(h_);
    if (void* kept = ::dlopen(name_.c_str(), RTLD_NOW | RTLD_NOLOAD)) {
      ::dlclose(kept);
      kept_files().keep(std::move(memfd_), std::move(name_));  // its number stays taken while the library is loaded
    }
  }
  DlHandle(const DlHandle&) = delete;
  DlHandle& operator=(const DlHandle&) = delete;
  void* get() const { return h_; }

 private:
  void* h_;
  UniqueFd memfd_;
  std::string name_;
};

using EntryFn = void (*)(void* const*, const int64_t*, int64_t, int64_t);

class CpuKernel final : public LoadedKernel {
 public:
  CpuKernel(std::string key, KernelMeta meta, std::unique_ptr<DlHandle> h, EntryFn fn,
            std::shared_ptr<ThreadPool> pool)
      : LoadedKernel(std::move(key), std::move(meta)), handle_(std::move(h)), fn_(fn), pool_(std::move(pool)) {}

  void launch(void* const* params, const LaunchDims& d, Stream) override {
    const Grid& grid = d.grid;
    if (grid.x <= 0 || grid.y <= 0 || grid.z <= 0) return;
    CellParams cell_room;
    params = with_cells(params, d, cell_room);
    for (int i = 0; i < d.nzero; ++i)
      if (d.zero_bytes[i] > 0) std::memset(*static_cast<void* const*>(params[d.zero_arg[i]]), 0, d.zero_bytes[i]);
    const int64_t g[3] = {grid.x, grid.y, grid.z};
    int64_t total = 0;
    if (__builtin_mul_overflow(grid.x, grid.y, &total) || __builtin_mul_overflow(total, grid.z, &total))
      fail(Errc::launch, "a grid of ({}, {}, {}) program instances overflows 64 bits", grid.x, grid.y, grid.z);
    if (total == 1 || pool_->size() == 1) {
      fn_(params, g, 0, total);
      return;
    }
    Ctx ctx{fn_, params, g};
    int64_t chunk = total / (static_cast<int64_t>(pool_->size()) * 4);
    pool_->parallel_for(total, chunk < 1 ? 1 : chunk, &Ctx::run, &ctx);
  }

 private:
  struct Ctx {
    EntryFn fn;
    void* const* params;
    const int64_t* grid;
    static void run(void* c, int64_t b, int64_t e) {
      auto* x = static_cast<Ctx*>(c);
      x->fn(x->params, x->grid, b, e);
    }
  };
  std::unique_ptr<DlHandle> handle_;
  EntryFn fn_;
  std::shared_ptr<ThreadPool> pool_;
};

}  // namespace

CpuBackend::CpuBackend(const Options& opts)
    : opts_(opts), pool_(std::make_shared<ThreadPool>(opts.resolved_launch_threads())),
      device_(std::make_unique<CpuDevice>(opts.resolved_launch_threads())) {
  libraries_.push_back(make_openblas(pool_->size()));
}

std::vector<Library*> CpuBackend::libraries() {
  std::vector<Library*> out;
  for (const auto& l : libraries_) out.push_back(l.get());
  return out;
}

CpuBackend::~CpuBackend() = default;

std::string CpuBackend::unavailable_reason() { return ""; }

Device& CpuBackend::device() { return *device_; }

LaunchLimits CpuBackend::limits() { return device_->info().limits; }

const CpuBackend::Toolchain& CpuBackend::toolchain() {
  std::call_once(toolchain_once_, [&] {
    toolchain_.path = find_in_path(opts_.cxx);
    ProcessResult r;
    try {
      r = run_process({toolchain_.path, "--version"}, 60);
    } catch (const Error& e) {
      toolchain_error_ = e.what();
      return;
    }
    if (!r.ok()) {
      toolchain_error_ = fmt::format("'{} --version' failed ({}): {}", toolchain_.path, r.describe(), r.output);
      return;
    }
    toolchain_.version = r.output;
    toolchain_.clang = r.output.find("clang") != std::string::npos;
    toolchain_.flags = {"-std=c++20", "-O3", "-march=native", "-fPIC", "-shared", "-fvisibility=hidden"};
    // GCC marks some template statics STB_GNU_UNIQUE, which makes dlclose a no-op.
    if (!toolchain_.clang) toolchain_.flags.push_back("-fno-gnu-unique");
  });
  if (!toolchain_error_.empty())
    fail(Errc::compile, "the cpu backend's compiler (KILN_CXX={}) cannot be used: {}", opts_.cxx,
         toolchain_error_);
  return toolchain_;
}

std::string CpuBackend::toolchain_identity() {
  const Toolchain& t = toolchain();
  std::string flags;
  for (const auto& f : t.flags) flags += f + " ";
  return fmt::format("cpu-abi {}\ncompiler {}\n{}flags {}\ntarget {}", kCpuAbiVersion, t.path, t.version, flags,
                     cpu_model());
}

std::string CpuBackend::device_identity() {
  return fmt::format("cpu {} threads={}", cpu_model(), pool_->size());
}

std::string CpuBackend::generate_source(const CompileRequest& req, const std::string& key) {
  std::string s;
  s += fmt::format("// generated by kiln: kernel {}, config {}\n", req.kernel, req.config_text);
  s += "#include <cstddef>\n#include <cstdint>\n";
  s += "namespace kiln { struct program_id { int64_t x, y, z, nx, ny, nz; };\n"
       "#if defined(__FLT16_MAX__)\nusing f16 = _Float16;\n#else\nstruct f16 { uint16_t bits; };\n#endif\n"
       "struct bf16 { uint16_t bits; }; }\n";
  // A `cell = true` argument's value: itself, or the word a cell (minus its address) holds (docs/program.md).
  s += "static inline int64_t kiln_cell(int64_t kiln_v) {\n"
       "  return kiln_v >= 0 ? kiln_v : *reinterpret_cast<const int32_t*>(static_cast<uintptr_t>(-kiln_v));\n}\n";
  for (const auto& [n, v] : req.defines) s += fmt::format("#define {} {}\n", n, v);
  s += fmt::format("#line 1 \"{}\"\n", c_escape(req.source_name));
  s += req.source_text;
  if (!req.source_text.empty() && req.source_text.back() != '\n') s += '\n';
  s += fmt::format("#line 1 \"<kiln entry for {}>\"\n", c_escape(req.kernel));
  s += fmt::format("extern \"C\" __attribute__((visibility(\"default\"))) const int kiln_cpu_abi = {};\n",
                   kCpuAbiVersion);
  s += fmt::format("extern \"C\" __attribute__((visibility(\"default\"))) const char kiln_binary_key[] = \"{}\";\n",
                   key);
  s += "extern \"C\" __attribute__((visibility(\"default\"))) void kiln_entry(void* const* kiln_params, "
       "const int64_t* kiln_grid, int64_t kiln_begin, int64_t kiln_end) noexcept {\n";
  std::string call_args;
  for (size_t i = 0; i < req.args.size(); ++i) {
    const ArgSig& a = req.args[i];
    std::string ct = a.dtype == DType::f16 ? "kiln::f16" : dtype_ctype(a.dtype);
    if (a.pointer) {
      s += fmt::format("  {}* const kiln_a{} = *static_cast<{}* const*>(kiln_params[{}]);\n", ct, i, ct, i);
    } else {
      s += fmt::format("  const {} kiln_a{} = *static_cast<const {}*>(kiln_params[{}]);\n", ct, i, ct, i);
    }
    call_args += fmt::format(", kiln_a{}", i);
  }
  s += "  const int64_t kiln_nx = kiln_grid[0], kiln_ny = kiln_grid[1], kiln_nz = kiln_grid[2];\n";
  s += "  for (int64_t kiln_i = kiln_begin; kiln_i < kiln_end; ++kiln_i) {\n";
  s += "    const ::kiln::program_id kiln_pid{kiln_i % kiln_nx, (kiln_i / kiln_nx) % kiln_ny,\n"
       "                                      kiln_i / (kiln_nx * kiln_ny), kiln_nx, kiln_ny, kiln_nz};\n";
  s += fmt::format("    {}(kiln_pid{});\n", req.entry, call_args);
  s += "  }\n}\n";
  return s;
}

Binary CpuBackend::compile(const CompileRequest& req, const std::string& key) {
  const Toolchain& t = toolchain();
  auto t0 = std::chrono::steady_clock::now();
  TempDir tmp("kiln-cc");
  fs::path src = tmp.path() / "kernel.cpp";
  fs::path out = tmp.path() / "kernel.so";
  write_file_atomic(src, generate_source(req, key));
  std::vector<std::string> argv{t.path};
  argv.insert(argv.end(), t.flags.begin(), t.flags.end());
  for (const auto& d : req.include_dirs) argv.push_back("-I" + d);
  argv.insert(argv.end(), req.cflags.begin(), req.cflags.end());
  argv.insert(argv.end(), {"-o", out.string(), src.string()});

  ProcessResult r = run_process(argv, opts_.compile_timeout_s);
  // A compiler that dies by a signal may be flaky (memory pressure, a
  // process killed from outside): tried once more, as a compile in a
  // worker is (docs/workers.md). A compile error is not retried, nor a
  // compiler past its deadline (in a worker, the pool's own deadline
  // handles a hang).
  bool retried = false;
  if (!r.ok() && r.signal != 0 && !r.timed_out) {
    log::info("kernel '{}' (config {}): the compiler {}; compiling once more", req.kernel, req.config_text,
              r.describe());
    r = run_process(argv, opts_.compile_timeout_s);
    retried = true;
  }
  if (!r.ok()) {
    std::string cmd;
    for (const auto& a : argv) cmd += (cmd.empty() ? "" : " ") + a;
    fail(Errc::compile, "kernel '{}' (config {}) failed to compile: the compiler {}{}\n{}command: {}", req.kernel,
         req.config_text, r.describe(), retried ? " (twice: it was retried once)" : "", r.output, cmd);
  }
  std::optional<std::string> so = read_file(out);
  if (!so) fail(Errc::compile, "kernel '{}' (config {}): the compiler wrote no shared object", req.kernel, req.config_text);
  Binary b;
  b.key = key;
  b.backend = "cpu";
  b.kernel = req.kernel;
  b.config_text = req.config_text;
  b.entry = req.entry;
  b.meta.symbol = "kiln_entry";
  b.meta.target = cpu_model();
  b.bytes.assign(so->begin(), so->end());
  b.log = r.output;
  b.compile_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return b;
}

std::shared_ptr<LoadedKernel> CpuBackend::load(const Binary& bin) {
  if (bin.backend != "cpu")
    fail(Errc::launch, "kernel '{}': a {} binary cannot be loaded by the cpu backend", bin.kernel, bin.backend);
  if (is_library_binary(bin)) return load_library(bin);
  if (bin.meta.symbol != "kiln_entry")
    fail(Errc::launch, "kernel '{}' (config {}): its binary's metadata names entry '{}', not kiln_entry", bin.kernel,
         bin.config_text, bin.meta.symbol);
  kept_files().sweep();
  // The bytes go into a memory file that stays open while they are loaded.
  UniqueFd mem(::memfd_create(fmt::format("kiln-{}", bin.key.substr(0, 16)).c_str(), MFD_CLOEXEC));
  if (!mem) fail(Errc::launch, "kernel '{}': memfd_create: {}", bin.kernel, errno_text(errno));
  const uint8_t* p = bin.bytes.data();
  size_t left = bin.bytes.size();
  while (left > 0) {
    ssize_t w = ::write(mem.get(), p, left);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) fail(Errc::launch, "kernel '{}': writing its binary to memory: {}", bin.kernel, errno_text(errno));
    p += w;
    left -= static_cast<size_t>(w);
  }
  std::string name = fmt::format("/proc/self/fd/{}", mem.get());
  void* raw = ::dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!raw) {
    const char* e = ::dlerror();
    fail(Errc::launch, "kernel '{}' (config {}): cannot load its binary: {}", bin.kernel, bin.config_text,
         e ? e : "unknown dlopen error");
  }
  auto h = std::make_unique<DlHandle>(raw, std::move(mem), name);
  auto* abi = static_cast<const int*>(::dlsym(h->get(), "kiln_cpu_abi"));
  auto* key = static_cast<const char*>(::dlsym(h->get(), "kiln_binary_key"));
  auto fn = reinterpret_cast<EntryFn>(::dlsym(h->get(), "kiln_entry"));
  if (!abi || !fn || !key)
    fail(Errc::launch, "kernel '{}' (config {}): its binary lacks kiln's entry symbols", bin.kernel, bin.config_text);
  if (*abi != kCpuAbiVersion)
    fail(Errc::launch, "kernel '{}': binary ABI version {} but this kiln needs {}", bin.kernel, *abi, kCpuAbiVersion);
  if (bin.key != key)
    fail(Errc::launch, "kernel '{}' (config {}): loading binary {} gave binary {}", bin.kernel, bin.config_text,
         bin.key, key);
  return std::make_shared<CpuKernel>(bin.key, bin.meta, std::move(h), fn, pool_);
}

// ---- CpuDevice ----

namespace {

int64_t llc_bytes() {
  int64_t best = 0;
  for (int i = 0; i < 8; ++i) {
    auto t = read_file(fmt::format("/sys/devices/system/cpu/cpu0/cache/index{}/size", i));
    if (!t) continue;
    int64_t v = std::atoll(t->c_str());
    if (t->find('K') != std::string::npos) v <<= 10;
    if (t->find('M') != std::string::npos) v <<= 20;
    best = std::max(best, v);
  }
  return best;
}

class HostTimer final : public Timer {
 public:
  void start(Stream) override { t0_ = std::chrono::steady_clock::now(); }
  void stop(Stream) override { t1_ = std::chrono::steady_clock::now(); }
  double elapsed_ns() override { return std::chrono::duration<double, std::nano>(t1_ - t0_).count(); }

 private:
  std::chrono::steady_clock::time_point t0_, t1_;
};

}  // namespace

CpuDevice::CpuDevice(int threads) {
  info_.name = cpu_model();
  info_.arch = "x86_64";
  info_.multiprocessors = threads;
  info_.l2_bytes = llc_bytes();
  info_.memory_bytes = static_cast<int64_t>(::sysconf(_SC_PHYS_PAGES)) * ::sysconf(_SC_PAGESIZE);
  info_.limits.grid_total = int64_t{1} << 62;
  info_.limits.multiprocessors = threads;
}

void* CpuDevice::alloc(size_t bytes) {
  size_t n = (bytes + 255) / 256 * 256;
  if (n == 0) n = 256;
  // The buffer is zeroed at once, so all of it is touched: past what the machine has free, that
  // would end this process by the kernel's out-of-memory killer, with no word of why.
  // (Only a buffer of 64 MiB or more asks: a smaller one is no such risk, and allocations are many.)
  bool by_cgroup = false;
  if (const int64_t avail = n < (size_t{64} << 20) ? -1 : available_memory_bytes(&by_cgroup);
      avail >= 0 && n > static_cast<uint64_t>(avail))
    fail(Errc::io, "cannot allocate {} bytes ({:.1f} GiB) of host memory: {:.1f} GiB are available{}", bytes,
         static_cast<double>(bytes) / (1 << 30), static_cast<double>(avail) / (1 << 30),
         by_cgroup ? " under this process's control group's memory limit" : "");
  void* p = std::aligned_alloc(256, n);
  if (!p) fail(Errc::io, "cannot allocate {} bytes of host memory", bytes);
  std::memset(p, 0, n);
  return p;
}
void CpuDevice::free(void* p) noexcept { std::free(p); }
void CpuDevice::to_device(void* dst, const void* src, size_t bytes, Stream) {
  if (bytes) std::memcpy(dst, src, bytes);
}
void CpuDevice::to_host(void* dst, const void* src, size_t bytes, Stream) {
  if (bytes) std::memcpy(dst, src, bytes);
}
void CpuDevice::copy(void* dst, const void* src, size_t bytes, Stream) {
  if (bytes) std::memmove(dst, src, bytes);
}
void CpuDevice::fill(void* dst, uint32_t pattern, int pattern_bytes, size_t count, Stream) {
  auto* p = static_cast<unsigned char*>(dst);
  if (pattern_bytes == 1) {
    std::memset(p, static_cast<int>(pattern & 0xff), count);
    return;
  }
  for (size_t i = 0; i < count; ++i) std::memcpy(p + i * pattern_bytes, &pattern, static_cast<size_t>(pattern_bytes));
}
std::unique_ptr<Timer> CpuDevice::timer() { return std::make_unique<HostTimer>(); }

size_t CpuDevice::flush_caches(Stream) {
  std::lock_guard<std::mutex> g(junk_m_);
  size_t want = static_cast<size_t>(std::max<int64_t>(info_.l2_bytes * 4, 64 << 20));
  if (junk_.size() < want) junk_.assign(want, 0);
  static char sink = 0;
  for (size_t i = 0; i < junk_.size(); i += 64) junk_[i] = static_cast<char>(junk_[i] + 1 + sink);
  sink = junk_[junk_.size() / 2];
  return junk_.size();
}

std::string CpuDevice::export_buffer(const void*, std::string* why) {
  if (why) *why = "host memory travels to a worker in shared memory";
  return "";
}
void* CpuDevice::import_buffer(const std::string&) {
  fail(Errc::internal, "the cpu device imports no buffers");
}

}  // namespace kiln
