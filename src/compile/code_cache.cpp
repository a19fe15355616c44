#include <map>
#include <mutex>
#include "compile/code_cache.hpp"

#include <cstring>

#include "backends/serialize.hpp"
#include "core/format.hpp"
#include "core/fsutil.hpp"
#include "core/log.hpp"

namespace kiln {

namespace fs = std::filesystem;

namespace {

constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'B', 'I', 'N', '\0'};
constexpr uint32_t kEntryVersion = 1;  // bump when the entry layout below changes

struct Header {
  char magic[8];
  uint32_t version;
  uint32_t meta_len;
  uint64_t payload_len;
  uint64_t checksum;  // xxh3-64 of meta + payload
};
static_assert(sizeof(Header) == 32);

bool is_hex_key(const std::string& k) {
  if (k.size() != 32) return false;
  for (char c : k)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

}  // namespace

struct CodeCache::Dirs {
  SafeDir root, code, locks;
  std::mutex overlay_m;
  std::map<std::string, Binary> overlay;  // binaries from a packed artifact, by key
};
struct CodeCache::Held {
  FileLock lock;
};

CodeCache::CodeCache(fs::path root) : dirs_(std::make_unique<Dirs>()), root_(std::move(root)) {
  dirs_->root = SafeDir::open(root_, true);
  dirs_->code = dirs_->root.sub("code", true);
  dirs_->locks = dirs_->root.sub("locks", true);
  dirs_->code.check_writable();  // FolderNotWritable: the caller runs without a cache
  dirs_->locks.check_writable();
}

std::unique_ptr<CodeCache> CodeCache::open_existing(const fs::path& root) {
  std::unique_ptr<CodeCache> c(new CodeCache());
  c->dirs_ = std::make_unique<Dirs>();
  c->root_ = root;
  c->dirs_->root = SafeDir::open(root, false);
  if (c->dirs_->root) c->dirs_->code = c->dirs_->root.sub("code", false);
  return c;
}

std::unique_ptr<CodeCache> CodeCache::open_read_only(const fs::path& root) {
  std::unique_ptr<CodeCache> c = open_existing(root);
  c->discard_writes_ = true;
  return c;
}

CodeCache::~CodeCache() = default;

std::string CodeCache::encode(const Binary& b) {
  std::string meta = dump_json(binary_meta_to_json(b));
  Header h{};
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.version = kEntryVersion;
  h.meta_len = static_cast<uint32_t>(meta.size());
  h.payload_len = b.bytes.size();
  std::string body = meta;
  body.append(reinterpret_cast<const char*>(b.bytes.data()), b.bytes.size());
  h.checksum = hash64(body.data(), body.size());
  std::string out(reinterpret_cast<const char*>(&h), sizeof h);
  out += body;
  return out;
}

std::optional<Binary> CodeCache::decode(std::string_view data, const std::string& expect_key) {
  if (data.size() < sizeof(Header)) return std::nullopt;
  Header h;
  std::memcpy(&h, data.data(), sizeof h);
  if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0 || h.version != kEntryVersion) return std::nullopt;
  if (data.size() != sizeof h + h.meta_len + h.payload_len) return std::nullopt;
  std::string_view body = data.substr(sizeof h);
  if (hash64(body.data(), body.size()) != h.checksum) return std::nullopt;
  try {
    auto meta = nlohmann::json::parse(body.substr(0, h.meta_len));
    Binary b = binary_from_meta_json(meta);
    if (b.key != expect_key) return std::nullopt;
    std::string_view payload = body.substr(h.meta_len);
    b.bytes.assign(payload.begin(), payload.end());
    return b;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

void CodeCache::add_overlay(std::vector<Binary> bins) {
  std::lock_guard<std::mutex> g(dirs_->overlay_m);
  for (auto& b : bins) dirs_->overlay[b.key] = std::move(b);
}

std::optional<Binary> CodeCache::get(const std::string& key) {
  {
    std::lock_guard<std::mutex> g(dirs_->overlay_m);
    if (auto it = dirs_->overlay.find(key); it != dirs_->overlay.end()) {
      Binary b = it->second;
      b.from_cache = true;
      return b;
    }
  }
  if (!is_hex_key(key) || !dirs_->code) return std::nullopt;
  SafeDir sub = dirs_->code.sub(key.substr(0, 2), false);
  if (!sub) return std::nullopt;
  std::string name = key + ".kbin";
  std::optional<std::string> data = sub.read(name, kMaxEntryBytes);
  if (!data) return std::nullopt;
  std::optional<Binary> b = decode(*data, key);
  if (!b) {
    ++corrupt_;
    log::warn("code cache entry {} is corrupt or from another kiln; it will be rebuilt", (sub.path() / name).string());
    sub.remove(name);
  }
  return b;
}

void CodeCache::put(const Binary& b) {
  if (!is_hex_key(b.key)) fail(Errc::internal, "bad binary key '{}'", b.key);
  if (discard_writes_) return;
  if (!dirs_->code) fail(Errc::cache, "the code cache at '{}' is open for reading only", root_.string());
  dirs_->code.sub(b.key.substr(0, 2), true).write(b.key + ".kbin", encode(b));
}

std::shared_ptr<CodeCache::Held> CodeCache::lock_key(const std::string& key) {
  if (!dirs_->locks) return nullptr;
  auto h = std::make_shared<Held>();
  h->lock = dirs_->locks.lock(key + ".lock");
  return h;
}

CodeCache::Stats CodeCache::stats() const {
  Stats s;
  if (!dirs_->code) return s;
  for (const auto& d : dirs_->code.entries()) {
    if (!d.dir) continue;
    for (const auto& e : dirs_->code.sub(d.name, false).entries())
      if (e.file && e.name.size() > 5 && e.name.substr(e.name.size() - 5) == ".kbin") {
        ++s.entries;
        s.bytes += e.bytes;
      }
  }
  return s;
}

size_t CodeCache::clear() {
  size_t n = stats().entries;
  if (dirs_->code) dirs_->code.clear();
  if (dirs_->locks) dirs_->locks.clear();
  return n;
}

}  // namespace kiln
