// A model's fingerprint for the offload tiers' compatibility digest
// (kvcache/serving/tier_object.h BlockCompat::model): two processes get the same string iff
// they read byte-identical model files, so K/V blocks computed by one model
// are never served to another (a retrained checkpoint under the same name, a
// different quantization, a truncated download).
//
// What it is: "xxh3-128:<32 hex>:<file size>", the XXH3-128 of the whole
// file -- GGUF header, metadata (architecture, RoPE base, norms, vocabulary)
// and tensor data; for a llama2.c checkpoint its config header and weights.
// Hashing costs one pass over the mapped file (0.03 to 0.17 s for SmolLM2's
// 98 MB GGUF in the page cache; generate --json reports it as
// fingerprint_seconds); a name, path, size or mtime alone would not be sound.
//
// Thread safety: reentrant.
#pragma once

#include <string>

#include "kvcache/status.h"

namespace kvcache::model {

// IoError (naming the file) if it cannot be read.
Result<std::string> ModelFingerprint(const std::string& path);

}  // namespace kvcache::model
