// The turbo family's piece of the attention V pass: turbo4i's integer-level
// value pass (IntValuePass<kTurbo4I>; the generic pass in
// src/attention/vpass-inl.h asks it first). The other turbo formats take the
// generic pass over their Decoders.
//
// Per-target header (Highway's -inl.h convention): included by the family's
// attention kernels (src/attention/kernels_<family>.cc) after
// hwy/foreach_target.h, so once per compiled target, at file scope.

#include <optional>

#include "attention/vpass-inl.h"

#if defined(KVCACHE_SRC_FORMAT_TURBO_VPASS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVCACHE_SRC_FORMAT_TURBO_VPASS_INL_H_
#undef KVCACHE_SRC_FORMAT_TURBO_VPASS_INL_H_
#else
#define KVCACHE_SRC_FORMAT_TURBO_VPASS_INL_H_
#endif

HWY_BEFORE_NAMESPACE();
namespace kvcache {
namespace attention_internal {
namespace HWY_NAMESPACE {

// ---------------------------------------------------------------------------
// turbo4i values on AVX2 and AVX-512 (head_dim a multiple of 4 * the vector
// bytes, at most kT4IMaxDim): per 16-row tile, each row's codes are split
// into nibbles once (AVX2: and looked up as int8 levels by vpshufb),
// regrouped into each 16-value group's even/odd order by two 64-bit
// interleaves per vector, and its weights e_r times the group scales
// s_g / 128 made once per query (ws, 4 lanes per multiply); then per value
// block and row: two instructions to f32 levels (AVX-512: vpmovzxbd +
// vpermps; AVX2: vpmovsxbd + vcvtdq2ps; no scale multiply) and one FMA per
// query vector. Rows still add in row order per output value; the weight times
// scale is rounded once more than e_r * (s_g * level) (within float
// rounding of the decoded reference).

#if HWY_TARGET <= HWY_AVX2 && HWY_ARCH_X86
constexpr bool kT4IValuePass = true;  // this target has VPassT4I
constexpr uint32_t kT4IMaxDim = 256;
using DB8 = hn::ScalableTag<uint8_t>;
constexpr uint32_t kVB = static_cast<uint32_t>(hn::MaxLanes(DB8()));  // code bytes per vector

HWY_INLINE bool T4IValuesFit(uint32_t d) { return d % (2 * kVB) == 0 && d <= kT4IMaxDim; }

// AVX-512 keeps the code nibbles in the buffer and looks the levels up as
// f32 with one vpermps per block (a shuffle-port instruction, where the int8
// route's vcvtdq2ps shares the FMAs' port; the two measured alike on the
// machine of docs/perf/attention.md). AVX2's vpermps has 8 entries: int8
// levels, vpmovsxbd + vcvtdq2ps.
#if HWY_TARGET <= HWY_AVX3
constexpr bool kT4INibbles = true;
#else
constexpr bool kT4INibbles = false;
#endif
alignas(64) inline constexpr float kT4ILevelsF[16] = {-127, -102, -80, -62, -46, -32, -18, -6,
                                                      6,    18,   32,  46,  62,  80,  102, 127};

// Offset of group g's 16 levels in a row's level buffer (T4ILevels).
HWY_INLINE uint32_t T4IGroupOffset(uint32_t g) {
  const uint32_t per = kVB / 8, c = g / per, gl = g % per;
  return c * 2 * kVB + (gl % 2) * kVB + 16 * (gl / 2);
}

// The int8 levels of the d / 2 code bytes at p into out[d] (T4IGroupOffset).
HWY_INLINE void T4ILevels(const uint8_t* p, uint32_t d, int8_t* out) {
  const DB8 d8;
  const hn::Repartition<uint16_t, DB8> dw;
  const hn::Repartition<uint64_t, DB8> dq;
  const auto table = hn::LoadDup128(d8, reinterpret_cast<const uint8_t*>(fi::kTurbo4IInt.data()));
  const auto mask = hn::Set(d8, uint8_t{15});
  for (uint32_t c = 0; c < d / (2 * kVB); ++c) {
    const auto x = hn::LoadU(d8, p + c * kVB);
    auto lo = hn::And(x, mask);
    auto hi = hn::And(hn::BitCast(d8, hn::ShiftRight<4>(hn::BitCast(dw, x))), mask);
    if constexpr (!kT4INibbles) {
      lo = hn::TableLookupBytes(table, lo);
      hi = hn::TableLookupBytes(table, hi);
    }
    uint8_t* o = reinterpret_cast<uint8_t*>(out) + c * 2 * kVB;
    hn::StoreU(hn::BitCast(d8, hn::InterleaveLower(dq, hn::BitCast(dq, lo), hn::BitCast(dq, hi))), d8, o);
    hn::StoreU(hn::BitCast(d8, hn::InterleaveUpper(dq, hn::BitCast(dq, lo), hn::BitCast(dq, hi))), d8,
               o + kVB);
  }
}

// ws[j][g] = w[j] * s_g / 128 for the d / 16 E4M3 group scales at sc.
template <int kQB>
HWY_INLINE void T4IWeights(const uint8_t* sc, uint32_t d, const float* w, float (*ws)[kT4IMaxDim / 16]) {
  // kL groups per step (8 where the groups allow: d a multiple of 128).
  auto run = [&](auto tag) HWY_ATTR {
    using DF4 = decltype(tag);
    constexpr size_t kL = hn::MaxLanes(DF4());
    const hn::Rebind<uint8_t, DF4> d8;
    const hn::Rebind<uint16_t, DF4> du16;
    const hn::Rebind<int16_t, DF4> di16;
    const hn::Rebind<hwy::float16_t, DF4> dh;
    for (uint32_t g = 0; g < d / 16; g += kL) {
      // E4M3 -> f16 by moving bits (E4M3Block): the scale times 2^-8.
      const auto u = hn::BitCast(di16, hn::ShiftLeft<8>(hn::PromoteTo(du16, hn::LoadU(d8, sc + g))));
      const auto sv = hn::PromoteTo(
          tag, hn::BitCast(dh, hn::And(hn::ShiftRight<1>(u), hn::Set(di16, static_cast<int16_t>(0xBFFF)))));
      for (int j = 0; j < kQB; ++j) {
        hn::StoreU(hn::Mul(hn::Set(tag, w[j] * (kE4M3BlockMul * fi::kTurbo4IStep)), sv), tag, ws[j] + g);
      }
    }
  };
  if (d % 128 == 0) {
    run(hn::FixedTag<float, 8>());
  } else {
    run(hn::FixedTag<float, 4>());
  }
}

// kN levels as f32: from int8 levels at p, or (kT4INibbles) from nibbles
// through the f32 levels in `levels`.
HWY_INLINE VF T4IBlockLevels(const int8_t* p, VF levels) {
#if HWY_TARGET <= HWY_AVX3
  const auto idx = hn::PromoteTo(DU(), hn::LoadU(hn::Rebind<uint8_t, DF>(), reinterpret_cast<const uint8_t*>(p)));
  return VF{_mm512_permutexvar_ps(idx.raw, levels.raw)};
#else
  (void)levels;
  return hn::ConvertTo(DF(), hn::PromoteTo(DI(), hn::LoadU(hn::Rebind<int8_t, DF>(), p)));
#endif
}

// Value block b of a prepared tile (VPassT4I): o[j][b] += sum over the
// rows of ws * levels, rows in order.
template <int kQB>
HWY_INLINE void T4IAccumulateBlock(const VTile& tile, const int8_t (*lv)[kT4IMaxDim],
                                   const float (*ws)[kQB][kT4IMaxDim / 16], float* const* o,
                                   uint32_t b) {
  const uint32_t ob = T4IGroupOffset(b);
  const VF levels = hn::LoadU(DF(), kT4ILevelsF);  // the first kN (unused off AVX-512)
  VF acc[kQB][kVecs];
  for (int j = 0; j < kQB; ++j) {
    for (size_t v = 0; v < kVecs; ++v) acc[j][v] = hn::LoadU(DF(), o[j] + b * kDotLanes + v * kN);
  }
  // The common case tests nothing per row (a separate loop, as in
  // AccumulateBlock; acc stays in registers).
  if (tile.all) {
    for (uint32_t i = 0; i < tile.n; ++i) {
      VF vv[kVecs];
      for (size_t v = 0; v < kVecs; ++v) vv[v] = T4IBlockLevels(lv[i] + ob + v * kN, levels);
      for (int j = 0; j < kQB; ++j) {
        const VF ew = hn::Set(DF(), ws[i][j][b]);
        for (size_t v = 0; v < kVecs; ++v) acc[j][v] = hn::MulAdd(ew, vv[v], acc[j][v]);
      }
    }
  } else {
    for (uint32_t i = 0; i < tile.n; ++i) {
      VF vv[kVecs];
      for (size_t v = 0; v < kVecs; ++v) vv[v] = T4IBlockLevels(lv[i] + ob + v * kN, levels);
      for (int j = 0; j < kQB; ++j) {
        if (!(tile.masks[i] & (1u << j))) continue;
        const VF ew = hn::Set(DF(), ws[i][j][b]);
        for (size_t v = 0; v < kVecs; ++v) acc[j][v] = hn::MulAdd(ew, vv[v], acc[j][v]);
      }
    }
  }
  for (int j = 0; j < kQB; ++j) {
    for (size_t v = 0; v < kVecs; ++v) hn::StoreU(acc[j][v], DF(), o[j] + b * kDotLanes + v * kN);
  }
}

template <int kQB>
void VPassT4I(const VArgs& a) {
  const Plan& plan = *a.plan;
  const HeadJob& job = *a.job;
  const LayerKvView& view = *job.view;
  const uint32_t d = plan.head_dim, n_blocks = d / kDotLanes;
  const Decoder<Format::kTurbo4I> dec = MakeDecoder<Format::kTurbo4I>(d);
  const Visibility vis = MakeVisibility(job);
  const QueryVec* qv = plan.queries.data() + job.first_query + a.qi0;
  const float* e[kQB];
  float* o[kQB];
  for (int j = 0; j < kQB; ++j) {
    e[j] = a.e + static_cast<size_t>(a.qi0 + j) * job.rows;
    o[j] = a.o + static_cast<size_t>(a.qi0 + j) * plan.padded_dim;
  }
  const bool all_visible = AllVisible(vis, qv, kQB, a.r0, a.r1);
  const HeadRows hrows(view, view.v, job.head);
  std::optional<Prefetcher> own_pf;  // as VPass: spread over the value blocks
  if (a.pf == nullptr) own_pf.emplace(&hrows, &job.rows, 1, a.r0, kWholeRun);
  Prefetcher& pf = a.pf ? *a.pf : *own_pf;
  VTile tile;
  RowWalk walk{hrows};
  alignas(64) int8_t lv[kTileRows][kT4IMaxDim];
  alignas(64) float ws[kTileRows][kQB][kT4IMaxDim / 16];
  for (uint32_t t0 = a.r0; t0 < a.r1;) {
    const uint32_t tile_r0 = t0;
    t0 = GatherTile<Format::kTurbo4I, kQB>(dec, d, vis, qv, all_visible, t0, a.r1, walk, tile);
    const uint32_t steps = t0 - tile_r0;
    const uint32_t per = steps / n_blocks, extra = steps % n_blocks;
    if (tile.n == 0) {
      for (uint32_t k = 0; k < steps; ++k) pf.Step();
      continue;
    }
    float et[kQB][kTileRows];
    const float* w[kQB];
    TileWeights<kQB>(tile, all_visible, e, tile_r0, a.l + a.qi0, et, w);
    for (uint32_t i = 0; i < tile.n; ++i) {
      float wi[kQB];
      for (int j = 0; j < kQB; ++j) wi[j] = w[j][i];
      T4ILevels(tile.rows[i].p, d, lv[i]);
      T4IWeights<kQB>(tile.rows[i].p + d / 2, d, wi, ws[i]);
    }
    for (uint32_t b = 0; b < n_blocks; ++b) {
      for (uint32_t k = per + (b < extra ? 1 : 0); k > 0; --k) pf.Step();
      T4IAccumulateBlock<kQB>(tile, lv, ws, o, b);
    }
  }
}
#else
// No VPassT4I on this target: VPass tests the flag at compile time, so no
// call to it is left for the linker even without optimization.
constexpr bool kT4IValuePass = false;
HWY_INLINE bool T4IValuesFit(uint32_t) { return false; }
template <int kQB>
void VPassT4I(const VArgs& a);
#endif

template <>
struct IntValuePass<Format::kTurbo4I> {
  static constexpr bool kDefined = true;
  template <int kQB>
  static bool Run(const VArgs& a) {
    if constexpr (kT4IValuePass) {
      if (T4IValuesFit(a.plan->head_dim)) {
        VPassT4I<kQB>(a);
        return true;
      }
    }
    (void)a;
    return false;
  }
};

}  // namespace HWY_NAMESPACE
}  // namespace attention_internal
}  // namespace kvcache
HWY_AFTER_NAMESPACE();

#endif  // KVCACHE_SRC_FORMAT_TURBO_VPASS_INL_H_
