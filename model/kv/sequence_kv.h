// SequenceKv: the part of a KvBackend kept in a kvcache sequence that does
// not depend on which one -- the open pass (the positions [base, base +
// size) that Extend added) and the pass protocol of kv_backend.h around it.
// CacheKv keeps a SequenceCache, HybridKv a HybridSequence; `Seq` is either
// (num_tokens(), num_tokens(layer), Truncate, Fork).
//
// Extend(n) fails with CapacityExceeded past max_seq_len, then runs the
// backend's BeforePass, then opens the pass. Store(layer) requires the
// layer to end where the pass starts (CheckStore), Attend(layer) requires
// it to hold the whole pass (CheckAttend); Truncate closes the pass at the
// new length; Fork copies the sequence (WithSequence builds the backend
// around the copy) and the pass. Errors begin with the backend's name.
//
// Thread safety: one sequence, one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "kvcache/status.h"
#include "model/kv/kv_backend.h"

namespace kvcache::model {

template <class Seq>
class SequenceKv : public KvBackend {
 public:
  uint32_t num_tokens() const override { return base_ + pass_; }

  Status Extend(uint32_t n) override {
    const uint32_t len = seq_.num_tokens();
    if (static_cast<uint64_t>(len) + n > shape_.max_seq_len) {
      return Status::CapacityExceeded(std::string(name_) + ": " + std::to_string(len + n) +
                                      " positions exceed max_seq_len " +
                                      std::to_string(shape_.max_seq_len));
    }
    KV_RETURN_IF_ERROR(BeforePass(len, n));
    base_ = len;
    pass_ = n;
    return Status::Ok();
  }

  Status Truncate(uint32_t num_tokens) override {
    KV_RETURN_IF_ERROR(seq_.Truncate(num_tokens));
    ClosePass(num_tokens);
    return Status::Ok();
  }

  uint32_t window(uint32_t layer) const override { return shape_.window(layer); }

  Result<std::unique_ptr<KvBackend>> Fork() override {
    KV_ASSIGN_OR_RETURN(Seq copy, seq_.Fork());
    std::unique_ptr<SequenceKv> kv = WithSequence(std::move(copy));
    kv->base_ = base_;
    kv->pass_ = pass_;
    return std::unique_ptr<KvBackend>(std::move(kv));
  }

 protected:
  // name: the errors' prefix ("cache kv").
  SequenceKv(const char* name, const AttentionShape& shape, Seq seq)
      : name_(name), shape_(shape), seq_(std::move(seq)) {}

  // The same backend (options, shape) around `seq`, with no pass open.
  virtual std::unique_ptr<SequenceKv> WithSequence(Seq seq) const = 0;
  // Extend's own checks and work, after the capacity check and before a
  // pass of n positions opens after the sequence's len; on an error
  // nothing is opened.
  virtual Status BeforePass(uint32_t len, uint32_t n) {
    (void)len;
    (void)n;
    return Status::Ok();
  }

  // FailedPrecondition unless `layer` ends where the pass starts.
  Status CheckStore(uint32_t layer) const {
    const uint32_t held = seq_.num_tokens(layer);
    if (held != base_) {
      return Status::FailedPrecondition(std::string(name_) + ": layer " + std::to_string(layer) +
                                        " holds " + std::to_string(held) +
                                        " positions, the pass starts at " + std::to_string(base_));
    }
    return Status::Ok();
  }
  // FailedPrecondition unless `layer` holds the whole pass.
  Status CheckAttend(uint32_t layer) const {
    if (seq_.num_tokens(layer) != base_ + pass_) {
      return Status::FailedPrecondition(std::string(name_) + ": attend before store");
    }
    return Status::Ok();
  }
  // No pass open; the sequence holds len positions.
  void ClosePass(uint32_t len) {
    base_ = len;
    pass_ = 0;
  }
  uint32_t pass_tokens() const { return pass_; }

  const char* name_;
  AttentionShape shape_;
  Seq seq_;

 private:
  uint32_t base_ = 0;  // positions before the open pass
  uint32_t pass_ = 0;  // positions of the open pass
};

}  // namespace kvcache::model
