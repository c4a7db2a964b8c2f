// kvcache._kvcache: the nanobind bindings of kvcache's public C++ API.
//
// Thin by design (python/kvcache/__init__.py re-exports everything): each
// function converts arrays and options, calls the C++ API, and turns a
// non-OK Status into the exception class of its StatusCode (kvcache.Error
// and one subclass per code). No logic of the cache lives here.
//
// Arrays. Inputs are float32, C-contiguous, CPU arrays; anything else that
// numpy (or DLPack) can convert is copied into that form by nanobind, and
// what cannot be is a TypeError. Outputs are new numpy arrays that own their
// memory (copies), except BlockPool.arena(), a read-only zero-copy view of
// pool storage that keeps the pool alive for as long as the array lives.
//
// Threads. Attention calls release the GIL. While one runs, the caches it
// reads are marked busy: a mutating call on a busy cache from another Python
// thread raises FailedPrecondition instead of racing (SequenceCache itself
// needs external synchronization for mutation, see cache.h).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <Python.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kvcache/attention.h"
#include "kvcache/cache.h"
#include "kvcache/format.h"
#include "kvcache/geometry.h"
#include "kvcache/pool.h"
#include "kvcache/simd.h"
#include "kvcache/status.h"
#include "kvcache/thread_pool.h"
#include "common.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace kvcache::py {
namespace {

uint32_t CheckLayer(const SequenceCache& c, uint32_t layer) {
  if (layer >= c.n_layers()) {
    Throw(Status::OutOfRange("layer " + std::to_string(layer) + " out of range: the cache has " +
                             std::to_string(c.n_layers()) + " layers"));
  }
  return layer;
}
uint32_t CheckHead(const SequenceCache& c, uint32_t head) {
  if (head >= c.n_kv_heads()) {
    Throw(Status::OutOfRange("kv head " + std::to_string(head) + " out of range: the cache has " +
                             std::to_string(c.n_kv_heads()) + " kv heads"));
  }
  return head;
}

void CheckLayerHead(const SequenceCache& c, uint32_t layer, uint32_t head) {
  CheckLayer(c, layer);
  CheckHead(c, head);
}

// k or v for Append: [n_layers][tokens][n_kv_heads][head_dim] when layer is
// unset, [tokens][n_kv_heads][head_dim] (or one token [n_kv_heads][head_dim])
// for one layer. Returns the token count.
size_t CheckKvShape(const SequenceCache& c, const InF32& a, const char* name, bool one_layer) {
  const size_t want_ndim = one_layer ? 3 : 4;
  const size_t H = c.n_kv_heads(), D = c.head_dim();
  const char* layout = one_layer ? "[tokens, kv_heads, head_dim] (or [kv_heads, head_dim])"
                                 : "[layers, tokens, kv_heads, head_dim]";
  bool ok = false;
  size_t tokens = 0;
  if (a.ndim() == want_ndim) {
    const size_t o = one_layer ? 0 : 1;
    ok = (one_layer || a.shape(0) == c.n_layers()) && a.shape(o + 1) == H && a.shape(o + 2) == D;
    tokens = a.shape(o);
  } else if (one_layer && a.ndim() == 2) {
    ok = a.shape(0) == H && a.shape(1) == D;
    tokens = 1;
  }
  if (!ok || tokens == 0) {
    ThrowInvalid(std::string(name) + " must have shape " + layout + " with layers=" +
                 std::to_string(c.n_layers()) + ", kv_heads=" + std::to_string(H) +
                 ", head_dim=" + std::to_string(D) + " and tokens >= 1; got " + ShapeString(a));
  }
  return tokens;
}

std::vector<uint8_t> AliveMask(const SequenceCache& c, std::optional<InU8> alive, bool one_layer) {
  if (!alive) return {};
  const InU8& a = *alive;
  const size_t H = c.n_kv_heads();
  const bool per_head = a.ndim() == 1 && a.shape(0) == H;
  const bool per_layer = !one_layer && a.ndim() == 2 && a.shape(0) == c.n_layers() && a.shape(1) == H;
  if (!per_head && !per_layer) {
    ThrowInvalid("alive must have shape [kv_heads]" +
                 std::string(one_layer ? "" : " or [layers, kv_heads]") + " (kv_heads=" +
                 std::to_string(H) + "); got " + ShapeString(a));
  }
  return std::vector<uint8_t>(a.data(), a.data() + a.size());
}

// ---- attention ------------------------------------------------------------------

struct AttnArgs {
  float scale = 0.0f;
  uint32_t window = 0;
  uint32_t n_sink = 0;
  ThreadPool* pool = nullptr;
};

AttentionOptions MakeOptions(uint32_t n_q_heads, const AttnArgs& a) {
  AttentionOptions o;
  o.n_q_heads = n_q_heads;
  o.scale = a.scale;
  o.window = a.window;
  o.n_sink = a.n_sink;
  o.pool = a.pool;
  return o;
}

// out, and optionally lse / probs, for n_queries tokens. Returns out alone
// or a tuple (out, lse[, probs]) / (out, probs).
nb::object Attend(PyCache& pc, uint32_t layer, const InF32& q, bool multi, bool return_lse,
                  bool return_probs, const AttnArgs& args) {
  const SequenceCache& c = pc.obj;
  CheckLayer(c, layer);
  const size_t D = c.head_dim();
  const size_t want_ndim = multi ? 3 : 2;
  if (q.ndim() != want_ndim || q.shape(want_ndim - 1) != D || q.shape(want_ndim - 2) == 0 ||
      (multi && q.shape(0) == 0)) {
    ThrowInvalid(std::string("q must have shape ") +
                 (multi ? "[n_queries, n_q_heads, head_dim]" : "[n_q_heads, head_dim]") +
                 " with head_dim=" + std::to_string(D) + "; got " + ShapeString(q));
  }
  const uint32_t n_queries = multi ? static_cast<uint32_t>(q.shape(0)) : 1;
  const uint32_t n_q_heads = static_cast<uint32_t>(q.shape(want_ndim - 2));
  LayerKvView view = Unwrap(c.View(layer));
  std::vector<float> out(size_t{n_queries} * n_q_heads * D);
  std::vector<float> lse(return_lse ? size_t{n_queries} * n_q_heads : 0);
  std::vector<float> probs(return_probs ? size_t{n_queries} * n_q_heads * view.num_tokens : 0);
  AttentionOutput output{out, lse, probs, {}};
  const AttentionOptions options = MakeOptions(n_q_heads, args);
  Status status;
  {
    ReadGuard guard(std::vector<PyCache*>{&pc});
    nb::gil_scoped_release release;
    status = multi ? AttendMulti(view, n_queries, Span(q), options, output)
                   : AttendDecode(view, Span(q), options, output);
  }
  Check(status);
  std::vector<size_t> head_shape = multi ? std::vector<size_t>{n_queries, n_q_heads}
                                         : std::vector<size_t>{n_q_heads};
  auto with = [&](size_t extra) {
    std::vector<size_t> s = head_shape;
    s.push_back(extra);
    return s;
  };
  nb::object out_arr = nb::cast(ToArray(std::move(out), with(D)));
  if (!return_lse && !return_probs) return out_arr;
  std::vector<nb::object> items{out_arr};
  if (return_lse) items.push_back(nb::cast(ToArray(std::move(lse), head_shape)));
  if (return_probs) items.push_back(nb::cast(ToArray(std::move(probs), with(view.num_tokens))));
  if (items.size() == 2) return nb::make_tuple(items[0], items[1]);
  return nb::make_tuple(items[0], items[1], items[2]);
}

}  // namespace

void BindServing(nb::module_& m);

}  // namespace kvcache::py

using namespace kvcache;
using namespace kvcache::py;

NB_MODULE(_kvcache, m) {
  m.doc() =
      "kvcache: the key/value cache of LLM inference (bindings of the C++ library).\n\n"
      "Arrays in are float32 (converted if needed), shapes as documented per call;\n"
      "arrays out are new numpy arrays (copies) unless stated otherwise.";

  // --- exceptions ------------------------------------------------------------
  struct ErrorSpec {
    StatusCode code;
    const char* name;
    PyObject* extra_base;
    const char* doc;
  };
  PyObject* base = PyErr_NewExceptionWithDoc(
      "kvcache.Error", "Base class of every error kvcache raises (a non-OK Status).", nullptr,
      nullptr);
  m.attr("Error") = nb::handle(base);
  const ErrorSpec specs[] = {
      {StatusCode::kInvalidArgument, "InvalidArgument", PyExc_ValueError,
       "A value passed is malformed or out of range (also a ValueError)."},
      {StatusCode::kOutOfRange, "OutOfRange", PyExc_IndexError,
       "An index or length past what exists (also an IndexError)."},
      {StatusCode::kPoolExhausted, "PoolExhausted", nullptr,
       "The block pool cannot satisfy an allocation or reservation; nothing changed."},
      {StatusCode::kCapacityExceeded, "CapacityExceeded", nullptr,
       "A pre-sized cache or a reservation is full."},
      {StatusCode::kFailedPrecondition, "FailedPrecondition", nullptr,
       "The object is in the wrong state (released cache, open draft, busy cache)."},
      {StatusCode::kNotFound, "NotFound", PyExc_LookupError, "Something looked up is absent."},
      {StatusCode::kUnimplemented, "Unimplemented", PyExc_NotImplementedError,
       "Not supported."},
      {StatusCode::kIoError, "IoError", PyExc_OSError, "A file could not be opened or read."},
      {StatusCode::kCorruption, "Corruption", nullptr,
       "A file's contents are malformed or truncated."},
      {StatusCode::kInternal, "Internal", nullptr, "A broken internal invariant (a bug)."},
  };
  for (const ErrorSpec& s : specs) {
    PyObject* bases = s.extra_base ? PyTuple_Pack(2, base, s.extra_base) : PyTuple_Pack(1, base);
    const std::string qual = std::string("kvcache.") + s.name;
    PyObject* type = PyErr_NewExceptionWithDoc(qual.c_str(), s.doc, bases, nullptr);
    Py_DECREF(bases);
    g_error_types[static_cast<int>(s.code)] = type;
    m.attr(s.name) = nb::handle(type);
  }

  // --- SIMD, formats --------------------------------------------------------------
  m.def("simd_target", &SimdTarget, "Highway target the kernels dispatch to on this CPU.");
  m.def("supported_simd_targets", &SupportedSimdTargets,
        "Every compiled target this CPU supports, best first.");
  m.def(
      "format_names", [] {
        std::vector<std::string> names;
        for (Format f : kAllFormats) names.emplace_back(FormatName(f));
        return names;
      },
      "Names of the storage formats, e.g. 'bf16', 'turbo4', 'q8_0'.");
  m.def(
      "parse_formats",
      [](const std::string& text) { return FormatPairName(ParsePair(text)); }, "text"_a,
      "Canonical 'k:v' name of a format pair ('bf16' -> 'bf16:bf16'); InvalidArgument if unknown.");
  m.def(
      "bits_per_value",
      [](const std::string& format, uint32_t head_dim) {
        const Format f = Unwrap(ParseFormat(format));
        Check(CheckHeadDim(f, head_dim));
        return BitsPerValue(f, head_dim);
      },
      "format"_a, "head_dim"_a, "Storage bits per value of one side, scales included.");
  m.def(
      "row_bytes",
      [](const std::string& format, uint32_t head_dim) {
        const Format f = Unwrap(ParseFormat(format));
        Check(CheckHeadDim(f, head_dim));
        return RowBytes(f, head_dim);
      },
      "format"_a, "head_dim"_a, "Bytes of one stored row of head_dim values.");

  // --- Geometry --------------------------------------------------------------------
  nb::class_<Geometry>(m, "Geometry",
                       "Model geometry as the cache sees it: layers, kv heads, head_dim, block "
                       "size (token positions per pool block).")
      .def(
          "__init__",
          [](Geometry* self, uint32_t n_layers, uint32_t n_kv_heads, uint32_t head_dim,
             uint32_t block_size) {
            new (self) Geometry(Unwrap(Geometry::Create({n_layers, n_kv_heads, head_dim, block_size})));
          },
          "n_layers"_a, "n_kv_heads"_a, "head_dim"_a, "block_size"_a = 16)
      .def_prop_ro("n_layers", &Geometry::n_layers)
      .def_prop_ro("n_kv_heads", &Geometry::n_kv_heads)
      .def_prop_ro("head_dim", &Geometry::head_dim)
      .def_prop_ro("block_size", &Geometry::block_size)
      .def_prop_ro("kv_dim", &Geometry::kv_dim)
      .def("__eq__", [](const Geometry& a, const Geometry& b) { return a == b; })
      .def("__repr__", [](const Geometry& g) { return "Geometry(" + g.ToString() + ")"; });

  // --- ThreadPool ----------------------------------------------------------------------
  nb::class_<ThreadPool>(m, "ThreadPool",
                         "Workers for attention calls (num_threads counts the caller).")
      .def(nb::init<uint32_t>(), "num_threads"_a)
      .def_prop_ro("num_threads", &ThreadPool::num_threads);

  // --- BlockPool ------------------------------------------------------------------------
  nb::class_<PoolStats>(m, "PoolStats", "A consistent snapshot of a pool's counters.")
      .def_ro("num_blocks", &PoolStats::num_blocks)
      .def_ro("free_blocks", &PoolStats::free_blocks)
      .def_ro("cached_blocks", &PoolStats::cached_blocks)
      .def_ro("used_blocks", &PoolStats::used_blocks)
      .def_ro("reserved_blocks", &PoolStats::reserved_blocks)
      .def_ro("available_blocks", &PoolStats::available_blocks)
      .def_ro("evictions", &PoolStats::evictions)
      .def("__repr__", [](const PoolStats& s) {
        return "PoolStats(num_blocks=" + std::to_string(s.num_blocks) +
               ", free=" + std::to_string(s.free_blocks) +
               ", cached=" + std::to_string(s.cached_blocks) +
               ", used=" + std::to_string(s.used_blocks) +
               ", reserved=" + std::to_string(s.reserved_blocks) +
               ", available=" + std::to_string(s.available_blocks) + ")";
      });

  nb::class_<BlockPool>(m, "BlockPool",
                        "The fixed set of K/V blocks paged sequences draw from (thread-safe).")
      .def(nb::new_([](const Geometry& geometry, const std::string& formats,
                       std::optional<uint64_t> num_blocks, std::optional<uint64_t> bytes,
                       uint64_t rotation_seed, bool huge_pages) {
             const FormatPair pair = ParsePair(formats);
             if (num_blocks.has_value() == bytes.has_value()) {
               ThrowInvalid("BlockPool: give exactly one of num_blocks= or bytes=");
             }
             uint64_t n = num_blocks ? *num_blocks
                                     : BlockPool::BlocksForBytes(geometry, pair, *bytes);
             if (n == 0 || n > std::numeric_limits<uint32_t>::max()) {
               ThrowInvalid("BlockPool: " + std::to_string(n) + " blocks is out of range" +
                            (bytes ? " (bytes=" + std::to_string(*bytes) + " holds no block)"
                                   : std::string()));
             }
             BlockPoolOptions options;
             options.num_blocks = static_cast<uint32_t>(n);
             options.rotation_seed = rotation_seed;
             options.huge_pages = huge_pages;
             return Unwrap(BlockPool::Create(geometry, pair, options));
           }),
           "geometry"_a, "formats"_a = "f32", nb::kw_only(), "num_blocks"_a = nb::none(),
           "bytes"_a = nb::none(), "rotation_seed"_a = RowCodec::kDefaultRotationSeed,
           "huge_pages"_a = true,
           "A pool of num_blocks blocks, or as many as fit in bytes, for K:V formats "
           "('bf16:turbo4').")
      .def_static(
          "block_bytes_for",
          [](const Geometry& g, const std::string& formats) {
            return BlockPool::BlockBytes(g, ParsePair(formats));
          },
          "geometry"_a, "formats"_a, "Bytes one block occupies (all layers, K and V).")
      .def_prop_ro("geometry", &BlockPool::geometry)
      .def_prop_ro("formats", [](const BlockPool& p) { return FormatPairName(p.formats()); })
      .def_prop_ro("num_blocks", &BlockPool::num_blocks)
      .def_prop_ro("block_size", &BlockPool::block_size)
      .def_prop_ro("block_bytes", &BlockPool::block_bytes)
      .def_prop_ro("storage_bytes", &BlockPool::storage_bytes)
      .def("stats", &BlockPool::stats)
      .def_prop_ro("free_blocks", &BlockPool::num_free_blocks)
      .def_prop_ro("cached_blocks", &BlockPool::num_cached_blocks)
      .def_prop_ro("used_blocks", &BlockPool::num_used_blocks)
      .def_prop_ro("reserved_blocks", &BlockPool::num_reserved_blocks)
      .def_prop_ro("available_blocks", &BlockPool::num_available_blocks)
      .def("refcount", &BlockPool::refcount, "block"_a)
      .def(
          "arena",
          [](std::shared_ptr<BlockPool> pool, uint32_t layer, const std::string& side) {
            if (layer >= pool->geometry().n_layers()) {
              Throw(Status::OutOfRange("layer " + std::to_string(layer) + " out of range"));
            }
            if (side != "k" && side != "v") ThrowInvalid("side must be 'k' or 'v', got '" + side + "'");
            const Side s = side == "k" ? Side::kKey : Side::kValue;
            const uint8_t* data = pool->arena(layer, s);
            size_t shape[4] = {pool->num_blocks(), pool->geometry().n_kv_heads(),
                               pool->block_size(), pool->row_bytes(s)};
            auto* keep = new std::shared_ptr<BlockPool>(std::move(pool));
            nb::capsule owner(keep, [](void* p) noexcept {
              delete static_cast<std::shared_ptr<BlockPool>*>(p);
            });
            return nb::ndarray<nb::numpy, const uint8_t>(data, 4, shape, owner);
          },
          "layer"_a, "side"_a,
          "Zero-copy, read-only view of one layer's K or V storage as uint8 "
          "[num_blocks, n_kv_heads, block_size, row_bytes]; it keeps the pool alive.")
      .def("check_invariants", [](const BlockPool& p) { Check(p.CheckInvariants()); })
      .def("__repr__", [](const BlockPool& p) {
        return "BlockPool(" + p.geometry().ToString() + ", formats='" +
               FormatPairName(p.formats()) + "', num_blocks=" + std::to_string(p.num_blocks()) + ")";
      });

  // --- SequenceCache ----------------------------------------------------------------------
  auto cache_class = nb::class_<PyCache>(m, "SequenceCache",
                                         "The K/V cache of one sequence, all layers, contiguous or paged.\n\n"
                                         "Mutated by one thread at a time; a context manager that releases.")
      .def_static(
          "contiguous",
          [](const Geometry& geometry, const std::string& formats, uint32_t capacity_tokens,
             bool fixed_capacity, uint64_t rotation_seed, uint32_t sinks, uint32_t recent,
             uint32_t slack) {
            ContiguousOptions o;
            o.capacity_tokens = capacity_tokens;
            o.policy = fixed_capacity ? CapacityPolicy::kFixed : CapacityPolicy::kGrow;
            o.rotation_seed = rotation_seed;
            o.window = {.sinks = sinks, .recent = recent, .slack = slack};
            return std::make_unique<PyCache>(
                Unwrap(SequenceCache::CreateContiguous(geometry, ParsePair(formats), o)));
          },
          "geometry"_a, "formats"_a = "f32", nb::kw_only(), "capacity_tokens"_a = 0,
          "fixed_capacity"_a = false, "rotation_seed"_a = RowCodec::kDefaultRotationSeed,
          "sinks"_a = 0, "recent"_a = 0, "slack"_a = 0,
          "A contiguous cache (per head private buffers). sinks / recent > 0: a precision "
          "window (the first sinks and last recent positions also kept as bf16 rows, which "
          "attention reads instead; slack more rows so that truncating up to slack positions "
          "leaves it exact).")
      .def_static(
          "paged",
          [](std::shared_ptr<BlockPool> pool, uint32_t reserve_tokens, uint32_t sinks,
             uint32_t recent, uint32_t slack) {
            if (!pool) ThrowInvalid("paged: pool is None");
            PagedOptions o;
            o.reserve_tokens = reserve_tokens;
            o.window = {.sinks = sinks, .recent = recent, .slack = slack};
            return std::make_unique<PyCache>(Unwrap(SequenceCache::CreatePaged(std::move(pool), o)));
          },
          "pool"_a, nb::kw_only(), "reserve_tokens"_a = 0, "sinks"_a = 0, "recent"_a = 0,
          "slack"_a = 0,
          "A paged cache on pool; reserve_tokens > 0 reserves up front (PoolExhausted if not); "
          "sinks / recent: a precision window, as for contiguous().")
      // shape
      .def_prop_ro("geometry", [](const PyCache& c) { return c.obj.geometry(); })
      .def_prop_ro("formats", [](const PyCache& c) { return FormatPairName(c.obj.formats()); })
      .def_prop_ro("layout", [](const PyCache& c) {
        return c.obj.layout() == CacheLayout::kPaged ? "paged" : "contiguous";
      })
      .def_prop_ro("n_layers", [](const PyCache& c) { return c.obj.n_layers(); })
      .def_prop_ro("n_kv_heads", [](const PyCache& c) { return c.obj.n_kv_heads(); })
      .def_prop_ro("head_dim", [](const PyCache& c) { return c.obj.head_dim(); })
      .def_prop_ro("block_size", [](const PyCache& c) { return c.obj.block_size(); })
      .def_prop_ro(
          "precision_window",
          [](const PyCache& c) {
            const PrecisionWindow& w = c.obj.precision_window();
            return nb::make_tuple(w.sinks, w.recent, w.slack);
          },
          "(sinks, recent, slack) of the precision window; (0, 0, 0) for none.")
      .def_prop_ro("pool", [](const PyCache& c) { return c.obj.pool(); })
      // lengths and memory
      .def_prop_ro("num_tokens", [](const PyCache& c) { return c.obj.num_tokens(); })
      .def(
          "layer_tokens", [](const PyCache& c, uint32_t layer) { return c.obj.num_tokens(layer); },
          "layer"_a, "Positions appended to one layer.")
      .def(
          "head_len",
          [](const PyCache& c, uint32_t layer, uint32_t head) {
            CheckHead(c.obj, head);
            return c.obj.head_len(CheckLayer(c.obj, layer), head);
          },
          "layer"_a, "head"_a, "Rows stored for one kv head of one layer.")
      .def_prop_ro("capacity_tokens", [](const PyCache& c) { return c.obj.capacity_tokens(); })
      .def_prop_ro("allocated_bytes", [](const PyCache& c) { return c.obj.allocated_bytes(); })
      .def_prop_ro("used_bytes", [](const PyCache& c) { return c.obj.used_bytes(); })
      .def_prop_ro("is_within_planned_capacity",
                   [](const PyCache& c) { return c.obj.is_within_planned_capacity(); })
      .def_prop_ro("released", [](const PyCache& c) { return c.obj.released(); })
      .def("__len__", [](const PyCache& c) { return c.obj.num_tokens(); })
      // appends
      .def(
          "append",
          [](PyCache& pc, const InF32& k, const InF32& v, std::optional<uint32_t> layer,
             std::optional<InU8> alive) {
            SequenceCache& c = pc.Mut();
            const bool one = layer.has_value();
            if (one) CheckLayer(c, *layer);
            const size_t tk = CheckKvShape(c, k, "k", one);
            const size_t tv = CheckKvShape(c, v, "v", one);
            if (tk != tv) {
              ThrowInvalid("k and v must have the same shape; got " + ShapeString(k) + " and " +
                           ShapeString(v));
            }
            const std::vector<uint8_t> mask = AliveMask(c, alive, one);
            AppendOptions o;
            o.alive = mask;
            Check(one ? c.AppendLayer(*layer, Span(k), Span(v), o) : c.Append(Span(k), Span(v), o));
          },
          "k"_a, "v"_a, nb::kw_only(), "layer"_a = nb::none(), "alive"_a = nb::none(),
          "Appends tokens. Without layer: k, v [layers, tokens, kv_heads, head_dim], all layers "
          "or none. With layer: [tokens, kv_heads, head_dim] (or [kv_heads, head_dim]). "
          "alive: uint8 [kv_heads] (or [layers, kv_heads]) mask of heads that store.")
      .def(
          "advance_len", [](PyCache& c, uint32_t n) { Check(c.Mut().AdvanceLen(n)); }, "n"_a,
          "Appends n positions of zero K/V rows to every layer.")
      .def(
          "truncate", [](PyCache& c, uint32_t n) { Check(c.Mut().Truncate(n)); }, "num_tokens"_a,
          "Keeps positions [0, num_tokens); OutOfRange past the end.")
      .def(
          "truncate_last", [](PyCache& c, uint32_t n) { Check(c.Mut().TruncateLast(n)); },
          "n_drop"_a, "Drops the last n_drop positions.")
      .def("clear", [](PyCache& c) { Check(c.Mut().Clear()); },
           "Back to empty; keeps layout, pool and reservation target.")
      .def("release", [](PyCache& c) { c.Mut().Release(); },
           "Gives everything back to the pool; later mutations raise FailedPrecondition. "
           "Idempotent.")
      .def(
          "fork",
          [](PyCache& c) { return std::make_unique<PyCache>(Unwrap(c.Mut().Fork())); },
          "Paged: shares every block (copy-on-write). Contiguous: a clone.")
      .def(
          "clone",
          [](const PyCache& c, bool same_layout) {
            CloneOptions o;
            o.layout = same_layout ? CloneLayout::kSame : CloneLayout::kContiguous;
            return std::make_unique<PyCache>(Unwrap(c.obj.Clone(o)));
          },
          nb::kw_only(), "same_layout"_a = false,
          "Detached deep copy: contiguous by default; same_layout=True keeps a paged clone "
          "paged with its own blocks.")
      .def(
          "reserve", [](PyCache& c, uint32_t n) { Check(c.Mut().Reserve(n)); }, "max_tokens"_a,
          "Paged: promises every block appending up to max_tokens rows could need.")
      .def_prop_ro("reserved_blocks", [](const PyCache& c) { return c.obj.reserved_blocks(); })
      .def_prop_ro("is_fully_reserved", [](const PyCache& c) { return c.obj.is_fully_reserved(); })
      // exports
      .def_prop_ro(
          "block_table",
          [](const PyCache& c) {
            auto t = c.obj.block_table();
            return ToArray1D(std::vector<uint32_t>(t.begin(), t.end()));
          },
          nb::rv_policy::move,
          "uint32 [num_blocks] logical -> physical block ids (a copy; empty if contiguous).")
      .def_prop_ro(
          "context_lens",
          [](const PyCache& c) {
            auto t = c.obj.context_lens();
            return ToArray1D(std::vector<uint32_t>(t.begin(), t.end()));
          },
          nb::rv_policy::move, "uint32 [1]: the sequence length (a copy; empty if contiguous).")
      .def(
          "head_keys",
          [](const PyCache& c, uint32_t layer, uint32_t head) {
            CheckLayerHead(c.obj, layer, head);
            return HeadRowsArray(Unwrap(c.obj.HeadKeys(layer, head)), c.obj.head_dim());
          },
          "layer"_a, "head"_a, "Decoded keys of one head: float32 [head_len, head_dim] (a copy).")
      .def(
          "head_values",
          [](const PyCache& c, uint32_t layer, uint32_t head) {
            CheckLayerHead(c.obj, layer, head);
            return HeadRowsArray(Unwrap(c.obj.HeadValues(layer, head)), c.obj.head_dim());
          },
          "layer"_a, "head"_a, "Decoded values of one head: float32 [head_len, head_dim] (a copy).")
      .def(
          "head_positions",
          [](const PyCache& c, uint32_t layer, uint32_t head) {
            CheckLayerHead(c.obj, layer, head);
            return ToArray1D(c.obj.HeadPositions(layer, head));
          },
          "layer"_a, "head"_a, "uint32 [head_len]: position of each stored row.")
      .def(
          "accumulate_importance",
          [](PyCache& pc, uint32_t layer, uint32_t head, const InF32& probs) {
            SequenceCache& c = pc.Mut();
            CheckLayerHead(c, layer, head);
            if (probs.ndim() != 1) ThrowInvalid("probs must be 1-D [head_len]; got " + ShapeString(probs));
            Check(c.AccumulateImportance(layer, head, Span(probs)));
          },
          "layer"_a, "head"_a, "probs"_a,
          "Adds probs [head_len] to the head's per-row importance.")
      .def(
          "head_importance",
          [](const PyCache& c, uint32_t layer, uint32_t head) {
            CheckLayerHead(c.obj, layer, head);
            return ToArray1D(c.obj.HeadImportance(layer, head));
          },
          "layer"_a, "head"_a, "float32 [head_len] accumulated importance per stored row.")
      .def(
          "importance",
          [](const PyCache& c, uint32_t layer) {
            CheckLayer(c.obj, layer);
            return ToArray1D(c.obj.Importance(layer));
          },
          "layer"_a, "float32 [num_tokens] accumulated importance per position, over heads.")
      .def(
          "keep_rows",
          [](PyCache& pc, uint32_t layer, uint32_t head, const InU32& rows) {
            SequenceCache& c = pc.Mut();
            CheckLayerHead(c, layer, head);
            if (rows.ndim() != 1) ThrowInvalid("rows must be 1-D; got " + ShapeString(rows));
            Check(c.KeepRows(layer, head, Span(rows)));
          },
          "layer"_a, "head"_a, "rows"_a,
          "Eviction: keeps only stored rows `rows` (strictly ascending) of one head.")
;
  DefInvariantsAndWith(cache_class)
      .def("__repr__", [](const PyCache& c) {
        return std::string("SequenceCache(") +
               (c.obj.layout() == CacheLayout::kPaged ? "paged" : "contiguous") + ", " +
               c.obj.geometry().ToString() + ", formats='" + FormatPairName(c.obj.formats()) +
               "', num_tokens=" + std::to_string(c.obj.num_tokens()) +
               (c.obj.released() ? ", released" : "") + ")";
      });

  // --- attention ------------------------------------------------------------------------------
  // attend_decode and attend_multi: one signature, the query block's shape
  // the difference.
  const struct {
    const char* name;
    bool multi;
    const char* doc;
  } attend_defs[] = {
      {"attend_decode", false,
       "Decode attention of one query token (the last position) over one layer.\n\n"
       "q: float32 [n_q_heads, head_dim] (n_q_heads a multiple of the kv heads, GQA).\n"
       "Returns out [n_q_heads, head_dim], or a tuple adding lse [n_q_heads] and/or probs\n"
       "[n_q_heads, num_tokens] (probability per stored row). scale 0 = 1/sqrt(head_dim);\n"
       "window/n_sink: sliding window with attention sinks. Releases the GIL."},
      {"attend_multi", true,
       "Attention of the last n_queries tokens, causal inside the block (speculative verify,\n"
       "chunked prefill). q: float32 [n_queries, n_q_heads, head_dim]; out likewise; lse\n"
       "[n_queries, n_q_heads]; probs [n_queries, n_q_heads, num_tokens]. Releases the GIL."},
  };
  for (const auto& def : attend_defs) {
    m.def(
        def.name,
        [multi = def.multi](PyCache& cache, uint32_t layer, const InF32& q, float scale, uint32_t window,
                            uint32_t n_sink, bool return_lse, bool return_probs, ThreadPool* pool) {
          return Attend(cache, layer, q, multi, return_lse, return_probs, {scale, window, n_sink, pool});
        },
        "cache"_a, "layer"_a, "q"_a, nb::kw_only(), "scale"_a = 0.0f, "window"_a = 0, "n_sink"_a = 0,
        "return_lse"_a = false, "return_probs"_a = false, "pool"_a.none() = nb::none(), def.doc);
  }
  m.def(
      "attend_decode_batch",
      [](std::vector<PyCache*> caches, uint32_t layer, const InF32& q, float scale,
         uint32_t window, uint32_t n_sink, bool return_lse, ThreadPool* pool) {
        if (caches.empty()) ThrowInvalid("attend_decode_batch: no caches");
        std::vector<LayerKvView> views;
        for (PyCache* c : caches) {
          if (c == nullptr) ThrowInvalid("attend_decode_batch: a cache is None");
          CheckLayer(c->obj, layer);
          views.push_back(Unwrap(c->obj.View(layer)));
        }
        const size_t D = caches[0]->obj.head_dim();
        if (q.ndim() != 3 || q.shape(0) != caches.size() || q.shape(1) == 0 || q.shape(2) != D) {
          ThrowInvalid("q must have shape [n_seqs, n_q_heads, head_dim] with n_seqs=" +
                       std::to_string(caches.size()) + ", head_dim=" + std::to_string(D) +
                       "; got " + ShapeString(q));
        }
        const uint32_t n_q_heads = static_cast<uint32_t>(q.shape(1));
        std::vector<float> out(q.size());
        std::vector<float> lse(return_lse ? caches.size() * n_q_heads : 0);
        const AttentionOptions options = MakeOptions(n_q_heads, {scale, window, n_sink, pool});
        Status status;
        {
          ReadGuard guard(caches);
          nb::gil_scoped_release release;
          status = AttendDecodeBatch(views, Span(q), options, out, lse);
        }
        Check(status);
        nb::object o = nb::cast(ToArray(std::move(out), {caches.size(), n_q_heads, D}));
        if (!return_lse) return o;
        return nb::object(
            nb::make_tuple(o, nb::cast(ToArray(std::move(lse), {caches.size(), n_q_heads}))));
      },
      "caches"_a, "layer"_a, "q"_a, nb::kw_only(), "scale"_a = 0.0f, "window"_a = 0,
      "n_sink"_a = 0, "return_lse"_a = false, "pool"_a.none() = nb::none(),
      "Decode for many sequences of one layer at once. q: float32 [n_seqs, n_q_heads,\n"
      "head_dim]; returns out [n_seqs, n_q_heads, head_dim] (and lse [n_seqs, n_q_heads]).\n"
      "Releases the GIL.");

  m.def(
      "attend_decode_head",
      [](PyCache& pc, uint32_t layer, uint32_t kv_head, const InF32& q, float scale,
         bool return_lse, ThreadPool* pool) {
        const SequenceCache& c = pc.obj;
        CheckLayer(c, layer);
        const size_t D = c.head_dim();
        if (q.ndim() != 2 || q.shape(0) == 0 || q.shape(1) != D) {
          ThrowInvalid("q must have shape [group, head_dim] with head_dim=" + std::to_string(D) +
                       "; got " + ShapeString(q));
        }
        const uint32_t group = static_cast<uint32_t>(q.shape(0));
        if (group > UINT32_MAX / c.n_kv_heads()) ThrowInvalid("q has too many heads");
        LayerKvView view = Unwrap(c.View(layer));
        const size_t rows = kv_head < view.n_kv_heads ? view.rows(kv_head) : 0;
        std::vector<float> out(size_t{group} * D), lse(return_lse ? group : 0);
        std::vector<float> probs(size_t{group} * rows);
        const AttentionOptions options =
            MakeOptions(group * c.n_kv_heads(), {scale, 0, 0, pool});
        Status status;
        {
          ReadGuard guard(std::vector<PyCache*>{&pc});
          nb::gil_scoped_release release;
          status = AttendDecodeHead(view, kv_head, Span(q), options, {out, lse, probs, {}});
        }
        Check(status);
        nb::object out_arr = nb::cast(ToArray(std::move(out), {group, D}));
        nb::object probs_arr = nb::cast(ToArray(std::move(probs), {group, rows}));
        if (!return_lse) return nb::object(nb::make_tuple(out_arr, probs_arr));
        return nb::object(
            nb::make_tuple(out_arr, nb::cast(ToArray(std::move(lse), {group})), probs_arr));
      },
      "cache"_a, "layer"_a, "kv_head"_a, "q"_a, nb::kw_only(), "scale"_a = 0.0f,
      "return_lse"_a = false, "pool"_a.none() = nb::none(),
      "Decode attention of ONE kv head's query group (an engine that keeps or evicts per\n"
      "head). q: float32 [group, head_dim], the q heads that read kv head `kv_head`\n"
      "(group = n_q_heads / n_kv_heads). Returns (out [group, head_dim], probs [group,\n"
      "head_len]) -- probs over the head's stored rows in head_positions() order, their sum\n"
      "over the group being what accumulate_importance takes -- or (out, lse, probs) with\n"
      "return_lse. IndexError for a kv head out of range, ValueError for a bad q. Releases\n"
      "the GIL.");

  // --- the C++ side of python/bench/overhead.py ---------------------------------------------
  // The same calls as the Python API makes, looped in C++ over the same objects, so the
  // benchmark measures only what the bindings add. Microseconds per call. They keep the
  // GIL (errors raise directly); not part of the public API.
  m.def(
      "_bench_append_cpp",
      [](PyCache& pc, const InF32& k, const InF32& v, uint32_t calls) {
        SequenceCache& c = pc.Mut();
        CheckKvShape(c, k, "k", false);
        CheckKvShape(c, v, "v", false);
        if (calls == 0) ThrowInvalid("calls must be >= 1");
        const auto t0 = std::chrono::steady_clock::now();
        uint32_t n = 0;
        for (uint32_t i = 0; i < calls; ++i) {
          if (++n == 256) {
            Check(c.Clear());
            n = 0;
          }
          Check(c.Append(Span(k), Span(v)));
        }
        return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
                   .count() / calls;
      },
      "cache"_a, "k"_a, "v"_a, "calls"_a);
  m.def(
      "_bench_attend_decode_cpp",
      [](PyCache& pc, uint32_t layer, const InF32& q, uint32_t calls) {
        const SequenceCache& c = pc.obj;
        CheckLayer(c, layer);
        const uint32_t n_q_heads = static_cast<uint32_t>(q.size() / c.head_dim());
        if (calls == 0) ThrowInvalid("calls must be >= 1");
        std::vector<double> t;
        for (uint32_t i = 0; i < calls; ++i) {
          const auto t0 = std::chrono::steady_clock::now();
          // What the binding does per call: view, output buffer, the kernel.
          LayerKvView view = Unwrap(c.View(layer));
          std::vector<float> out(q.size());
          Check(AttendDecode(view, Span(q), MakeOptions(n_q_heads, {}), {out, {}, {}, {}}));
          t.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() -
                                                                t0).count());
        }
        std::nth_element(t.begin(), t.begin() + t.size() / 2, t.end());
        return t[t.size() / 2];
      },
      "cache"_a, "layer"_a, "q"_a, "calls"_a);

  BindServing(m);
}
