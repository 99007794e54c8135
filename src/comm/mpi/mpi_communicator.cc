#include "comm/mpi/mpi_communicator.h"

#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <algorithm>
#include <thread>
#include <vector>

#include "core/reduce_kernels.h"

namespace distribute::internal {
namespace {

using Clock = std::chrono::steady_clock;

// All-reduces of at most this many bytes gather every input and reduce locally.
constexpr std::size_t kGatherAllBytes = 4096;
// The tag of failure notices (on the notices communicator, nothing else is sent).
constexpr int kNoticeTag = 1;
// Polls of a pending request between two looks for failure notices.
constexpr unsigned kPollsPerNoticeProbe = 32;

void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

int to_int(std::size_t bytes, const CollectiveCall& call) {
  if (bytes > static_cast<std::size_t>(INT_MAX)) {
    throw UnimplementedError(std::string(call.op) + " #" + std::to_string(call.sequence) + ": " +
                             std::to_string(bytes) + " bytes in one MPI message; the MPI backend moves at most " +
                             std::to_string(INT_MAX) + " bytes per rank and call");
  }
  return static_cast<int>(bytes);
}

std::string seconds_text(double seconds) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", seconds);
  return text;
}

std::string label(const CollectiveCall& call) { return std::string(call.op) + " #" + std::to_string(call.sequence); }

}  // namespace

void ensure_mpi_initialized() {
  static std::once_flag once;
  std::call_once(once, [] {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      int provided = 0;
      MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
      std::atexit(finalize_at_exit);
    }
  });
  int provided = 0;
  MPI_Query_thread(&provided);
  if (provided < MPI_THREAD_SERIALIZED) {
    throw FailedPreconditionError(
        "MPI was initialised with a thread level below MPI_THREAD_SERIALIZED (provided " + std::to_string(provided) +
        "); distribute calls MPI from its replica threads one at a time and needs at least SERIALIZED");
  }
}

MpiCommunicator::MpiCommunicator(MPI_Comm comm) {
  ensure_mpi_initialized();
  CollectiveCall setup{.op = "MPI_Comm_dup"};
  check(MPI_Comm_dup(comm, &comm_), "MPI_Comm_dup", setup);
  check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler", setup);
  check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank", setup);
  check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size", setup);
  check(MPI_Comm_dup(comm_, &notices_), "MPI_Comm_dup", setup);
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  // A failed communicator may have a collective in flight; freeing it then
  // could wait for peers that never come, so it is left to MPI_Finalize.
  if (!finalized && comm_ != MPI_COMM_NULL && !failed_.load()) {
    MPI_Comm_free(&notices_);
    MPI_Comm_free(&comm_);
  }
}

MpiCommunicator::Token::Token(MpiCommunicator& c) : c_(c) {
  c_.token_.lock();
  c_.token_holder_.store(std::this_thread::get_id());
}

MpiCommunicator::Token::~Token() {
  c_.token_holder_.store(std::thread::id());
  c_.token_.unlock();
  c_.flush_notice();  // an abort() from another thread may have left its notice for us
}

void MpiCommunicator::flush_notice() noexcept {
  // Flag first, then try the token: whoever lets go of the token looks at the
  // flag again, so a notice is never left behind.
  while (notice_pending_.load(std::memory_order_acquire)) {
    if (token_holder_.load() == std::this_thread::get_id()) return;  // sent when this thread lets go
    if (!token_.try_lock()) return;                                    // the holder sends it
    if (notice_pending_.exchange(false)) {
      for (int q = 0; q < size_; ++q) {
        if (q == rank_) continue;
        MPI_Request request;
        // Small: MPI delivers it eagerly; nobody waits for its completion.
        if (MPI_Isend(notice_.data(), static_cast<int>(notice_.size()), MPI_CHAR, q, kNoticeTag, notices_,
                      &request) == MPI_SUCCESS) {
          MPI_Request_free(&request);
        }
      }
    }
    token_.unlock();
  }
}

void MpiCommunicator::receive_notice() {
  int arrived = 0;
  MPI_Status status;
  if (MPI_Iprobe(MPI_ANY_SOURCE, kNoticeTag, notices_, &arrived, &status) != MPI_SUCCESS || !arrived) return;
  int bytes = 0;
  MPI_Get_count(&status, MPI_CHAR, &bytes);
  std::string text(static_cast<std::size_t>(std::max(bytes, 0)), '\0');
  MPI_Recv(text.data(), bytes, MPI_CHAR, status.MPI_SOURCE, kNoticeTag, notices_, MPI_STATUS_IGNORE);
  std::lock_guard<std::mutex> lock(mu_);
  if (failed_.load()) return;
  failure_code_ = text.empty() ? ErrorCode::kAborted : static_cast<ErrorCode>(static_cast<unsigned char>(text[0]));
  failure_message_ = "Worker " + std::to_string(status.MPI_SOURCE) + " failed: " +
                     (text.empty() ? std::string("(no message)") : text.substr(1));
  failed_.store(true, std::memory_order_release);
}

void MpiCommunicator::throw_if_failed() {
  if (!failed_.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(mu_);
  throw_error(failure_code_, failure_message_);
}

void MpiCommunicator::abort(ErrorCode code, const std::string& message, int) noexcept {
  try {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (failed_.load()) return;
      failure_code_ = code;
      failure_message_ = message;
      notice_ = static_cast<char>(code) + message;
      failed_.store(true, std::memory_order_release);
    }
    notice_pending_.store(true, std::memory_order_release);
    flush_notice();
  } catch (...) {
  }
}

void MpiCommunicator::check(int mpi_result, const char* what, const CollectiveCall& call) {
  if (mpi_result == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(mpi_result, text, &len);
  const std::string message = label(call) + ": " + what + " failed on rank " + std::to_string(rank_) + ": " +
                              std::string(text, static_cast<std::size_t>(len)) +
                              "; this communicator cannot be used any more";
  abort(ErrorCode::kUnavailable, message, rank_);
  throw UnavailableError(message);
}

void MpiCommunicator::wait(MPI_Request& request, const CollectiveCall& call) {
  const Clock::time_point start = Clock::now();
  const bool bounded = call.timeout_seconds > 0;
  const Clock::time_point deadline =
      bounded ? start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(call.timeout_seconds))
              : Clock::time_point::max();
  for (unsigned polls = 0;; ++polls) {
    int done = 0;
    check(MPI_Test(&request, &done, MPI_STATUS_IGNORE), "MPI_Test", call);
    if (done) return;
    if (polls % kPollsPerNoticeProbe == kPollsPerNoticeProbe - 1) receive_notice();
    if (failed_.load(std::memory_order_acquire)) throw_if_failed();
    if (bounded && (polls & 63) == 0 && Clock::now() >= deadline) {
      const std::string message =
          label(call) + " timed out after " + seconds_text(call.timeout_seconds) + " s on rank " +
          std::to_string(rank_) + " of " + std::to_string(size_) +
          ": other processes did not take part in time (one may have died, or be busy elsewhere). An MPI "
          "collective cannot be cancelled, so this communicator cannot be used any more";
      abort(ErrorCode::kDeadlineExceeded, message, rank_);
      throw DeadlineExceededError(message);
    }
    // Progress needs MPI_Test calls; between them, give the core to others
    // (processes usually outnumber cores here).
    std::this_thread::yield();
  }
}

void MpiCommunicator::check_tags(const CollectiveCall& call) {
  if (call.signature_tag == 0) return;
  std::vector<std::uint64_t> tags(static_cast<std::size_t>(size_));
  std::uint64_t mine = call.signature_tag;
  MPI_Request request;
  check(MPI_Iallgather(&mine, 1, MPI_UINT64_T, tags.data(), 1, MPI_UINT64_T, comm_, &request), "MPI_Iallgather",
        call);
  wait(request, call);
  for (std::uint64_t t : tags) {
    if (t != tags[0] || (t & 1) != 0) throw SignatureMismatch();
  }
}

void MpiCommunicator::gather_bytes(const void* send, std::size_t send_bytes, void* recv,
                                   const std::vector<int>& counts, const CollectiveCall& call) {
  std::vector<int> displs(counts.size());
  long long at = 0;
  for (std::size_t q = 0; q < counts.size(); ++q) {
    displs[q] = to_int(static_cast<std::size_t>(at), call);
    at += counts[q];
  }
  MPI_Request request;
  check(MPI_Iallgatherv(send, to_int(send_bytes, call), MPI_BYTE, recv, counts.data(), displs.data(), MPI_BYTE,
                        comm_, &request),
        "MPI_Iallgatherv", call);
  wait(request, call);
}

std::vector<std::string> MpiCommunicator::exchange(std::string payload, const CollectiveCall& call) {
  Token token(*this);
  throw_if_failed();
  check_tags(call);
  std::vector<int> sizes(static_cast<std::size_t>(size_));
  int mine = to_int(payload.size(), call);
  MPI_Request request;
  check(MPI_Iallgather(&mine, 1, MPI_INT, sizes.data(), 1, MPI_INT, comm_, &request), "MPI_Iallgather", call);
  wait(request, call);
  std::size_t total = 0;
  for (int s : sizes) total += static_cast<std::size_t>(s);
  std::string all(total, '\0');
  gather_bytes(payload.data(), payload.size(), all.data(), sizes, call);
  std::vector<std::string> out;
  std::size_t at = 0;
  for (int s : sizes) {
    out.push_back(all.substr(at, static_cast<std::size_t>(s)));
    at += static_cast<std::size_t>(s);
  }
  return out;
}

void MpiCommunicator::all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op,
                                 const CollectiveCall& call, std::int64_t mean_divisor) {
  Token token(*this);
  throw_if_failed();
  check_tags(call);
  const std::size_t esz = size_of(dtype);
  const std::size_t bytes = count * esz;
  const std::int64_t divisor = mean_divisor > 0 ? mean_divisor : size_;
  const auto n = static_cast<std::size_t>(size_);
  if (size_ == 1) {
    const void* srcs[1] = {send};
    if (op == ReduceOp::kMean && divisor > 1) {
      reduce_sources(recv, srcs, count, dtype, op, divisor);
    } else if (send != recv && bytes > 0) {
      std::memcpy(recv, send, bytes);
    }
    return;
  }
  if (bytes == 0) return;
  std::vector<const void*> srcs(n);
  if (bytes <= kGatherAllBytes) {
    // Latency: one all-gather of every input, then every rank reduces them all
    // in rank order (the same bits everywhere).
    std::vector<std::byte> all(bytes * n);
    gather_bytes(send, bytes, all.data(), std::vector<int>(n, static_cast<int>(bytes)), call);
    for (std::size_t q = 0; q < n; ++q) srcs[q] = all.data() + q * bytes;
    reduce_sources(recv, srcs, count, dtype, op, divisor);
    return;
  }
  // Bandwidth: rank r receives slice r of every input, reduces it in rank
  // order, and the reduced slices are all-gathered into place.
  std::vector<int> slice_bytes(n), slice_displs(n);
  for (std::size_t q = 0; q < n; ++q) {
    const std::size_t begin = count * q / n, end = count * (q + 1) / n;
    slice_bytes[q] = to_int((end - begin) * esz, call);
    slice_displs[q] = to_int(begin * esz, call);
  }
  const auto me = static_cast<std::size_t>(rank_);
  const int my_bytes = slice_bytes[me];
  std::vector<std::byte> pieces(static_cast<std::size_t>(my_bytes) * n);
  std::vector<int> recv_counts(n, my_bytes), recv_displs(n);
  for (std::size_t q = 0; q < n; ++q) recv_displs[q] = to_int(q * static_cast<std::size_t>(my_bytes), call);
  MPI_Request request;
  check(MPI_Ialltoallv(send, slice_bytes.data(), slice_displs.data(), MPI_BYTE, pieces.data(), recv_counts.data(),
                       recv_displs.data(), MPI_BYTE, comm_, &request),
        "MPI_Ialltoallv", call);
  wait(request, call);
  for (std::size_t q = 0; q < n; ++q) srcs[q] = pieces.data() + q * static_cast<std::size_t>(my_bytes);
  auto* mine = static_cast<std::byte*>(recv) + slice_displs[me];
  reduce_sources(mine, srcs, static_cast<std::size_t>(my_bytes) / esz, dtype, op, divisor);
  check(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_BYTE, recv, slice_bytes.data(), slice_displs.data(), MPI_BYTE, comm_,
                        &request),
        "MPI_Iallgatherv", call);
  wait(request, call);
}

void MpiCommunicator::all_gather_v(const void* send, void* recv, std::span<const std::size_t> counts,
                                   std::size_t outer, DType dtype, const CollectiveCall& call) {
  Token token(*this);
  throw_if_failed();
  check_tags(call);
  const std::size_t esz = size_of(dtype);
  std::vector<int> bytes(counts.size());
  std::size_t total = 0;
  for (std::size_t q = 0; q < counts.size(); ++q) {
    bytes[q] = to_int(counts[q] * outer * esz, call);
    total += static_cast<std::size_t>(bytes[q]);
  }
  const std::size_t mine = static_cast<std::size_t>(bytes[static_cast<std::size_t>(rank_)]);
  if (outer == 1) {
    gather_bytes(send, mine, recv, bytes, call);
    return;
  }
  // Gathered rank by rank (each rank's `outer` rows together), then laid out
  // row by row: row o is every rank's row o, in rank order.
  std::vector<std::byte> staged(total);
  gather_bytes(send, mine, staged.data(), bytes, call);
  auto* dst = static_cast<std::byte*>(recv);
  for (std::size_t o = 0; o < outer; ++o) {
    std::size_t rank_start = 0;
    for (std::size_t q = 0; q < counts.size(); ++q) {
      const std::size_t row = counts[q] * esz;
      if (row) std::memcpy(dst, staged.data() + rank_start + o * row, row);
      dst += row;
      rank_start += static_cast<std::size_t>(bytes[q]);
    }
  }
}

void MpiCommunicator::broadcast(void* buffer, std::size_t count, DType dtype, int root, const CollectiveCall& call) {
  Token token(*this);
  throw_if_failed();
  check_tags(call);
  if (size_ == 1 || count == 0) return;
  MPI_Request request;
  check(MPI_Ibcast(buffer, to_int(count * size_of(dtype), call), MPI_BYTE, root, comm_, &request), "MPI_Ibcast",
        call);
  wait(request, call);
}

void MpiCommunicator::barrier(const CollectiveCall& call) {
  Token token(*this);
  throw_if_failed();
  if (call.signature_tag != 0) {
    check_tags(call);  // itself a synchronisation of every rank
    return;
  }
  MPI_Request request;
  check(MPI_Ibarrier(comm_, &request), "MPI_Ibarrier", call);
  wait(request, call);
}

}  // namespace distribute::internal
