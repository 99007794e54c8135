// File: communicator.h
//
// The interface between the runtime (strategies, ReplicaContext) and a
// transport: byte-level collectives of one member ("rank") of a fixed group.
// The runtime validates and agrees on every call before it reaches a
// communicator, so implementations may assume matching calls, counts and
// dtypes on every rank. The backends that implement it, and how one plugs
// in: docs/algorithms.md, "How a backend plugs in".
//
// Contract for every method: called by every rank of the group, in the same
// order; blocks until this rank's part is done; throws the group's abort
// error (see abort()) or DeadlineExceededError after `call.timeout`.
// After such a failure, a backend between processes may be left with a
// receive that MPI could not cancel (a message already arriving in pieces):
// if the receive buffer is tensor storage (Tensor, allocate_storage), that
// storage is kept aside for good once freed, never reused; any other buffer
// must stay alive as long as the process uses MPI.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "distribute/dtype.h"
#include "distribute/errors.h"
#include "distribute/reduce_op.h"

namespace distribute {

// Where the buffers of a call live, and what orders the work on them: with
// the pointers and counts of a call, the buffer descriptor a backend reads.
// Host memory (the process's own, any thread) is the one kind a backend
// serves today; the CUDA backend will serve kCuda (buffers on device
// `device_index`, the call's copies and kernels ordered on `stream`, a
// cudaStream_t, as NCCL's calls are). docs/algorithms.md, "How a backend
// plugs in".
enum class MemoryKind : std::uint8_t {
  kHost,
  kCuda,
};
struct BufferPlace {
  MemoryKind kind = MemoryKind::kHost;
  int device_index = 0;    // the device's ordinal for a device kind; 0 on the host
  void* stream = nullptr;  // the device stream the call is ordered on; null on the host
  friend bool operator==(const BufferPlace&, const BufferPlace&) = default;
};
// "host", "CUDA device 1".
std::string to_string(const BufferPlace& place);

// What a collective is, for matching and for error messages.
struct CollectiveCall {
  std::string_view op = "collective";  // "all_reduce", "all_gather", "merge_call", ...
  std::uint64_t sequence = 0;          // 1-based index of the collective in this run, per replica
  double timeout_seconds = 0;          // 0: wait forever
  double stall_warning_seconds = 0;    // 0: never warn
  // Non-zero on the first call of a collective: a hash of what must agree
  // (bit 0 set: this rank found its own arguments invalid). Before any
  // result is delivered, a communicator compares the tags of all ranks; if
  // they differ or any has bit 0, every rank throws SignatureMismatch
  // (inputs untouched, nothing left in flight; see all_gather_v for its
  // output) and the runtime exchanges full signatures to say what differs.
  std::uint64_t signature_tag = 0;
  // The first call of a new session of the group's user (the meeting of a
  // strategy built on it): a member that ended its last session
  // (end_session) just before this call is where it should be.
  bool starts_session = false;
  // The caller's words for a member that returned from its work without
  // making this call (its count of such calls differs from the others'):
  // the first sentence of the error every waiting rank raises. Empty: the
  // backend's own words ("... can never complete").
  std::string_view count_mismatch = {};
  // Where every buffer of the call lives (send, recv, segments, the storage
  // a *_shared call returns). A backend is only given a place it reaches().
  BufferPlace place = {};
};

// Part of the contract, for whoever implements a backend: thrown by a
// communicator's call on every rank at once when the ranks' signature tags
// differ (CollectiveCall::signature_tag). Not an error users see: the
// runtime catches it and raises the typed error that says what differs.
class SignatureMismatch : public std::exception {
 public:
  const char* what() const noexcept override { return "collective signatures differ"; }
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  // Fixed for the communicator's life, 0 <= rank() < size(); neither may
  // throw (a MultiWorkerMirroredStrategy reads them before its workers meet,
  // and a worker that threw there would leave the others waiting).
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string_view backend_name() const = 0;
  // Whether this backend can work on buffers at `place` (the default: host
  // memory only). Whoever makes a call on other memory asks first.
  virtual bool reaches(const BufferPlace& place) const noexcept { return place.kind == MemoryKind::kHost; }

  // Every rank contributes `payload`; returns all payloads in rank order.
  virtual std::vector<std::string> exchange(std::string payload, const CollectiveCall& call) = 0;
  // recv = op over every rank's send, combined in rank order (MEAN divides by
  // `mean_divisor`, or size() when 0). send == recv is allowed (in place).
  virtual void all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op,
                          const CollectiveCall& call, std::int64_t mean_divisor = 0) = 0;
  // One all_reduce over several buffers of one dtype, as if they were
  // concatenated (every rank passes the same segment counts): how a pack of
  // many values is reduced without first copying them together. The default
  // stages through one contiguous buffer; a backend may do better.
  struct Segment {
    const void* send = nullptr;
    void* recv = nullptr;
    std::size_t count = 0;
  };
  virtual void all_reduce_segments(std::span<const Segment> segments, DType dtype, ReduceOp op,
                                   const CollectiveCall& call, std::int64_t mean_divisor = 0);
  // all_reduce_segments into storage of the call's own, which this rank must
  // only read (the segments' recv are not used): returns the concatenation
  // of every segment's result, null for no elements. Ranks that share an
  // address space may all be given the same storage (from which size each
  // backend does: docs/algorithms.md, "Shared outputs"), so that each element
  // of the result is written once instead of once per rank. The default allocates
  // one block per rank and calls all_reduce (one segment) or
  // all_reduce_segments.
  virtual std::shared_ptr<std::byte> all_reduce_shared(std::span<const Segment> segments, DType dtype, ReduceOp op,
                                                       const CollectiveCall& call, std::int64_t mean_divisor = 0);
  // Every rank passes the same counts and a send buffer of their sum; rank r
  // receives counts[r] elements: op over every rank's send, combined in rank
  // order, of the block that starts at counts[0] + ... + counts[r-1] (MEAN
  // divides by `mean_divisor`, or size() when 0). As MPI_Reduce_scatter;
  // recv must not overlap send. The default all-reduces the whole buffer and
  // keeps this rank's block; a backend may do better.
  virtual void reduce_scatter(const void* send, void* recv, std::span<const std::size_t> counts, DType dtype,
                              ReduceOp op, const CollectiveCall& call, std::int64_t mean_divisor = 0);
  // Rank r contributes outer * counts[r] elements, seen as `outer` rows of
  // counts[r]. recv holds `outer` rows, each the concatenation of every
  // rank's row in rank order (outer == 1: plain all-gather-v). On
  // SignatureMismatch, recv's blocks of other ranks may hold what arrived
  // (a backend may receive blocks into place while it compares tags); send
  // and this rank's own block are untouched.
  virtual void all_gather_v(const void* send, void* recv, std::span<const std::size_t> counts, std::size_t outer,
                            DType dtype, const CollectiveCall& call) = 0;
  // all_gather_v into storage of the call's own, which this rank must only
  // read: ranks that share an address space may all be given the same
  // storage ("Shared outputs", as above), so that each rank writes its own block once instead of every rank
  // writing every block. Returns outer * sum(counts) elements (null
  // for none). The default allocates one block per rank and calls
  // all_gather_v. Failures as all_gather_v's.
  virtual std::shared_ptr<std::byte> all_gather_v_shared(const void* send, std::span<const std::size_t> counts,
                                                         std::size_t outer, DType dtype, const CollectiveCall& call);
  // Copies root's buffer into every other rank's buffer; root's is only read.
  virtual void broadcast(void* buffer, std::size_t count, DType dtype, int root, const CollectiveCall& call) = 0;
  // Out of place, as ncclBroadcast: root's `send` into every rank's `recv`,
  // root's own included; `send` is read on root only (the others may pass
  // null). send == recv on root is broadcast() in place; otherwise they must
  // not overlap. On
  // SignatureMismatch root's recv is untouched. The default broadcasts from
  // root's send in place, then root copies it into its recv.
  virtual void broadcast_out_of_place(const void* send, void* recv, std::size_t count, DType dtype, int root,
                                      const CollectiveCall& call);
  // broadcast into storage of the call's own, which this rank must only
  // read: returns root's `count` elements (null for none); `send` is read
  // on root only. Ranks that share an address space may all be given the
  // same storage ("Shared outputs", as above), so that root's bytes are copied
  // once instead of once per rank. The default allocates one block per rank
  // and calls broadcast_out_of_place into it.
  virtual std::shared_ptr<std::byte> broadcast_shared(const void* send, std::size_t count, DType dtype, int root,
                                                      const CollectiveCall& call);
  virtual void barrier(const CollectiveCall& call) = 0;
  // Fails the group: every pending and later call on every rank throws an
  // error of `code` with `message`, until the group is reset by its owner.
  virtual void abort(ErrorCode code, const std::string& message, int origin_rank) noexcept = 0;
  // The session that the latest call with CollectiveCall::starts_session
  // began: a number the same on every rank (0 before any, and for a backend
  // without sessions). Its user reads it right after that call.
  virtual std::uint64_t session() const noexcept { return 0; }
  // This rank's user is done with session `session` (a strategy built on it
  // was destroyed; `why` says so): another rank that is in, or enters, a
  // call of that session this rank did not make raises
  // FailedPreconditionError naming this rank and `why` at once, instead of
  // waiting for it; a rank in another session (it started a new one after
  // the same calls, or before this one ended) is not concerned. A backend
  // between processes also says so on its own when its process ends or the
  // communicator is destroyed. The default does nothing: the threads of one
  // process see a replica return on their own.
  virtual void end_session(std::uint64_t session, std::string_view why) noexcept {
    static_cast<void>(session);
    static_cast<void>(why);
  }
};

}  // namespace distribute
