// Fuzz target `api_sequence`: bytes decoded into operations on pools,
// sequence caches, the prefix cache and hybrid sequences, with every
// invariant checked after every operation (see api_sequence.h).
// Thread safety: see fuzz_target.h.
#include "fuzz/api_sequence.h"
#include "fuzz/fuzz_target.h"

KVCACHE_FUZZ_TARGET(api_sequence) {
  const std::string failure = kvcache::fuzz::RunApiSequence(data, size);
  FUZZ_CHECK_MSG(failure.empty(), "%s", failure.c_str());
  return 0;
}
