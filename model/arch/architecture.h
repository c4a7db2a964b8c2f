// The per-model math of a decoder-only transformer, behind one interface.
//
// The Decoder (model/decoder/decoder.h) drives a pass: the embedding of every
// token, the loop over layers, the residual adds, RoPE, K/V storage and
// attention through a KvBackend, the batching of several sequences' tokens
// into each weight product, and the threads. An Architecture supplies what
// differs between model families:
//   Embed            token -> hidden state (e.g. a scale by sqrt(dim))
//   Layer            layer l's attention kind (full or a sliding window of
//                    `window` positions) and its RoPE (base, rotated dims,
//                    position scaling)
//   AttentionInputs  the residual stream -> Q, K, V before RoPE (the
//                    pre-attention norm, the projections, any per-head Q/K
//                    norms)
//   AttentionProjection  attention's output -> the block's output (the output
//                    projection, any post-attention norm)
//   FeedForward      the residual stream -> the MLP block's output (the
//                    pre-FFN norm, SwiGLU or GeGLU, any post-FFN norm)
//   FinalNorm, OutputHead   the last norm and the matrix giving the logits
//                           (its own, or the embedding's when tied)
// A block's output is left in Pass::xb; the decoder adds it into x.
//
// Every hook computes each token's values by the same operations whatever
// the other tokens in the pass and the thread count (Pass::Product and
// Pass::ForTokens keep that promise), so the decoder's batch invariance holds
// for every architecture that uses them.
//
// Thread safety: an Architecture is immutable; its hooks are reentrant on
// distinct Pass buffers.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>

#include "kvcache/thread_pool.h"
#include "model/io/checkpoint.h"
#include "model/tensor/matmul.h"

namespace kvcache::model {

// Adds the wall time between Start and Stop to *acc (nothing when acc is null).
class PhaseTimer {
 public:
  explicit PhaseTimer(double* acc) : acc_(acc) {}
  void Start() {
    if (acc_ != nullptr) t0_ = std::chrono::steady_clock::now();
  }
  void Stop() {
    if (acc_ != nullptr) *acc_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }

 private:
  double* acc_;
  std::chrono::steady_clock::time_point t0_;
};

// One pass over n tokens: the decoder's scratch rows and its threads.
// q_dim = n_heads * head_dim, kv_dim = n_kv_heads * head_dim.
struct Pass {
  uint32_t n = 0;
  float* x = nullptr;    // [n][dim]: the residual stream
  float* xb = nullptr;   // [n][dim]: a block's normed input, then its output
  float* q = nullptr;    // [n][q_dim]
  float* k = nullptr;    // [n][kv_dim]
  float* v = nullptr;    // [n][kv_dim]
  float* att = nullptr;  // [n][q_dim]: attention's output
  float* hb = nullptr;   // [n][hidden]
  float* hb2 = nullptr;  // [n][hidden]
  ThreadPool* pool = nullptr;      // null for one thread
  double* products_s = nullptr;    // where the products' wall time goes, or null

  // out[n][w.rows] = w * in[n][w.cols] (MatMul on the pool), timed as a product.
  void Product(const WeightMatrix& w, const float* in, float* out) const {
    PhaseTimer timer(products_s);
    timer.Start();
    MatMul(w, in, n, out, pool);
    timer.Stop();
  }

  // f(t0, t1) over tokens [0, n), split over the pool's threads when there
  // are enough tokens to pay for the hand-off. Every token's values are
  // computed by the same code whatever the split, so the split changes no bit.
  template <class F>
  void ForTokens(const F& f) const {
    constexpr uint32_t kMinTokensToSplit = 8;
    if (pool == nullptr || n < kMinTokensToSplit) {
      f(0u, n);
      return;
    }
    const uint32_t parts = std::min(pool->num_threads(), n);
    pool->ParallelFor(parts, [&](uint32_t p, uint32_t) {
      f(static_cast<uint32_t>(uint64_t{n} * p / parts), static_cast<uint32_t>(uint64_t{n} * (p + 1) / parts));
    });
  }

  // RmsNorm of each token's `dim` values of in into out (rows of `dim`).
  void NormRows(const float* in, std::span<const float> weight, float* out, uint32_t dim, float eps) const;

  // A gated feed-forward over the normed input in xb: hb = w1 * xb (the
  // gate), hb2 = w3 * xb (up), gate_times_up(hb, hb2, values) in place over
  // each token's `hidden` values, xb = w2 * hb. GeGLU and SwiGLU differ
  // only in gate_times_up.
  void GatedFeedForward(const LayerWeights& w, uint32_t hidden,
                        void (*gate_times_up)(float* gate, const float* up, size_t n)) const;
};

enum class AttentionKind : uint8_t {
  kFull,           // every earlier position
  kSlidingWindow,  // the last `window` positions
};

// Which values of a head RoPE rotates together.
enum class RopePairs : uint8_t {
  kAdjacent,  // (2i, 2i+1): llama2.c, GGUF's llama (its tensors are permuted for it)
  kHalves,    // (i, i + dims/2): GPT-NeoX's layout, Gemma's
};

// Rotary position embedding of one layer: pair i of the first `dims`
// values of each head rotated by (pos / scaling) * base^(-2i/dims).
struct RopeParams {
  float base = 10000.0f;
  uint32_t dims = 0;      // even, at most head_dim
  float scaling = 1.0f;   // linear position scaling (1: none)
  RopePairs pairs = RopePairs::kAdjacent;
};

struct LayerAttention {
  AttentionKind kind = AttentionKind::kFull;
  uint32_t window = 0;  // kSlidingWindow only
  RopeParams rope;
};

class Architecture {
 public:
  virtual ~Architecture() = default;

  // The shape the decoder sizes its scratch and its checks by.
  virtual const ModelConfig& config() const = 0;
  // out[dim]: token's hidden state before the first layer.
  virtual void Embed(int32_t token, float* out) const = 0;
  virtual LayerAttention Layer(uint32_t l) const = 0;
  // p.x -> p.q, p.k, p.v (RoPE not applied yet).
  virtual void AttentionInputs(uint32_t l, const Pass& p) const = 0;
  // p.att -> p.xb.
  virtual void AttentionProjection(uint32_t l, const Pass& p) const = 0;
  // p.x -> p.xb.
  virtual void FeedForward(uint32_t l, const Pass& p) const = 0;
  // One token: x[dim] -> out[dim].
  virtual void FinalNorm(const float* x, float* out) const = 0;
  // [vocab][dim].
  virtual const WeightMatrix& OutputHead() const = 0;
};

// The architecture of `model` (it must outlive the result).
std::unique_ptr<Architecture> MakeArchitecture(const Model& model);

}  // namespace kvcache::model
