#include "kiln/code_cache.hpp"

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

CodeCache::CodeCache(fs::path root) : root_(std::move(root)) {
  ensure_private_dir(root_);
  code_ = root_ / "code";
  locks_ = root_ / "locks";
  ensure_private_dir(code_);
  ensure_private_dir(locks_);
}

fs::path CodeCache::path_of(const std::string& key) const {
  return code_ / key.substr(0, 2) / (key + ".kbin");
}

std::string CodeCache::encode(const Binary& b) {
  std::string meta = binary_meta_to_json(b).dump();
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

std::optional<Binary> CodeCache::get(const std::string& key) {
  if (!is_hex_key(key)) return std::nullopt;
  fs::path p = path_of(key);
  std::optional<std::string> data = read_file(p);
  if (!data) return std::nullopt;
  std::optional<Binary> b = decode(*data, key);
  if (!b) {
    ++corrupt_;
    log::warn("code cache entry {} is corrupt or from another kiln; it will be rebuilt", p.string());
    std::error_code ec;
    fs::remove(p, ec);
  }
  return b;
}

void CodeCache::put(const Binary& b) {
  if (!is_hex_key(b.key)) fail(Errc::internal, "bad binary key '{}'", b.key);
  fs::path p = path_of(b.key);
  std::error_code ec;
  fs::create_directories(p.parent_path(), ec);
  if (ec) fail(Errc::cache, "cannot create '{}': {}", p.parent_path().string(), ec.message());
  write_file_atomic(p, encode(b));
}

std::unique_ptr<FileLock> CodeCache::lock(const std::string& key) {
  return std::make_unique<FileLock>(locks_ / (key + ".lock"));
}

CodeCache::Stats CodeCache::stats() const {
  Stats s;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(code_, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    if (it->is_regular_file(ec) && it->path().extension() == ".kbin") {
      ++s.entries;
      s.bytes += it->file_size(ec);
    }
  }
  return s;
}

size_t CodeCache::clear() {
  size_t n = stats().entries;
  std::error_code ec;
  for (const auto& d : {code_, locks_}) {
    for (auto& e : fs::directory_iterator(d, ec)) fs::remove_all(e.path(), ec);
  }
  return n;
}

}  // namespace kiln
