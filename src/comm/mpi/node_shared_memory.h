// NodeSharedMemory: memory that every rank of an MPI communicator maps, when
// all of them run on one host (a POSIX shared memory object, named for the
// setup only: rank 0 creates it, the others map it, and it is unlinked before
// any collective uses it, so a killed process leaves nothing behind; unmapping
// it is local, so no teardown waits for a peer). Ranks that share a
// host then move large messages with plain loads and stores at memory speed,
// where MPI between processes moves them with the kernel's single copy
// (process_vm_readv, about 5 to 7 GB/s on this project's machines).
//
// Each rank owns one area: a step counter (on a page of its own, with two
// slots for what it says of its calls) and two buffers of kChunkBytes. Every
// rank reads every other rank's area; only its owner writes it. A rank says
// it has finished a step by storing the step's number in its counter
// (release); others wait until every counter has reached it (acquire).
//
// Slots and buffers alternate with the step's parity: what a rank writes
// before step s goes into slot and buffer s % 2, and every rank finishes
// reading step s's before it takes step s + 1. So the writes for step s + 2,
// made once every rank has taken step s + 1, never meet a reader. The waiting
// itself is the communicator's (MpiCommunicator::poll: timeout, failure
// notices, yielding).
#pragma once

#include <mpi.h>
#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace distribute::internal {

class NodeSharedMemory {
 public:
  // Large enough that the steps' waits cost little (two per chunk), small
  // enough that a chunk stays in a core's cache between its steps.
  static constexpr std::size_t kChunkBytes = std::size_t{512} << 10;

  // What a rank says of its call at the call's first step, so that ranks
  // whose calls differ find out before they read each other's data.
  // Every field but `address`, and `bytes` of an exchange or an all-gather
  // (whose `layout` says every rank's), is the same on every rank of a
  // matching call, so that every rank that compares its own with the
  // others' reaches the same verdict.
  struct Call {
    std::uint64_t tag = 0;      // the signature tag (0: none)
    std::uint64_t bytes = 0;    // the bytes this rank sends
    std::uint64_t layout = 0;   // an all-gather's: every rank's block size, hashed
    std::uint64_t address = 0;  // where this rank's data is, for single_copy() reads
    std::uint32_t kind = 0;
    std::uint32_t dtype = 0;
    std::uint32_t op = 0;
    std::int32_t root = 0;
  };

  // Collective over `comm` (rank `rank` of `size`); every rank must call it
  // (or none). nullptr on every rank when the ranks do not all share one
  // host, when there is only one, or when the memory cannot be had on some
  // rank (a too small /dev/shm, say: its space is reserved here): the caller
  // then keeps to MPI. Each rank touches its own buffers and maps the
  // others' here, so that no collective pays for first touches.
  static std::unique_ptr<NodeSharedMemory> create(MPI_Comm comm, int rank, int size);
  ~NodeSharedMemory();
  NodeSharedMemory(const NodeSharedMemory&) = delete;
  NodeSharedMemory& operator=(const NodeSharedMemory&) = delete;

  // Rank `rank`'s slot and buffer (kChunkBytes) of step `step`.
  Call& call(int rank, std::uint64_t step) const { return *areas_[static_cast<std::size_t>(rank)].calls[step & 1]; }
  std::byte* buffer(int rank, std::uint64_t step) const {
    return areas_[static_cast<std::size_t>(rank)].buffers[step & 1];
  }
  // Whether every rank can read every other's memory with the kernel's
  // single copy (process_vm_readv, as MPI does between processes on one
  // host), found by trying at setup; DISTRIBUTE_MPI_SINGLE_COPY=0 on any
  // rank turns it off.
  bool single_copy() const { return single_copy_; }
  // Copies `bytes` at `address` in rank `rank`'s memory into `into`; false
  // (errno set) if the kernel refuses (the process gone, the address bad).
  bool read(int rank, std::uint64_t address, void* into, std::size_t bytes) const;
  // One source pointer per rank, for the reductions (no allocation per call).
  std::vector<const void*>& sources() { return sources_; }
  // This rank has finished `step`.
  void publish(int rank, std::uint64_t step) const {
    areas_[static_cast<std::size_t>(rank)].step->store(step, std::memory_order_release);
  }
  // Every rank has finished `step` (its writes before that are visible).
  bool all_reached(std::uint64_t step) const {
    for (const Area& a : areas_) {
      if (a.step->load(std::memory_order_acquire) < step) return false;
    }
    return true;
  }
  // The next step's number: every rank counts the steps of every call alike.
  std::uint64_t next_step() { return ++steps_; }

 private:
  struct Area {
    std::atomic<std::uint64_t>* step = nullptr;
    Call* calls[2] = {};
    std::byte* buffers[2] = {};
  };
  NodeSharedMemory() = default;
  // Collective: whether single_copy() works between every pair of ranks.
  bool try_single_copy(MPI_Comm comm, int rank, int size, std::uint64_t nonce);
  void* mapping_ = nullptr;
  std::size_t mapping_bytes_ = 0;
  std::vector<Area> areas_;
  std::vector<const void*> sources_;
  std::uint64_t steps_ = 0;
  std::vector<pid_t> pids_;  // every rank's process
  bool single_copy_ = false;
};

}  // namespace distribute::internal
