// MpiCommunicator: the Communicator of one process among the processes of an
// MPI communicator (one member per process; the runtime calls it from one
// thread at a time).
//
// Results follow the threads backend exactly: every element of an all_reduce
// is combined in rank order by the same kernels (src/core/reduce_kernels.h),
// so all ranks get the same bits, for every dtype and op, float16 and bfloat16
// included, and MEAN, MIN, MAX and PRODUCT behave as documented in
// docs/semantics.md. MPI moves bytes only (MPI_BYTE); it never reduces.
//
// Every rank on one host (the common case of several processes per machine,
// and ctest's): the ranks map memory they share (NodeSharedMemory), and
// every call begins with a step there in which each rank says what it calls
// (kind, tag, sizes) and the ranks compare, before any data is read:
//   all_reduce up to 64 KiB: the inputs through the shared buffers in that
//          step; every rank reduces all of them;
//   all_reduce up to 4 MiB: chunk by chunk, rank r reduces slice r of every
//          input in the shared buffers, every rank copies the slices out;
//   all-gathers of blocks up to 8 KiB, broadcasts and exchanges up to
//          512 KiB: through the shared buffers in that step;
//   larger all-gathers: every rank reads the others' blocks where they are
//          (process_vm_readv, the kernel's single copy), then a second step;
//   anything larger: through MPI as between hosts, below, after that step.
// DISTRIBUTE_MPI_SHARED_MEMORY=0 keeps every call on MPI's path, and
// DISTRIBUTE_MPI_SINGLE_COPY=0 large all-gathers.
//
// Between hosts, all_reduce:
//   small (<= 64 KiB): the inputs ride in the header round (below), and
//          every rank reduces all of them locally;
//   medium (<= 1 MiB received per rank): every rank sends its input to every
//          other and reduces all of them (one round);
//   large: all-to-all of slices (rank r receives slice r of every input),
//          reduce slice r in rank order, all-gather the reduced slices.
//
// All data moves point to point (MPI_Isend / MPI_Irecv): OpenMPI's
// non-blocking collectives cost microseconds of scheduling per round. MPI
// counts are ints, so a block of more than max_message_bytes() (1 GiB)
// travels as several messages, one after the other under the same tag (MPI
// matches messages between two ranks in order): no size is too large.
// DISTRIBUTE_MPI_MAX_MESSAGE_BYTES sets a smaller piece, down to 1000 bytes
// (the smallest any rank asks for), so that tests take that path with small
// tensors.
//
// The header round (between hosts): a collective whose CollectiveCall carries a signature tag
// begins with one message from every rank to every other: a 16-byte header
// (the tag and a size) followed by up to 64 KiB of data, received into
// buffers of the largest size. Every kind of call begins the same way, so ranks that
// disagree still match at the MPI level and all see the tags differ before
// any result is delivered; small all_reduces, all-gathers and exchanges, and
// barriers, need no other round. A larger tagged all-gather posts its blocks
// alongside the header round instead of after it (posted_gather).
//
// No call blocks without bound: every request is polled with MPI_Testall
// (without pause for the first 200 us, then yielding between polls), so
// a timeout raises DeadlineExceededError and abort() raises
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
//
// Departures reach them too, so that no rank waits for one that is gone.
// A rank leaves for good when its communicator is destroyed or MPI is
// finalised (at exit, by an attribute of MPI_COMM_SELF that MPI_Finalize
// deletes first), and ends a session when its user says so (end_session):
// either way every other rank is sent the number of calls it made. A rank in,
// or entering, a later call raises FailedPreconditionError naming the one
// that left, at once; a call that the leaver made still completes. The
// processes of peers on this host are watched besides (pidfd): one that ends
// without a word (SIGKILL, a crash) fails the calls waiting for it with
// UnavailableError within about 10 ms plus a grace of 100 ms, no timeout
// needed. docs/errors.md, "A worker that leaves".
#pragma once

#include <mpi.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "comm/mpi/node_shared_memory.h"
#include "distribute/communicator.h"

namespace distribute::internal {

// Initialises MPI (MPI_THREAD_SERIALIZED at least) unless the program has,
// and finalises it at exit if it was initialised here. Throws
// FailedPreconditionError if MPI gives a lower thread level.
void ensure_mpi_initialized();

// Where an MPI call's receives write, or where its sends read: the caller's
// buffer, or the communicator's own (MpiCommunicator::release).
struct MpiArea {
  void* data = nullptr;
  std::size_t bytes = 0;
};

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
  // Whether calls go through memory that all ranks map (every rank on one
  // host, and DISTRIBUTE_MPI_SHARED_MEMORY not "0").
  bool uses_node_shared_memory() const { return shared_ != nullptr; }
  // Whether, besides, every rank reads the others' memory with the kernel's
  // single copy (process_vm_readv; DISTRIBUTE_MPI_SINGLE_COPY not "0").
  bool uses_single_copy() const { return shared_ != nullptr && shared_->single_copy(); }
  // The most bytes one MPI message carries; larger blocks go in pieces.
  std::size_t max_message_bytes() const { return max_message_bytes_; }
  static constexpr std::size_t kMaxMessageBytes = std::size_t{1} << 30;
  // The smallest piece a setting may ask for: smaller ones would only make
  // requests by the million (a request per piece).
  static constexpr std::size_t kMinMessageBytes = 1000;

  std::vector<std::string> exchange(std::string payload, const CollectiveCall& call) override;
  void all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op, const CollectiveCall& call,
                  std::int64_t mean_divisor = 0) override;
  void all_gather_v(const void* send, void* recv, std::span<const std::size_t> counts, std::size_t outer, DType dtype,
                    const CollectiveCall& call) override;
  void broadcast(void* buffer, std::size_t count, DType dtype, int root, const CollectiveCall& call) override;
  void barrier(const CollectiveCall& call) override;
  void abort(ErrorCode code, const std::string& message, int origin_rank) noexcept override;
  std::uint64_t session() const noexcept override { return session_start_.load(std::memory_order_relaxed); }
  void end_session(std::uint64_t session, std::string_view why) noexcept override;
  // Every live communicator of this process leaves for good, saying `why`,
  // and refuses later calls (MPI_Finalize calls it before it finalises).
  static void leave_all(const char* why) noexcept;
  // How long an ended process is given before the calls waiting for it fail:
  // what it sent before it ended may still be on its way.
  static constexpr std::chrono::milliseconds kDeathGrace{100};
  // How often a waiting rank looks at the processes of its peers on this host.
  static constexpr std::chrono::milliseconds kHealthCheckPeriod{10};

  // The most data one rank sends inside the header round.
  static constexpr std::size_t kInlineBytes = 64 * 1024 - 16;
  // All-gathers whose largest block is at most this many bytes move the
  // blocks inside the header round; larger ones send each block as a message
  // of its own, alongside the header round (posted_gather) or, beyond what
  // MPI's tags can name or one message carries (max_message_bytes()), after
  // it. Measured at 2 workers (docs/history/benchmarks.md,
  // multi-worker): 32 KiB blocks took 8.3 to 9.5 us posted, 9.9 to 26.9
  // inside the header round (OpenMPI sends a two-part datatype that large
  // through its own buffers).
  static constexpr std::size_t kPostedGatherBytes = std::size_t{16} << 10;
  static_assert(kPostedGatherBytes <= kInlineBytes);
  // On one host, all-gathers whose largest block is at most this many bytes
  // move every block through the shared buffers in one step (a copy in, a
  // copy out); larger ones read every block where it is with the kernel's
  // single copy (single_copy_gather), if it can be had. Measured at 2
  // workers (docs/history/benchmarks.md, multi-worker): with 16 KiB blocks the
  // single copy took 5.0-5.7 us and the buffers 4.0-4.3, but 13.5 in one of
  // three runs, when the host was in a state that slows memory shared
  // between processes; with 32 KiB blocks, 6.9-8.4 us against 7.7 (25 in
  // that run).
  static constexpr std::size_t kSharedGatherBytes = std::size_t{8} << 10;
  static_assert(kSharedGatherBytes <= NodeSharedMemory::kChunkBytes);

 private:
  using Area = MpiArea;
  struct Header {
    std::uint64_t tag = 0;
    std::uint64_t size = 0;  // what the call says; the inline data, if any, follows
  };
  struct Received {
    Header header;
    const std::byte* data = nullptr;  // inline data (`inline_bytes` of it)
    std::size_t inline_bytes = 0;
  };
  // Set in Header::size by a posted all-gather (posted_gather): a block
  // message of the size in the low bits follows the header, with MPI tag
  // block_tag(size).
  static constexpr std::uint64_t kBlockFollows = std::uint64_t{1} << 63;
  // A posted all-gather's block travels under an MPI tag made of its size
  // and the parity of the header round it belongs to:
  //  - a receive posted for another size cannot match it (matching it and
  //    truncating it is no option: OpenMPI 4.1 writes a truncated
  //    single-copy message past the end of the receive buffer);
  //  - a receive cancelled after a mismatch cannot match the same peer's
  //    block of the next call, which may be sent before the cancel (a peer
  //    sends its block without waiting for headers); the call after that
  //    needs this rank's next header first.
  static constexpr int kFirstBlockTag = 16;
  static int block_tag(std::size_t bytes, std::uint64_t round) {
    return kFirstBlockTag + 2 * static_cast<int>(bytes) + static_cast<int>(round & 1);
  }
  // The size of the block that peer q's header (this round's) announced, if any.
  std::optional<std::size_t> announced_block(std::size_t q) const {
    const std::uint64_t size = received_[q].header.size;
    if (q == me() || !(size & kBlockFollows)) return std::nullopt;
    return static_cast<std::size_t>(size & ~kBlockFollows);
  }
  // The largest block with a tag of its own, sent as one message.
  std::size_t largest_tagged_block() const {
    return std::min(static_cast<std::size_t>(tag_ub_ - kFirstBlockTag - 1) / 2, max_message_bytes_);
  }
  // The point-to-point messages of one call: its receives (into `area`),
  // all posted before its sends (from `sent`), waited for together.
  struct Messages {
    Messages(Area into, Area from) : area(into), sent(from) {}
    std::vector<MPI_Request> requests;
    int receives = 0;
    Area area, sent;
  };
  // Post the receive (the send) of `bytes` from (to) `peer` as messages of at
  // most max_message_bytes_, in order; none for 0 bytes. Both sides cut the
  // same bytes alike, so the pieces match in order. If MPI refuses one,
  // what `m` has posted is released (release()) before the error is thrown.
  void post_receive(Messages& m, void* into, std::size_t bytes, int peer, int tag, const CollectiveCall& call);
  void post_send(Messages& m, const void* from, std::size_t bytes, int peer, int tag, const CollectiveCall& call);
  void post_failed(Messages& m, int mpi_result, const char* what, const CollectiveCall& call);
  // wait_all for everything `m` has posted.
  void wait(Messages& m, const CollectiveCall& call) {
    wait_all(m.requests.data(), static_cast<int>(m.requests.size()), m.receives, call, m.area, m.sent);
  }
  // The header round: sends {tag, size} and `inline_bytes` (<= kInlineBytes)
  // of `data` to every other rank; returns every rank's, in rank order.
  // Throws SignatureMismatch on every rank if the tags differ, after
  // receiving and dropping the blocks that peers in a posted all-gather sent.
  const std::vector<Received>& header_round(std::uint64_t tag, std::uint64_t size, const void* data,
                                            std::size_t inline_bytes, const CollectiveCall& call);
  // header_round in two halves: post its receives and sends, then wait for
  // them and compare the tags. On a mismatch, receives and drops the blocks
  // that peers announced and that no receive of this rank matches
  // (`sizes_posted[q]`: the size of the receive posted for peer q's block;
  // nullptr: none posted).
  void post_header_round(std::uint64_t tag, std::uint64_t size, const void* data, std::size_t inline_bytes,
                         const CollectiveCall& call);
  const std::vector<Received>& finish_header_round(const CollectiveCall& call,
                                                   const std::vector<std::size_t>* sizes_posted);
  // all_gather_v of bytes (outer == 1) with a tag, in one round: every block's
  // receive is posted into place before the headers are sent, and each block
  // follows its header at once. On a mismatch every block sent is received
  // (into place if its size is the one expected, else dropped) and every
  // receive left unmatched is cancelled, so nothing is left in flight;
  // `recv`'s blocks of other ranks then hold whatever arrived. Without
  // `place_own`, this rank's own block of `recv` is left as it is (a caller
  // that reads its input where it is).
  void posted_gather(const void* send, std::size_t send_bytes, std::byte* recv, const std::vector<std::size_t>& counts,
                     const CollectiveCall& call, bool place_own = true);
  // Polls `done()` until it returns true, watching the timeout, abort and
  // other ranks' failure notices in between (defined in
  // mpi_communicator_internal.h: its callers are in several files).
  template <class Done>
  void poll(const CollectiveCall& call, Done&& done);
  // The header round with the tag alone, if the call has one.
  void check_tags(const CollectiveCall& call);
  // Waits for all `count` requests (the first `receives` of them receives,
  // into `area`; the others sends, from `sent`), polling for timeout, abort
  // and other ranks' failure notices. If it throws, the requests are
  // released first (release()).
  void wait_all(MPI_Request* requests, int count, int receives, const CollectiveCall& call, Area area = {},
                Area sent = {}, MPI_Status* statuses = nullptr);
  void poll_all(MPI_Request* requests, int count, const CollectiveCall& call, MPI_Status* statuses);
  // Cancels pending receives and frees every request, after a failure. A
  // receive that a message is already filling cannot be cancelled: if one is
  // left, `area` is quarantined (core/storage.h), so that its storage is
  // never reused while MPI may still write into it. A send cannot be
  // cancelled either: one left pending (its peer late, or the way to it full)
  // may read `sent` at any later time and deliver it to a peer that then
  // completes its call, so `sent` is quarantined too: tensor storage is
  // never freed or reused, though its owner may still write into it. Other
  // memory is the caller's to keep alive and unchanged.
  static void release(MPI_Request* requests, int count, int receives, Area area, Area sent) noexcept;
  // A buffer of at least `bytes`, reused from call to call.
  std::byte* scratch(std::size_t bytes);
  std::size_t me() const { return static_cast<std::size_t>(rank_); }
  void check(int mpi_result, const char* what, const CollectiveCall& call);
  void throw_if_failed();
  // On one host (shared_), every call begins with a step of its own whose
  // data (if any) the caller has written into this rank's buffer of that
  // step: shared_begin publishes `mine` as step `step`, waits until every
  // rank has taken it, and compares what they said. Tags that differ (or an
  // odd tag): SignatureMismatch on every rank, the communicator still usable.
  // Calls that differ otherwise (untagged calls of different kinds, sizes or
  // layouts of an all-gather's blocks): InvalidArgumentError on every rank,
  // the communicator closed.
  enum class Kind : std::uint32_t { kExchange = 1, kAllReduce, kAllGather, kBroadcast, kBarrier };
  void shared_begin(std::uint64_t step, const NodeSharedMemory::Call& mine, const CollectiveCall& call);
  // Before data moves through MPI: shared_begin on one host (a step without
  // data), else the header round with the tag, if the call has one.
  void agree(const NodeSharedMemory::Call& mine, const CollectiveCall& call);
  // This rank has finished `step`; waits until every rank has.
  void shared_step(std::uint64_t step, const CollectiveCall& call);
  // all_reduce through node shared memory, chunk by chunk, two steps per
  // chunk: every rank writes the slices of its input that others reduce into
  // its buffer; rank r reduces slice r of every input into its next buffer;
  // every rank copies the reduced slices out. The first chunk's first step
  // is the call's shared_begin.
  void shared_all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op,
                         std::int64_t divisor, const NodeSharedMemory::Call& mine, const CollectiveCall& call);
  // all_gather_v of bytes (outer == 1) on one host with single_copy(): two
  // steps, the blocks read where they are in between.
  void single_copy_gather(const void* send, std::size_t send_bytes, std::byte* recv,
                          const std::vector<std::size_t>& counts, NodeSharedMemory::Call mine,
                          const CollectiveCall& call);
  // The calls of one host: exchange, all_gather_v of blocks up to
  // NodeSharedMemory::kChunkBytes, and broadcast (from the shared buffers up
  // to kChunkBytes; larger, the data through MPI after shared_begin).
  std::vector<std::string> shared_exchange(std::string payload, const CollectiveCall& call);
  // A copy of an exchange's payload in tensor storage, to send from: a send
  // left pending by a failure then reads memory that is quarantined, not a
  // string freed by then (release()).
  static std::shared_ptr<std::byte> sendable(const std::string& payload);
  void shared_broadcast(void* buffer, std::size_t bytes, DType dtype, int root, const CollectiveCall& call);
  // The root sends `bytes` to every other rank, point to point.
  void broadcast_bytes(void* buffer, std::size_t bytes, int root, const CollectiveCall& call);
  // all_gather_v of bytes, outer == 1 (`place_own`: as posted_gather's).
  void gather_bytes(const void* send, std::size_t send_bytes, void* recv, const std::vector<std::size_t>& counts,
                    const CollectiveCall& call, bool place_own = true);

  // The right to call MPI, held for a whole operation.
  class Token {
   public:
    explicit Token(MpiCommunicator& c);
    ~Token();
    Token(const Token&) = delete;
    Token& operator=(const Token&) = delete;

   private:
    MpiCommunicator& c_;
    int unwinding_ = std::uncaught_exceptions();  // more at the end: the call was abandoned
  };
  // Sends this rank's failure notice to every other rank, once, if one is
  // pending and the token can be had (its holder sends it otherwise).
  void flush_notice() noexcept;
  // The start of every notice: this communicator's nonce, then `kind`.
  std::string notice_head(char kind) const;
  // Receives every notice that has arrived: a failure is recorded as this
  // communicator's, a departure in departures_ (token held).
  void receive_notices();
  // The start of every call (token held): the group's failure, if any; the
  // count; a departure that leaves this call without a partner.
  void begin_call(const CollectiveCall& call);
  // What a rank said when it left: for good (its communicator destroyed,
  // MPI finalised) or at the end of a session (end_session).
  struct Departure {
    int rank = 0;
    std::uint64_t calls = 0;    // the calls it had made
    std::uint64_t session = 0;  // the session it ended (a session's end only)
    bool for_good = true;
    std::string why;
  };
  // Fails the group (FailedPreconditionError) if a departed rank did not
  // make the call in progress (calls_), unless it ended a session other than
  // the one this rank is in (session_start_); drops such departures.
  void check_departures(const CollectiveCall& call);
  // Sends a departure notice ('L': for good, 'S': the end of `session`) to
  // every other rank: waits up to a second for the token, and leaves the
  // notice to its holder if it cannot have it (flush_departure, from poll
  // and ~Token).
  void send_departure(char kind, std::string_view why, std::uint64_t session = 0) noexcept;
  // Sends the pending departure notice, if any (token held); waits up to a
  // second for the sends.
  // `abandoned`: the call in progress will not complete (its holder gives it
  // up), so the notice counts the calls before it; so does one sent after a
  // call that ended in an exception (last_call_abandoned_).
  void flush_departure(bool abandoned = false) noexcept;
  // Opens a pidfd on the process of every other rank on this host (same
  // MPI shared-memory node and pid namespace); collective over comm_.
  void watch_local_peers();
  // A watched peer whose process has ended, or -1 (one that said it left
  // for good is not watched any more).
  int ended_peer();
  [[noreturn]] void fail_for_ended_peer(int peer, const CollectiveCall& call);

  static constexpr std::size_t kCopiedInlineBytes = 1024;
  // What the header round sends from: this rank's header, and the header
  // with a little data behind it. On the heap, so that a failed
  // communicator can leave it to sends still pending.
  struct Outbox {
    Header header;
    std::array<std::byte, sizeof(Header) + kCopiedInlineBytes> small{};
  };
  std::unique_ptr<Outbox> out_ = std::make_unique<Outbox>();
  Area header_sent_;                  // the caller's data that the header round sends in place, if any
  std::vector<std::byte> header_in_;  // every other rank's message, header + kInlineBytes each
  std::vector<Received> received_;
  std::uint64_t header_rounds_ = 0;           // header rounds started; the same count on every rank
  std::vector<MPI_Request> header_requests_;  // reused: the header round is every small call's path
  std::vector<MPI_Request> block_requests_;   // reused by posted_gather
  std::vector<MPI_Status> header_statuses_;
  std::unique_ptr<NodeSharedMemory> shared_;  // null: every rank not on one host, or turned off
  std::shared_ptr<std::byte> scratch_;
  std::shared_ptr<std::byte> drain_;  // blocks received and dropped after a mismatch
  std::size_t scratch_bytes_ = 0;
  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Comm notices_ = MPI_COMM_NULL;  // failure notices only
  std::timed_mutex token_;
  std::atomic<std::thread::id> token_holder_{};
  std::atomic<bool> notice_pending_{false};
  // Error code byte + message; made once, before notice_pending_; never
  // freed once sent (flush_notice lets its sends go unfinished).
  std::unique_ptr<std::string> notice_;
  int rank_ = 0;
  int size_ = 1;
  int tag_ub_ = 32767;  // MPI_TAG_UB of comm_ (at least 32767 by the standard)
  std::size_t max_message_bytes_ = kMaxMessageBytes;
  std::uint64_t nonce_ = 0;  // the same on every rank, made anew for each communicator
  std::uint64_t calls_ = 0;  // calls begun, the same count on every rank (token held)
  // The number of the last call that started a session (written with the
  // token held; read by session()).
  std::atomic<std::uint64_t> session_start_{0};
  std::vector<Departure> departures_;         // (token held)
  std::vector<std::pair<int, int>> watched_;  // (rank, pidfd) of the peers on this host
  bool left_ = false;                         // this rank has left for good (token held)
  bool last_call_abandoned_ = false;          // the last call ended in an exception (token held)
  std::atomic<bool> departure_pending_{false};
  // MPI is being finalised (leave_all): a call in progress stops calling MPI.
  std::atomic<bool> finalizing_{false};
  [[noreturn]] void throw_finalizing(const CollectiveCall& call);
  std::string pending_departure_;  // kind, then why (mu_)
  std::mutex mu_;
  std::atomic<bool> failed_{false};
  ErrorCode failure_code_ = ErrorCode::kUnavailable;
  std::string failure_message_;
};

}  // namespace distribute::internal
