// The API-sequence fuzzer's decoder: bytes -> a sequence of operations on
// the library's public API, with every invariant checked after every one.
//
// World: one BlockPool (geometry and formats chosen by the first bytes), a
// PrefixCache on it, up to kSlots SequenceCaches (paged or contiguous),
// prefix references the harness holds (acquired, not yet adopted), blocks
// a "hog" holds to press the pool, and up to kHybridSlots HybridSequences
// (full layer with a heavy-hitter head, window layer, linear layer) on
// their own two pools. Each following byte picks an operation: create,
// append (with dead heads), advance, truncate, fork, clone, reserve,
// release, publish, adopt, acquire/hold, adopt held, drop held, keep rows
// (eviction), accumulate importance (finite or not), hog/unhog, and on
// hybrids: append, draft + commit/abort, importance, evict, fork, truncate,
// release. Operations whose inputs are invalid are issued on purpose; the
// library must refuse them with the documented Status and change nothing.
//
// Checked (the first failure is returned), after every operation on what
// it touched (a sequence or hybrid slot it picks is also compared before
// it, so nothing done to it elsewhere is absorbed or released unseen), on
// everything every 16 operations and after the last; the pools, the prefix
// cache and the accounting after every operation:
//   - CheckInvariants of every cache, hybrid sequence, pool, prefix cache;
//   - exact pool accounting against a model built from the caches' block
//     tables and the harness's own references: the refcount of every block,
//     used / free / cached / reserved / available counters;
//   - isolation: every sequence still decodes to exactly the rows, positions
//     it held (an operation on one never changes another: copy-on-write);
//     f32 rows equal the values appended, bit for bit;
//   - reservation promises: an append within a fully reserved target never
//     fails with PoolExhausted;
//   - prefix reuse: a published block holds exactly the positions its hash
//     names, and an adopted block decodes to what its publisher stored;
//   - a failing call changes nothing (rows, lengths, importance, accounting);
//   - hybrid drafts: after Commit / Abort the sequence equals a contiguous
//     twin that appended only the kept tokens (rows, positions, linear state).
// At the end everything is released and every pool must be exactly full.
// By default an input runs at most 48 operations; sequences stop growing at 32 tokens,
// hybrids at 24 (an input's cost is its operations times the rows read back).
//
// Thread safety: RunApiSequence is reentrant (all state is local).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace kvcache::fuzz {

struct ApiSequenceOptions {
  // Check everything after every operation (the replay test; the
  // environment variable KVCACHE_FUZZ_CHECK_ALL=1 does the same, to find
  // the operation behind a finding that a periodic full check reported).
  bool check_all = false;
  // An input runs at most max_ops operations; appends that would take a
  // sequence past max_tokens (a hybrid past max_hybrid_tokens) are skipped.
  // The fuzzer's limits keep an execution short; the regression replay runs
  // the inputs found before these limits (400 operations, no length limit)
  // as they ran then.
  size_t max_ops = 48;
  uint32_t max_tokens = 32;
  uint32_t max_hybrid_tokens = 24;
};

// Runs the operations `data` decodes to. Returns "" if every check held,
// else a description of the first one that failed (and the operation).
std::string RunApiSequence(const uint8_t* data, size_t size, const ApiSequenceOptions& options = {});

}  // namespace kvcache::fuzz
