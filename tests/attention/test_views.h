// Test helper: a LayerKvView over buffers the test owns, filled with random
// rows encoded by RowCodec, plus the decoded f32 rows per head for the
// reference. Contiguous, paged (shuffled block table) or per-head layouts.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "kvcache/attention.h"
#include "kvcache/codec.h"
#include "kvcache/kv_view.h"

namespace kvcache::testing {

enum class Layout { kContiguous, kPaged, kPerHead };

struct ViewSpec {
  uint32_t n_kv_heads = 2;
  uint32_t head_dim = 32;
  uint32_t num_tokens = 40;
  FormatPair formats{Format::kF32, Format::kF32};
  Layout layout = Layout::kPaged;
  uint32_t block_size = 16;
  // Rows per head (default num_tokens each); with evict_every > 0, every
  // evict_every-th position is dropped (positions become non-trivial).
  std::vector<uint32_t> head_rows;
  uint32_t evict_every = 0;
  bool key_mean = false;       // give keys an offset and calibrate a transform
  bool calibrate = false;      // use RowCodec::Calibrate (q8 column scales, means)
  uint64_t seed = 1;
};

class TestView {
 public:
  static Result<std::unique_ptr<TestView>> Make(const ViewSpec& spec) {
    auto t = std::unique_ptr<TestView>(new TestView());
    KV_RETURN_IF_ERROR(t->Init(spec));
    return t;
  }
  const LayerKvView& view() const { return view_; }
  // Decoded rows per head, the reference's input.
  std::vector<ReferenceHead> reference_heads() const {
    std::vector<ReferenceHead> out;
    for (uint32_t h = 0; h < spec_.n_kv_heads; ++h) {
      out.push_back({keys_[h], values_[h], positions_[h]});
    }
    return out;
  }

 private:
  TestView() = default;

  Status Init(const ViewSpec& spec) {
    spec_ = spec;
    const uint32_t nkv = spec.n_kv_heads, d = spec.head_dim;
    std::mt19937_64 rng(spec.seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    KV_ASSIGN_OR_RETURN(RowCodec kc, RowCodec::Create(spec.formats.k, d, Side::kKey));
    KV_ASSIGN_OR_RETURN(RowCodec vc, RowCodec::Create(spec.formats.v, d, Side::kValue));
    k_codec_ = std::make_unique<RowCodec>(kc);
    v_codec_ = std::make_unique<RowCodec>(vc);
    // Positions and rows per head.
    positions_.assign(nkv, {});
    rows_.assign(nkv, 0);
    uint32_t max_rows = 0;
    for (uint32_t h = 0; h < nkv; ++h) {
      std::vector<uint32_t> pos;
      for (uint32_t p = 0; p < spec.num_tokens; ++p) {
        if (spec.evict_every > 0 && p % spec.evict_every == spec.evict_every - 1) continue;
        pos.push_back(p);
      }
      if (!spec.head_rows.empty()) pos.resize(std::min<size_t>(pos.size(), spec.head_rows[h]));
      rows_[h] = static_cast<uint32_t>(pos.size());
      max_rows = std::max(max_rows, rows_[h]);
      if (spec.evict_every > 0) positions_[h] = pos;
    }
    // Raw rows, transforms, encoded rows, decoded rows.
    k_transforms_.assign(nkv, {});
    v_transforms_.assign(nkv, {});
    keys_.assign(nkv, {});
    values_.assign(nkv, {});
    std::vector<std::vector<uint8_t>> k_enc(nkv), v_enc(nkv);
    bool any_transform = false;
    for (uint32_t h = 0; h < nkv; ++h) {
      const uint32_t n = rows_[h];
      std::vector<float> k(size_t{n} * d), v(size_t{n} * d);
      std::vector<float> offset(d);
      for (auto& o : offset) o = spec.key_mean ? 4.0f * normal(rng) : 0.0f;
      for (uint32_t r = 0; r < n; ++r) {
        for (uint32_t i = 0; i < d; ++i) {
          k[size_t{r} * d + i] = normal(rng) + offset[i];
          v[size_t{r} * d + i] = normal(rng);
        }
      }
      if (spec.calibrate && n > 0) {
        k_transforms_[h] = k_codec_->Calibrate(k);
        v_transforms_[h] = v_codec_->Calibrate(v);
        any_transform = any_transform || !k_transforms_[h].empty() || !v_transforms_[h].empty();
      }
      k_enc[h].resize(size_t{n} * kc.row_bytes());
      v_enc[h].resize(size_t{n} * vc.row_bytes());
      KV_RETURN_IF_ERROR(kc.Encode(k, k_enc[h], &k_transforms_[h]));
      KV_RETURN_IF_ERROR(vc.Encode(v, v_enc[h], &v_transforms_[h]));
      keys_[h].resize(k.size());
      values_[h].resize(v.size());
      KV_RETURN_IF_ERROR(kc.Decode(k_enc[h], keys_[h], &k_transforms_[h]));
      KV_RETURN_IF_ERROR(vc.Decode(v_enc[h], values_[h], &v_transforms_[h]));
    }
    // Storage.
    view_ = LayerKvView{};
    view_.n_kv_heads = nkv;
    view_.head_dim = d;
    view_.num_tokens = spec.num_tokens;
    head_len_ = rows_;
    view_.head_len = head_len_.data();
    if (spec.evict_every > 0) {
      for (auto& p : positions_) pos_ptrs_.push_back(p.data());
      view_.positions = pos_ptrs_.data();
    }
    const uint32_t bs = spec.layout == Layout::kPaged ? spec.block_size : std::max(1u, max_rows);
    const uint32_t n_blocks = std::max(1u, (max_rows + bs - 1) / bs);
    const uint32_t pool_blocks = spec.layout == Layout::kPaged ? n_blocks + 3 : 1;
    table_.resize(n_blocks);
    std::vector<uint32_t> perm(pool_blocks);
    std::iota(perm.begin(), perm.end(), 0u);
    if (spec.layout == Layout::kPaged) std::shuffle(perm.begin(), perm.end(), rng);
    for (uint32_t b = 0; b < n_blocks; ++b) table_[b] = perm[b];
    view_.block_table = table_.data();
    view_.num_blocks = n_blocks;
    view_.block_size = bs;
    Fill(view_.k, kc, spec.formats.k, k_enc, k_arena_, k_head_bufs_, k_head_ptrs_, pool_blocks, spec.layout);
    Fill(view_.v, vc, spec.formats.v, v_enc, v_arena_, v_head_bufs_, v_head_ptrs_, pool_blocks, spec.layout);
    view_.k.codec = k_codec_.get();
    view_.v.codec = v_codec_.get();
    if (any_transform) {
      view_.k.transforms = k_transforms_.data();
      view_.v.transforms = v_transforms_.data();
    }
    return Status::Ok();
  }

  void Fill(KvSideView& side, const RowCodec& codec, Format f,
            const std::vector<std::vector<uint8_t>>& enc, std::vector<uint8_t>& arena,
            std::vector<std::vector<uint8_t>>& head_bufs, std::vector<const uint8_t*>& head_ptrs,
            uint32_t pool_blocks, Layout layout) {
    const uint32_t nkv = spec_.n_kv_heads, bs = view_.block_size;
    const size_t rb = codec.row_bytes();
    side.format = f;
    side.row_bytes = static_cast<uint32_t>(rb);
    if (layout == Layout::kPerHead) {
      head_bufs.assign(nkv, {});
      head_ptrs.assign(nkv, nullptr);
      for (uint32_t h = 0; h < nkv; ++h) {
        if (rows_[h] == 0) continue;
        head_bufs[h] = enc[h];
        head_ptrs[h] = head_bufs[h].data();
      }
      side.head_base = head_ptrs.data();
      return;
    }
    side.head_stride = bs * rb;
    side.block_stride = nkv * side.head_stride;
    arena.assign(pool_blocks * side.block_stride, 0xA5);  // garbage outside stored rows
    side.base = arena.data();
    for (uint32_t h = 0; h < nkv; ++h) {
      for (uint32_t r = 0; r < rows_[h]; ++r) {
        uint8_t* dst = arena.data() + size_t{table_[r / bs]} * side.block_stride +
                       h * side.head_stride + size_t{r % bs} * rb;
        std::copy_n(enc[h].data() + r * rb, rb, dst);
      }
    }
  }

  ViewSpec spec_;
  LayerKvView view_;
  std::unique_ptr<RowCodec> k_codec_, v_codec_;
  std::vector<RowTransform> k_transforms_, v_transforms_;
  std::vector<uint32_t> rows_, head_len_, table_;
  std::vector<std::vector<uint32_t>> positions_;
  std::vector<const uint32_t*> pos_ptrs_;
  std::vector<std::vector<float>> keys_, values_;
  std::vector<uint8_t> k_arena_, v_arena_;
  std::vector<std::vector<uint8_t>> k_head_bufs_, v_head_bufs_;
  std::vector<const uint8_t*> k_head_ptrs_, v_head_ptrs_;
};

inline std::vector<float> RandomVector(size_t n, uint64_t seed, float stddev = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, stddev);
  std::vector<float> v(n);
  for (auto& x : v) x = normal(rng);
  return v;
}

}  // namespace kvcache::testing
