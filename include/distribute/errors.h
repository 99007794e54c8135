// File: errors.h
//
// Typed errors of `distribute`, named after TensorFlow's `tf.errors` classes.
// Every public function reports failure by throwing one of these; none returns a
// status code. Collective errors are collective: every replica of a failed
// collective throws the same type with the same message.
//
//   try {
//     strategy.run(step_fn);
//   } catch (const distribute::AbortedError& e) {
//     // another replica failed; e.what() names it and its error
//   }
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

namespace distribute {

// The canonical codes used by TensorFlow (and abseil). Only those we raise.
enum class ErrorCode {
  kCancelled,
  kInvalidArgument,
  kDeadlineExceeded,
  kNotFound,
  kFailedPrecondition,
  kAborted,
  kOutOfRange,
  kUnimplemented,
  kInternal,
  kUnavailable,
  kResourceExhausted,
  kDataLoss,
};

std::string_view to_string(ErrorCode code);

// Root of every error `distribute` throws.
class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message);
  ErrorCode code() const noexcept { return code_; }
  // The message without the "<ClassName>: " prefix that what() does not carry.
  const std::string& message() const noexcept { return message_; }

 private:
  ErrorCode code_;
  std::string message_;
};

// (A class name cannot be parenthesised, whatever clang-tidy suggests.)
#define DISTRIBUTE_DEFINE_ERROR(Name, Code)                                        \
  class Name /* NOLINT(bugprone-macro-parentheses) */ : public Error {             \
   public:                                                                         \
    explicit Name(const std::string& message) : Error(ErrorCode::Code, message) {} \
  }

// Bad input: wrong axis, rank, dtype, shape, structure, option value.
DISTRIBUTE_DEFINE_ERROR(InvalidArgumentError, kInvalidArgument);
// Called in the wrong context or state (outside run, collectives out of order).
DISTRIBUTE_DEFINE_ERROR(FailedPreconditionError, kFailedPrecondition);
// A collective did not complete within its timeout.
DISTRIBUTE_DEFINE_ERROR(DeadlineExceededError, kDeadlineExceeded);
// This replica was stopped because another replica failed.
DISTRIBUTE_DEFINE_ERROR(AbortedError, kAborted);
// The operation exists in TensorFlow but not for this input or build.
DISTRIBUTE_DEFINE_ERROR(UnimplementedError, kUnimplemented);
// A transport or peer is gone.
DISTRIBUTE_DEFINE_ERROR(UnavailableError, kUnavailable);
// An index is past the end.
DISTRIBUTE_DEFINE_ERROR(OutOfRangeError, kOutOfRange);
// A broken invariant inside the library: a bug.
DISTRIBUTE_DEFINE_ERROR(InternalError, kInternal);
// A run was cancelled before it finished.
DISTRIBUTE_DEFINE_ERROR(CancelledError, kCancelled);
// A named thing (a device, a key) does not exist.
DISTRIBUTE_DEFINE_ERROR(NotFoundError, kNotFound);
// Memory (or another resource: threads) ran out; the message names what was asked for.
DISTRIBUTE_DEFINE_ERROR(ResourceExhaustedError, kResourceExhausted);
// Stored bytes are lost or corrupted (a checkpoint's CRC, size or header); the message names the file.
DISTRIBUTE_DEFINE_ERROR(DataLossError, kDataLoss);

#undef DISTRIBUTE_DEFINE_ERROR

// Throws the subclass of Error that matches `code`.
[[noreturn]] void throw_error(ErrorCode code, const std::string& message);

}  // namespace distribute
