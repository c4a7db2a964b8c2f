// The V pass: for rows [r0, r1) inside one 512-row segment, l += e_r and
// o[d] += e_r * v_r[d] for kQB query vectors, in row order (the reference
// order of reference.h), 16-row tiles decoded one 16-value block at a time.
// The pass is the same for every format (over Decoder<F>); a format with an
// integer V pass (format/traits.h int_values) has it in its family's
// format/<family>/vpass-inl.h, as a specialization of IntValuePass<F>.
//
// Per-target header (Highway's -inl.h convention): included by a kernel .cc
// after hwy/foreach_target.h, so once per compiled target, at file scope.

#include <optional>

#include "attention/kernel_common-inl.h"

#if defined(KVCACHE_SRC_ATTENTION_VPASS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVCACHE_SRC_ATTENTION_VPASS_INL_H_
#undef KVCACHE_SRC_ATTENTION_VPASS_INL_H_
#else
#define KVCACHE_SRC_ATTENTION_VPASS_INL_H_
#endif

HWY_BEFORE_NAMESPACE();
namespace kvcache {
namespace attention_internal {
namespace HWY_NAMESPACE {

constexpr uint32_t kTileRows = 16;

// Up to kTileRows rows of a V pass. When some row may be masked, rows no
// query sees are left out and each kept row has masks (bit j: query j
// sees it) and ridx (its row index).
struct VTile {
  RowRef rows[kTileRows];
  uint32_t masks[kTileRows];
  uint32_t ridx[kTileRows];
  uint32_t n = 0;    // rows kept
  bool all = true;   // every kept row is visible to every query
};

// The stored rows of one head in order, a run inside one block at a time
// (one block-table read per run).
struct RowWalk {
  const HeadRows& hrows;
  const uint8_t* p = nullptr;
  uint32_t left = 0;
  HWY_INLINE const uint8_t* Next(uint32_t r, uint32_t r_end) {
    if (left == 0) p = hrows.Run(r, r_end, &left);
    const uint8_t* row = p;
    p += hrows.row_bytes;
    --left;
    return row;
  }
};

// Fills tile from rows [t0, r1) until it holds kTileRows rows; returns the
// row after the last one taken (kept or masked).
template <Format F, int kQB>
HWY_INLINE uint32_t GatherTile(const Decoder<F>& dec, uint32_t d, const Visibility& vis,
                               const QueryVec* qv, bool all_visible, uint32_t t0, uint32_t r1,
                               RowWalk& walk, VTile& tile) {
  tile.n = 0;
  tile.all = true;
  for (; tile.n < kTileRows && t0 < r1; ++t0) {
    const uint8_t* p = walk.Next(t0, r1);
    if (!all_visible) {
      // masks and ridx are read only here (masked tiles, gathered weights).
      const uint32_t pos = vis.Pos(t0);
      uint32_t mask = 0;
      for (int j = 0; j < kQB; ++j) mask |= vis.Visible(pos, qv[j].qpos) ? (1u << j) : 0u;
      if (mask == 0) continue;
      tile.all = tile.all && mask == (1u << kQB) - 1;
      tile.masks[tile.n] = mask;
      tile.ridx[tile.n] = t0;
    }
    tile.rows[tile.n] = dec.Prepare(p, d);
    ++tile.n;
  }
  return t0;
}

// The tile's weights w[j][i] (masked entries are never read): straight
// from e when every row is visible (the tile is rows tile_r0 + i), else
// gathered into et. l[j] adds them in row order either way.
template <int kQB>
HWY_INLINE void TileWeights(const VTile& tile, bool all_visible, const float* const* e,
                            uint32_t tile_r0, float* l, float (*et)[kTileRows],
                            const float** w) {
  for (int j = 0; j < kQB; ++j) {
    float lj = l[j];
    if (all_visible) {
      w[j] = e[j] + tile_r0;
      for (uint32_t i = 0; i < tile.n; ++i) lj = lj + w[j][i];
    } else {
      for (uint32_t i = 0; i < tile.n; ++i) {
        et[j][i] = e[j][tile.ridx[i]];
        if (tile.masks[i] & (1u << j)) lj = lj + et[j][i];
      }
      w[j] = et[j];
    }
    l[j] = lj;
  }
}

// Value block b: o[j][b] += sum over the tile's rows of w[j][i] * v_i[b],
// rows in order; decode(row, vv) decodes block b of a row. The masked case
// is a separate loop so the common one tests nothing per row.
template <bool kExact, int kQB, class DecodeBlock>
HWY_INLINE void AccumulateBlock(const VTile& tile, const float* const* w, float* const* o,
                                uint32_t b, const DecodeBlock& decode) {
  VF acc[kQB][kVecs];
  for (int j = 0; j < kQB; ++j) {
    for (size_t v = 0; v < kVecs; ++v) acc[j][v] = hn::LoadU(DF(), o[j] + b * kDotLanes + v * kN);
  }
  if (tile.all) {
    for (uint32_t i = 0; i < tile.n; ++i) {
      VF vv[kVecs];
      decode(tile.rows[i], vv);
      for (int j = 0; j < kQB; ++j) {
        const VF ew = hn::Set(DF(), w[j][i]);
        for (size_t v = 0; v < kVecs; ++v) acc[j][v] = MulAcc<kExact>(ew, vv[v], acc[j][v]);
      }
    }
  } else {
    for (uint32_t i = 0; i < tile.n; ++i) {
      VF vv[kVecs];
      decode(tile.rows[i], vv);
      for (int j = 0; j < kQB; ++j) {
        if (!(tile.masks[i] & (1u << j))) continue;
        const VF ew = hn::Set(DF(), w[j][i]);
        for (size_t v = 0; v < kVecs; ++v) acc[j][v] = MulAcc<kExact>(ew, vv[v], acc[j][v]);
      }
    }
  }
  for (int j = 0; j < kQB; ++j) {
    for (size_t v = 0; v < kVecs; ++v) hn::StoreU(acc[j][v], DF(), o[j] + b * kDotLanes + v * kN);
  }
}

// A format's integer V pass: Run<kQB>(a) runs the V pass of a and returns
// true, or returns false (it does not fit this head_dim or target) and the
// generic pass below runs. The families specialize it for the formats whose
// table row (format/traits.h) says int_values (format/<family>/vpass-inl.h);
// kDefined says a specialization is there.
template <Format F>
struct IntValuePass {
  static constexpr bool kDefined = false;
  template <int kQB>
  static bool Run(const VArgs&) {
    return false;
  }
};

template <Format F, bool kExact, int kQB>
void VPass(const VArgs& a) {
  static_assert(IntValuePass<F>::kDefined == fi::TraitsOf(F).int_values,
                "a format with an integer V pass in the table needs its family's vpass-inl.h");
  if constexpr (!kExact && IntValuePass<F>::kDefined) {
    if (IntValuePass<F>::template Run<kQB>(a)) return;
  }
  const Plan& plan = *a.plan;
  const HeadJob& job = *a.job;
  const LayerKvView& view = *job.view;
  const uint32_t d = plan.head_dim, pd = plan.padded_dim;
  const uint32_t n_blocks = pd / kDotLanes;
  const uint32_t full_blocks = d / kDotLanes;
  const Decoder<F> dec = MakeDecoder<F>(d);
  const Visibility vis = MakeVisibility(job);
  const QueryVec* qv = plan.queries.data() + job.first_query + a.qi0;
  const float* e[kQB];
  float* o[kQB];
  for (int j = 0; j < kQB; ++j) {
    e[j] = a.e + static_cast<size_t>(a.qi0 + j) * job.rows;
    o[j] = a.o + static_cast<size_t>(a.qi0 + j) * pd;
  }
  const bool all_visible = AllVisible(vis, qv, kQB, a.r0, a.r1);
  const HeadRows hrows(view, view.v, job.head);
  // Prefetch runs on past the segment, so the next segment's rows are in
  // flight when this call ends. A tile's prefetch steps are spread over its
  // value blocks, not issued as the tile is gathered: a burst of 16 rows'
  // lines (64 for bf16) at once made the V pass on a 32k context 1.7-1.8x
  // slower than the K pass over the same bytes, spread ~1.0x (see
  // docs/attention.md).
  std::optional<Prefetcher> own_pf;
  if (a.pf == nullptr) own_pf.emplace(&hrows, &job.rows, 1, a.r0, kWholeRun);
  Prefetcher& pf = a.pf ? *a.pf : *own_pf;
  VTile tile;
  RowWalk walk{hrows};
  for (uint32_t t0 = a.r0; t0 < a.r1;) {
    const uint32_t tile_r0 = t0;
    t0 = GatherTile<F, kQB>(dec, d, vis, qv, all_visible, t0, a.r1, walk, tile);
    // One prefetch step per row taken from the stream (masked ones too),
    // `per` (+1 for the first `extra` blocks) before each value block.
    const uint32_t steps = t0 - tile_r0;
    const uint32_t per = steps / n_blocks, extra = steps % n_blocks;
    auto prefetch_part = [&](uint32_t b) {
      for (uint32_t k = per + (b < extra ? 1 : 0); k > 0; --k) pf.Step();
    };
    if (tile.n == 0) {
      for (uint32_t k = 0; k < steps; ++k) pf.Step();
      continue;
    }
    float et[kQB][kTileRows];
    const float* w[kQB];
    TileWeights<kQB>(tile, all_visible, e, tile_r0, a.l + a.qi0, et, w);
    for (uint32_t b = 0; b < full_blocks; ++b) {
      prefetch_part(b);
      AccumulateBlock<kExact, kQB>(tile, w, o, b, [&](const RowRef& row, VF* vv) HWY_ATTR {
        dec.Block(row, b, vv);
      });
    }
    if constexpr (Decoder<F>::kTail) {
      if (n_blocks != full_blocks) {
        prefetch_part(full_blocks);
        AccumulateBlock<kExact, kQB>(tile, w, o, full_blocks,
                                     [&](const RowRef& row, VF* vv) HWY_ATTR {
                                       TailBlock(dec, row, full_blocks, d, vv);
                                     });
      }
    }
  }
}

template <Format F, bool kExact>
VFn VFor(int qb) {
  return qb == 4   ? &VPass<F, kExact, 4>
         : qb == 3 ? &VPass<F, kExact, 3>
         : qb == 2 ? &VPass<F, kExact, 2>
                   : &VPass<F, kExact, 1>;
}

}  // namespace HWY_NAMESPACE
}  // namespace attention_internal
}  // namespace kvcache
HWY_AFTER_NAMESPACE();

#endif  // KVCACHE_SRC_ATTENTION_VPASS_INL_H_
