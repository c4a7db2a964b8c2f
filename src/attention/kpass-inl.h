// The K pass: scores s[qi][r] = scale * <q_qi, k_r> + bias_qi for the
// visible rows of a job (-inf for the others) and the running max per query
// vector, for kQB query vectors per stored row (a row is decoded once per
// block of queries). The f32 exact instance adds rounded products in the
// reference order (reference.h); the others use FMAs.
//
// This header holds only the pass structure, the same for every format: the
// float dot products over Decoder<F> (RowDots), the row walk and the scores
// (KPassRows), and the pieces the families' integer paths share (query
// rounding to int16, the x86 byte multiply-adds, ReduceDots). A format whose
// table row (format/traits.h) names an integer K path has it in its family's
// format/<family>/kpass-inl.h, as a specialization of IntKeyPass<F>: KPass
// asks it first and takes the float path when it declines.
//
// Per-target header (Highway's -inl.h convention): included by a kernel .cc
// after hwy/foreach_target.h, so once per compiled target, at file scope.

#include <optional>

#include "attention/kernel_common-inl.h"

#if defined(KVCACHE_SRC_ATTENTION_KPASS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVCACHE_SRC_ATTENTION_KPASS_INL_H_
#undef KVCACHE_SRC_ATTENTION_KPASS_INL_H_
#else
#define KVCACHE_SRC_ATTENTION_KPASS_INL_H_
#endif

HWY_BEFORE_NAMESPACE();
namespace kvcache {
namespace attention_internal {
namespace HWY_NAMESPACE {

// acc[j][v] += q_j's block b times kv[v], for the kQB queries. A function
// that is always inlined, not a lambda capturing acc: GCC inlines a lambda
// only after its early scalar replacement, and on the 16-lane target it then
// kept acc in memory, storing the 4 accumulators (512-bit stores, 2 cycles
// each on Zen 4) after every block.
template <bool kExact, int kQB>
HWY_INLINE void AccumulateDots(const float* const* q, uint32_t b, const VF* kv,
                               VF (&acc)[kQB][kVecs]) {
  for (int j = 0; j < kQB; ++j) {
    for (size_t v = 0; v < kVecs; ++v) {
      const VF qq = hn::LoadU(DF(), q[j] + b * kDotLanes + v * kN);
      acc[j][v] = MulAcc<kExact>(qq, kv[v], acc[j][v]);
    }
  }
}

// The kQB dot products of one stored row with queries q[0..kQB).
template <Format F, bool kExact, int kQB>
HWY_INLINE void RowDots(const Decoder<F>& dec, const uint8_t* p, uint32_t d,
                        const float* const* q, float* dots) {
  const uint32_t full_blocks = d / kDotLanes;
  const uint32_t n_blocks = full_blocks + ((d % kDotLanes) != 0 ? 1 : 0);
  const RowRef row = dec.Prepare(p, d);
  VF acc[kQB][kVecs];
  for (int j = 0; j < kQB; ++j) {
    for (size_t v = 0; v < kVecs; ++v) acc[j][v] = hn::Zero(DF());
  }
  // Full blocks, then the zero-padded tail block (no per-block test).
  for (uint32_t b = 0; b < full_blocks; ++b) {
    VF kv[kVecs];
    dec.Block(row, b, kv);
    AccumulateDots<kExact, kQB>(q, b, kv, acc);
  }
  if constexpr (Decoder<F>::kTail) {
    if (n_blocks != full_blocks) {
      VF kv[kVecs];
      TailBlock(dec, row, full_blocks, d, kv);
      AccumulateDots<kExact, kQB>(q, full_blocks, kv, acc);
    }
  }
  if constexpr (!kExact && kQB == 4) {
    for (int j = 0; j < kQB; ++j) {
      for (size_t v = 1; v < kVecs; ++v) acc[j][0] = hn::Add(acc[j][0], acc[j][v]);
    }
    Reduce4(acc[0][0], acc[1][0], acc[2][0], acc[3][0], dots);
  } else {
    for (int j = 0; j < kQB; ++j) dots[j] = Reduce16(acc[j]);
  }
}


// ---------------------------------------------------------------------------
// What the families' integer K paths share. A path rounds each query vector
// once per K pass (to int16: q ~= qscale * q16, |q16| <= 32767; or to int8)
// and computes a row's dot products in integer lanes, the scales applied in
// f32 afterwards; the query's rounding moves a score by at most
// scale * qscale / 2 * sum_i |k_i| (documented in docs/attention.md). Used
// when head_dim is a multiple of 32 and at most kIntMaxDim, so that no int32
// lane can overflow (int16 x int8 pairs: a lane adds at most d / 8 pairs, on
// SSE4, of at most 2 * 128 * 32767 each: < 2^30 for d = 1024).

constexpr uint32_t kIntMaxDim = 1024;

// The x86 SIMD targets (SSE4 to AVX3_DL): the byte multiply-add paths use
// their fixed 128/256/512-bit descriptors and instructions. Elsewhere
// (EMU128, which clang compiles where GCC 12 compiles SCALAR; NEON; SVE)
// those formats take the int16 or the float path.
#undef KVCACHE_ATTN_X86_SIMD
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_SSE4
#define KVCACHE_ATTN_X86_SIMD 1
#else
#define KVCACHE_ATTN_X86_SIMD 0
#endif

// Whether this target has int16 lanes for the int16-query paths (not the
// scalar target, whose 1-lane vectors have no int16 pairs).
constexpr bool kInt16Lanes = HWY_TARGET != HWY_SCALAR;

HWY_INLINE bool IntPathFits(uint32_t d) { return d % 32 == 0 && d <= kIntMaxDim; }

// q16[d] and its scale from q[d] (d a multiple of 32).
HWY_INLINE float QuantizeQuery(const float* q, uint32_t d, int16_t* q16) {
#if HWY_TARGET == HWY_SCALAR
  (void)q;
  (void)d;
  (void)q16;
  return 0.0f;  // the integer path is off on this target
#else
  const DF df;
  VF vmax = hn::Zero(df);
  VF vbad = hn::Zero(df);  // x * 0 is NaN exactly for x inf or NaN
  for (uint32_t i = 0; i < d; i += kN) {
    const VF x = hn::LoadU(df, q + i);
    vmax = hn::Max(vmax, hn::Abs(x));
    vbad = hn::Add(vbad, hn::Mul(x, hn::Zero(df)));
  }
  const float amax = std::isnan(hn::GetLane(hn::SumOfLanes(df, vbad)))
                         ? std::numeric_limits<float>::infinity()
                         : hn::GetLane(hn::MaxOfLanes(df, vmax));
  if (!(amax > 0.0f) || !std::isfinite(amax)) {
    // Zero: every dot is 0. inf or NaN (the calls reject a non-finite
    // query, but a finite one can still overflow in the column scales or the
    // rotation): the scale is NaN, so every dot is NaN, as in the float path.
    std::fill(q16, q16 + d, int16_t{0});
    return amax == 0.0f ? 0.0f : std::numeric_limits<float>::quiet_NaN();
  }
  // Round to nearest; |q * inv| <= 32767 up to rounding, and the demotion
  // saturates.
  const VF inv = hn::Set(df, 32767.0f / amax);
  const hn::Rebind<int16_t, DI> d16;
  for (uint32_t i = 0; i < d; i += kN) {
    hn::StoreU(hn::DemoteTo(d16, hn::NearestInt(hn::Mul(hn::LoadU(df, q + i), inv))), d16, q16 + i);
  }
  return amax / 32767.0f;
#endif
}

#if HWY_TARGET != HWY_SCALAR
using DI32 = hn::ScalableTag<int32_t>;
using DI16 = hn::Repartition<int16_t, DI32>;
constexpr size_t kN16 = hn::MaxLanes(DI16());
static_assert(32 % kN16 == 0, "int16 lanes must divide a q8_0 block");

// The int16 x int8 products of values [i, i + kN16) of q16 and codes, added
// into (s0, s1).
HWY_INLINE void MulAddCodes(const int8_t* codes, const int16_t* q16, hn::Vec<DI32>& s0,
                            hn::Vec<DI32>& s1) {
  const DI16 d16;
  const hn::Rebind<int8_t, DI16> d8;
  const auto c = hn::PromoteTo(d16, hn::LoadU(d8, codes));
  s0 = hn::ReorderWidenMulAccumulate(DI32(), c, hn::LoadU(d16, q16), s0, s1);
}
#endif

// The byte multiply-adds of the int8-query paths (x86 SIMD targets).
#if KVCACHE_ATTN_X86_SIMD
#if HWY_TARGET == HWY_SSE4
using D8 = hn::Full128<int8_t>;
#else
using D8 = hn::Full256<int8_t>;
#endif
using D8U = hn::RebindToUnsigned<D8>;
using D8I32 = hn::Repartition<int32_t, D8>;
using D8F = hn::Repartition<float, D8>;
using V8 = hn::Vec<D8>;
using V8I32 = hn::Vec<D8I32>;
constexpr size_t kB8 = hn::MaxLanes(D8());  // codes per vector: 16 or 32
constexpr size_t kVecs8 = 32 / kB8;          // vectors per 32-value block

// acc + (the sums of 4 adjacent products a_u8[i] * b_i8[i]) per int32 lane.
HWY_INLINE V8I32 DotBytes(V8 a_u8, V8 b_i8, V8I32 acc) {
#if HWY_TARGET == HWY_AVX3_DL
  return V8I32{_mm256_dpbusd_epi32(acc.raw, a_u8.raw, b_i8.raw)};
#elif HWY_TARGET == HWY_SSE4
  const __m128i p = _mm_maddubs_epi16(a_u8.raw, b_i8.raw);
  return hn::Add(acc, V8I32{_mm_madd_epi16(p, _mm_set1_epi16(1))});
#else
  const __m256i p = _mm256_maddubs_epi16(a_u8.raw, b_i8.raw);
  return hn::Add(acc, V8I32{_mm256_madd_epi16(p, _mm256_set1_epi16(1))});
#endif
}

// b with its sign flipped where c < 0 and zeroed where c == 0 (vpsignb).
HWY_INLINE V8 SignBytes(V8 b, V8 c) {
#if HWY_TARGET == HWY_SSE4
  return V8{_mm_sign_epi8(b.raw, c.raw)};
#else
  return V8{_mm256_sign_epi8(b.raw, c.raw)};
#endif
}
#endif  // KVCACHE_ATTN_X86_SIMD

// dots[j] = the sum of the lanes of tot[j] for j < kQB (Reduce4's order
// for 4 queries): the end of every integer path's row.
template <int kQB, class D>
HWY_INLINE void ReduceDots(D d, const hn::Vec<D>* tot, float* dots) {
  if constexpr (kQB == 4) {
    Reduce4(d, tot[0], tot[1], tot[2], tot[3], dots);
  } else {
    for (int j = 0; j < kQB; ++j) dots[j] = hn::GetLane(hn::SumOfLanes(d, tot[j]));
  }
}

// ---------------------------------------------------------------------------
// The row walk and the scores, for any row_dots.

// Where a K pass over kQB query vectors puts its scores (s[j][r]), their
// running maxima, and what each score adds (scale, then bias when
// has_bias).
template <int kQB>
struct KScores {
  float* s[kQB];
  float m[kQB];
  float bias[kQB];
  float scale;
  bool has_bias;
};

// Scores of rows [r, run_end) of one run (row r at p), every row visible
// to every query. row_dots(p, dots) gives a row's kQB dot products.
template <int kQB, class RowDotsFn>
HWY_INLINE void ScoreRunVisible(const RowDotsFn& row_dots, const uint8_t* p, uint32_t r,
                                uint32_t run_end, uint32_t row_bytes, Prefetcher& pf,
                                KScores<kQB>& k) {
  // Locals in the row loop (not k's fields): nothing a score store could
  // alias, so the maxima stay in registers.
  float* const* s = k.s;
  const float scale = k.scale;
  const bool has_bias = k.has_bias;
#if HWY_TARGET <= HWY_AVX2
  if constexpr (kQB == 4) {
    // The 4 scores of a row as one 128-bit vector: the same multiply,
    // add and max as the scalar loop below (bit for bit), in 3 vector
    // ops. Kept scalar, GCC held m[] packed in two 64-bit stack words
    // and spent ~10 ops per query per row on it. AVX2 and AVX-512 only:
    // SSE4's 16 registers are already short of its 16 accumulators
    // (turbo2 measured ~5% slower there with the vector form).
    const hn::FixedTag<float, 4> d4;
    const auto scale4 = hn::Set(d4, scale);
    const auto bias4 = hn::LoadU(d4, k.bias);
    auto m4 = hn::LoadU(d4, k.m);
    float* s0 = s[0];
    float* s1 = s[1];
    float* s2 = s[2];
    float* s3 = s[3];
    for (; r < run_end; ++r, p += row_bytes) {
      pf.Step();
      alignas(16) float dots[4];
      row_dots(p, dots);
      auto x4 = hn::Mul(hn::Load(d4, dots), scale4);
      if (has_bias) x4 = hn::Add(x4, bias4);
      m4 = hn::IfThenElse(m4 < x4, x4, m4);  // std::max(m, x), NaN x included
      s0[r] = hn::GetLane(x4);
      s1[r] = hn::ExtractLane(x4, 1);
      s2[r] = hn::ExtractLane(x4, 2);
      s3[r] = hn::ExtractLane(x4, 3);
    }
    hn::StoreU(m4, d4, k.m);
    return;
  }
#endif
  float m[kQB], bias[kQB];
  for (int j = 0; j < kQB; ++j) m[j] = k.m[j], bias[j] = k.bias[j];
  for (; r < run_end; ++r, p += row_bytes) {
    pf.Step();
    float dots[4];
    row_dots(p, dots);
    for (int j = 0; j < kQB; ++j) {
      float x = dots[j] * scale;
      if (has_bias) x = x + bias[j];
      s[j][r] = x;
      m[j] = std::max(m[j], x);
    }
  }
  for (int j = 0; j < kQB; ++j) k.m[j] = m[j];
}

// As ScoreRunVisible, testing each row's visibility to each query (-inf
// where hidden; a row no query sees is not decoded).
template <int kQB, class RowDotsFn>
HWY_INLINE void ScoreRunMasked(const RowDotsFn& row_dots, const uint8_t* p, uint32_t r,
                               uint32_t run_end, uint32_t row_bytes, Prefetcher& pf,
                               const Visibility& vis, const QueryVec* qv, KScores<kQB>& k) {
  float* const* s = k.s;  // locals in the row loop, as in ScoreRunVisible
  const float scale = k.scale;
  const bool has_bias = k.has_bias;
  float m[kQB], bias[kQB];
  for (int j = 0; j < kQB; ++j) m[j] = k.m[j], bias[j] = k.bias[j];
  for (; r < run_end; ++r, p += row_bytes) {
    pf.Step();
    const uint32_t pos = vis.Pos(r);
    uint32_t mask = 0;
    for (int j = 0; j < kQB; ++j) mask |= vis.Visible(pos, qv[j].qpos) ? (1u << j) : 0u;
    if (mask == 0) {
      for (int j = 0; j < kQB; ++j) s[j][r] = kNegInf;
      continue;
    }
    float dots[4];
    row_dots(p, dots);
    for (int j = 0; j < kQB; ++j) {
      if (!(mask & (1u << j))) {
        s[j][r] = kNegInf;
        continue;
      }
      float x = dots[j] * scale;
      if (has_bias) x = x + bias[j];
      s[j][r] = x;
      m[j] = std::max(m[j], x);
    }
  }
  for (int j = 0; j < kQB; ++j) k.m[j] = m[j];
}

// The K pass over rows [a.r0, a.r1) of a job: row_dots(p, dots) gives the
// kQB dot products of the row at p (unscaled by plan.scale, divided by
// ValueMul(F) as the decoders' values are). row_dots is taken by value: a
// local copy the row loop can keep in registers.
template <Format F, int kQB, class RowDotsFn>
void KPassRows(const KArgs& a, RowDotsFn row_dots) {
  const Plan& plan = *a.plan;
  const HeadJob& job = *a.job;
  const LayerKvView& view = *job.view;
  const Visibility vis = MakeVisibility(job);
  const QueryVec* qv = plan.queries.data() + job.first_query + a.qi0;
  KScores<kQB> k;
  for (int j = 0; j < kQB; ++j) {
    k.s[j] = a.scores + static_cast<size_t>(a.qi0 + j) * job.rows;
    k.m[j] = a.maxes[a.qi0 + j];
    k.bias[j] = qv[j].bias;
  }
  k.scale = plan.scale * ValueMul(F);
  k.has_bias = job.has_bias;
  const bool all_visible = AllVisible(vis, qv, kQB, a.r0, a.r1);
  const HeadRows rows(view, view.k, job.head);
  std::optional<Prefetcher> own_pf;
  if (a.pf == nullptr) own_pf.emplace(&rows, &a.r1, 1, a.r0, kWholeRun);
  Prefetcher& pf = a.pf ? *a.pf : *own_pf;
  for (uint32_t r = a.r0; r < a.r1;) {
    uint32_t n;
    const uint8_t* p = rows.Run(r, a.r1, &n);
    if (all_visible) {
      ScoreRunVisible<kQB>(row_dots, p, r, r + n, rows.row_bytes, pf, k);
    } else {
      ScoreRunMasked<kQB>(row_dots, p, r, r + n, rows.row_bytes, pf, vis, qv, k);
    }
    r += n;
  }
  for (int j = 0; j < kQB; ++j) a.maxes[a.qi0 + j] = k.m[j];
}

// fn(qq) with the kQB query vectors of a's block rounded by
// quantize(q, d, &query) into Query objects, once per K pass. The arrays
// go to fn by reference, so a row_dots lambda capturing by value holds
// copies its row loop can keep in registers.
template <class Query, int kQB, class QuantizeFn, class Fn>
HWY_INLINE void WithQueries(const KArgs& a, const QuantizeFn& quantize, const Fn& fn) {
  const uint32_t d = a.plan->head_dim;
  const QueryVec* qv = a.plan->queries.data() + a.job->first_query + a.qi0;
  Query qbuf[kQB];
  const Query* qq[kQB];
  for (int j = 0; j < kQB; ++j) {
    quantize(qv[j].q, d, &qbuf[j]);
    qq[j] = &qbuf[j];
  }
  fn(qq);
}

// fn(q16, qscale) with the kQB query vectors of a's block rounded to int16
// by quantize(q, d, q16) (QuantizeQuery, or a family's permuting form; it
// returns qscale), once per K pass.
template <int kQB, class QuantizeFn, class Fn>
HWY_INLINE void WithInt16Queries(const KArgs& a, const QuantizeFn& quantize, const Fn& fn) {
  const uint32_t d = a.plan->head_dim;
  const QueryVec* qv = a.plan->queries.data() + a.job->first_query + a.qi0;
  alignas(64) int16_t q16_buf[kQB * kIntMaxDim];
  const int16_t* q16[kQB];
  float qscale[kQB];
  for (int j = 0; j < kQB; ++j) {
    qscale[j] = quantize(qv[j].q, d, q16_buf + j * kIntMaxDim);
    q16[j] = q16_buf + j * kIntMaxDim;
  }
  fn(q16, qscale);
}

// A format's integer K path: Run<kQB>(a) runs the K pass of a and returns
// true, or returns false (the path does not fit this head_dim, this target
// or the plan's options) and the float path runs. The families specialize
// it for the formats whose table row names an integer K path
// (format/<family>/kpass-inl.h); kDefined says a specialization is there.
template <Format F>
struct IntKeyPass {
  static constexpr bool kDefined = false;
  template <int kQB>
  static bool Run(const KArgs&) {
    return false;
  }
};

template <Format F, bool kExact, int kQB>
void KPass(const KArgs& a) {
  static_assert(IntKeyPass<F>::kDefined == (fi::TraitsOf(F).int_keys != fi::IntKeyPath::kNone),
                "a format with an integer K path in the table needs its family's kpass-inl.h");
  if constexpr (!kExact && IntKeyPass<F>::kDefined) {
    if (IntKeyPass<F>::template Run<kQB>(a)) return;
  }
  const uint32_t d = a.plan->head_dim;
  const Decoder<F> dec = MakeDecoder<F>(d);
  const QueryVec* qv = a.plan->queries.data() + a.job->first_query + a.qi0;
  const float* q[kQB];
  for (int j = 0; j < kQB; ++j) q[j] = qv[j].q;
  KPassRows<F, kQB>(a, [=](const uint8_t* p, float* dots) HWY_ATTR {
    RowDots<F, kExact, kQB>(dec, p, d, q, dots);
  });
}

template <Format F, bool kExact>
KFn KFor(int qb) {
  return qb == 4   ? &KPass<F, kExact, 4>
         : qb == 3 ? &KPass<F, kExact, 3>
         : qb == 2 ? &KPass<F, kExact, 2>
                   : &KPass<F, kExact, 1>;
}

}  // namespace HWY_NAMESPACE
}  // namespace attention_internal
}  // namespace kvcache
HWY_AFTER_NAMESPACE();

#endif  // KVCACHE_SRC_ATTENTION_KPASS_INL_H_
