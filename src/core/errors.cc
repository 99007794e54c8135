#include "distribute/errors.h"

namespace distribute {

std::string_view to_string(ErrorCode code) {
  switch (code) {
    case ErrorCode::kCancelled: return "CancelledError";
    case ErrorCode::kInvalidArgument: return "InvalidArgumentError";
    case ErrorCode::kDeadlineExceeded: return "DeadlineExceededError";
    case ErrorCode::kNotFound: return "NotFoundError";
    case ErrorCode::kFailedPrecondition: return "FailedPreconditionError";
    case ErrorCode::kAborted: return "AbortedError";
    case ErrorCode::kOutOfRange: return "OutOfRangeError";
    case ErrorCode::kUnimplemented: return "UnimplementedError";
    case ErrorCode::kInternal: return "InternalError";
    case ErrorCode::kUnavailable: return "UnavailableError";
    case ErrorCode::kResourceExhausted: return "ResourceExhaustedError";
    case ErrorCode::kDataLoss: return "DataLossError";
  }
  return "Error";
}

Error::Error(ErrorCode code, const std::string& message)
    : std::runtime_error(message), code_(code), message_(message) {}

void throw_error(ErrorCode code, const std::string& message) {
  switch (code) {
    case ErrorCode::kCancelled: throw CancelledError(message);
    case ErrorCode::kInvalidArgument: throw InvalidArgumentError(message);
    case ErrorCode::kDeadlineExceeded: throw DeadlineExceededError(message);
    case ErrorCode::kNotFound: throw NotFoundError(message);
    case ErrorCode::kFailedPrecondition: throw FailedPreconditionError(message);
    case ErrorCode::kAborted: throw AbortedError(message);
    case ErrorCode::kOutOfRange: throw OutOfRangeError(message);
    case ErrorCode::kUnimplemented: throw UnimplementedError(message);
    case ErrorCode::kInternal: throw InternalError(message);
    case ErrorCode::kUnavailable: throw UnavailableError(message);
    case ErrorCode::kResourceExhausted: throw ResourceExhaustedError(message);
    case ErrorCode::kDataLoss: throw DataLossError(message);
  }
  throw InternalError(message);
}

}  // namespace distribute
