// Reading and writing NumPy .npy files of float32 / float16 arrays.
//
// Engines and users hand kvcache dumps of keys, values and queries as .npy
// files (`kvcache eval --keys K.npy`). This is a small, strict reader of the
// NPY format, versions 1.0, 2.0 and 3.0: a little-endian '<f4' or '<f2'
// array in C order. Everything else (other dtypes, big-endian, Fortran
// order, object arrays, pickles) is rejected with a Status that says why;
// a malformed or truncated file is Corruption, an unsupported but well-formed
// one is InvalidArgument, a file that cannot be opened is IoError.
//
// Thread safety: free functions on values; safe to call concurrently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kvcache/status.h"

namespace kvcache {

// Element type stored in the file. Data is always returned as float32.
enum class NpyDtype : uint8_t {
  kF32,  // '<f4'
  kF16,  // '<f2' (IEEE binary16), widened exactly to float32 on read
};

struct NpyArray {
  std::vector<uint64_t> shape;  // () for a scalar
  std::vector<float> data;      // [product(shape)] in C (row-major) order
  NpyDtype stored_dtype = NpyDtype::kF32;

  uint64_t num_elements() const;
};

// Parses a whole .npy file held in memory.
Result<NpyArray> ParseNpy(std::span<const uint8_t> bytes);
// Reads and parses a .npy file. IoError if it cannot be read.
Result<NpyArray> ReadNpy(const std::string& path);

struct NpyWriteOptions {
  NpyDtype dtype = NpyDtype::kF32;  // f16 rounds to nearest even, saturating to inf
  uint8_t major_version = 1;        // 1, 2 or 3
};

// The bytes of a .npy file holding `data` ([product(shape)], C order).
// InvalidArgument if data.size() != product(shape) or the version is not 1-3.
Result<std::vector<uint8_t>> EncodeNpy(std::span<const uint64_t> shape, std::span<const float> data,
                                       const NpyWriteOptions& options = {});
// EncodeNpy, written to `path`. IoError if the file cannot be written.
Status WriteNpy(const std::string& path, std::span<const uint64_t> shape,
                std::span<const float> data, const NpyWriteOptions& options = {});

}  // namespace kvcache
