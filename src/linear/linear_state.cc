// LinearState: committed state, scratch lane and draft replay (contract in
// kvcache/linear_state.h). Every public mutator validates everything first
// and only then touches state, so a failing call changes nothing.
#include "kvcache/linear_state.h"

#include <cmath>
#include <string>
#include <utility>

#include "linear/linear_kernels.h"

namespace kvcache {
namespace {

bool AllFinite(std::span<const float> x) {
  for (float f : x) {
    if (!std::isfinite(f)) return false;
  }
  return true;
}

// Allowed gate range per rule: g in [0, 1], β in [0, 2].
float GateMax(LinearRule rule) { return rule == LinearRule::kDelta ? 2.0f : 1.0f; }

Status CheckGates(LinearRule rule, std::span<const float> gates, const char* what) {
  const float hi = GateMax(rule);
  for (size_t i = 0; i < gates.size(); ++i) {
    const float g = gates[i];
    if (!(g >= 0.0f && g <= hi)) {  // also rejects NaN
      return Status::InvalidArgument(std::string(what) + "[" + std::to_string(i) + "] = " +
                                     std::to_string(g) + " is outside [0, " +
                                     std::to_string(static_cast<int>(hi)) + "] for rule " +
                                     std::string(LinearRuleName(rule)));
    }
  }
  return Status::Ok();
}

}  // namespace

std::string_view LinearRuleName(LinearRule rule) {
  switch (rule) {
    case LinearRule::kPlain: return "plain";
    case LinearRule::kDecay: return "decay";
    case LinearRule::kDelta: return "delta";
  }
  return "unknown";
}

Result<LinearRule> ParseLinearRule(std::string_view name) {
  for (LinearRule r : {LinearRule::kPlain, LinearRule::kDecay, LinearRule::kDelta}) {
    if (name == LinearRuleName(r)) return r;
  }
  return Status::InvalidArgument("unknown linear rule '" + std::string(name) +
                                 "' (plain, decay, delta)");
}

Result<LinearState> LinearState::Create(const LinearStateOptions& o) {
  if (o.n_heads == 0 || o.n_heads > kMaxHeads) {
    return Status::InvalidArgument("linear state: n_heads = " + std::to_string(o.n_heads) +
                                   " must be in [1, " + std::to_string(kMaxHeads) + "]");
  }
  if (o.d_k == 0 || o.d_k > kMaxDim || o.d_v == 0 || o.d_v > kMaxDim) {
    return Status::InvalidArgument("linear state: d_k = " + std::to_string(o.d_k) +
                                   ", d_v = " + std::to_string(o.d_v) + " must be in [1, " +
                                   std::to_string(kMaxDim) + "]");
  }
  if (o.rule != LinearRule::kPlain && o.rule != LinearRule::kDecay &&
      o.rule != LinearRule::kDelta) {
    return Status::InvalidArgument("linear state: unknown rule");
  }
  if (o.max_draft_tokens == 0) {
    return Status::InvalidArgument("linear state: max_draft_tokens must be >= 1");
  }
  if (!o.head_gate.empty()) {
    if (o.rule == LinearRule::kPlain) {
      return Status::InvalidArgument("linear state: rule plain takes no head_gate");
    }
    if (o.head_gate.size() != o.n_heads) {
      return Status::InvalidArgument("linear state: head_gate has " +
                                     std::to_string(o.head_gate.size()) + " values, want n_heads = " +
                                     std::to_string(o.n_heads));
    }
    KV_RETURN_IF_ERROR(CheckGates(o.rule, o.head_gate, "head_gate"));
  }
  return LinearState(o);
}

LinearState::LinearState(LinearStateOptions options)
    : options_(std::move(options)), state_(state_size(), 0.0) {}

Status LinearState::Validate(const LinearInputs& in, std::span<float> out,
                             size_t* n_tokens) const {
  const size_t H = options_.n_heads;
  const size_t k_per_token = H * options_.d_k;
  const size_t v_per_token = H * options_.d_v;
  if (in.k.size() % k_per_token != 0) {
    return Status::InvalidArgument("linear append: k has " + std::to_string(in.k.size()) +
                                   " values, not a multiple of n_heads * d_k = " +
                                   std::to_string(k_per_token));
  }
  const size_t n = in.k.size() / k_per_token;
  if (in.v.size() != n * v_per_token) {
    return Status::InvalidArgument("linear append: v has " + std::to_string(in.v.size()) +
                                   " values, want " + std::to_string(n * v_per_token) + " for " +
                                   std::to_string(n) + " tokens");
  }
  if (options_.rule == LinearRule::kPlain) {
    if (!in.gate.empty()) {
      return Status::InvalidArgument("linear append: rule plain takes no gate");
    }
  } else if (!in.gate.empty()) {
    if (in.gate.size() != n * H) {
      return Status::InvalidArgument("linear append: gate has " + std::to_string(in.gate.size()) +
                                     " values, want n_tokens * n_heads = " +
                                     std::to_string(n * H));
    }
    KV_RETURN_IF_ERROR(CheckGates(options_.rule, in.gate, "gate"));
  }
  if (in.q.empty()) {
    if (!out.empty()) {
      return Status::InvalidArgument("linear append: out given without q");
    }
  } else {
    if (in.q.size() != n * k_per_token) {
      return Status::InvalidArgument("linear append: q has " + std::to_string(in.q.size()) +
                                     " values, want " + std::to_string(n * k_per_token));
    }
    if (out.size() != n * v_per_token) {
      return Status::InvalidArgument("linear append: out has " + std::to_string(out.size()) +
                                     " values, want " + std::to_string(n * v_per_token));
    }
  }
  if (!AllFinite(in.k) || !AllFinite(in.v) || !AllFinite(in.q)) {
    return Status::InvalidArgument("linear append: non-finite value in k, v or q");
  }
  if (in_draft_ && draft_tokens_ + n > options_.max_draft_tokens) {
    return Status::CapacityExceeded("linear append: draft would hold " +
                                    std::to_string(draft_tokens_ + n) +
                                    " tokens, max_draft_tokens = " +
                                    std::to_string(options_.max_draft_tokens));
  }
  *n_tokens = n;
  return Status::Ok();
}

Status LinearState::Append(const LinearInputs& in, std::span<float> out) {
  size_t n = 0;
  KV_RETURN_IF_ERROR(Validate(in, out, &n));
  if (n == 0) return Status::Ok();
  const linear::Shape shape{options_.n_heads, options_.d_k, options_.d_v};
  const size_t H = options_.n_heads;

  // Gates resolved to [n][n_heads] (per-token values or the head defaults).
  std::vector<float> gates;
  if (options_.rule != LinearRule::kPlain) {
    if (!in.gate.empty()) {
      gates.assign(in.gate.begin(), in.gate.end());
    } else {
      gates.resize(n * H);
      for (size_t t = 0; t < n; ++t) {
        for (size_t h = 0; h < H; ++h) {
          gates[t * H + h] = options_.head_gate.empty() ? 1.0f : options_.head_gate[h];
        }
      }
    }
  }
  const float* q = in.q.empty() ? nullptr : in.q.data();
  float* o = in.q.empty() ? nullptr : out.data();
  if (in_draft_) {
    draft_k_.insert(draft_k_.end(), in.k.begin(), in.k.end());
    draft_v_.insert(draft_v_.end(), in.v.begin(), in.v.end());
    draft_gate_.insert(draft_gate_.end(), gates.begin(), gates.end());
    draft_tokens_ += static_cast<uint32_t>(n);
    linear::ApplyTokens(options_.rule, shape, n, in.k.data(), in.v.data(), gates.data(), q, o,
                        scratch_.data());
  } else {
    linear::ApplyTokens(options_.rule, shape, n, in.k.data(), in.v.data(), gates.data(), q, o,
                        state_.data());
    num_tokens_ += n;
  }
  return Status::Ok();
}

Status LinearState::Read(std::span<const float> q, std::span<float> out) const {
  const size_t qn = static_cast<size_t>(options_.n_heads) * options_.d_k;
  const size_t on = static_cast<size_t>(options_.n_heads) * options_.d_v;
  if (q.size() != qn || out.size() != on) {
    return Status::InvalidArgument("linear read: q has " + std::to_string(q.size()) +
                                   " values (want " + std::to_string(qn) + "), out " +
                                   std::to_string(out.size()) + " (want " + std::to_string(on) +
                                   ")");
  }
  if (!AllFinite(q)) return Status::InvalidArgument("linear read: non-finite value in q");
  const linear::Shape shape{options_.n_heads, options_.d_k, options_.d_v};
  linear::Read(shape, in_draft_ ? scratch_.data() : state_.data(), q.data(), out.data());
  return Status::Ok();
}

Status LinearState::BeginDraft() {
  if (in_draft_) {
    return Status::FailedPrecondition("linear state: a draft is already open (no nesting)");
  }
  scratch_ = state_;
  in_draft_ = true;
  draft_tokens_ = 0;
  return Status::Ok();
}

Status LinearState::Commit(uint32_t num_accepted) {
  if (!in_draft_) return Status::FailedPrecondition("linear commit: no draft is open");
  if (num_accepted > draft_tokens_) {
    return Status::OutOfRange("linear commit: " + std::to_string(num_accepted) +
                              " tokens accepted but only " + std::to_string(draft_tokens_) +
                              " drafted");
  }
  if (num_accepted == draft_tokens_) {
    // The scratch lane went through exactly these tokens' operations.
    state_.swap(scratch_);
  } else if (num_accepted > 0) {
    const linear::Shape shape{options_.n_heads, options_.d_k, options_.d_v};
    linear::ApplyTokens(options_.rule, shape, num_accepted, draft_k_.data(), draft_v_.data(),
                        draft_gate_.data(), nullptr, nullptr, state_.data());
  }
  num_tokens_ += num_accepted;
  return Abort();
}

Status LinearState::Abort() {
  if (!in_draft_) return Status::FailedPrecondition("linear abort: no draft is open");
  in_draft_ = false;
  draft_tokens_ = 0;
  std::vector<double>().swap(scratch_);
  draft_k_.clear();
  draft_v_.clear();
  draft_gate_.clear();
  return Status::Ok();
}

void LinearState::Clear() {
  if (in_draft_) (void)Abort();
  std::fill(state_.begin(), state_.end(), 0.0);
  num_tokens_ = 0;
}

size_t LinearState::memory_bytes() const {
  return (state_.capacity() + scratch_.capacity()) * sizeof(double) +
         (draft_k_.capacity() + draft_v_.capacity() + draft_gate_.capacity()) * sizeof(float);
}

}  // namespace kvcache
