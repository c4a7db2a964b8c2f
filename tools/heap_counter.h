// Live C++ heap bytes of the kvcache CLI process, for `kvcache soak`'s
// bytes_leaked. tools/heap_counter.cc replaces the global operator new /
// delete (all forms) of the CLI binary with versions that keep an atomic
// count of the bytes they hold (malloc_usable_size of each block, so the
// count is exact whichever delete form frees it). Everything the library,
// fmt, the JSON library and the standard containers allocate goes through
// them. malloc's own statistics cannot be used: chunks parked in a thread's
// malloc cache count as in use there.
//
// Thread safety: the counter is a relaxed atomic; safe from any thread.
#pragma once

#include <cstddef>

namespace kvcache::tools {

// Bytes currently held by operator new allocations (0 before any).
size_t LiveHeapBytes();

}  // namespace kvcache::tools
