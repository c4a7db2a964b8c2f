// Status names and formatting.
#include "kvcache/status.h"

namespace kvcache {

std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kInvalidArgument: return "InvalidArgument";
    case StatusCode::kOutOfRange: return "OutOfRange";
    case StatusCode::kPoolExhausted: return "PoolExhausted";
    case StatusCode::kCapacityExceeded: return "CapacityExceeded";
    case StatusCode::kFailedPrecondition: return "FailedPrecondition";
    case StatusCode::kNotFound: return "NotFound";
    case StatusCode::kUnimplemented: return "Unimplemented";
    case StatusCode::kIoError: return "IoError";
    case StatusCode::kCorruption: return "Corruption";
    case StatusCode::kInternal: return "Internal";
  }
  return "Unknown";
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  std::string s(StatusCodeName(code_));
  s += ": ";
  s += message_;
  return s;
}

}  // namespace kvcache
