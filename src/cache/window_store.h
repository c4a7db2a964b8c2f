// The rows of a precision window (cache.h, PrecisionWindow): per layer, per
// side, per kv head `sinks + ring` bf16 slots (ring = recent + slack) beside
// the cache's RowStore, and the two views attention reads them through.
//
// Slots. Position p < sinks lives in slot p; position p >= sinks in slot
// sinks + (p - sinks) % ring (appending p overwrites p - ring, which has
// left the ring by then). slot_pos[slot] says which position a slot holds,
// kNone for none. Per layer:
//   sinks_held  positions [0, sinks_held) are held in their slots;
//   ring_begin  positions [ring_begin, num_tokens) are held in the ring;
//               every position in [sinks_held, ring_begin) is not held.
// A query at position q reads from the window the sinks held and the ring
// positions p with p + recent > q; the cache's rows serve the rest (the
// rule of kv_view.h, with first_position = sinks_held and recent_from =
// ring_begin), so each position is attended exactly once.
//   hot_begin   max(ring_begin, num_tokens - recent), set by Refresh: what
//               the sequence's last position reads from the window.
// The views: the cache's view of the layer gets head_len = hot_begin for
// every head (no later query needs more of its rows); hot() is a
// per-head-buffer view of the min(num_tokens, slots) first slots.
//
// Thread safety: as SequenceCache (mutated by the cache's mutating calls;
// the views are rebuilt by Refresh at the end of each and only read after).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kvcache/cache.h"
#include "kvcache/codec.h"
#include "kvcache/geometry.h"
#include "kvcache/kv_view.h"
#include "kvcache/status.h"

namespace kvcache {

class WindowStore {
 public:
  static constexpr uint32_t kNone = UINT32_MAX;

  // InvalidArgument for a window outside PrecisionWindow's limits or over
  // a pair of float formats (f32, f16, bf16 on both sides).
  static Result<std::unique_ptr<WindowStore>> Create(const Geometry& geometry,
                                                     FormatPair formats,
                                                     const PrecisionWindow& window);

  const PrecisionWindow& window() const { return window_; }
  uint32_t slots() const { return slots_; }

  // Rows [n0, n0 + T) of `layer` were just stored in the cache (so they
  // are finite); k, v: [T][n_kv_heads][head_dim], or nullptr for zero rows.
  // Writes the held ones and moves the window. Cannot fail.
  void Append(uint32_t layer, uint32_t n0, uint32_t T, const float* k, const float* v);
  // The layer keeps positions [0, n) (n below its length).
  void Truncate(uint32_t layer, uint32_t n);
  // The layer holds nothing and its positions [0, n) are the cache's alone
  // (Clear: n = 0; AdoptPrefix: n = the adopted length).
  void Reset(uint32_t layer, uint32_t n);

  // True iff the layer holds every sink position (and the window has sinks).
  bool sinks_complete(uint32_t layer) const {
    return window_.sinks > 0 && layers_[layer].sinks_held == window_.sinks;
  }
  // The layer's sink rows, [2][n_kv_heads][sinks][row_bytes] (WindowSinks'
  // per-layer part): CopySinks writes them to `out`, REQUIRES
  // sinks_complete(layer); SetSinks fills the sink slots from `in` and holds
  // them, REQUIRES the layer's positions [0, sinks) were Reset to the cache's
  // (AdoptPrefix of at least sinks positions).
  void CopySinks(uint32_t layer, uint8_t* out) const;
  void SetSinks(uint32_t layer, const uint8_t* in);
  size_t sink_bytes_per_layer() const {
    return size_t{2} * geometry_.n_kv_heads() * window_.sinks * row_bytes_;
  }

  // Rebuilds the layer's views for a cache view of `num_tokens` positions.
  void Refresh(uint32_t layer, uint32_t num_tokens);
  const LayerKvView* hot(uint32_t layer) const { return &layers_[layer].view; }
  const uint32_t* cold_len(uint32_t layer) const { return layers_[layer].cold_len.data(); }
  uint32_t cold_first(uint32_t layer) const { return layers_[layer].sinks_held; }
  uint32_t recent_from(uint32_t layer) const { return layers_[layer].ring_begin; }

  // Replaces, in `rows` ([num_tokens][head_dim], the cache's decoded rows of
  // one head), the rows the sequence's last position reads from the window
  // by their bf16 rows.
  Status Overlay(uint32_t layer, int side, uint32_t head, std::vector<float>& rows) const;

  // A deep copy (Fork, Clone); its views are rebuilt by the next Refresh.
  std::unique_ptr<WindowStore> Copy() const { return std::unique_ptr<WindowStore>(new WindowStore(*this)); }
  // Slots holding a row in the layer.
  uint32_t held(uint32_t layer) const;

  size_t allocated_bytes() const;
  size_t allocated_bytes(uint32_t layer) const;
  Status CheckInvariants(uint32_t layer, uint32_t num_tokens) const;

 private:
  struct Layer {
    uint32_t sinks_held = 0;
    uint32_t ring_begin = 0;
    uint32_t hot_begin = 0;                  // Refresh
    std::vector<uint32_t> slot_pos;          // [slots]
    std::vector<uint8_t> rows[2];            // [n_kv_heads][slots][row_bytes] per side
    // View storage (Refresh): [n_kv_heads] each.
    std::vector<uint32_t> cold_len, hot_len;
    std::vector<const uint32_t*> positions;
    std::vector<const uint8_t*> head_base[2];
    LayerKvView view;
  };

  WindowStore(const Geometry& g, const PrecisionWindow& w, RowCodec codec);
  uint32_t SlotOf(uint32_t p) const;
  uint8_t* Row(Layer& l, int side, uint32_t head, uint32_t slot);
  void WriteRow(Layer& l, uint32_t slot, uint32_t p, const float* k, const float* v);

  Geometry geometry_;
  PrecisionWindow window_;
  uint32_t ring_;  // recent + slack
  uint32_t slots_;
  size_t row_bytes_;
  RowCodec codec_;  // bf16, both sides
  std::vector<Layer> layers_;
  std::vector<float> zeros_;  // [n_kv_heads * head_dim]
};

}  // namespace kvcache
