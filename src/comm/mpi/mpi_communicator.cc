#include "comm/mpi/mpi_communicator.h"

#include <poll.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstdio>
#include <cerrno>
#include <cstring>
#include <algorithm>
#include <new>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "core/reduce_kernels.h"
#include "core/seconds.h"
#include "core/storage.h"
#include "core/whole_number.h"

namespace distribute::internal {
namespace {

using Clock = std::chrono::steady_clock;

// The tag of failure notices (on the notices communicator, nothing else is sent).
constexpr int kNoticeTag = 1;
// The tag of point-to-point data messages (on the data communicator).
constexpr int kDataTag = 2;
// The tag of the header round's messages.
constexpr int kHeaderTag = 3;
// All-reduces that receive at most this many bytes per rank in all gather
// every input and reduce locally (one round); larger ones scatter slices.
// Measured at 2 workers: from 2 MiB of input, halving each rank's reduction
// work beats saving a round (docs/benchmarks.md, multi-worker).
constexpr std::size_t kGatherAllBytes = 1 << 20;
// All-reduces of more than 64 KiB and at most this many bytes go through node
// shared memory when every rank is on one host. Measured at 2 workers
// (docs/benchmarks.md, multi-worker): 1.2 to 1.9x faster than MPI's single
// copy from 256 KiB to 4 MiB, but 1.5x slower at 8 MiB, where the lock-step
// chunks cost more than the kernel's copy.
constexpr std::size_t kSharedAllReduceBytes = std::size_t{4} << 20;
// On one host, all-reduces of at most this many bytes move every input
// through the shared buffers in one step and every rank reduces all of them
// (as the header round does between hosts); larger ones are reduced slice by
// slice (shared_all_reduce).
constexpr std::size_t kSharedReduceAllBytes = std::size_t{64} << 10;
static_assert(kSharedReduceAllBytes <= NodeSharedMemory::kChunkBytes);
// How long a wait polls MPI without pause before it starts yielding the core
// between polls. Measured at 2 workers (docs/benchmarks.md, multi-worker):
// yielding from the first poll cost 1 to 4 us per call, 1.2 to 1.5x
// MPI_Allgatherv from 8 KiB to 512 KiB; 50 and 200 us both removed that, and
// 3 workers on 2 cores did not slow down. 200 us covers a whole 2 MiB call.
constexpr auto kSpinBeforeYield = std::chrono::microseconds(200);
// Polls of a pending request between two looks for failure notices.
constexpr unsigned kPollsPerNoticeProbe = 32;

// A peer's process ended without a word (found by its pidfd): MPI_Finalize
// would wait for it for ever (OpenMPI's finalisation meets every process).
std::atomic<bool> g_peer_process_ended{false};

void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (g_peer_process_ended.load()) {
    std::fprintf(stderr,
                 "distribute: MPI is not finalised at exit: the process of another worker ended without leaving, "
                 "and MPI_Finalize would wait for it\n");
    return;
  }
  // Outside MPI, before MPI_Finalize: a replica thread still in a call can
  // send the notice in its turn and stop calling MPI.
  MpiCommunicator::leave_all("its process is ending");
  MPI_Finalize();
}

// MPI_Finalize deletes MPI_COMM_SELF's attributes first, while MPI still
// works: every live communicator says that this process leaves.
int leave_at_finalize(MPI_Comm, int, void*, void*) {
  MpiCommunicator::leave_all("its process called MPI_Finalize");  // (at exit, done already)
  return MPI_SUCCESS;
}

// The communicators alive in this process (never destroyed: MPI_Finalize
// may run from an exit handler after static destructors).
struct Registry {
  std::mutex mu;
  std::vector<MpiCommunicator*> live;
};
Registry& registry() {
  static Registry* r = new Registry();
  return *r;
}

// The kinds of notice, the first byte of each.
constexpr char kFailureNotice = 'F';
constexpr char kLeftNotice = 'L';
constexpr char kSessionEndNotice = 'S';

std::string ordinal(std::uint64_t n) {
  const char* suffix = (n % 100 >= 11 && n % 100 <= 13) ? "th"
                       : n % 10 == 1                   ? "st"
                       : n % 10 == 2                   ? "nd"
                       : n % 10 == 3                   ? "rd"
                                                       : "th";
  return std::to_string(n) + suffix;
}

// DISTRIBUTE_MPI_MAX_MESSAGE_BYTES as a piece size, or 0 if it is not a
// whole number of bytes from kMinMessageBytes to kMaxMessageBytes.
int parse_message_bytes(const char* text) {
  const std::optional<std::size_t> bytes = parse_whole_number(text);
  return bytes && *bytes >= MpiCommunicator::kMinMessageBytes && *bytes <= MpiCommunicator::kMaxMessageBytes
             ? static_cast<int>(*bytes)
             : 0;
}

std::string seconds_text(double seconds) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", seconds);
  return text;
}

std::string label(const CollectiveCall& call) { return std::string(call.op) + " #" + std::to_string(call.sequence); }

// FNV-1a of every rank's block size: ranks that agree on them all agree on
// this (never 0, which says "no layout").
std::uint64_t hash_layout(const std::vector<std::size_t>& bytes) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (std::size_t b : bytes) {
    for (int i = 0; i < 8; ++i) h = (h ^ ((static_cast<std::uint64_t>(b) >> (8 * i)) & 0xff)) * 0x100000001b3ull;
  }
  return h == 0 ? 1 : h;
}

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
    registry();  // made before MPI_Finalize can need it
    int keyval = MPI_KEYVAL_INVALID;
    if (MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, leave_at_finalize, &keyval, nullptr) == MPI_SUCCESS) {
      MPI_Comm_set_attr(MPI_COMM_SELF, keyval, nullptr);
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
  try {
    CollectiveCall setup{.op = "MPI_Comm_dup"};
    check(MPI_Comm_dup(comm, &comm_), "MPI_Comm_dup", setup);
    check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler", setup);
    check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank", setup);
    check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size", setup);
    int* tag_ub = nullptr;
    int has_tag_ub = 0;
    check(MPI_Comm_get_attr(comm_, MPI_TAG_UB, &tag_ub, &has_tag_ub), "MPI_Comm_get_attr", setup);
    if (has_tag_ub && tag_ub != nullptr) tag_ub_ = *tag_ub;
    check(MPI_Comm_dup(comm_, &notices_), "MPI_Comm_dup", setup);
    // Notices carry this communicator's nonce: MPI reuses a freed
    // communicator's context for a new one, and a notice sent to the old one
    // but not received there would be taken for the new one's.
    if (rank_ == 0) {
      std::random_device random;
      nonce_ = (std::uint64_t{random()} << 32) ^ random() ^ static_cast<std::uint64_t>(getpid());
    }
    check(MPI_Bcast(&nonce_, 1, MPI_UINT64_T, 0, comm_), "MPI_Bcast", setup);
    // One piece size on every rank (the smallest asked for), or an error on
    // every rank naming the first rank whose setting is not a size.
    struct {
      int bytes;
      int rank;
    } piece{static_cast<int>(kMaxMessageBytes), rank_}, agreed{};
    static_assert(kMaxMessageBytes <= static_cast<std::size_t>(INT_MAX));
    const char* piece_text = std::getenv("DISTRIBUTE_MPI_MAX_MESSAGE_BYTES");
    if (piece_text != nullptr) piece.bytes = parse_message_bytes(piece_text);
    check(MPI_Allreduce(&piece, &agreed, 1, MPI_2INT, MPI_MINLOC, comm_), "MPI_Allreduce", setup);
    if (agreed.bytes <= 0) {
      MPI_Comm_free(&notices_);
      MPI_Comm_free(&comm_);
      throw InvalidArgumentError("DISTRIBUTE_MPI_MAX_MESSAGE_BYTES on rank " + std::to_string(agreed.rank) +
                                 " is not a whole number of bytes from " + std::to_string(kMinMessageBytes) +
                                 " to " + std::to_string(kMaxMessageBytes) +
                                 (agreed.rank == rank_ ? " (it is \"" + std::string(piece_text) + "\")" : ""));
    }
    max_message_bytes_ = static_cast<std::size_t>(agreed.bytes);
    // Shared memory only if every rank wants it: a launcher that passes the
    // switch to some ranks only (across hosts without -x) must not leave the
    // others alone in create()'s collectives.
    const char* shared = std::getenv("DISTRIBUTE_MPI_SHARED_MEMORY");
    int wanted = shared == nullptr || std::strcmp(shared, "0") != 0 ? 1 : 0;
    check(MPI_Allreduce(MPI_IN_PLACE, &wanted, 1, MPI_INT, MPI_MIN, comm_), "MPI_Allreduce", setup);
    if (wanted == 1) shared_ = NodeSharedMemory::create(comm_, rank_, size_);
    watch_local_peers();
  } catch (...) {
    for (const auto& [peer, fd] : watched_) close(fd);
    // A failure here (an MPI error) may have sent this rank's notice, and
    // a throwing constructor runs no destructor: leave the notice and the
    // header buffers to MPI, as a failed communicator does.
    if (failed_.load()) {
      new std::unique_ptr<std::string>(std::move(notice_));
      new std::unique_ptr<Outbox>(std::move(out_));
    }
    throw;
  }
  const std::lock_guard<std::mutex> lock(registry().mu);
  registry().live.push_back(this);
}

MpiCommunicator::~MpiCommunicator() {
  {
    const std::lock_guard<std::mutex> lock(registry().mu);
    std::erase(registry().live, this);
  }
  for (const auto& [peer, fd] : watched_) close(fd);
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && !failed_.load()) send_departure(kLeftNotice, "its communicator was destroyed");
  // A failed communicator may have a collective in flight; freeing it then
  // could wait for peers that never come, so it is left to MPI_Finalize.
  // The notices' communicator is never freed: peers may still send to it
  // (their departures), and MPI would give its context to a later
  // communicator, whose notices from those peers would then queue behind
  // messages numbered for this one, never to be matched (seen with
  // OpenMPI's ob1: a failure notice that never arrived). It holds one of
  // MPI's contexts for the process's life.
  if (!finalized && comm_ != MPI_COMM_NULL && !failed_.load()) {
    MPI_Comm_free(&comm_);
    return;
  }
  // Failed: a receive that could not be cancelled may still write into the
  // internal buffers, so they outlive the communicator (a deliberate leak,
  // bounded by the buffers of one failed communicator).
  if (failed_.load()) {
    new std::vector<std::byte>(std::move(header_in_));
    new std::unique_ptr<Outbox>(std::move(out_));
    // The notice's sends were let go unfinished: MPI may still read it (it
    // does when earlier messages to a peer still hold the way, unreceived).
    new std::unique_ptr<std::string>(std::move(notice_));
    new std::shared_ptr<std::byte>(std::move(scratch_));
    new std::shared_ptr<std::byte>(std::move(drain_));
  }
}

std::byte* MpiCommunicator::scratch(std::size_t bytes) {
  if (scratch_bytes_ < bytes) {
    scratch_ = allocate_storage(bytes);
    scratch_bytes_ = bytes;
  }
  return scratch_.get();
}

MpiCommunicator::Token::Token(MpiCommunicator& c) : c_(c) {
  c_.token_.lock();
  c_.token_holder_.store(std::this_thread::get_id());
}

MpiCommunicator::Token::~Token() {
  // A departure that another thread left to the token's holder (a thread
  // ending the process while this one was in a call).
  // A call left by an exception may not have completed on every rank: a
  // departure sent later counts the calls before it.
  c_.last_call_abandoned_ = std::uncaught_exceptions() > unwinding_;
  if (c_.departure_pending_.load(std::memory_order_acquire)) c_.flush_departure();
  c_.token_holder_.store(std::thread::id());
  c_.token_.unlock();
  c_.flush_notice();  // an abort() from another thread may have left its notice for us
}

void MpiCommunicator::flush_notice() noexcept {
  if (notices_ == MPI_COMM_NULL) return;  // failed while being made: nobody to tell
  // Flag first, then try the token: whoever lets go of the token looks at the
  // flag again, so a notice is never left behind.
  while (notice_pending_.load(std::memory_order_acquire)) {
    if (token_holder_.load() == std::this_thread::get_id()) return;  // sent when this thread lets go
    if (!token_.try_lock()) return;                                    // the holder sends it
    if (notice_pending_.exchange(false) && !finalizing_.load(std::memory_order_acquire)) {
      int finalized = 0;
      MPI_Finalized(&finalized);
      for (int q = 0; q < size_ && !finalized; ++q) {
        if (q == rank_) continue;
        MPI_Request request;
        // Small: MPI delivers it eagerly; nobody waits for its completion.
        if (MPI_Isend(notice_->data(), static_cast<int>(notice_->size()), MPI_CHAR, q, kNoticeTag, notices_,
                      &request) == MPI_SUCCESS) {
          MPI_Request_free(&request);
        }
      }
    }
    token_.unlock();
  }
}

void MpiCommunicator::receive_notices() {
  for (;;) {
    int arrived = 0;
    MPI_Status status;
    if (MPI_Iprobe(MPI_ANY_SOURCE, kNoticeTag, notices_, &arrived, &status) != MPI_SUCCESS || !arrived) return;
    int bytes = 0;
    MPI_Get_count(&status, MPI_CHAR, &bytes);
    std::string text(static_cast<std::size_t>(std::max(bytes, 0)), '\0');
    MPI_Recv(text.data(), bytes, MPI_CHAR, status.MPI_SOURCE, kNoticeTag, notices_, MPI_STATUS_IGNORE);
    const int from = status.MPI_SOURCE;
    std::uint64_t nonce = 0;
    if (text.size() < sizeof nonce + 1) continue;
    std::memcpy(&nonce, text.data(), sizeof nonce);
    if (nonce != nonce_) continue;  // to an earlier communicator whose context MPI reused for this one
    text.erase(0, sizeof nonce);
    if ((text[0] == kLeftNotice || text[0] == kSessionEndNotice) && text.size() >= 1 + sizeof(std::uint64_t)) {
      // kind, calls, session, why
      constexpr std::size_t kWhy = 1 + 2 * sizeof(std::uint64_t);
      if (text.size() < kWhy) continue;
      Departure d{.rank = from, .for_good = text[0] == kLeftNotice, .why = text.substr(kWhy)};
      std::memcpy(&d.calls, text.data() + 1, sizeof d.calls);
      std::memcpy(&d.session, text.data() + 1 + sizeof d.calls, sizeof d.session);
      if (d.for_good) {
        // Its process may end now: that is no longer news.
        for (auto it = watched_.begin(); it != watched_.end(); ++it) {
          if (it->first != from) continue;
          close(it->second);
          watched_.erase(it);
          break;
        }
      }
      departures_.push_back(std::move(d));
      continue;
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (failed_.load()) continue;
    const bool failure = text.size() >= 2 && text[0] == kFailureNotice;
    failure_code_ = failure ? static_cast<ErrorCode>(static_cast<unsigned char>(text[1])) : ErrorCode::kAborted;
    failure_message_ = "Worker " + std::to_string(from) + " failed: " +
                       (failure ? text.substr(2) : std::string("(a notice that could not be read)"));
    failed_.store(true, std::memory_order_release);
  }
}

std::string MpiCommunicator::notice_head(char kind) const {
  std::string head(reinterpret_cast<const char*>(&nonce_), sizeof nonce_);
  head += kind;
  return head;
}

void MpiCommunicator::throw_finalizing(const CollectiveCall& call) {
  throw FailedPreconditionError(label(call) + ": rank " + std::to_string(rank_) +
                                " is finalising MPI (its process is ending); this communicator cannot be used any "
                                "more");
}

void MpiCommunicator::begin_call(const CollectiveCall& call) {
  if (finalizing_.load(std::memory_order_acquire)) throw_finalizing(call);
  if (left_) {
    throw FailedPreconditionError(label(call) + ": this communicator cannot be used any more: rank " +
                                  std::to_string(rank_) + " has left its group (MPI was finalised)");
  }
  throw_if_failed();
  ++calls_;
  if (call.starts_session) session_start_.store(calls_, std::memory_order_relaxed);
  if (!departures_.empty()) check_departures(call);
}

void MpiCommunicator::check_departures(const CollectiveCall& call) {
  for (auto it = departures_.begin(); it != departures_.end();) {
    if (!it->for_good && it->session != session_start_.load(std::memory_order_relaxed)) {  // not this rank's session
      it = departures_.erase(it);
      continue;
    }
    if (calls_ <= it->calls) {  // a call that rank made too: it completes
      ++it;
      continue;
    }
    const std::string message =
        label(call) + " can never complete: worker " + std::to_string(it->rank) +
        (it->for_good ? " has left the group (" : " has ended its session (") + it->why + ") after its " +
        ordinal(it->calls) + " call between the workers, and this is worker " + std::to_string(rank_) + "'s " +
        ordinal(calls_) +
        ". Every worker must run the same collectives in the same order: a worker that stops early (fewer steps "
        "or epochs, another strategy) leaves the others without a partner";
    abort(ErrorCode::kFailedPrecondition, message, rank_);
    throw FailedPreconditionError(message);
  }
}

void MpiCommunicator::send_departure(char kind, std::string_view why, std::uint64_t session) noexcept {
  if (notices_ == MPI_COMM_NULL || size_ < 2) return;
  try {
    {
      std::lock_guard<std::mutex> lock(mu_);
      pending_departure_ = std::string(1, kind);
      pending_departure_.append(reinterpret_cast<const char*>(&session), sizeof session);
      pending_departure_ += why;
    }
    departure_pending_.store(true, std::memory_order_release);
    // The token: MPI is called by one thread at a time. A replica thread may
    // be in a call while this thread ends the process: it sends the notice
    // from its polling loop, where it waits for peers that will not come.
    if (!token_.try_lock_for(std::chrono::seconds(1))) return;
    std::unique_lock<std::timed_mutex> hold(token_, std::adopt_lock);
    flush_departure();
  } catch (...) {
  }
}

void MpiCommunicator::flush_departure(bool abandoned) noexcept {
  if (!departure_pending_.exchange(false, std::memory_order_acq_rel)) return;
  try {
    std::string said;
    {
      std::lock_guard<std::mutex> lock(mu_);
      said = std::move(pending_departure_);
    }
    if (said.empty() || left_ || failed_.load()) return;  // gone already, or the others were told of the failure
    const char kind = said[0];
    auto text = std::make_unique<std::string>(notice_head(kind));
    // A call given up is no call made: peers must not wait in it for this rank.
    const std::uint64_t made = (abandoned || last_call_abandoned_) && calls_ > 0 ? calls_ - 1 : calls_;
    text->append(reinterpret_cast<const char*>(&made), sizeof made);
    text->append(said, 1);  // the session, then why
    std::vector<MPI_Request> requests;
    for (int q = 0; q < size_; ++q) {
      if (q == rank_) continue;
      requests.emplace_back(MPI_REQUEST_NULL);
      if (MPI_Isend(text->data(), static_cast<int>(text->size()), MPI_CHAR, q, kNoticeTag, notices_,
                    &requests.back()) != MPI_SUCCESS) {
        requests.pop_back();
      }
    }
    // Small: sent eagerly. A send still pending after a second is let go,
    // its text kept for MPI to read.
    const Clock::time_point give_up = Clock::now() + std::chrono::seconds(1);
    int done = 0;
    while (!done && Clock::now() < give_up) {
      MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done, MPI_STATUSES_IGNORE);
      if (!done) std::this_thread::yield();
    }
    if (!done) {
      for (MPI_Request& r : requests) {
        if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
      }
      static_cast<void>(text.release());
    }
    if (kind == kLeftNotice) left_ = true;
  } catch (...) {
  }
}

void MpiCommunicator::end_session(std::uint64_t session, std::string_view why) noexcept {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) send_departure(kSessionEndNotice, why, session);
}

void MpiCommunicator::leave_all(const char* why) noexcept {
  const std::lock_guard<std::mutex> lock(registry().mu);
  // A thread in a call sends the notice from its polling loop (or when it
  // lets go of the token), then raises an error instead of calling MPI again.
  for (MpiCommunicator* c : registry().live) c->finalizing_.store(true, std::memory_order_release);
  for (MpiCommunicator* c : registry().live) c->send_departure(kLeftNotice, why);
}

void MpiCommunicator::watch_local_peers() {
  // The ranks of this MPI node, with their pids and pid namespaces: a pid of
  // another namespace would name another process here.
  MPI_Comm node = MPI_COMM_NULL;
  const CollectiveCall setup{.op = "MPI_Comm_split_type"};
  check(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node), "MPI_Comm_split_type", setup);
  struct Published {
    std::int64_t pid = 0;
    std::int32_t rank = 0;
    std::array<char, 44> pid_namespace{};
  };
  Published mine{.pid = static_cast<std::int64_t>(getpid()), .rank = rank_};
  const ssize_t n = readlink("/proc/self/ns/pid", mine.pid_namespace.data(), mine.pid_namespace.size() - 1);
  if (n <= 0) mine.pid_namespace[0] = '\0';
  int node_size = 1;
  MPI_Comm_size(node, &node_size);
  std::vector<Published> all(static_cast<std::size_t>(node_size));
  const int result = MPI_Allgather(&mine, static_cast<int>(sizeof mine), MPI_BYTE, all.data(),
                                   static_cast<int>(sizeof mine), MPI_BYTE, node);
  MPI_Comm_free(&node);
  check(result, "MPI_Allgather", setup);
  if (mine.pid_namespace[0] == '\0') return;
  for (const Published& p : all) {
    if (p.rank == rank_ || p.pid_namespace != mine.pid_namespace) continue;
    const int fd = static_cast<int>(syscall(SYS_pidfd_open, static_cast<pid_t>(p.pid), 0));
    if (fd >= 0) watched_.emplace_back(p.rank, fd);  // (no pidfd, no watch: a kernel before 5.3)
  }
}

int MpiCommunicator::ended_peer() {
  for (const auto& [peer, fd] : watched_) {
    pollfd p{.fd = fd, .events = POLLIN, .revents = 0};
    if (::poll(&p, 1, 0) > 0 && (p.revents & (POLLIN | POLLHUP | POLLERR)) != 0) return peer;
  }
  return -1;
}

void MpiCommunicator::fail_for_ended_peer(int peer, const CollectiveCall& call) {
  g_peer_process_ended.store(true);
  const std::string message =
      label(call) + " can never complete: the process of worker " + std::to_string(peer) +
      " on this host has ended without leaving the group (killed by a signal, or crashed) while worker " +
      std::to_string(rank_) + " waits for it; this communicator cannot be used any more";
  abort(ErrorCode::kUnavailable, message, rank_);
  throw UnavailableError(message);
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
      notice_ = std::make_unique<std::string>(notice_head(kFailureNotice) + static_cast<char>(code) + message);
      failed_.store(true, std::memory_order_release);
    }
    // While MPI is finalised (the process is ending) nothing more is sent:
    // the departure said it, and another thread is inside MPI_Finalize.
    if (finalizing_.load(std::memory_order_acquire)) return;
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

void MpiCommunicator::wait_all(MPI_Request* requests, int count, int receives, const CollectiveCall& call, Area area,
                               Area sent, MPI_Status* statuses) {
  try {
    poll_all(requests, count, call, statuses);
  } catch (...) {
    release(requests, count, receives, area, sent);
    throw;
  }
}

void MpiCommunicator::release(MPI_Request* requests, int count, int receives, Area area, Area sent) noexcept {
  // Receives still posted would write into buffers that are about to be
  // freed: cancel them (local for a receive not yet matched). One that a
  // message is already filling cannot be cancelled; it is given a moment,
  // then left, and its area quarantined: on a transport that moves a message
  // in pieces (TCP between hosts) the rest may still arrive, and the area may
  // be the caller's output tensor. Sends get the same moment; one still
  // pending after it may read its buffer later, and a late peer would take
  // what it reads as this rank's data, so that buffer is quarantined too.
  for (int i = 0; i < receives; ++i) {
    if (requests[i] != MPI_REQUEST_NULL) MPI_Cancel(&requests[i]);
  }
  const Clock::time_point give_up = Clock::now() + std::chrono::milliseconds(100);
  bool receive_left = false, send_left = false;
  for (int i = 0; i < count; ++i) {
    // Each request is tested at least once, even after the grace is spent:
    // one that has finished (MPI_Testall leaves finished requests in place
    // while others are pending) must not have its area kept for nothing.
    int done = 0;
    while (requests[i] != MPI_REQUEST_NULL) {
      MPI_Test(&requests[i], &done, MPI_STATUS_IGNORE);
      if (done || Clock::now() >= give_up) break;
    }
    (i < receives ? receive_left : send_left) |= requests[i] != MPI_REQUEST_NULL && !done;
  }
  for (const Area& a : {receive_left ? area : Area{}, send_left ? sent : Area{}}) {
    if (a.bytes == 0) continue;
    try {
      quarantine_storage(a.data, a.bytes);
    } catch (const std::bad_alloc&) {
      // Out of memory, after a failure: nothing better to do than go on.
    }
  }
  for (int i = 0; i < count; ++i) {
    if (requests[i] != MPI_REQUEST_NULL) MPI_Request_free(&requests[i]);
  }
}

template <class Done>
void MpiCommunicator::poll(const CollectiveCall& call, Done&& done) {
  const Clock::time_point start = Clock::now();
  const Clock::time_point deadline = deadline_after(start, call.timeout_seconds);
  const bool bounded = deadline != Clock::time_point::max();
  bool yielding = false;
  Clock::time_point next_health_check = start + kHealthCheckPeriod;
  Clock::time_point grace_ends = Clock::time_point::max();  // a peer's process has ended
  int ended = -1;
  for (unsigned polls = 0;; ++polls) {
    // A call that completes has completed on every rank's inputs, even if a
    // peer failed after sending them: a notice that arrives later is raised
    // by the next call, not this one.
    if (done()) return;
    if (polls % kPollsPerNoticeProbe == kPollsPerNoticeProbe - 1) {
      if (finalizing_.load(std::memory_order_acquire)) {
        flush_departure(/*abandoned=*/true);  // this call is given up: it counts the calls before it
        throw_finalizing(call);
      }
      if (departure_pending_.load(std::memory_order_acquire)) flush_departure();  // for a thread without the token
      receive_notices();
      if (!departures_.empty()) check_departures(call);
    }
    if (failed_.load(std::memory_order_acquire)) throw_if_failed();
    if ((polls & 63) == 0 && (bounded || !watched_.empty())) {
      const Clock::time_point now = Clock::now();
      if (!watched_.empty() && now >= next_health_check) {
        next_health_check = now + kHealthCheckPeriod;
        if (ended < 0 && (ended = ended_peer()) >= 0) grace_ends = now + kDeathGrace;
      }
      if (now >= grace_ends) {
        // Its last words (a departure, a failure) arrive before its end is
        // seen; a few probes for them, on this path only.
        for (int probe = 0; probe < 16; ++probe) receive_notices();
        if (failed_.load(std::memory_order_acquire)) throw_if_failed();
        if (!departures_.empty()) check_departures(call);
        if (ended_peer() == ended) fail_for_ended_peer(ended, call);  // (else: it left for good, unwatched now)
        ended = -1;
        grace_ends = Clock::time_point::max();
      }
    }
    if (bounded && (polls & 63) == 0 && Clock::now() >= deadline) {
      const std::string message =
          label(call) + " timed out after " + seconds_text(call.timeout_seconds) + " s on rank " +
          std::to_string(rank_) + " of " + std::to_string(size_) +
          ": other processes did not take part in time (one may have died, or be busy elsewhere). An MPI "
          "collective cannot be cancelled, so this communicator cannot be used any more";
      abort(ErrorCode::kDeadlineExceeded, message, rank_);
      throw DeadlineExceededError(message);
    }
    // Progress needs MPI_Test calls. A message that is about to arrive is
    // caught soonest by polling without pause; after kSpinBeforeYield, the
    // core goes to others between polls (processes often outnumber cores).
    if (yielding || Clock::now() - start >= kSpinBeforeYield) {
      yielding = true;
      std::this_thread::yield();
    }
  }
}

void MpiCommunicator::poll_all(MPI_Request* requests, int count, const CollectiveCall& call, MPI_Status* statuses) {
  poll(call, [&] {
    int done = 0;
    check(MPI_Testall(count, requests, &done, statuses != nullptr ? statuses : MPI_STATUSES_IGNORE), "MPI_Testall",
          call);
    return done != 0;
  });
}

const std::vector<MpiCommunicator::Received>& MpiCommunicator::header_round(std::uint64_t tag, std::uint64_t size,
                                                                          const void* data, std::size_t inline_bytes,
                                                                          const CollectiveCall& call) {
  post_header_round(tag, size, data, inline_bytes, call);
  return finish_header_round(call, nullptr);
}

void MpiCommunicator::post_header_round(std::uint64_t tag, std::uint64_t size, const void* data,
                                        std::size_t inline_bytes, const CollectiveCall& call) {
  constexpr std::size_t kSlot = sizeof(Header) + kInlineBytes;
  const auto n = static_cast<std::size_t>(size_);
  ++header_rounds_;
  Header& header_out = out_->header;
  header_out = Header{tag, size};
  header_in_.resize(kSlot * n);
  received_.assign(n, Received{});
  received_[me()] = Received{header_out, static_cast<const std::byte*>(data), inline_bytes};
  std::vector<MPI_Request>& requests = header_requests_;
  requests.clear();
  for (int q = 0; q < size_; ++q) {
    if (q == rank_) continue;
    requests.emplace_back(MPI_REQUEST_NULL);
    check(MPI_Irecv(header_in_.data() + kSlot * static_cast<std::size_t>(q), static_cast<int>(kSlot), MPI_BYTE, q,
                    kHeaderTag, comm_, &requests.back()),
          "MPI_Irecv", call);
  }
  // One message: the header and the data; a little data is copied behind the
  // header, more is sent straight from where it is.
  MPI_Datatype message = MPI_DATATYPE_NULL;
  const bool copy = inline_bytes <= kCopiedInlineBytes;
  header_sent_ = copy ? Area{} : Area{const_cast<void*>(data), inline_bytes};
  if (copy) {
    std::memcpy(out_->small.data(), &header_out, sizeof(Header));
    if (inline_bytes) std::memcpy(out_->small.data() + sizeof(Header), data, inline_bytes);
  } else if (size_ > 1) {
    MPI_Aint where[2];
    MPI_Get_address(&header_out, &where[0]);
    MPI_Get_address(inline_bytes ? data : &header_out, &where[1]);
    const int lengths[2] = {static_cast<int>(sizeof(Header)), static_cast<int>(inline_bytes)};
    check(MPI_Type_create_hindexed(2, lengths, where, MPI_BYTE, &message), "MPI_Type_create_hindexed", call);
    check(MPI_Type_commit(&message), "MPI_Type_commit", call);
  }
  for (int q = 0; q < size_; ++q) {
    if (q == rank_) continue;
    requests.emplace_back(MPI_REQUEST_NULL);
    check(copy ? MPI_Isend(out_->small.data(), static_cast<int>(sizeof(Header) + inline_bytes), MPI_BYTE, q,
                           kHeaderTag, comm_, &requests.back())
               : MPI_Isend(MPI_BOTTOM, 1, message, q, kHeaderTag, comm_, &requests.back()),
          "MPI_Isend", call);
  }
  if (message != MPI_DATATYPE_NULL) MPI_Type_free(&message);  // freed by MPI when the sends are done
}

const std::vector<MpiCommunicator::Received>& MpiCommunicator::finish_header_round(
    const CollectiveCall& call, const std::vector<std::size_t>* sizes_posted) {
  constexpr std::size_t kSlot = sizeof(Header) + kInlineBytes;
  std::vector<MPI_Request>& requests = header_requests_;
  std::vector<MPI_Status>& statuses = header_statuses_;
  statuses.resize(requests.size());
  wait_all(requests.data(), static_cast<int>(requests.size()), size_ - 1, call, {}, header_sent_, statuses.data());
  std::size_t r = 0;
  for (std::size_t q = 0; q < received_.size(); ++q) {
    if (q == me()) continue;
    Received& in = received_[q];
    int bytes = 0;
    MPI_Get_count(&statuses[r++], MPI_BYTE, &bytes);
    const std::byte* slot = header_in_.data() + kSlot * q;
    std::memcpy(&in.header, slot, sizeof(Header));
    in.data = slot + sizeof(Header);
    in.inline_bytes = static_cast<std::size_t>(bytes) - sizeof(Header);
  }
  bool mismatch = false;
  for (const Received& in : received_) {
    mismatch |= in.header.tag != received_[0].header.tag || (in.header.tag & 1) != 0;
  }
  if (!mismatch) return received_;
  // Peers in a posted all-gather sent their blocks behind their headers:
  // receive and drop those that no receive of this rank matches, so that no
  // later call finds them; one at a time, into a buffer of the largest,
  // freed after.
  std::size_t largest = 0;
  for (std::size_t q = 0; q < received_.size(); ++q) {
    const std::optional<std::size_t> bytes = announced_block(q);
    if (!bytes || (sizes_posted != nullptr && (*sizes_posted)[q] == *bytes)) continue;
    if (*bytes > largest) {
      try {
        drain_ = allocate_storage(*bytes);
      } catch (const std::bad_alloc&) {
        // Peers wait for this rank to take their blocks: fail the group rather than leave them waiting.
        const std::string message = label(call) + ": rank " + std::to_string(rank_) + " could not allocate " +
                                    std::to_string(*bytes) + " bytes to receive and drop rank " +
                                    std::to_string(q) + "'s block after a mismatch; this communicator cannot be used any more";
        abort(ErrorCode::kUnavailable, message, rank_);
        throw UnavailableError(message);
      }
      largest = *bytes;
    }
    MPI_Request drain = MPI_REQUEST_NULL;  // one message: at most largest_tagged_block()
    check(MPI_Irecv(drain_.get(), static_cast<int>(*bytes), MPI_BYTE, static_cast<int>(q),
                    block_tag(*bytes, header_rounds_ - 1), comm_, &drain),
          "MPI_Irecv", call);
    wait_all(&drain, 1, 1, call, {drain_.get(), *bytes});
  }
  drain_.reset();
  throw SignatureMismatch();
}

void MpiCommunicator::post_receive(Messages& m, void* into, std::size_t bytes, int peer, int tag,
                                   const CollectiveCall& call) {
  if (m.receives != static_cast<int>(m.requests.size())) {
    throw InternalError(label(call) + ": a receive posted after a send");  // release() counts receives first
  }
  auto* at = static_cast<std::byte*>(into);
  for (std::size_t done = 0; done < bytes;) {
    const std::size_t piece = std::min(bytes - done, max_message_bytes_);
    m.requests.emplace_back(MPI_REQUEST_NULL);
    const int result = MPI_Irecv(at + done, static_cast<int>(piece), MPI_BYTE, peer, tag, comm_, &m.requests.back());
    if (result != MPI_SUCCESS) post_failed(m, result, "MPI_Irecv", call);
    ++m.receives;
    done += piece;
  }
}

void MpiCommunicator::post_send(Messages& m, const void* from, std::size_t bytes, int peer, int tag,
                                const CollectiveCall& call) {
  const auto* at = static_cast<const std::byte*>(from);
  for (std::size_t done = 0; done < bytes;) {
    const std::size_t piece = std::min(bytes - done, max_message_bytes_);
    m.requests.emplace_back(MPI_REQUEST_NULL);
    const int result = MPI_Isend(at + done, static_cast<int>(piece), MPI_BYTE, peer, tag, comm_, &m.requests.back());
    if (result != MPI_SUCCESS) post_failed(m, result, "MPI_Isend", call);
    done += piece;
  }
}

void MpiCommunicator::post_failed(Messages& m, int mpi_result, const char* what, const CollectiveCall& call) {
  m.requests.pop_back();  // the one MPI refused
  release(m.requests.data(), static_cast<int>(m.requests.size()), m.receives, m.area, m.sent);
  check(mpi_result, what, call);  // throws
}

void MpiCommunicator::check_tags(const CollectiveCall& call) {
  if (call.signature_tag == 0) return;
  header_round(call.signature_tag, 0, nullptr, 0, call);
}

void MpiCommunicator::gather_bytes(const void* send, std::size_t send_bytes, void* recv,
                                   const std::vector<std::size_t>& counts, const CollectiveCall& call,
                                   bool place_own) {
  // Point to point: every rank sends its block to every other (messages
  // between two ranks are matched in order, so one tag serves every call).
  auto* out = static_cast<std::byte*>(recv);
  std::size_t total = 0;
  for (std::size_t c : counts) total += c;
  Messages m({out, total}, {const_cast<void*>(send), send_bytes});
  m.requests.reserve(2 * counts.size());
  std::size_t at = 0;
  std::byte* own = nullptr;
  for (std::size_t q = 0; q < counts.size(); ++q) {
    const int peer = static_cast<int>(q);
    if (peer == rank_) {
      own = out + at;
    } else {
      post_receive(m, out + at, counts[q], peer, kDataTag, call);
    }
    at += counts[q];
  }
  for (int q = 0; q < size_; ++q) {
    if (q != rank_) post_send(m, send, send_bytes, q, kDataTag, call);
  }
  if (place_own && own != nullptr && own != send && send_bytes > 0) std::memcpy(own, send, send_bytes);
  wait(m, call);
}

void MpiCommunicator::posted_gather(const void* send, std::size_t send_bytes, std::byte* recv,
                                    const std::vector<std::size_t>& counts, const CollectiveCall& call,
                                    bool place_own) {
  // Every block is one message: callers come here only with blocks of at
  // most largest_tagged_block().
  const int bytes = static_cast<int>(send_bytes);
  std::vector<MPI_Request>& blocks = block_requests_;
  blocks.clear();
  const std::uint64_t round = header_rounds_;  // the header round posted below
  // Every peer's block is received straight into place, the receive posted
  // before any header leaves: a block that arrives is never held back for its
  // header's round. Zero-byte blocks are sent too, so every peer's header is
  // followed by exactly one block.
  std::size_t at = 0;
  for (std::size_t c : counts) at += c;
  std::byte* own = nullptr;
  int receives = 0;
  const Area sent{const_cast<void*>(send), send_bytes};
  try {
    std::size_t offset = 0;
    for (std::size_t q = 0; q < counts.size(); ++q) {
      if (q == me()) {
        own = recv + offset;
      } else {
        blocks.emplace_back(MPI_REQUEST_NULL);
        check(MPI_Irecv(recv + offset, static_cast<int>(counts[q]), MPI_BYTE, static_cast<int>(q),
                        block_tag(counts[q], round), comm_, &blocks.back()),
              "MPI_Irecv", call);
        ++receives;
      }
      offset += counts[q];
    }
    post_header_round(call.signature_tag, kBlockFollows | static_cast<std::uint64_t>(bytes), nullptr, 0, call);
    for (int q = 0; q < size_; ++q) {
      if (q == rank_) continue;
      blocks.emplace_back(MPI_REQUEST_NULL);
      check(MPI_Isend(send, bytes, MPI_BYTE, q, block_tag(send_bytes, round), comm_, &blocks.back()), "MPI_Isend",
            call);
    }
    finish_header_round(call, &counts);
  } catch (const SignatureMismatch&) {
    // finish_header_round has received the blocks of another size. A peer
    // whose header announced a block of the size expected has sent it into
    // its receive here. Any other peer sent none under that tag in this
    // round, and cannot before this rank's next header (its next call's
    // block has the other parity, block_tag), so its receive is cancelled
    // unmatched.
    std::size_t r = 0;
    for (std::size_t q = 0; q < counts.size(); ++q) {
      if (q == me()) continue;
      if (announced_block(q) != counts[q]) MPI_Cancel(&blocks[r]);
      ++r;
    }
    wait_all(blocks.data(), static_cast<int>(blocks.size()), receives, call, {recv, at}, sent);
    throw;
  } catch (...) {
    release(blocks.data(), static_cast<int>(blocks.size()), receives, {recv, at}, sent);
    throw;
  }
  if (place_own && own != nullptr && own != send && bytes > 0) std::memcpy(own, send, send_bytes);
  wait_all(blocks.data(), static_cast<int>(blocks.size()), receives, call, {recv, at}, sent);
}

std::shared_ptr<std::byte> MpiCommunicator::sendable(const std::string& payload) {
  std::shared_ptr<std::byte> copy = allocate_storage(payload.size());
  if (copy) std::memcpy(copy.get(), payload.data(), payload.size());
  return copy;
}

std::vector<std::string> MpiCommunicator::exchange(std::string payload, const CollectiveCall& call) {
  Token token(*this);
  begin_call(call);
  if (shared_ != nullptr) return shared_exchange(std::move(payload), call);
  // The header round carries the tag and the payload's size, and the payload itself if it fits.
  const std::size_t inline_bytes = payload.size() <= kInlineBytes ? payload.size() : 0;
  std::shared_ptr<std::byte> outgoing;
  // (Up to kCopiedInlineBytes, the header round copies the payload itself.)
  if (inline_bytes > kCopiedInlineBytes) outgoing = sendable(payload);
  const void* from = outgoing ? static_cast<const void*>(outgoing.get()) : payload.data();
  const std::vector<Received>& headers = header_round(call.signature_tag, payload.size(), from, inline_bytes, call);
  std::vector<std::size_t> sizes;
  bool all_inline = true;
  for (const Received& h : headers) {
    sizes.push_back(static_cast<std::size_t>(h.header.size));
    all_inline &= h.inline_bytes == h.header.size;
  }
  if (all_inline) {
    std::vector<std::string> out;
    for (const Received& h : headers) out.emplace_back(reinterpret_cast<const char*>(h.data), h.inline_bytes);
    return out;
  }
  std::size_t total = 0;
  for (std::size_t s : sizes) total += s;
  // Tensor storage, not a string: a receive left after a failure quarantines it (release()).
  const std::shared_ptr<std::byte> all = allocate_storage(total);
  if (!outgoing) outgoing = sendable(payload);
  gather_bytes(outgoing.get(), payload.size(), all.get(), sizes, call);
  std::vector<std::string> out;
  std::size_t at = 0;
  for (std::size_t s : sizes) {
    out.emplace_back(reinterpret_cast<const char*>(all.get()) + at, s);
    at += s;
  }
  return out;
}

void MpiCommunicator::all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op,
                                 const CollectiveCall& call, std::int64_t mean_divisor) {
  Token token(*this);
  begin_call(call);
  const std::size_t esz = size_of(dtype);
  const std::size_t bytes = count * esz;
  const std::int64_t divisor = mean_divisor > 0 ? mean_divisor : size_;
  const auto n = static_cast<std::size_t>(size_);
  bool agreed = false;  // the tags compared already
  if (shared_ != nullptr) {
    const NodeSharedMemory::Call mine{.tag = call.signature_tag,
                                      .bytes = bytes,
                                      .kind = static_cast<std::uint32_t>(Kind::kAllReduce),
                                      .dtype = static_cast<std::uint32_t>(dtype),
                                      .op = static_cast<std::uint32_t>(op)};
    if (bytes <= kSharedReduceAllBytes) {
      // Small: every rank's input through its buffer, one step; every rank
      // reduces all of them in rank order (the same bits everywhere).
      const std::uint64_t step = shared_->next_step();
      if (bytes) std::memcpy(shared_->buffer(rank_, step), send, bytes);
      shared_begin(step, mine, call);
      std::vector<const void*>& srcs = shared_->sources();
      for (int q = 0; q < size_; ++q) srcs[static_cast<std::size_t>(q)] = shared_->buffer(q, step);
      if (bytes) reduce_sources(recv, srcs, count, dtype, op, divisor);
      return;
    }
    if (bytes <= kSharedAllReduceBytes) {
      shared_all_reduce(send, recv, count, dtype, op, divisor, mine, call);
      return;
    }
    agree(mine, call);  // then MPI's path, below
    agreed = true;
  }
  if (bytes <= kInlineBytes && size_ > 1) {
    // Small: the inputs travel in the header round, the only round; every
    // rank reduces all of them in rank order (the same bits everywhere).
    const std::vector<Received>& headers = header_round(call.signature_tag, bytes, send, bytes, call);
    std::vector<const void*> srcs(n);
    for (std::size_t q = 0; q < n; ++q) srcs[q] = headers[q].data;
    if (bytes) reduce_sources(recv, srcs, count, dtype, op, divisor);
    return;
  }
  if (size_ == 1) {
    check_tags(call);
    const void* srcs[1] = {send};
    if (op == ReduceOp::kMean && divisor > 1) {
      reduce_sources(recv, srcs, count, dtype, op, divisor);
    } else if (send != recv && bytes > 0) {
      std::memcpy(recv, send, bytes);
    }
    return;
  }
  std::vector<const void*> srcs(n);
  if (bytes * (n - 1) <= kGatherAllBytes) {
    // Latency: every rank receives every input and reduces them all in rank
    // order (the same bits everywhere): one round, as recursive doubling for 2,
    // the tags compared alongside (posted_gather). The own input is read where
    // it is, not copied into place.
    std::byte* all = scratch(bytes * n);
    const std::vector<std::size_t> counts(n, bytes);
    if (!agreed && call.signature_tag != 0 && bytes <= largest_tagged_block()) {
      posted_gather(send, bytes, all, counts, call, /*place_own=*/false);
    } else {
      if (!agreed) check_tags(call);
      gather_bytes(send, bytes, all, counts, call, /*place_own=*/false);
    }
    for (std::size_t q = 0; q < n; ++q) srcs[q] = all + q * bytes;
    srcs[me()] = send;
    reduce_sources(recv, srcs, count, dtype, op, divisor);
    return;
  }
  // Bandwidth: rank r receives slice r of every input, reduces it in rank
  // order, and the reduced slices are all-gathered into place.
  if (!agreed) check_tags(call);
  std::vector<std::size_t> slice_bytes(n), slice_displs(n);
  for (std::size_t q = 0; q < n; ++q) {
    const std::size_t begin = count * q / n, end = count * (q + 1) / n;
    slice_bytes[q] = (end - begin) * esz;
    slice_displs[q] = begin * esz;
  }
  const auto me = static_cast<std::size_t>(rank_);
  const std::size_t my_bytes = slice_bytes[me];
  // The slices received from the other ranks; kept by the communicator, so
  // that a receive left pending by a failure never writes into freed memory.
  std::byte* pieces = scratch(my_bytes * n);
  // Scatter: slice q of this rank's input goes to rank q, point to point.
  Messages m({pieces, my_bytes * n}, {const_cast<void*>(send), bytes});
  m.requests.reserve(2 * n);
  for (std::size_t q = 0; q < n; ++q) {
    if (q != me) post_receive(m, pieces + q * my_bytes, my_bytes, static_cast<int>(q), kDataTag, call);
  }
  for (std::size_t q = 0; q < n; ++q) {
    if (q == me) continue;
    post_send(m, static_cast<const std::byte*>(send) + slice_displs[q], slice_bytes[q], static_cast<int>(q),
              kDataTag, call);
  }
  wait(m, call);
  for (std::size_t q = 0; q < n; ++q) srcs[q] = pieces + q * my_bytes;
  srcs[me] = static_cast<const std::byte*>(send) + slice_displs[me];  // our own slice, read in place
  auto* mine = static_cast<std::byte*>(recv) + slice_displs[me];
  reduce_sources(mine, srcs, my_bytes / esz, dtype, op, divisor);
  // Gather: the reduced slices, into place on every rank.
  gather_bytes(mine, my_bytes, recv, slice_bytes, call);
}

void MpiCommunicator::all_gather_v(const void* send, void* recv, std::span<const std::size_t> counts,
                                   std::size_t outer, DType dtype, const CollectiveCall& call) {
  Token token(*this);
  begin_call(call);
  const std::size_t esz = size_of(dtype);
  std::vector<std::size_t> bytes(counts.size());
  std::size_t total = 0, largest = 0;
  for (std::size_t q = 0; q < counts.size(); ++q) {
    bytes[q] = counts[q] * outer * esz;
    total += bytes[q];
    largest = std::max(largest, bytes[q]);
  }
  const std::size_t mine = bytes[me()];
  // Every rank's block, rank by rank (each rank's `outer` rows together).
  std::vector<const std::byte*> blocks(counts.size());
  std::shared_ptr<std::byte> staged;
  const NodeSharedMemory::Call my_call{.tag = call.signature_tag,
                                       .bytes = mine,
                                       .layout = hash_layout(bytes),
                                       .kind = static_cast<std::uint32_t>(Kind::kAllGather),
                                       .dtype = static_cast<std::uint32_t>(dtype)};
  if (shared_ != nullptr && largest <= kSharedGatherBytes) {
    // One host: every block through its rank's buffer, one step; laid out
    // below straight from the buffers.
    const std::uint64_t step = shared_->next_step();
    if (mine) std::memcpy(shared_->buffer(rank_, step), send, mine);
    shared_begin(step, my_call, call);
    for (int q = 0; q < size_; ++q) blocks[static_cast<std::size_t>(q)] = shared_->buffer(q, step);
  } else if (shared_ == nullptr && (largest <= kPostedGatherBytes || size_ == 1)) {
    // Small: the blocks travel in the header round, the only round.
    const std::vector<Received>& in = header_round(call.signature_tag, 0, send, mine, call);
    for (std::size_t q = 0; q < counts.size(); ++q) blocks[q] = in[q].data;
  } else {
    // Larger: one message per block, into place (rows: into a staging
    // buffer, laid out below); with a tag, its header round alongside.
    std::byte* into = static_cast<std::byte*>(recv);
    if (outer != 1) {
      try {
        staged = allocate_storage(total);
      } catch (const std::bad_alloc&) {
        // The others are about to wait for this rank: fail the group rather than leave them waiting.
        const std::string message = label(call) + ": rank " + std::to_string(rank_) + " could not allocate " +
                                    std::to_string(total) + " bytes to stage an all-gather; this communicator "
                                    "cannot be used any more";
        abort(ErrorCode::kUnavailable, message, rank_);
        throw UnavailableError(message);
      }
      into = staged.get();
    }
    // (A receive that a failure leaves pending quarantines `into`, the
    // staging buffer or the caller's output: release().)
    if (shared_ != nullptr && shared_->single_copy()) {
      single_copy_gather(send, mine, into, bytes, my_call, call);
    } else if (shared_ == nullptr && call.signature_tag != 0 && largest <= largest_tagged_block()) {
      posted_gather(send, mine, into, bytes, call);
    } else {
      agree(my_call, call);
      gather_bytes(send, mine, into, bytes, call);
    }
    if (outer == 1) return;
    std::size_t at = 0;
    for (std::size_t q = 0; q < counts.size(); ++q) {
      blocks[q] = staged.get() + at;
      at += bytes[q];
    }
  }
  // Laid out row by row: row o is every rank's row o, in rank order (empty
  // rows, however many, need no loop).
  auto* dst = static_cast<std::byte*>(recv);
  const std::size_t rows = total == 0 ? 0 : outer;
  for (std::size_t o = 0; o < rows; ++o) {
    for (std::size_t q = 0; q < counts.size(); ++q) {
      const std::size_t row = counts[q] * esz;
      const std::byte* src = blocks[q] + o * row;
      if (row && src != dst) std::memcpy(dst, src, row);  // equal: one rank, in place
      dst += row;
    }
  }
}

void MpiCommunicator::broadcast(void* buffer, std::size_t count, DType dtype, int root, const CollectiveCall& call) {
  Token token(*this);
  begin_call(call);
  const std::size_t bytes = count * size_of(dtype);
  if (shared_ != nullptr) {
    shared_broadcast(buffer, bytes, dtype, root, call);
    return;
  }
  check_tags(call);
  if (size_ > 1 && bytes > 0) broadcast_bytes(buffer, bytes, root, call);
}

void MpiCommunicator::broadcast_bytes(void* buffer, std::size_t bytes, int root, const CollectiveCall& call) {
  // The root sends to every other rank, point to point.
  const bool sends = rank_ == root;
  Messages m(sends ? Area{} : Area{buffer, bytes}, sends ? Area{buffer, bytes} : Area{});
  for (int q = 0; q < size_ && sends; ++q) {
    if (q != root) post_send(m, buffer, bytes, q, kDataTag, call);
  }
  if (!sends) post_receive(m, buffer, bytes, root, kDataTag, call);
  wait(m, call);
}

void MpiCommunicator::shared_step(std::uint64_t step, const CollectiveCall& call) {
  shared_->publish(rank_, step);
  poll(call, [&] { return shared_->all_reached(step); });
}

namespace {

// What a rank's call is, for the error that says two ranks' calls differ.
std::string describe(const NodeSharedMemory::Call& c) {
  const std::string bytes = std::to_string(c.bytes) + " bytes of " + std::string(to_string(static_cast<DType>(c.dtype)));
  switch (c.kind) {
    case 1: return "an exchange";
    case 2: return "an all-reduce of " + bytes + " (" + std::string(to_string(static_cast<ReduceOp>(c.op))) + ")";
    case 3: return "an all-gather sending " + bytes;
    case 4: return "a broadcast of " + bytes + " from rank " + std::to_string(c.root);
    case 5: return "a barrier";
    default: return "a call of unknown kind " + std::to_string(c.kind);
  }
}

}  // namespace

void MpiCommunicator::shared_begin(std::uint64_t step, const NodeSharedMemory::Call& mine,
                                   const CollectiveCall& call) {
  shared_->call(rank_, step) = mine;
  shared_step(step, call);
  // Every rank reads the same slots, so every rank decides alike.
  bool tags_differ = (mine.tag & 1) != 0;  // bit 0: a tag that can never agree
  for (int q = 0; q < size_; ++q) tags_differ |= shared_->call(q, step).tag != mine.tag;
  const auto peer_failed_first = [&] {
    // A rank that published this step and then failed (a timeout, say) is
    // in another call by now: its failure notice, if sent, is the error.
    // (A message that has arrived may take OpenMPI a progress call or two
    // to match: a few probes, on this error path only.)
    for (int probe = 0; probe < 16 && !failed_.load(std::memory_order_acquire); ++probe) receive_notices();
    throw_if_failed();
    if (!departures_.empty()) check_departures(call);
  };
  if (tags_differ) {
    peer_failed_first();
    throw SignatureMismatch();
  }
  for (int q = 0; q < size_; ++q) {
    const NodeSharedMemory::Call theirs = shared_->call(q, step);
    const bool exchange = mine.kind == static_cast<std::uint32_t>(Kind::kExchange);
    if (theirs.kind == mine.kind && theirs.dtype == mine.dtype && theirs.op == mine.op && theirs.root == mine.root &&
        theirs.layout == mine.layout && (exchange || theirs.bytes == mine.bytes || mine.layout != 0)) {
      continue;
    }
    peer_failed_first();
    std::string message = label(call) + ": rank " + std::to_string(q) + " makes " + describe(theirs) + " where rank " +
                          std::to_string(rank_) + " makes " + describe(mine);
    if (theirs.kind == mine.kind && theirs.layout != mine.layout) message += ", with other sizes of the ranks' blocks";
    message += mine.tag == 0 ? "; the call had no signature tag to compare first, and this communicator cannot be "
                               "used any more"
                             : "; this communicator cannot be used any more";
    abort(ErrorCode::kInvalidArgument, message, rank_);
    throw InvalidArgumentError(message);
  }
}

void MpiCommunicator::agree(const NodeSharedMemory::Call& mine, const CollectiveCall& call) {
  if (shared_ != nullptr) {
    shared_begin(shared_->next_step(), mine, call);
  } else {
    check_tags(call);
  }
}

void MpiCommunicator::shared_all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op,
                                        std::int64_t divisor, const NodeSharedMemory::Call& mine,
                                        const CollectiveCall& call) {
  // Per chunk: every rank copies into its buffer the slices of its input
  // that the others reduce; rank r reduces slice r of every rank's input in
  // rank order (its own read where it is) into its next buffer and copies it
  // out; then every rank copies the others' reduced slices out. In place
  // (send == recv) is safe: a slice is read before it is written.
  const std::size_t esz = size_of(dtype);
  const std::size_t chunk = NodeSharedMemory::kChunkBytes / esz;
  const auto n = static_cast<std::size_t>(size_);
  std::vector<const void*>& srcs = shared_->sources();
  const auto* in = static_cast<const std::byte*>(send);
  auto* out = static_cast<std::byte*>(recv);
  for (std::size_t at = 0; at < count; at += chunk) {
    const std::size_t len = std::min(chunk, count - at);
    const std::size_t begin = len * me() / n, end = len * (me() + 1) / n;
    const std::uint64_t inputs = shared_->next_step();
    std::byte* mine_in = shared_->buffer(rank_, inputs);
    if (begin > 0) std::memcpy(mine_in, in + at * esz, begin * esz);
    if (len > end) std::memcpy(mine_in + end * esz, in + (at + end) * esz, (len - end) * esz);
    if (at == 0) {
      shared_begin(inputs, mine, call);
    } else {
      shared_step(inputs, call);
    }
    for (std::size_t q = 0; q < n; ++q) srcs[q] = shared_->buffer(static_cast<int>(q), inputs) + begin * esz;
    srcs[me()] = in + (at + begin) * esz;
    const std::uint64_t outputs = shared_->next_step();
    std::byte* reduced = shared_->buffer(rank_, outputs) + begin * esz;
    if (end > begin) {
      reduce_sources(reduced, srcs, end - begin, dtype, op, divisor);
      std::memcpy(out + (at + begin) * esz, reduced, (end - begin) * esz);
    }
    shared_step(outputs, call);
    for (std::size_t q = 0; q < n; ++q) {
      const std::size_t b = len * q / n, e = len * (q + 1) / n;
      if (q != me() && e > b) {
        std::memcpy(out + (at + b) * esz, shared_->buffer(static_cast<int>(q), outputs) + b * esz, (e - b) * esz);
      }
    }
  }
}

void MpiCommunicator::single_copy_gather(const void* send, std::size_t send_bytes, std::byte* recv,
                                         const std::vector<std::size_t>& counts, NodeSharedMemory::Call mine,
                                         const CollectiveCall& call) {
  // Every rank says where its block is at the first step and reads the
  // others' from there; the second step keeps every block in place until
  // every rank has read it.
  const std::uint64_t step = shared_->next_step();
  mine.address = reinterpret_cast<std::uint64_t>(send);
  shared_begin(step, mine, call);
  std::size_t at = 0;
  for (int q = 0; q < size_; ++q) {
    const std::size_t bytes = counts[static_cast<std::size_t>(q)];
    if (q == rank_) {
      if (bytes > 0 && recv + at != send) std::memcpy(recv + at, send, send_bytes);
    } else if (bytes > 0 && !shared_->read(q, shared_->call(q, step).address, recv + at, bytes)) {
      const int error = errno;
      const std::string message = label(call) + ": rank " + std::to_string(rank_) + " could not read rank " +
                                  std::to_string(q) + "'s block of " + std::to_string(bytes) +
                                  " bytes (process_vm_readv: " + std::strerror(error) +
                                  "); this communicator cannot be used any more";
      abort(ErrorCode::kUnavailable, message, rank_);
      throw UnavailableError(message);
    }
    at += bytes;
  }
  const std::uint64_t read = shared_->next_step();
  try {
    shared_step(read, call);
  } catch (...) {
    // Failing here (a timeout, an abort, a peer's notice), this rank must
    // not hand `send` back while peers may still be reading it: they would
    // finish this step (this rank took it) with a torn block. A moment for
    // them, as release() gives pending receives; then `send` is quarantined.
    const Clock::time_point give_up = Clock::now() + std::chrono::milliseconds(100);
    while (!shared_->all_reached(read) && Clock::now() < give_up) std::this_thread::yield();
    if (!shared_->all_reached(read) && send_bytes > 0) {
      try {
        quarantine_storage(send, send_bytes);
      } catch (const std::bad_alloc&) {
      }
    }
    throw;
  }
}

std::vector<std::string> MpiCommunicator::shared_exchange(std::string payload, const CollectiveCall& call) {
  // Payloads up to a buffer through the buffers; larger ones through MPI,
  // their sizes known from the first step.
  const std::uint64_t step = shared_->next_step();
  const bool through_buffer = payload.size() <= NodeSharedMemory::kChunkBytes;
  if (through_buffer && !payload.empty()) std::memcpy(shared_->buffer(rank_, step), payload.data(), payload.size());
  shared_begin(step, {.tag = call.signature_tag, .bytes = payload.size(), .kind = static_cast<std::uint32_t>(Kind::kExchange)},
               call);
  std::vector<std::size_t> by_mpi(static_cast<std::size_t>(size_), 0);
  std::size_t mpi_total = 0;
  for (int q = 0; q < size_; ++q) {
    const auto bytes = static_cast<std::size_t>(shared_->call(q, step).bytes);
    if (q != rank_ && bytes > NodeSharedMemory::kChunkBytes) {
      by_mpi[static_cast<std::size_t>(q)] = bytes;
      mpi_total += bytes;
    }
  }
  std::shared_ptr<std::byte> received;
  if (mpi_total > 0 || !through_buffer) {
    // Tensor storage, not a string: a receive left after a failure quarantines it (release()).
    received = allocate_storage(mpi_total);
    const std::shared_ptr<std::byte> outgoing = through_buffer ? nullptr : sendable(payload);
    gather_bytes(outgoing.get(), through_buffer ? 0 : payload.size(), received.get(), by_mpi, call,
                 /*place_own=*/false);
  }
  std::vector<std::string> out(static_cast<std::size_t>(size_));
  std::size_t at = 0;
  for (int q = 0; q < size_; ++q) {
    const auto bytes = static_cast<std::size_t>(shared_->call(q, step).bytes);
    auto& o = out[static_cast<std::size_t>(q)];
    if (q == rank_) {
      o = std::move(payload);
    } else if (by_mpi[static_cast<std::size_t>(q)] > 0) {
      o.assign(reinterpret_cast<const char*>(received.get()) + at, bytes);
      at += bytes;
    } else {
      o.assign(reinterpret_cast<const char*>(shared_->buffer(q, step)), bytes);
    }
  }
  return out;
}

void MpiCommunicator::shared_broadcast(void* buffer, std::size_t bytes, DType dtype, int root,
                                       const CollectiveCall& call) {
  const std::uint64_t step = shared_->next_step();
  const bool through_buffer = bytes <= NodeSharedMemory::kChunkBytes;
  if (rank_ == root && through_buffer && bytes > 0) std::memcpy(shared_->buffer(rank_, step), buffer, bytes);
  shared_begin(step,
               {.tag = call.signature_tag, .bytes = bytes, .kind = static_cast<std::uint32_t>(Kind::kBroadcast),
                .dtype = static_cast<std::uint32_t>(dtype), .root = root},
               call);
  if (root < 0 || root >= size_) {  // the same root on every rank: every rank throws
    throw InvalidArgumentError(label(call) + ": broadcast from rank " + std::to_string(root) + " of " +
                               std::to_string(size_));
  }
  if (bytes == 0) return;
  if (!through_buffer) {
    broadcast_bytes(buffer, bytes, root, call);
  } else if (rank_ != root) {
    std::memcpy(buffer, shared_->buffer(root, step), bytes);
  }
}

void MpiCommunicator::barrier(const CollectiveCall& call) {
  Token token(*this);
  begin_call(call);
  if (shared_ != nullptr) {
    shared_begin(shared_->next_step(), {.tag = call.signature_tag, .kind = static_cast<std::uint32_t>(Kind::kBarrier)},
                 call);
    return;
  }
  header_round(call.signature_tag, 0, nullptr, 0, call);  // a message from every rank to every rank
}

}  // namespace distribute::internal
