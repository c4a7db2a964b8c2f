// Fuzz target `npy`: ParseNpy on arbitrary bytes (src/core/npy.cc).
// Properties of an accepted file: data holds product(shape) values, and
// encoding it again (same dtype, version 1) parses back to the same shape
// and the same values (NaN to NaN). Thread safety: see fuzz_target.h.
#include <cmath>
#include <cstring>
#include <span>

#include "fuzz/fuzz_target.h"
#include "kvcache/npy.h"

namespace {
bool SameValue(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  uint32_t x, y;
  std::memcpy(&x, &a, 4);
  std::memcpy(&y, &b, 4);
  return x == y;
}
}  // namespace

KVCACHE_FUZZ_TARGET(npy) {
  using namespace kvcache;
  auto parsed = ParseNpy(std::span<const uint8_t>(data, size));
  if (!parsed.ok()) {
    const StatusCode c = parsed.status().code();
    FUZZ_CHECK(c == StatusCode::kCorruption || c == StatusCode::kInvalidArgument);
    return 0;
  }
  const NpyArray& a = *parsed;
  uint64_t n = 1;
  for (uint64_t d : a.shape) n *= d;
  FUZZ_CHECK(a.num_elements() == n);
  FUZZ_CHECK(a.data.size() == n);
  const size_t elem = a.stored_dtype == NpyDtype::kF16 ? 2 : 4;
  FUZZ_CHECK(n * elem <= size);  // the values came from the file
  auto again = EncodeNpy(a.shape, a.data, {.dtype = a.stored_dtype, .major_version = 1});
  FUZZ_CHECK(again.ok());
  auto back = ParseNpy(*again);
  FUZZ_CHECK(back.ok());
  FUZZ_CHECK(back->shape == a.shape);
  FUZZ_CHECK(back->stored_dtype == a.stored_dtype);
  FUZZ_CHECK(back->data.size() == a.data.size());
  for (size_t i = 0; i < a.data.size(); ++i) FUZZ_CHECK(SameValue(back->data[i], a.data[i]));
  return 0;
}
