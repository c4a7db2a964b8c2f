// Shared pieces of the attention kernels (kernels.cc and kernels_<family>.cc):
// vector types, small-table lookups, the byte helpers the decoders share, the
// reference-order reductions, the row walk (HeadRows, Prefetcher,
// Visibility), the K/V pass argument blocks and the family entry points.
//
// A decoder is the format's Decoder<F> (format/decoders-inl.h, one per
// format, shared with the codec): Prepare(row, d) once per row, Block(row,
// b, out) writes values [16b, 16b + 16) of the row, in kernel order (plan.h)
// with its scales applied, into kVecs vectors of kN lanes; formats that
// allow any head_dim (kTail) also give Value(row, i) for the last partial
// block. Decoders hold only constants: thread-safe.
//
// Per-target header (Highway's -inl.h convention): included by a kernel .cc
// after hwy/foreach_target.h, so once per compiled target, at file scope.

#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "attention/plan.h"
#include "attention/reference.h"
#include "format/decoders-inl.h"
#include "format/format_internal.h"

#if defined(KVCACHE_SRC_ATTENTION_KERNEL_COMMON_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVCACHE_SRC_ATTENTION_KERNEL_COMMON_INL_H_
#undef KVCACHE_SRC_ATTENTION_KERNEL_COMMON_INL_H_
#else
#define KVCACHE_SRC_ATTENTION_KERNEL_COMMON_INL_H_
#endif

HWY_BEFORE_NAMESPACE();
namespace kvcache {
namespace attention_internal {
namespace HWY_NAMESPACE {

namespace hn = hwy::HWY_NAMESPACE;
namespace fi = format_internal;

// The vector types and the decoders' pieces the kernels use.
using fi::HWY_NAMESPACE::BroadcastF16;
using fi::HWY_NAMESPACE::Decoder;
using fi::HWY_NAMESPACE::DF;
using fi::HWY_NAMESPACE::DI;
using fi::HWY_NAMESPACE::DU;
using fi::HWY_NAMESPACE::E4M3Block;
using fi::HWY_NAMESPACE::kE4M3BlockMul;
using fi::HWY_NAMESPACE::kN;
using fi::HWY_NAMESPACE::kVecs;
using fi::HWY_NAMESPACE::MakeDecoder;
using fi::HWY_NAMESPACE::RowRef;
using fi::HWY_NAMESPACE::TailBlock;
using fi::HWY_NAMESPACE::ValueMul;
using fi::HWY_NAMESPACE::VF;
static_assert(fi::HWY_NAMESPACE::kBlockValues == kDotLanes, "a decoder block is one dot block");

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// ---------------------------------------------------------------------------
// The reference reduction of 16 running sums held as kVecs vectors.

template <class D>
HWY_INLINE float ReduceHalving(D d, hn::Vec<D> v) {
#if HWY_TARGET == HWY_SCALAR
  (void)d;
  return hn::GetLane(v);
#else
  if constexpr (hn::MaxLanes(D()) > 4) {
    const hn::Half<D> dh;
    return ReduceHalving(dh, hn::Add(hn::LowerHalf(dh, v), hn::UpperHalf(dh, v)));
  } else {
    (void)d;
    v = hn::Add(v, hn::Shuffle1032(v));
    v = hn::Add(v, hn::Shuffle2301(v));
    return hn::GetLane(v);
  }
#endif
}

HWY_INLINE float Reduce16(VF* acc) {
  for (size_t c = kVecs; c > 1; c /= 2) {
    for (size_t i = 0; i < c / 2; ++i) acc[i] = hn::Add(acc[i], acc[i + c / 2]);
  }
  return ReduceHalving(DF(), acc[0]);
}

#if HWY_TARGET != HWY_SCALAR
// Sums the 128-bit blocks of v and stores the 4 resulting lanes.
template <class D>
HWY_INLINE void StoreBlockSum(D d, hn::Vec<D> v, float* out4) {
  if constexpr (hn::MaxLanes(D()) > 4) {
    const hn::Half<D> dh;
    StoreBlockSum(dh, hn::Add(hn::LowerHalf(dh, v), hn::UpperHalf(dh, v)), out4);
  } else {
    hn::StoreU(v, d, out4);
  }
}
#endif

// Four dot products at once (any order: lossy paths only): out4[j] = sum of
// the lanes of acc_j (vectors of float descriptor D).
template <class D>
HWY_INLINE void Reduce4(D df, hn::Vec<D> a, hn::Vec<D> b, hn::Vec<D> c, hn::Vec<D> d,
                        float* out4) {
#if HWY_TARGET == HWY_SCALAR
  (void)df;
  out4[0] = hn::GetLane(a);
  out4[1] = hn::GetLane(b);
  out4[2] = hn::GetLane(c);
  out4[3] = hn::GetLane(d);
#else
  using V = hn::Vec<D>;
  const hn::Repartition<double, D> dd;
  const V ab = hn::Add(hn::InterleaveLower(df, a, b), hn::InterleaveUpper(df, a, b));
  const V cd = hn::Add(hn::InterleaveLower(df, c, d), hn::InterleaveUpper(df, c, d));
  const auto ab64 = hn::BitCast(dd, ab), cd64 = hn::BitCast(dd, cd);
  const V s = hn::Add(hn::BitCast(df, hn::InterleaveLower(dd, ab64, cd64)),
                      hn::BitCast(df, hn::InterleaveUpper(dd, ab64, cd64)));
  StoreBlockSum(df, s, out4);
#endif
}
HWY_INLINE void Reduce4(VF a, VF b, VF c, VF d, float* out4) { Reduce4(DF(), a, b, c, d, out4); }

template <bool kExact>
HWY_INLINE VF MulAcc(VF a, VF b, VF acc) {
  if constexpr (kExact) {
    return hn::Add(acc, hn::Mul(a, b));
  } else {
    return hn::MulAdd(a, b, acc);
  }
}


// ---------------------------------------------------------------------------
// Walking the stored rows of one head on one side.

// Software prefetch distance in bytes of one head's row stream: paged
// blocks are scattered, so the hardware prefetcher loses the stream at every
// block boundary.
constexpr uint32_t kPrefetchBytes = 6144;
// The stored rows of one head on one side, handed out as runs of consecutive
// rows inside one block (the whole range for per-head contiguous storage),
// so the block table is read once per block, not once per row.
struct HeadRows {
  const uint8_t* head_base;
  const uint32_t* table;
  size_t block_stride;
  uint32_t block_size, row_bytes;
  const uint8_t* contiguous;  // per-head contiguous storage (side.head_base)
  HeadRows() = default;
  HeadRows(const LayerKvView& v, const KvSideView& s, uint32_t head)
      : head_base(s.base + static_cast<size_t>(head) * s.head_stride),
        table(v.block_table),
        block_stride(s.block_stride),
        block_size(v.block_size),
        row_bytes(s.row_bytes),
        contiguous(s.head_base ? s.head_base[head] : nullptr) {}
  // Row r (< r_end) and the number of rows of its run: *n in [1, r_end - r].
  HWY_INLINE const uint8_t* Run(uint32_t r, uint32_t r_end, uint32_t* n) const {
    if (contiguous != nullptr) {
      *n = r_end - r;
      return contiguous + static_cast<size_t>(r) * row_bytes;
    }
    const uint32_t b = r / block_size, off = r - b * block_size;
    *n = std::min(block_size - off, r_end - r);
    return head_base + static_cast<size_t>(table[b]) * block_stride +
           static_cast<size_t>(off) * row_bytes;
  }
};

// Prefetches a row stream kPrefetchBytes ahead of its consumer: Step() once
// per consumed row issues one prefetch per new cache line. The stream is
// rows [r0, ends[g]) of n heads taken chunk by chunk: rows [c, c + chunk) of
// head 0, then of head 1, ..., then the next chunk; with one head and
// chunk = kWholeRun, that head's rows in order.
constexpr uint32_t kWholeRun = 0xFFFFFFFFu;
struct Prefetcher {
  const HeadRows* heads;
  const uint32_t* ends;
  uint32_t n, chunk, row_bytes, max_end = 0;  // row_bytes: the same for every head of a view
  uint64_t c0;        // first row of the current chunk
  uint32_t g = 0;     // current head
  uint32_t r, seg_end, left = 0;
  bool done = false;
  const uint8_t* p = nullptr;  // next row to prefetch
  uintptr_t next_line = 0;     // first line not yet prefetched in this run
  Prefetcher(const HeadRows* h, const uint32_t* e, uint32_t n_heads, uint32_t r0, uint32_t chunk_rows)
      : heads(h), ends(e), n(n_heads), chunk(chunk_rows), row_bytes(h[0].row_bytes), c0(r0), r(r0) {
    for (uint32_t i = 0; i < n; ++i) max_end = std::max(max_end, ends[i]);
    seg_end = static_cast<uint32_t>(std::min<uint64_t>(c0 + chunk, ends[0]));
    const uint32_t ahead = std::max<uint32_t>(1, kPrefetchBytes / row_bytes);
    for (uint32_t i = 0; i < ahead && !done; ++i) Step();
  }
  HWY_INLINE void Step() {
    if (left == 0) {
      if (done) return;
      while (r >= seg_end) {  // the next head's part of this chunk, or the next chunk
        if (++g == n) {
          g = 0;
          c0 += chunk;
        }
        if (c0 >= max_end) {
          done = true;
          return;
        }
        r = static_cast<uint32_t>(c0);
        seg_end = static_cast<uint32_t>(std::min<uint64_t>(c0 + chunk, ends[g]));
      }
      p = heads[g].Run(r, seg_end, &left);
      next_line = reinterpret_cast<uintptr_t>(p) & ~uintptr_t{63};
    }
    const uintptr_t end = reinterpret_cast<uintptr_t>(p) + row_bytes;
    for (; next_line < end; next_line += 64) {
      __builtin_prefetch(reinterpret_cast<const void*>(next_line), 0, 3);
    }
    p += row_bytes;
    ++r;
    --left;
  }
};

struct Visibility {
  const uint32_t* positions;  // nullptr: row r is position r
  uint32_t window, n_sink;
  // A precision window's rule for the view's own rows (kv_view.h): not
  // below `first`, and from recent_from on only `recent` or more back.
  uint32_t first, recent, recent_from;
  HWY_INLINE uint32_t Pos(uint32_t r) const { return positions ? positions[r] : r; }
  HWY_INLINE bool Visible(uint32_t p, uint32_t qpos) const {
    if (p > qpos || p < first) return false;
    if (recent != 0 && p >= recent_from && p + recent > qpos) return false;
    return window == 0 || p + window > qpos || p < n_sink;
  }
};

HWY_INLINE Visibility MakeVisibility(const HeadJob& job) {
  const LayerKvView& v = *job.view;
  return {v.positions ? v.positions[job.head] : nullptr, job.window, job.n_sink,
          v.first_position, v.recent, v.recent_from};
}


// True when every row in [r0, r1) is visible to every query of the job
// (no stored positions, no window, rows at or past `first`, queries at or
// after row r1 - 1): the common decode case, which skips all per-row
// visibility checks.
HWY_INLINE bool AllVisible(const Visibility& vis, const QueryVec* qv, int nq, uint32_t r0,
                           uint32_t r1) {
  if (vis.positions != nullptr || vis.window != 0 || r0 < vis.first) return false;
  // Rows the window serves to some query (recent rule) need the per-row check.
  const uint32_t need = vis.recent != 0 && r1 > vis.recent_from ? r1 + vis.recent : r1;
  for (int j = 0; j < nq; ++j) {
    if (uint64_t{qv[j].qpos} + 1 < need) return false;
  }
  return true;
}

// ---------------------------------------------------------------------------
// K pass: rows [r0, r1) for query vectors [qi0, qi0 + kQB).

struct KArgs {
  const Plan* plan;
  const HeadJob* job;
  uint32_t qi0, r0, r1;
  float* scores;  // [nq][job.rows] (the job's whole buffer)
  float* maxes;   // [nq] running maxima (the job's)
  Prefetcher* pf;  // the walk's stream, or nullptr: one of the call's own
};

// ---------------------------------------------------------------------------
// V pass: rows [r0, r1) inside one segment, query vectors [qi0, qi0 + kQB);
// adds into l[nq] and o[nq][padded_dim] (the segment's partial sums).

struct VArgs {
  const Plan* plan;
  const HeadJob* job;
  uint32_t qi0, r0, r1;
  const float* e;  // [nq][job.rows]
  float* l;        // [nq]
  float* o;        // [nq][padded_dim]
  Prefetcher* pf;  // the walk's stream, or nullptr: one of the call's own
};

using KFn = void (*)(const KArgs&);
using VFn = void (*)(const VArgs&);

// ---------------------------------------------------------------------------
// Kernel families: each kernels_<family>.cc instantiates the K and V passes
// for its formats. <Family>K/<Family>V return the pass for format f (one of
// the family's; exact only for kF32, in the Plain family) and qb query
// vectors per block (1 to 4); <Family>Decode is DecodeRow for format f.

KFn PlainK(Format f, bool exact, int qb);  // f32, f16, bf16 (kernels_plain.cc)
VFn PlainV(Format f, bool exact, int qb);
void PlainDecode(Format f, const uint8_t* row, uint32_t d, float* out);
KFn Fp8Q8K(Format f, bool exact, int qb);  // fp8_e4m3, q8 (kernels_fp8_q8.cc)
VFn Fp8Q8V(Format f, bool exact, int qb);
void Fp8Q8Decode(Format f, const uint8_t* row, uint32_t d, float* out);
KFn GgmlK(Format f, bool exact, int qb);  // q8_0, q4_0 (kernels_ggml.cc)
VFn GgmlV(Format f, bool exact, int qb);
void GgmlDecode(Format f, const uint8_t* row, uint32_t d, float* out);
KFn TurboK(Format f, bool exact, int qb);  // turbo8, turbo4, turbo3, turbo2 (kernels_turbo.cc)
VFn TurboV(Format f, bool exact, int qb);
void TurboDecode(Format f, const uint8_t* row, uint32_t d, float* out);

// The values of a stored row as the kernels consume them: out[PaddedDim(d)]
// in kernel order (plan.h), divided by ValueMul(F), the tail zero-padded
// (for tests: the decoders against the codec's scalar decode). noipa: GCC
// 12's interprocedural analysis dropped the calls of three turbo instances
// from the family's switch (the function kept its body, the caller skipped
// it; seen on AVX2 and SSE4), so the caller must not reason about it.
template <Format F>
__attribute__((noipa)) void DecodeRow(const uint8_t* row, uint32_t d, float* out) {
  const Decoder<F> dec = MakeDecoder<F>(d);
  const RowRef r = dec.Prepare(row, d);
  const uint32_t full = d / kDotLanes;
  VF v[kVecs];
  for (uint32_t b = 0; b < full; ++b) {
    dec.Block(r, b, v);
    for (size_t i = 0; i < kVecs; ++i) hn::StoreU(v[i], DF(), out + b * kDotLanes + i * kN);
  }
  if constexpr (Decoder<F>::kTail) {
    if (d % kDotLanes != 0) {
      TailBlock(dec, r, full, d, v);
      for (size_t i = 0; i < kVecs; ++i) hn::StoreU(v[i], DF(), out + full * kDotLanes + i * kN);
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace attention_internal
}  // namespace kvcache
HWY_AFTER_NAMESPACE();

#endif  // KVCACHE_SRC_ATTENTION_KERNEL_COMMON_INL_H_
