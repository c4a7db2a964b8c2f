// How a fuzz target is written: KVCACHE_FUZZ_TARGET(name) { body } defines
// `int KvcacheFuzz_name(const uint8_t* data, size_t size)`, the target's
// entry function, and, in a libFuzzer build (KVCACHE_LIBFUZZER defined by
// fuzz/CMakeLists.txt), libFuzzer's LLVMFuzzerTestOneInput calling it. The
// same entry functions are linked, all together, into the plain GoogleTest
// kvcache_fuzz_replay that replays the corpus with the normal compiler.
//
// A target checks what the library promises about arbitrary input: no
// crash, no undefined behaviour (ASan/UBSan), errors as Status values, and
// properties of what was accepted (FUZZ_CHECK). A broken property prints
// what broke and aborts: a finding for libFuzzer, a failing test for ctest.
//
// Thread safety: targets are called from one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#define FUZZ_CHECK(cond)                                                          \
  do {                                                                            \
    if (!(cond)) {                                                                \
      std::fprintf(stderr, "%s:%d: FUZZ_CHECK failed: %s\n", __FILE__, __LINE__, \
                   #cond);                                                        \
      std::abort();                                                               \
    }                                                                             \
  } while (0)

// FUZZ_CHECK with a message (a printf format and its arguments).
#define FUZZ_CHECK_MSG(cond, ...)                                                 \
  do {                                                                            \
    if (!(cond)) {                                                                \
      std::fprintf(stderr, "%s:%d: FUZZ_CHECK failed: %s: ", __FILE__, __LINE__, \
                   #cond);                                                        \
      std::fprintf(stderr, __VA_ARGS__);                                          \
      std::fprintf(stderr, "\n");                                                 \
      std::abort();                                                               \
    }                                                                             \
  } while (0)

#ifdef KVCACHE_LIBFUZZER
#define KVCACHE_FUZZ_LIBFUZZER_ENTRY(name)                                      \
  extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {    \
    return KvcacheFuzz_##name(data, size);                                      \
  }
#else
#define KVCACHE_FUZZ_LIBFUZZER_ENTRY(name)
#endif

#define KVCACHE_FUZZ_TARGET(name)                                 \
  int KvcacheFuzz_##name(const uint8_t* data, size_t size);       \
  KVCACHE_FUZZ_LIBFUZZER_ENTRY(name)                              \
  int KvcacheFuzz_##name(const uint8_t* data, size_t size)
