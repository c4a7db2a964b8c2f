// ModelFingerprint: XXH3-128 of the file's bytes, over a read-only mapping
// (the loader maps the same file, so its pages are shared, not copied).
#include "model/io/model_fingerprint.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>
#include <xxhash.h>

namespace kvcache::model {

Result<std::string> ModelFingerprint(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::IoError(fmt::format("cannot open {}: {}", path, std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status::IoError(fmt::format("cannot read {}: not a regular file", path));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  XXH128_hash_t h = XXH3_128bits(nullptr, 0);
  if (size > 0) {
    void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return Status::IoError(fmt::format("cannot map {}: {}", path, std::strerror(err)));
    }
    (void)::madvise(p, size, MADV_SEQUENTIAL);
    h = XXH3_128bits(p, size);
    ::munmap(p, size);
  }
  ::close(fd);
  return fmt::format("xxh3-128:{:016x}{:016x}:{}", h.high64, h.low64, size);
}

}  // namespace kvcache::model
