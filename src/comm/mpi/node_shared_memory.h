// NodeSharedMemory: memory that every rank of an MPI communicator maps, when
// all of them run on one host (a POSIX shared memory object, named for the
// setup only: rank 0 creates it, the others map it, and it is unlinked before
// any collective uses it, so a killed process leaves nothing behind; unmapping
// it is local, so no teardown waits for a peer). Ranks that share a
// host then move large messages with plain loads and stores at memory speed,
// where MPI between processes moves them with the kernel's single copy
// (process_vm_readv, about 5 to 7 GB/s on this project's machines).
//
// Each rank owns one area: a step counter and the fingerprint of its call (on
// a page of their own), an input buffer and an output buffer of kChunkBytes
// each. Every rank reads every
// other rank's area; only its owner writes it. A rank says it has finished a
// step by storing the step's number in its counter (release); others wait
// until every counter has reached it (acquire). The waiting itself is the
// communicator's (MpiCommunicator::poll: timeout, failure notices, yielding).
#pragma once

#include <mpi.h>

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

  // What a rank says of its call, so that ranks that disagree (untagged
  // calls of different sizes, which no header round compared) find out
  // before they read each other's buffers.
  struct Fingerprint {
    std::uint64_t bytes = 0;
    std::uint32_t dtype = 0;
    std::uint32_t op = 0;
    friend bool operator==(const Fingerprint&, const Fingerprint&) = default;
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

  std::byte* input(int rank) const { return areas_[static_cast<std::size_t>(rank)].input; }
  std::byte* output(int rank) const { return areas_[static_cast<std::size_t>(rank)].output; }
  Fingerprint& fingerprint(int rank) const { return *areas_[static_cast<std::size_t>(rank)].fingerprint; }
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
    Fingerprint* fingerprint = nullptr;
    std::byte* input = nullptr;
    std::byte* output = nullptr;
  };
  NodeSharedMemory() = default;
  void* mapping_ = nullptr;
  std::size_t mapping_bytes_ = 0;
  std::vector<Area> areas_;
  std::vector<const void*> sources_;
  std::uint64_t steps_ = 0;
};

}  // namespace distribute::internal
