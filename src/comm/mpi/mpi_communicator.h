// MpiCommunicator: the Communicator of one process among the processes of an
// MPI communicator (one member per process; the runtime calls it from one
// thread at a time).
//
// Results follow the threads backend exactly: every element of an all_reduce
// is combined in rank order by the same kernels (src/core/reduce_kernels.h),
// so all ranks get the same bits, for every dtype and op, float16 and bfloat16
// included, and MEAN, MIN, MAX and PRODUCT behave as documented in
// docs/semantics.md. MPI moves bytes only (MPI_BYTE); it never reduces:
//   small (<= 4 KiB): all-gather every input, reduce all of them locally;
//   large: all-to-all of slices (rank r receives slice r of every input),
//          reduce slice r in rank order, all-gather the reduced slices.
//
// No call blocks without bound: each is a non-blocking MPI collective polled
// with MPI_Test, so a timeout raises DeadlineExceededError and abort() raises
// the abort's error. MPI cannot cancel a started collective, so after either
// the communicator is broken for good (UnavailableError). MPI errors become
// UnavailableError with MPI's own message.
//
// Failures reach the other ranks: a failure found here (abort(), a timeout,
// an MPI error) is sent to every other rank as a short message on a second,
// private communicator, and every rank's polling loop watches for such
// messages; a rank that receives one fails with the sender's error code and
// message ("Worker 1 failed: ..."). MPI is called by one thread at a time (the
// "token"); abort() from another thread leaves its message for the token's
// holder to send when it lets go.
#pragma once

#include <mpi.h>

#include <atomic>
#include <mutex>
#include <string>
#include <thread>

#include "distribute/communicator.h"

namespace distribute::internal {

// Initialises MPI (MPI_THREAD_SERIALIZED at least) unless the program has,
// and finalises it at exit if it was initialised here. Throws
// FailedPreconditionError if MPI gives a lower thread level.
void ensure_mpi_initialized();

class MpiCommunicator final : public Communicator {
 public:
  // Works on a duplicate of `comm`, with errors returned rather than fatal.
  explicit MpiCommunicator(MPI_Comm comm = MPI_COMM_WORLD);
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view backend_name() const override { return "mpi"; }

  std::vector<std::string> exchange(std::string payload, const CollectiveCall& call) override;
  void all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op,
                  const CollectiveCall& call, std::int64_t mean_divisor = 0) override;
  void all_gather_v(const void* send, void* recv, std::span<const std::size_t> counts, std::size_t outer,
                    DType dtype, const CollectiveCall& call) override;
  void broadcast(void* buffer, std::size_t count, DType dtype, int root, const CollectiveCall& call) override;
  void barrier(const CollectiveCall& call) override;
  void abort(ErrorCode code, const std::string& message, int origin_rank) noexcept override;

 private:
  // Compares signature tags across ranks (one small all-gather); throws
  // SignatureMismatch on every rank if they differ.
  void check_tags(const CollectiveCall& call);
  // Waits for `request`, polling for timeout and abort.
  void wait(MPI_Request& request, const CollectiveCall& call);
  void check(int mpi_result, const char* what, const CollectiveCall& call);
  void throw_if_failed();
  // all_gather_v of bytes, outer == 1.
  void gather_bytes(const void* send, std::size_t send_bytes, void* recv, const std::vector<int>& counts,
                    const CollectiveCall& call);

  // The right to call MPI, held for a whole operation.
  class Token {
   public:
    explicit Token(MpiCommunicator& c);
    ~Token();
    Token(const Token&) = delete;
    Token& operator=(const Token&) = delete;

   private:
    MpiCommunicator& c_;
  };
  // Sends this rank's failure notice to every other rank, once, if one is
  // pending and the token can be had (its holder sends it otherwise).
  void flush_notice() noexcept;
  // If another rank's failure notice has arrived, records it (token held).
  void receive_notice();

  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Comm notices_ = MPI_COMM_NULL;  // failure notices only
  std::mutex token_;
  std::atomic<std::thread::id> token_holder_{};
  std::atomic<bool> notice_pending_{false};
  std::string notice_;  // error code byte + message; written once, before notice_pending_
  int rank_ = 0;
  int size_ = 1;
  std::mutex mu_;
  std::atomic<bool> failed_{false};
  ErrorCode failure_code_ = ErrorCode::kUnavailable;
  std::string failure_message_;
};

}  // namespace distribute::internal
