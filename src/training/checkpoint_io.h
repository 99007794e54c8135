// The file operations of a checkpoint save, each one a point where a test
// can make the save fail or the process die (fault injection): every
// write, fsync, rename and unlink goes through here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace distribute::internal::checkpoint_io {

// Tests: this thread's operation `after` operations from now (0: the next
// one) fails with an I/O error (kFail) or kills the process with SIGKILL
// (kCrash). Counted per thread, so that a test whose threads stand for
// workers can fail one of them.
enum class Fault { kNone, kFail, kCrash };
void inject_fault(std::int64_t after, Fault fault);
// Operations done by this thread so far (a test counts a save's points).
std::int64_t operations();
// This thread's count and injected fault, handed to the thread that does a
// save's work for it (an asynchronous save), and back when it is done, so
// that a test counts and injects as if the caller did the work.
struct ThreadFaults {
  std::int64_t done = 0;
  std::int64_t fault_at = -1;
  Fault kind = Fault::kNone;
};
ThreadFaults take_thread_faults();
void put_thread_faults(const ThreadFaults& faults);

// Throws the error for errno `err` of `op` on `path`: no space or a file
// too large -> ResourceExhaustedError, no permission or a read-only
// filesystem -> FailedPreconditionError, no such file -> NotFoundError,
// anything else -> UnavailableError.
[[noreturn]] void throw_io_error(const std::string& op, const std::string& path, int err);

// A file created for writing (it must not exist); removed on destruction
// unless close() succeeded.
class OutFile {
 public:
  explicit OutFile(std::string path);
  ~OutFile();
  OutFile(const OutFile&) = delete;
  OutFile& operator=(const OutFile&) = delete;
  void write(const void* data, std::size_t n);
  // fsync, then close.
  void sync_and_close();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
  bool closed_ = false;
};

// rename(2): atomically replaces `to`.
void rename_file(const std::string& from, const std::string& to);
// fsync of a directory, so that the names renamed or created in it last.
void sync_directory(const std::string& dir);
// unlink(2); a file already gone is not an error.
void remove_file(const std::string& path);

// A step of the save protocol that touches no file (a worker awaiting the
// commit): counted as an operation, so that a test can fail a worker there.
void protocol_point(const std::string& what, const std::string& path);

// Whole-file reads (no fault points: reads change nothing).
bool file_exists(const std::string& path);
std::string read_small_file(const std::string& path, std::size_t limit);

}  // namespace distribute::internal::checkpoint_io
