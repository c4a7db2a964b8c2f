// The recurrent state of one linear-attention layer of one sequence, with a
// scratch lane for speculative decoding.
//
// A linear layer keeps no K/V rows. Each head h holds a state matrix
// S_h [d_k][d_v] in f64, updated once per token from that token's key k
// [d_k], value v [d_v] and (for the gated rules) one scalar per head:
//
//   kPlain   S += k vᵀ
//   kDecay   S = g·S + k vᵀ                  g in [0, 1] (decay / forget gate)
//   kDelta   S += β k (v − Sᵀk)ᵀ             β in [0, 2] (delta-rule step size)
//
// and the layer's output for a query q [d_k] is o = Sᵀq [d_v], read after the
// token's own update. g or β come per token and head from the caller, or from
// the per-head defaults in the options when a token gives none.
//
// Arithmetic. Inputs are f32 and widened exactly to f64; every update and
// read is element-wise multiplies and adds in a fixed order (sums over d_k in
// ascending index order, no fused multiply-add), so the SIMD path equals the
// scalar reference (linear_reference.h) bit for bit on every target.
//
// Speculative lane. BeginDraft() copies the committed state into a scratch
// lane; tokens appended while the draft is open update only the scratch lane
// (reads see it too) and their inputs are kept. Commit(a) then applies the
// first a drafted tokens to the committed state by replaying their stored
// inputs through the same kernel (when a equals the number drafted, the
// scratch lane, which went through exactly those operations, is moved in
// instead), so the committed state is bit for bit what appending only those
// a tokens would have produced. Abort() drops the scratch lane; the committed
// state was never touched. Replaying inputs costs a·n_heads·(d_k+d_v+1) floats
// of memory instead of one d_k·d_v snapshot per drafted token.
//
// Errors: wrong sizes, non-finite values, gates out of range, a nested draft,
// a commit of more tokens than drafted, a commit or abort without a draft and
// a draft over max_draft_tokens return a Status and change nothing.
//
// Thread safety: none; one LinearState is used by one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "kvcache/status.h"

namespace kvcache {

enum class LinearRule : uint8_t {
  kPlain,  // S += k vᵀ
  kDecay,  // S = g·S + k vᵀ
  kDelta,  // S += β k (v − Sᵀk)ᵀ
};

// "plain", "decay", "delta".
std::string_view LinearRuleName(LinearRule rule);
Result<LinearRule> ParseLinearRule(std::string_view name);

struct LinearStateOptions {
  uint32_t n_heads = 0;
  uint32_t d_k = 0;
  uint32_t d_v = 0;
  LinearRule rule = LinearRule::kPlain;
  // [n_heads] g (kDecay) or β (kDelta) used for tokens that pass no gate;
  // empty means 1 for every head. Must be empty for kPlain.
  std::vector<float> head_gate = {};
  // Most tokens one draft may hold (bounds the stored draft inputs).
  uint32_t max_draft_tokens = 256;
};

// Inputs of n tokens for one layer. Shapes (n = k.size() / (n_heads * d_k)):
//   k    [n][n_heads][d_k]
//   v    [n][n_heads][d_v]
//   gate [n][n_heads]        g or β per token and head; empty = head_gate.
//                            Must be empty for kPlain.
//   q    [n][n_heads][d_k]   queries whose outputs are wanted; may be empty.
struct LinearInputs {
  std::span<const float> k = {};
  std::span<const float> v = {};
  std::span<const float> gate = {};
  std::span<const float> q = {};
};

class LinearState {
 public:
  static constexpr uint32_t kMaxDim = 4096;
  static constexpr uint32_t kMaxHeads = 1024;

  // InvalidArgument on zero or oversized dimensions, a head_gate of the wrong
  // size or out of range, a head_gate on kPlain, or max_draft_tokens == 0.
  static Result<LinearState> Create(const LinearStateOptions& options);

  LinearState(LinearState&&) = default;
  LinearState& operator=(LinearState&&) = default;
  // A deep copy, draft lane included (explicit so its cost is visible).
  LinearState Copy() const { return LinearState(*this); }

  const LinearStateOptions& options() const { return options_; }
  uint32_t n_heads() const { return options_.n_heads; }
  uint32_t d_k() const { return options_.d_k; }
  uint32_t d_v() const { return options_.d_v; }
  LinearRule rule() const { return options_.rule; }

  // Tokens applied to the committed state.
  uint64_t num_tokens() const { return num_tokens_; }
  bool in_draft() const { return in_draft_; }
  // Tokens appended since BeginDraft (0 outside a draft).
  uint32_t draft_tokens() const { return draft_tokens_; }

  // Applies the tokens in order to the committed state, or to the scratch
  // lane while a draft is open. If inputs.q is not empty, writes
  // out [n][n_heads][d_v] = Sᵀq after each token's update; out must be empty
  // otherwise. Zero tokens is a no-op.
  Status Append(const LinearInputs& inputs, std::span<float> out = {});

  // out [n_heads][d_v] = Sᵀq for q [n_heads][d_k] on the current lane
  // (scratch while a draft is open), without updating anything.
  Status Read(std::span<const float> q, std::span<float> out) const;

  // FailedPrecondition if a draft is already open.
  Status BeginDraft();
  // Keeps the first num_accepted drafted tokens and closes the draft.
  // FailedPrecondition without a draft, OutOfRange if num_accepted >
  // draft_tokens().
  Status Commit(uint32_t num_accepted);
  // Closes the draft, leaving the committed state as it was.
  // FailedPrecondition without a draft.
  Status Abort();

  // Committed state, [n_heads][d_k][d_v].
  std::span<const double> state() const { return state_; }
  // Scratch lane, [n_heads][d_k][d_v]; empty outside a draft.
  std::span<const double> scratch() const { return scratch_; }

  // Zeroes the state, forgets every token and any open draft.
  void Clear();
  // Bytes held: state, scratch lane and stored draft inputs.
  size_t memory_bytes() const;

 private:
  explicit LinearState(LinearStateOptions options);
  LinearState(const LinearState&) = default;
  LinearState& operator=(const LinearState&) = default;

  size_t state_size() const {
    return static_cast<size_t>(options_.n_heads) * options_.d_k * options_.d_v;
  }
  // Checks sizes and values; on success sets *n_tokens.
  Status Validate(const LinearInputs& inputs, std::span<float> out, size_t* n_tokens) const;

  LinearStateOptions options_;
  uint64_t num_tokens_ = 0;
  std::vector<double> state_;    // [n_heads][d_k][d_v]
  std::vector<double> scratch_;  // [n_heads][d_k][d_v] while a draft is open, else empty
  bool in_draft_ = false;
  uint32_t draft_tokens_ = 0;
  // Inputs of the drafted tokens, gates resolved (kept for Commit's replay).
  std::vector<float> draft_k_;     // [draft_tokens][n_heads][d_k]
  std::vector<float> draft_v_;     // [draft_tokens][n_heads][d_v]
  std::vector<float> draft_gate_;  // [draft_tokens][n_heads]; empty for kPlain
};

}  // namespace kvcache
