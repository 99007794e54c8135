// Internal to the MPI backend: what the files of MpiCommunicator share (the
// clock, the message tags, a call's label) and its polling loop, a template
// that the waits of several files instantiate.
#pragma once

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "comm/mpi/mpi_communicator.h"
#include "core/seconds.h"
#include "distribute/errors.h"

namespace distribute::internal {

using Clock = std::chrono::steady_clock;

// The tag of failure notices (on the notices communicator, nothing else is sent).
inline constexpr int kNoticeTag = 1;
// The tag of point-to-point data messages (on the data communicator).
inline constexpr int kDataTag = 2;
// The tag of the header round's messages.
inline constexpr int kHeaderTag = 3;

// How long a wait polls MPI without pause before it starts yielding the core
// between polls. Measured at 2 workers (docs/history/benchmarks.md, multi-worker):
// yielding from the first poll cost 1 to 4 us per call, 1.2 to 1.5x
// MPI_Allgatherv from 8 KiB to 512 KiB; 50 and 200 us both removed that, and
// 3 workers on 2 cores did not slow down. 200 us covers a whole 2 MiB call.
inline constexpr auto kSpinBeforeYield = std::chrono::microseconds(200);
// Polls of a pending request between two looks for failure notices.
inline constexpr unsigned kPollsPerNoticeProbe = 32;

inline std::string seconds_text(double seconds) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", seconds);
  return text;
}

inline std::string label(const CollectiveCall& call) {
  return std::string(call.op) + " #" + std::to_string(call.sequence);
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

}  // namespace distribute::internal
