#include "training/checkpoint_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <utility>

#include "distribute/errors.h"

namespace distribute::internal::checkpoint_io {
namespace {

thread_local std::int64_t done = 0;
thread_local std::int64_t fault_at = -1;
thread_local Fault fault_kind = Fault::kNone;

// Counts one operation; acts out an injected fault on it.
void point(const std::string& op, const std::string& path) {
  const std::int64_t n = done++;
  if (n != fault_at) return;
  fault_at = -1;
  if (fault_kind == Fault::kCrash) {
    std::raise(SIGKILL);
  }
  throw_io_error(op + " (injected fault)", path, EIO);
}

}  // namespace

void inject_fault(std::int64_t after, Fault fault) {
  fault_kind = fault;
  fault_at = fault == Fault::kNone ? -1 : done + after;
}

std::int64_t operations() { return done; }

ThreadFaults take_thread_faults() {
  ThreadFaults f{done, fault_at, fault_kind};
  fault_at = -1;
  fault_kind = Fault::kNone;
  return f;
}

void put_thread_faults(const ThreadFaults& faults) {
  done = faults.done;
  fault_at = faults.fault_at;
  fault_kind = faults.kind;
}

void throw_io_error(const std::string& op, const std::string& path, int err) {
  const std::string message = op + " '" + path + "': " + std::strerror(err);
  switch (err) {
    case ENOSPC:
    case EDQUOT:
    case EFBIG: throw ResourceExhaustedError(message);
    case EACCES:
    case EPERM:
    case EROFS: throw FailedPreconditionError(message);
    case ENOENT:
    case ENOTDIR: throw NotFoundError(message);
    default: throw UnavailableError(message);
  }
}

OutFile::OutFile(std::string path) : path_(std::move(path)) {
  point("create", path_);
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd_ < 0) throw_io_error("create", path_, errno);
}

OutFile::~OutFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!closed_) ::unlink(path_.c_str());
}

void OutFile::write(const void* data, std::size_t n) {
  point("write", path_);
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw_io_error("write", path_, errno);
    }
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}

void OutFile::sync_and_close() {
  point("fsync", path_);
  if (::fsync(fd_) != 0) throw_io_error("fsync", path_, errno);
  const int fd = std::exchange(fd_, -1);
  if (::close(fd) != 0) throw_io_error("close", path_, errno);
  closed_ = true;
}

void rename_file(const std::string& from, const std::string& to) {
  point("rename", to);
  if (::rename(from.c_str(), to.c_str()) != 0) throw_io_error("rename to", to, errno);
}

void sync_directory(const std::string& dir) {
  point("fsync", dir);
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw_io_error("open directory", dir, errno);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) throw_io_error("fsync", dir, err);
}

void remove_file(const std::string& path) {
  point("unlink", path);
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) throw_io_error("unlink", path, errno);
}

void protocol_point(const std::string& what, const std::string& path) { point(what, path); }

bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string read_small_file(const std::string& path, std::size_t limit) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw_io_error("open", path, errno);
  std::string out;
  char buf[65536];
  for (;;) {
    const ssize_t r = ::read(fd, buf, sizeof buf);
    if (r < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      throw_io_error("read", path, err);
    }
    if (r == 0) break;
    out.append(buf, static_cast<std::size_t>(r));
    if (out.size() > limit) {
      ::close(fd);
      throw DataLossError("'" + path + "' is larger than " + std::to_string(limit) + " bytes: not a checkpoint file");
    }
  }
  ::close(fd);
  return out;
}

}  // namespace distribute::internal::checkpoint_io
