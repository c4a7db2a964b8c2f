// Errors as values: Status and Result<T>.
//
// Every operation a caller can make fail (bad sizes, an exhausted pool, a
// truncate past the end, a malformed file) returns a Status or a Result<T>;
// nothing throws across the API and nothing aborts on bad input. An OK Status
// holds no allocation. A failing operation leaves its object unchanged.
//
// Thread safety: Status and Result are values; distinct objects may be used
// from different threads freely.
#pragma once

#include <cassert>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace kvcache {

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument,     // a value the caller passed is malformed or out of range
  kOutOfRange,          // an index or length past what exists (truncate past the end)
  kPoolExhausted,       // the block pool cannot satisfy an allocation or reservation
  kCapacityExceeded,    // a pre-sized cache or a reservation is full
  kFailedPrecondition,  // the object is in the wrong state (released cache, open draft)
  kNotFound,
  kUnimplemented,
  kIoError,             // a file could not be opened or read
  kCorruption,          // a file's contents are malformed or truncated
  kInternal,            // a broken internal invariant (a bug)
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  static Status InvalidArgument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
  static Status OutOfRange(std::string m) { return {StatusCode::kOutOfRange, std::move(m)}; }
  static Status PoolExhausted(std::string m) { return {StatusCode::kPoolExhausted, std::move(m)}; }
  static Status CapacityExceeded(std::string m) { return {StatusCode::kCapacityExceeded, std::move(m)}; }
  static Status FailedPrecondition(std::string m) { return {StatusCode::kFailedPrecondition, std::move(m)}; }
  static Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
  static Status Unimplemented(std::string m) { return {StatusCode::kUnimplemented, std::move(m)}; }
  static Status IoError(std::string m) { return {StatusCode::kIoError, std::move(m)}; }
  static Status Corruption(std::string m) { return {StatusCode::kCorruption, std::move(m)}; }
  static Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "OK" or "<CodeName>: <message>".
  std::string ToString() const;

  bool IsPoolExhausted() const { return code_ == StatusCode::kPoolExhausted; }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// Holds either a T or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {  // NOLINT
    assert(!status_.ok() && "Result built from an OK Status without a value");
    if (status_.ok()) status_ = Status::Internal("Result built from OK status without a value");
  }

  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }

  // REQUIRES: ok().
  T& value() & { assert(ok()); return *value_; }
  const T& value() const& { assert(ok()); return *value_; }
  T&& value() && { assert(ok()); return std::move(*value_); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace kvcache

#define KV_CONCAT_INNER_(a, b) a##b
#define KV_CONCAT_(a, b) KV_CONCAT_INNER_(a, b)

// Returns the Status of `expr` from the enclosing function if it is not OK.
#define KV_RETURN_IF_ERROR(expr)                        \
  do {                                                  \
    ::kvcache::Status kv_status_ = (expr);              \
    if (!kv_status_.ok()) return kv_status_;            \
  } while (0)

// `lhs = value of expr`, or returns its Status from the enclosing function.
#define KV_ASSIGN_OR_RETURN(lhs, expr) \
  KV_ASSIGN_OR_RETURN_IMPL_(KV_CONCAT_(kv_result_, __LINE__), lhs, expr)
#define KV_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return tmp.status();             \
  lhs = std::move(tmp).value()
