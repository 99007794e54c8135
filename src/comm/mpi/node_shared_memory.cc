#include "comm/mpi/node_shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <new>

namespace distribute::internal {
namespace {

// Each rank's area: its step counter alone on the first page, then its input
// and output buffers.
constexpr std::size_t kCounterBytes = 4096;
constexpr std::size_t kAreaBytes = kCounterBytes + 2 * NodeSharedMemory::kChunkBytes;

// Whether every rank of `comm` says yes.
bool all_agree(bool yes, MPI_Comm comm) {
  int value = yes ? 1 : 0;
  if (MPI_Allreduce(MPI_IN_PLACE, &value, 1, MPI_INT, MPI_MIN, comm) != MPI_SUCCESS) return false;
  return value == 1;
}

}  // namespace

std::unique_ptr<NodeSharedMemory> NodeSharedMemory::create(MPI_Comm comm, int rank, int size) {
  if (size < 2) return nullptr;
  // Do all ranks share this host? The split gives every rank its host's
  // ranks; the answer is the same on every rank.
  MPI_Comm node = MPI_COMM_NULL;
  if (MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) != MPI_SUCCESS) return nullptr;
  int node_size = 0;
  MPI_Comm_size(node, &node_size);
  MPI_Comm_free(&node);
  if (node_size != size) return nullptr;

  // Rank 0 creates the object under a name of its own and sends the name.
  std::array<char, 64> name{};
  const std::size_t bytes = kAreaBytes * static_cast<std::size_t>(size);
  int fd = -1;
  if (rank == 0) {
    static std::atomic<unsigned> made{0};
    std::snprintf(name.data(), name.size(), "/distribute-%ld-%u", static_cast<long>(getpid()), made.fetch_add(1));
    fd = shm_open(name.data(), O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd >= 0 && ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
      close(fd);
      shm_unlink(name.data());
      fd = -1;
    }
    if (fd < 0) name[0] = '\0';
  }
  if (MPI_Bcast(name.data(), static_cast<int>(name.size()), MPI_CHAR, 0, comm) != MPI_SUCCESS) {
    if (fd >= 0) close(fd);
    if (rank == 0 && name[0] != '\0') shm_unlink(name.data());
    return nullptr;
  }
  if (name[0] == '\0') return nullptr;  // rank 0 could not create it: every rank knows
  if (rank != 0) fd = shm_open(name.data(), O_RDWR, 0600);
  void* mapping = fd >= 0 ? mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
  if (fd >= 0) close(fd);
  bool ok = mapping != MAP_FAILED;
  std::unique_ptr<NodeSharedMemory> shared(new NodeSharedMemory());
  if (ok) {
    shared->mapping_ = mapping;
    shared->mapping_bytes_ = bytes;
    auto* base = static_cast<std::byte*>(mapping);
    for (int q = 0; q < size; ++q) {
      std::byte* area = base + kAreaBytes * static_cast<std::size_t>(q);
      shared->areas_.push_back(Area{reinterpret_cast<std::atomic<std::uint64_t>*>(area), area + kCounterBytes,
                                    area + kCounterBytes + kChunkBytes});
    }
    // The owner touches its own area (its pages on its own NUMA node) and
    // starts its counter at 0.
    std::byte* own = base + kAreaBytes * static_cast<std::size_t>(rank);
    std::memset(own, 0, kAreaBytes);
    new (own) std::atomic<std::uint64_t>(0);
  }
  // Everyone has mapped it (or given up) and set its counter: the name can go.
  ok = all_agree(ok, comm);
  if (rank == 0) shm_unlink(name.data());
  if (!ok) return nullptr;  // the destructor unmaps what was mapped
  static_assert(std::atomic<std::uint64_t>::is_always_lock_free, "the step counters are shared between processes");
  return shared;
}

NodeSharedMemory::~NodeSharedMemory() {
  if (mapping_ != nullptr) munmap(mapping_, mapping_bytes_);
}

}  // namespace distribute::internal
