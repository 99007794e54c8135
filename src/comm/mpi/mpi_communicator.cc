// MpiCommunicator's setup and teardown (MPI's too), and the link between its
// ranks: the token, failure notices, departures and sessions, and the watch
// of the processes of peers on this host.
#include "comm/mpi/mpi_communicator.h"

#include <poll.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "comm/mpi/mpi_communicator_internal.h"
#include "comm/mpi/node_shared_memory.h"
#include "core/storage.h"
#include "core/whole_number.h"
#include "distribute/errors.h"

namespace distribute::internal {
namespace {

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
                       : n % 10 == 1                    ? "st"
                       : n % 10 == 2                    ? "nd"
                       : n % 10 == 3                    ? "rd"
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
                                 " is not a whole number of bytes from " + std::to_string(kMinMessageBytes) + " to " +
                                 std::to_string(kMaxMessageBytes) +
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
    if (!token_.try_lock()) return;                                  // the holder sends it
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
    failure_message_ = "Worker " + std::to_string(from) +
                       " failed: " + (failure ? text.substr(2) : std::string("(a notice that could not be read)"));
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

}  // namespace distribute::internal
