// Counting replacements of the global operator new / delete (see
// heap_counter.h). Each allocation adds malloc_usable_size(p) to the count
// and its delete subtracts the same, so sized and unsized deletes agree.
#include "tools/heap_counter.h"

#include <malloc.h>

#include <atomic>
#include <cstdlib>
#include <new>

namespace kvcache::tools {
namespace {
std::atomic<size_t> g_live{0};

void* Count(void* p) {
  if (p) g_live.fetch_add(malloc_usable_size(p), std::memory_order_relaxed);
  return p;
}
void Uncount(void* p) {
  if (p) g_live.fetch_sub(malloc_usable_size(p), std::memory_order_relaxed);
}
void* Allocate(size_t n) {
  for (;;) {
    if (void* p = std::malloc(n ? n : 1)) return Count(p);
    std::new_handler h = std::get_new_handler();
    if (!h) throw std::bad_alloc();
    h();
  }
}
void* AllocateAligned(size_t n, std::align_val_t a) {
  const size_t align = static_cast<size_t>(a) < sizeof(void*) ? sizeof(void*) : static_cast<size_t>(a);
  for (;;) {
    void* p = nullptr;
    if (posix_memalign(&p, align, n ? n : 1) == 0) return Count(p);
    std::new_handler h = std::get_new_handler();
    if (!h) throw std::bad_alloc();
    h();
  }
}
void Free(void* p) {
  Uncount(p);
  std::free(p);
}
}  // namespace

size_t LiveHeapBytes() { return g_live.load(std::memory_order_relaxed); }

}  // namespace kvcache::tools

using kvcache::tools::Allocate;
using kvcache::tools::AllocateAligned;
using kvcache::tools::Free;

void* operator new(size_t n) { return Allocate(n); }
void* operator new[](size_t n) { return Allocate(n); }
void* operator new(size_t n, const std::nothrow_t&) noexcept {
  try { return Allocate(n); } catch (...) { return nullptr; }
}
void* operator new[](size_t n, const std::nothrow_t&) noexcept {
  try { return Allocate(n); } catch (...) { return nullptr; }
}
void* operator new(size_t n, std::align_val_t a) { return AllocateAligned(n, a); }
void* operator new[](size_t n, std::align_val_t a) { return AllocateAligned(n, a); }
void* operator new(size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  try { return AllocateAligned(n, a); } catch (...) { return nullptr; }
}
void* operator new[](size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  try { return AllocateAligned(n, a); } catch (...) { return nullptr; }
}
void operator delete(void* p) noexcept { Free(p); }
void operator delete[](void* p) noexcept { Free(p); }
void operator delete(void* p, size_t) noexcept { Free(p); }
void operator delete[](void* p, size_t) noexcept { Free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { Free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { Free(p); }
void operator delete(void* p, std::align_val_t) noexcept { Free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { Free(p); }
void operator delete(void* p, size_t, std::align_val_t) noexcept { Free(p); }
void operator delete[](void* p, size_t, std::align_val_t) noexcept { Free(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { Free(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { Free(p); }
