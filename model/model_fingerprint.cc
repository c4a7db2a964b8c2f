// ModelFingerprint: XXH3-128 of the file's bytes, read in 1 MiB chunks.
#include "model/model_fingerprint.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include <fmt/format.h>
#include <xxhash.h>

namespace kvcache::model {

Result<std::string> ModelFingerprint(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::IoError(fmt::format("cannot open {}: {}", path, std::strerror(errno)));
  XXH3_state_t* st = XXH3_createState();
  if (st == nullptr) {
    ::close(fd);
    return Status::Internal("model fingerprint: out of memory");
  }
  XXH3_128bits_reset(st);
  std::vector<char> buf(size_t{1} << 20);
  uint64_t size = 0;
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      XXH3_freeState(st);
      ::close(fd);
      return Status::IoError(fmt::format("cannot read {}: {}", path, std::strerror(err)));
    }
    if (n == 0) break;
    XXH3_128bits_update(st, buf.data(), static_cast<size_t>(n));
    size += static_cast<uint64_t>(n);
  }
  const XXH128_hash_t h = XXH3_128bits_digest(st);
  XXH3_freeState(st);
  ::close(fd);
  return fmt::format("xxh3-128:{:016x}{:016x}:{}", h.high64, h.low64, size);
}

}  // namespace kvcache::model
