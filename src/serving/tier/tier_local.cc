// HostTier and DiskTier (tier_store.h): a byte-budgeted index with chain-aware LRU
// eviction, over process memory or over one file per object.
//
// ChainLru is the shared index: key -> (bytes, parent key, calibration key,
// number of stored entries naming it, LRU position). Eviction walks from the
// least recently used end and takes the first entry nobody names (a chain's
// tail before its prefix, a calibration object after the last block that
// names it); if none is found within kVictimScan entries it takes the least
// recently used one (what names it is then unreachable and ages out).
//
// DiskTier files: <path>/objects/<hh>/<key with ':' as '-'>.kvcb (hh = the
// first two hex digits of the chain hash), written as <path>/tmp/<pid>-<n>.tmp,
// fsync'd, renamed. On open, temporaries of dead processes are deleted and
// every object file's header is parsed (ParseStoredObjectHeader: blocks and
// calibration objects; magic, version, header checksum, size): bad ones are deleted, good ones indexed in
// mtime order. A key the index lacks is looked for on disk before it is
// called absent, so several processes can share one folder (each keeps its
// own budget; an object another evicted is simply absent).
//
// Thread safety: one mutex per tier guards the index; file I/O runs outside
// it (a file evicted while being read stays readable through its open fd).
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <filesystem>
#include <list>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include <fmt/format.h>

#include "kvcache/serving/tier_object.h"
#include "kvcache/serving/tier_store.h"

namespace kvcache {
namespace {

constexpr size_t kVictimScan = 256;

class ChainLru {
 public:
  struct Entry {
    uint64_t bytes = 0;
    std::string parent;
    std::string calibration;  // the calibration object a block names, or ""
    uint32_t children = 0;    // stored entries naming this one (parent or calibration)
    std::list<std::string>::iterator pos;
    TierBytes value;  // HostTier only
  };

  explicit ChainLru(size_t history) : history_cap_(history) {}

  Entry* Find(const std::string& key) {
    auto it = map_.find(key);
    return it == map_.end() ? nullptr : &it->second;
  }
  bool WasEvicted(const std::string& key) const { return evicted_set_.count(key) != 0; }
  void Touch(Entry* e) { lru_.splice(lru_.end(), lru_, e->pos); }

  void Insert(const std::string& key, const std::string& parent, const std::string& calibration,
              uint64_t bytes, TierBytes value) {
    Entry* old = Find(key);
    const uint32_t children = old ? old->children : 0;  // a replaced key keeps its children
    Erase(key);
    Entry e;
    e.bytes = bytes;
    e.parent = parent;
    e.calibration = calibration;
    e.children = children;
    e.value = std::move(value);
    e.pos = lru_.insert(lru_.end(), key);
    map_.emplace(key, std::move(e));
    Name(parent, +1);
    Name(calibration, +1);
    total_ += bytes;
    evicted_set_.erase(key);
  }

  // Removes key (not counted as an eviction). Returns its bytes (0 if absent).
  uint64_t Erase(const std::string& key) {
    auto it = map_.find(key);
    if (it == map_.end()) return 0;
    Name(it->second.parent, -1);
    Name(it->second.calibration, -1);
    const uint64_t bytes = it->second.bytes;
    total_ -= bytes;
    lru_.erase(it->second.pos);
    map_.erase(it);
    return bytes;
  }

  // Picks and removes the next victim; false if empty.
  bool Evict(std::string* key) {
    if (lru_.empty()) return false;
    auto victim = lru_.begin();
    size_t scanned = 0;
    for (auto it = lru_.begin(); it != lru_.end() && scanned < kVictimScan; ++it, ++scanned) {
      if (map_.at(*it).children == 0) {
        victim = it;
        break;
      }
    }
    *key = *victim;
    Erase(*key);
    ++evictions_;
    evicted_set_.insert(*key);
    evicted_fifo_.push_back(*key);
    while (evicted_fifo_.size() > history_cap_) {
      evicted_set_.erase(evicted_fifo_.front());
      evicted_fifo_.pop_front();
    }
    return true;
  }

  // Recomputes every children count (after a bulk rebuild in arbitrary order).
  void RecountChildren() {
    for (auto& [k, e] : map_) e.children = 0;
    for (auto& [k, e] : map_) {
      Name(e.parent, +1);
      Name(e.calibration, +1);
    }
  }

  uint64_t total_bytes() const { return total_; }
  // The counters every local tier reports (objects, bytes, evictions), with
  // the tier's capacity and failed stores.
  TierUsage Usage(uint64_t capacity_bytes, uint64_t store_failures) const {
    TierUsage u;
    u.objects = map_.size();
    u.bytes = total_;
    u.capacity_bytes = capacity_bytes;
    u.evictions = evictions_;
    u.store_failures = store_failures;
    return u;
  }

 private:
  // One more (+1) or one fewer (-1) stored entry names `key` (if stored).
  void Name(const std::string& key, int delta) {
    Entry* p = key.empty() ? nullptr : Find(key);
    if (p == nullptr) return;
    if (delta > 0) {
      ++p->children;
    } else if (p->children > 0) {
      --p->children;
    }
  }

  std::unordered_map<std::string, Entry> map_;
  std::list<std::string> lru_;  // front = least recently used
  uint64_t total_ = 0;
  uint64_t evictions_ = 0;
  size_t history_cap_;
  std::unordered_set<std::string> evicted_set_;
  std::deque<std::string> evicted_fifo_;
};

// --- HostTier --------------------------------------------------------------

class HostTier final : public Tier {
 public:
  explicit HostTier(const HostTierOptions& o) : o_(o), lru_(o.evicted_history) {}
  std::string name() const override { return "host"; }

  std::vector<std::optional<TierMiss>> Exists(std::span<const std::string> keys) override {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::optional<TierMiss>> out(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      if (lru_.Find(keys[i]) == nullptr) {
        out[i] = lru_.WasEvicted(keys[i]) ? TierMiss::kEvicted : TierMiss::kAbsent;
      }
    }
    return out;
  }

  std::vector<TierGet> Load(std::span<const std::string> keys) override {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<TierGet> out(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      if (ChainLru::Entry* e = lru_.Find(keys[i])) {
        out[i].bytes = std::make_shared<const TierBlob>(e->value);
        lru_.Touch(e);
      } else {
        out[i].miss = lru_.WasEvicted(keys[i]) ? TierMiss::kEvicted : TierMiss::kAbsent;
      }
    }
    return out;
  }

  size_t Store(std::span<const TierPut> puts) override {
    std::lock_guard<std::mutex> lock(mu_);
    size_t stored = 0;
    for (const TierPut& p : puts) {
      if (p.bytes == nullptr || p.bytes->size() > o_.capacity_bytes) {
        ++store_failures_;
        continue;
      }
      lru_.Insert(p.key, p.parent_key, p.calibration_key, p.bytes->size(), p.bytes);
      ++stored;
      std::string victim;
      while (lru_.total_bytes() > o_.capacity_bytes && lru_.Evict(&victim)) {
      }
    }
    return stored;
  }

  void Erase(std::span<const std::string> keys) override {
    std::lock_guard<std::mutex> lock(mu_);
    for (const std::string& k : keys) lru_.Erase(k);
  }

  TierUsage usage() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return lru_.Usage(o_.capacity_bytes, store_failures_);
  }

 private:
  const HostTierOptions o_;
  mutable std::mutex mu_;
  ChainLru lru_;
  uint64_t store_failures_ = 0;
};

// --- DiskTier --------------------------------------------------------------

bool WriteAll(int fd, const uint8_t* p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool ReadAll(int fd, uint8_t* p, size_t n) {
  off_t off = 0;
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, n, off);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    off += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

class DiskTier final : public Tier {
 public:
  explicit DiskTier(const DiskTierOptions& o) : o_(o), lru_(o.evicted_history) {}
  std::string name() const override { return "disk"; }

  Status Open() {
    std::error_code ec;
    std::filesystem::create_directories(o_.path + "/objects", ec);
    std::filesystem::create_directories(o_.path + "/tmp", ec);
    if (ec) return Status::IoError(fmt::format("disk tier: cannot create {}: {}", o_.path, ec.message()));
    // Temporaries of processes that are gone are torn writes: delete them.
    for (const auto& f : std::filesystem::directory_iterator(o_.path + "/tmp", ec)) {
      const std::string n = f.path().filename().string();
      const long pid = std::strtol(n.c_str(), nullptr, 10);
      if (pid <= 0 || (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH)) {
        std::filesystem::remove(f.path(), ec);
      }
    }
    struct Found {
      StoredObjectHeader names;
      uint64_t bytes;
      int64_t mtime_ns;
    };
    std::vector<Found> found;
    for (const auto& shard : std::filesystem::directory_iterator(o_.path + "/objects", ec)) {
      if (!shard.is_directory()) continue;
      std::error_code ec2;
      for (const auto& f : std::filesystem::directory_iterator(shard.path(), ec2)) {
        const std::string path = f.path().string();
        Found x;
        struct stat st;
        if (::stat(path.c_str(), &st) != 0) continue;
        if (!ReadHeader(path, &x.names, &x.bytes) || PathFor(x.names.key) != path) {
          std::filesystem::remove(f.path(), ec2);
          ++discarded_;
          continue;
        }
        x.mtime_ns = int64_t{st.st_mtim.tv_sec} * 1'000'000'000 + st.st_mtim.tv_nsec;
        found.push_back(std::move(x));
      }
    }
    std::sort(found.begin(), found.end(),
              [](const Found& a, const Found& b) { return a.mtime_ns < b.mtime_ns; });
    std::lock_guard<std::mutex> lock(mu_);
    for (const Found& x : found) {
      lru_.Insert(x.names.key, x.names.parent_key, x.names.calibration_key, x.bytes, nullptr);
    }
    lru_.RecountChildren();
    recovered_ = found.size();
    EvictOverBudgetLocked();
    return Status::Ok();
  }

  std::vector<std::optional<TierMiss>> Exists(std::span<const std::string> keys) override {
    std::vector<std::optional<TierMiss>> out(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      if (!Known(keys[i])) {
        std::lock_guard<std::mutex> lock(mu_);
        out[i] = lru_.WasEvicted(keys[i]) ? TierMiss::kEvicted : TierMiss::kAbsent;
      }
    }
    return out;
  }

  std::vector<TierGet> Load(std::span<const std::string> keys) override {
    std::vector<TierGet> out(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      if (!Known(keys[i])) {
        std::lock_guard<std::mutex> lock(mu_);
        out[i].miss = lru_.WasEvicted(keys[i]) ? TierMiss::kEvicted : TierMiss::kAbsent;
        continue;
      }
      const int fd = ::open(PathFor(keys[i]).c_str(), O_RDONLY | O_CLOEXEC);
      struct stat st;
      if (fd < 0 || ::fstat(fd, &st) != 0) {
        if (fd >= 0) ::close(fd);
        std::lock_guard<std::mutex> lock(mu_);
        lru_.Erase(keys[i]);  // gone under us (another process evicted it)
        out[i].miss = TierMiss::kAbsent;
        continue;
      }
      // Uninitialized (no zero-fill of what read() overwrites), one read()
      // for the whole file.
      auto bytes = std::make_shared<TierBlob>(static_cast<size_t>(st.st_size));
      const bool ok = ReadAll(fd, bytes->mutable_data(), bytes->size());
      ::close(fd);
      if (!ok) {
        out[i].miss = TierMiss::kUnavailable;
        continue;
      }
      out[i].bytes = std::move(bytes);
      std::lock_guard<std::mutex> lock(mu_);
      if (ChainLru::Entry* e = lru_.Find(keys[i])) lru_.Touch(e);
    }
    return out;
  }

  size_t Store(std::span<const TierPut> puts) override {
    size_t stored = 0;
    for (const TierPut& p : puts) {
      if (p.bytes == nullptr || p.bytes->size() > o_.capacity_bytes || !WriteObject(p)) {
        std::lock_guard<std::mutex> lock(mu_);
        ++store_failures_;
        continue;
      }
      ++stored;
      std::lock_guard<std::mutex> lock(mu_);
      lru_.Insert(p.key, p.parent_key, p.calibration_key, p.bytes->size(), nullptr);
      EvictOverBudgetLocked();
    }
    return stored;
  }

  void Erase(std::span<const std::string> keys) override {
    std::lock_guard<std::mutex> lock(mu_);
    for (const std::string& k : keys) {
      lru_.Erase(k);
      ::unlink(PathFor(k).c_str());
    }
  }

  TierUsage usage() const override {
    std::lock_guard<std::mutex> lock(mu_);
    TierUsage u = lru_.Usage(o_.capacity_bytes, store_failures_);
    u.recovered_objects = recovered_;
    u.discarded_files = discarded_;
    return u;
  }

 private:
  std::string PathFor(const std::string& key) const {
    std::string file = key;
    std::replace(file.begin(), file.end(), ':', '-');
    const size_t last = key.rfind(':');
    const std::string shard = last == std::string::npos || last + 3 > key.size()
                                  ? std::string("xx")
                                  : key.substr(last + 1, 2);
    return o_.path + "/objects/" + shard + "/" + file + ".kvcb";
  }

  // Reads and checks a file's header; false if it is not a whole object.
  static bool ReadHeader(const std::string& path, StoredObjectHeader* names, uint64_t* bytes) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    struct stat st;
    std::vector<uint8_t> head;
    bool ok = ::fstat(fd, &st) == 0 && st.st_size >= static_cast<off_t>(kBlockObjectFixedHeader);
    if (ok) {
      head.resize(kBlockObjectFixedHeader);
      ok = ReadAll(fd, head.data(), head.size());
    }
    if (ok) {
      uint32_t header_bytes;
      std::memcpy(&header_bytes, head.data() + 8, 4);
      ok = header_bytes >= kBlockObjectFixedHeader && header_bytes <= st.st_size &&
           header_bytes <= (64u << 20);
      if (ok) {
        head.resize(header_bytes);
        ok = ReadAll(fd, head.data(), head.size());
      }
    }
    ::close(fd);
    if (!ok) return false;
    Result<StoredObjectHeader> info = ParseStoredObjectHeader(head, static_cast<uint64_t>(st.st_size));
    if (!info.ok()) return false;
    *names = std::move(*info);
    *bytes = static_cast<uint64_t>(st.st_size);
    return true;
  }

  // True if the key is indexed, or found on disk (then indexed).
  bool Known(const std::string& key) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (lru_.Find(key) != nullptr) return true;
    }
    StoredObjectHeader names;
    uint64_t bytes;
    if (!ReadHeader(PathFor(key), &names, &bytes) || names.key != key) return false;
    std::lock_guard<std::mutex> lock(mu_);
    if (lru_.Find(key) == nullptr) {
      lru_.Insert(key, names.parent_key, names.calibration_key, bytes, nullptr);
      EvictOverBudgetLocked();
    }
    return lru_.Find(key) != nullptr;
  }

  bool WriteObject(const TierPut& p) {
    const std::string tmp =
        fmt::format("{}/tmp/{}-{}.tmp", o_.path, ::getpid(), next_tmp_.fetch_add(1));
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) return false;
    bool ok = WriteAll(fd, p.bytes->data(), p.bytes->size());
    if (ok && o_.fsync) ok = ::fsync(fd) == 0;
    ok = (::close(fd) == 0) && ok;
    const std::string final_path = PathFor(p.key);
    if (ok) {
      std::error_code ec;
      std::filesystem::create_directories(std::filesystem::path(final_path).parent_path(), ec);
      ok = ::rename(tmp.c_str(), final_path.c_str()) == 0;
    }
    if (!ok) ::unlink(tmp.c_str());
    return ok;
  }

  void EvictOverBudgetLocked() {
    std::string victim;
    while (lru_.total_bytes() > o_.capacity_bytes && lru_.Evict(&victim)) {
      ::unlink(PathFor(victim).c_str());
    }
  }

  const DiskTierOptions o_;
  mutable std::mutex mu_;
  ChainLru lru_;
  uint64_t store_failures_ = 0;
  uint64_t recovered_ = 0;
  uint64_t discarded_ = 0;
  std::atomic<uint64_t> next_tmp_{0};
};

}  // namespace

std::unique_ptr<Tier> NewHostTier(const HostTierOptions& options) {
  return std::make_unique<HostTier>(options);
}

Result<std::unique_ptr<Tier>> OpenDiskTier(const DiskTierOptions& options) {
  if (options.path.empty()) return Status::InvalidArgument("disk tier: empty path");
  auto tier = std::make_unique<DiskTier>(options);
  KV_RETURN_IF_ERROR(tier->Open());
  return std::unique_ptr<Tier>(std::move(tier));
}

}  // namespace kvcache
