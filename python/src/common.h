// Helpers shared by the binding files: errors, array conversion, the cache
// wrapper. Private to the extension (python/src).
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <Python.h>

#include <atomic>
#include <span>
#include <string>
#include <vector>

#include "kvcache/cache.h"
#include "kvcache/format.h"
#include "kvcache/status.h"

namespace nb = nanobind;

namespace kvcache::py {

// ---- errors ---------------------------------------------------------------

// Exception class per StatusCode, created at module init. [code] -> type.
inline PyObject* g_error_types[static_cast<int>(StatusCode::kInternal) + 1] = {};

[[noreturn]] inline void Throw(const Status& status) {
  PyObject* type = g_error_types[static_cast<int>(status.code())];
  if (type == nullptr) type = g_error_types[static_cast<int>(StatusCode::kInternal)];
  PyErr_SetString(type, status.message().c_str());
  throw nb::python_error();
}
[[noreturn]] inline void ThrowInvalid(const std::string& message) {
  Throw(Status::InvalidArgument(message));
}
inline void Check(const Status& status) {
  if (!status.ok()) Throw(status);
}
template <typename T>
T Unwrap(Result<T> result) {
  if (!result.ok()) Throw(result.status());
  return std::move(result).value();
}

// ---- arrays -----------------------------------------------------------------

using InF32 = nb::ndarray<const float, nb::c_contig, nb::device::cpu>;
using InU8 = nb::ndarray<const uint8_t, nb::c_contig, nb::device::cpu>;
using InU32 = nb::ndarray<const uint32_t, nb::c_contig, nb::device::cpu>;

template <typename T>
using OutArray = nb::ndarray<nb::numpy, T>;

// A new numpy array that owns `values` (moved to the heap), shaped `shape`.
template <typename T>
OutArray<T> ToArray(std::vector<T> values, std::vector<size_t> shape) {
  auto* heap = new std::vector<T>(std::move(values));
  nb::capsule owner(heap, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return OutArray<T>(heap->data(), shape.size(), shape.data(), owner);
}

// The same, one-dimensional: [values.size()].
template <typename T>
OutArray<T> ToArray1D(std::vector<T> values) {
  const size_t n = values.size();
  return ToArray(std::move(values), {n});
}

// A head's decoded rows (HeadKeys, HeadValues: [rows * head_dim]) as a new
// float32 array [rows, head_dim].
inline OutArray<float> HeadRowsArray(std::vector<float> rows, uint32_t head_dim) {
  const size_t n = rows.size() / head_dim;
  return ToArray(std::move(rows), {n, head_dim});
}

template <typename A>
std::string ShapeString(const A& a) {
  std::string s = "(";
  for (size_t i = 0; i < a.ndim(); ++i) {
    if (i) s += ", ";
    s += std::to_string(a.shape(i));
  }
  if (a.ndim() == 1) s += ",";
  return s + ")";
}

template <typename A>
std::span<const typename std::remove_const_t<std::remove_pointer_t<decltype(std::declval<A>().data())>>>
Span(const A& a) {
  return {a.data(), a.size()};
}

// ---- formats ------------------------------------------------------------------

inline FormatPair ParsePair(const std::string& text) { return Unwrap(ParseFormatPair(text)); }

// ---- caches -------------------------------------------------------------------

// A mutable library object (SequenceCache, HybridSequence) plus the count
// of attention calls reading it right now (they run without the GIL).
template <typename T>
struct Guarded {
  explicit Guarded(T o) : obj(std::move(o)) {}
  T obj;
  std::atomic<int> readers{0};

  // The object, for a mutating call. Raises if attention is reading it.
  T& Mut() {
    if (readers.load(std::memory_order_acquire) != 0) {
      Throw(Status::FailedPrecondition(
          "the cache is being read by an attention call in another thread; mutate it after "
          "that call returns"));
    }
    return obj;
  }
};
using PyCache = Guarded<SequenceCache>;

// The end of a Guarded class's bindings: check_invariants, and the context
// manager (`with` returns the object and releases it on exit, letting any
// exception through).
template <typename T>
nb::class_<Guarded<T>>& DefInvariantsAndWith(nb::class_<Guarded<T>>& cls) {
  cls.def("check_invariants", [](const Guarded<T>& g) { Check(g.obj.CheckInvariants()); })
      .def("__enter__", [](nb::handle self) { return self; }, nb::rv_policy::reference)
      .def(
          "__exit__",
          [](Guarded<T>& g, nb::handle, nb::handle, nb::handle) {
            g.Mut().Release();
            return false;
          },
          nb::arg("exc_type").none(), nb::arg("exc").none(), nb::arg("tb").none());
  return cls;
}

// Marks caches busy for the duration of an attention call.
class ReadGuard {
 public:
  template <typename T>
  explicit ReadGuard(std::vector<Guarded<T>*> objs) {
    for (auto* o : objs) counters_.push_back(&o->readers);
    for (auto* c : counters_) c->fetch_add(1, std::memory_order_acq_rel);
  }
  ~ReadGuard() {
    for (auto* c : counters_) c->fetch_sub(1, std::memory_order_acq_rel);
  }
  ReadGuard(const ReadGuard&) = delete;
  ReadGuard& operator=(const ReadGuard&) = delete;

 private:
  std::vector<std::atomic<int>*> counters_;
};

}  // namespace kvcache::py
