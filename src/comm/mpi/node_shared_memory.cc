#include "comm/mpi/node_shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <random>

namespace distribute::internal {
namespace {

// Each rank's area: its step counter alone on the first page (with, in rank
// 0's, the object's nonce and, in every rank's, the two slots of its calls),
// then its two buffers.
std::size_t page_bytes() {
  const long page = sysconf(_SC_PAGESIZE);
  return page > 0 ? static_cast<std::size_t>(page) : 4096;
}
std::size_t counter_bytes() { return std::max<std::size_t>(4096, page_bytes()); }
std::size_t area_bytes() { return counter_bytes() + 2 * NodeSharedMemory::kChunkBytes; }
// Where rank 0's counter page holds the nonce that tells the ranks they
// mapped the same object, and where every counter page holds its rank's
// two call slots (each on a cache line of its own, past the counter's).
constexpr std::size_t kNonceOffset = 64;
constexpr std::size_t kCallsOffset = 128;
constexpr std::size_t kCacheLine = 64;
static_assert(sizeof(NodeSharedMemory::Call) <= kCacheLine);

// Whether every rank of `comm` says yes (no, if MPI fails).
bool all_agree(bool yes, MPI_Comm comm) {
  int value = yes ? 1 : 0;
  if (MPI_Allreduce(MPI_IN_PLACE, &value, 1, MPI_INT, MPI_MIN, comm) != MPI_SUCCESS) return false;
  return value == 1;
}

// Every rank of `comm` shares one host.
bool on_one_host(MPI_Comm comm, int size) {
  MPI_Comm node = MPI_COMM_NULL;
  bool one = false;
  if (MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) == MPI_SUCCESS) {
    int node_size = 0;
    one = MPI_Comm_size(node, &node_size) == MPI_SUCCESS && node_size == size;
    MPI_Comm_free(&node);
  }
  return all_agree(one, comm);  // the same answer everywhere, even if the split failed on some rank
}

// What rank 0 sends: the object's name ("" if it could not make one) and its nonce.
struct Invitation {
  std::array<char, 56> name{};
  std::uint64_t nonce = 0;
};

// Rank 0's part of create(): makes the object and maps it, with `bytes`
// reserved and `invitation`'s nonce written into it; MAP_FAILED, with
// `invitation`'s name empty, if it cannot. No exception leaves it.
void* make_object(Invitation& invitation, std::size_t bytes) {
  void* mapping = MAP_FAILED;
  try {
    // A name of its own (a leftover of a killed job may hold one: another
    // try), with the space reserved now: tmpfs grants pages only when they
    // are first written, and a full /dev/shm would then kill the process
    // with SIGBUS instead of failing here.
    static std::atomic<unsigned> made{0};
    std::random_device random;
    invitation.nonce = (std::uint64_t{random()} << 32) ^ random() ^ static_cast<std::uint64_t>(getpid());
    for (int attempt = 0; attempt < 8 && mapping == MAP_FAILED; ++attempt) {
      std::snprintf(invitation.name.data(), invitation.name.size(), "/distribute-%ld-%u-%u",
                    static_cast<long>(getpid()), made.fetch_add(1), static_cast<unsigned>(random() % 100000));
      const int fd = shm_open(invitation.name.data(), O_RDWR | O_CREAT | O_EXCL, 0600);
      if (fd < 0) continue;
      if (posix_fallocate(fd, 0, static_cast<off_t>(bytes)) == 0) {
        mapping = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      }
      close(fd);
      if (mapping == MAP_FAILED) shm_unlink(invitation.name.data());
    }
    if (mapping == MAP_FAILED) {
      invitation.name[0] = '\0';
    } else {
      std::memcpy(static_cast<std::byte*>(mapping) + kNonceOffset, &invitation.nonce, sizeof invitation.nonce);
    }
  } catch (...) {
    if (mapping != MAP_FAILED) {
      munmap(mapping, bytes);
      mapping = MAP_FAILED;
      shm_unlink(invitation.name.data());
    }
    invitation.name[0] = '\0';
  }
  return mapping;
}

}  // namespace

std::unique_ptr<NodeSharedMemory> NodeSharedMemory::create(MPI_Comm comm, int rank, int size) {
  if (size < 2 || !on_one_host(comm, size)) return nullptr;
  // Every rank runs the same collectives below, whatever fails where; a
  // failure only turns `ok` off, and the last vote sends everyone back to MPI.
  const std::size_t bytes = area_bytes() * static_cast<std::size_t>(size);
  Invitation invitation;
  void* mapping = MAP_FAILED;
  if (rank == 0) {
    // (No exception may leave before the broadcast below: the others wait there.)
    mapping = make_object(invitation, bytes);
  }
  if (MPI_Bcast(&invitation, static_cast<int>(sizeof invitation), MPI_BYTE, 0, comm) != MPI_SUCCESS) {
    invitation.name[0] = '\0';
  }
  bool ok = invitation.name[0] != '\0';
  if (ok && rank != 0) {
    const int fd = shm_open(invitation.name.data(), O_RDWR, 0600);
    if (fd >= 0) {
      mapping = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      close(fd);
    }
    // The object rank 0 made, not another of the same name (a rank in
    // another IPC namespace, say).
    std::uint64_t nonce = 0;
    if (mapping != MAP_FAILED) std::memcpy(&nonce, static_cast<std::byte*>(mapping) + kNonceOffset, sizeof nonce);
    ok = mapping != MAP_FAILED && nonce == invitation.nonce;
  }
  std::unique_ptr<NodeSharedMemory> shared;
  if (ok) {
    try {
      shared.reset(new NodeSharedMemory());
      shared->mapping_ = mapping;
      shared->mapping_bytes_ = bytes;
      mapping = MAP_FAILED;  // the object's now
      auto* base = static_cast<std::byte*>(shared->mapping_);
      for (int q = 0; q < size; ++q) {
        std::byte* area = base + area_bytes() * static_cast<std::size_t>(q);
        shared->areas_.push_back(Area{
            reinterpret_cast<std::atomic<std::uint64_t>*>(area),
            {reinterpret_cast<Call*>(area + kCallsOffset), reinterpret_cast<Call*>(area + kCallsOffset + kCacheLine)},
            {area + counter_bytes(), area + counter_bytes() + kChunkBytes}});
      }
      shared->sources_.resize(static_cast<std::size_t>(size));
      // The owner touches its own buffers (its pages on its own NUMA node)
      // and starts its counter at 0.
      std::byte* own = base + area_bytes() * static_cast<std::size_t>(rank);
      std::memset(own + counter_bytes(), 0, 2 * kChunkBytes);
      new (own) std::atomic<std::uint64_t>(0);
    } catch (const std::bad_alloc&) {
      ok = false;
    }
  }
  if (mapping != MAP_FAILED) munmap(mapping, bytes);
  // Everyone has mapped it (or given up) and set its counter: the name can go.
  ok = all_agree(ok, comm);
  if (rank == 0 && invitation.name[0] != '\0') shm_unlink(invitation.name.data());
  if (!ok) return nullptr;  // the destructor unmaps what was mapped
  // Map every page of the others' areas now, not in the first collective.
  for (int q = 0; q < size; ++q) {
    const auto* area =
        static_cast<const volatile std::byte*>(shared->mapping_) + area_bytes() * static_cast<std::size_t>(q);
    for (std::size_t at = 0; at < area_bytes(); at += page_bytes()) static_cast<void>(area[at]);
  }
  static_assert(std::atomic<std::uint64_t>::is_always_lock_free, "the step counters are shared between processes");
  shared->single_copy_ = shared->try_single_copy(comm, rank, size, invitation.nonce);
  return shared;
}

bool NodeSharedMemory::try_single_copy(MPI_Comm comm, int rank, int size, std::uint64_t nonce) {
  // Every rank publishes its pid and the address of a word that holds the
  // nonce and its rank, and reads every other's: the kernel may forbid it
  // (ptrace rules, containers), and then no rank uses it.
  const char* wanted = std::getenv("DISTRIBUTE_MPI_SINGLE_COPY");
  const volatile std::uint64_t probe = nonce ^ static_cast<std::uint64_t>(rank);
  struct Published {
    std::int64_t pid = 0;
    std::uint64_t address = 0;
  };
  Published mine{static_cast<std::int64_t>(getpid()), reinterpret_cast<std::uint64_t>(&probe)};
  std::vector<Published> all(static_cast<std::size_t>(size));
  bool ok = wanted == nullptr || std::strcmp(wanted, "0") != 0;
  if (MPI_Allgather(&mine, static_cast<int>(sizeof mine), MPI_BYTE, all.data(), static_cast<int>(sizeof mine), MPI_BYTE,
                    comm) != MPI_SUCCESS) {
    ok = false;
  }
  for (int q = 0; q < size && ok; ++q) {
    pids_.push_back(static_cast<pid_t>(all[static_cast<std::size_t>(q)].pid));
    std::uint64_t theirs = 0;
    ok = q == rank || (read(q, all[static_cast<std::size_t>(q)].address, &theirs, sizeof theirs) &&
                       theirs == (nonce ^ static_cast<std::uint64_t>(q)));
  }
  // `probe` lives until every rank has voted, so until every read is done.
  return all_agree(ok, comm);
}

bool NodeSharedMemory::read(int rank, std::uint64_t address, void* into, std::size_t bytes) const {
  auto* out = static_cast<std::byte*>(into);
  while (bytes > 0) {
    // The kernel may move less than asked (it stops at a page it cannot
    // read, or after MAX_RW_COUNT bytes): go on from there.
    iovec local{out, bytes};
    iovec remote{reinterpret_cast<void*>(address), bytes};
    const ssize_t moved = process_vm_readv(pids_[static_cast<std::size_t>(rank)], &local, 1, &remote, 1, 0);
    if (moved < 0 && errno == EINTR) continue;
    if (moved == 0) errno = EFAULT;  // nothing moved, nothing said: the address is bad
    if (moved <= 0) return false;
    out += moved;
    address += static_cast<std::uint64_t>(moved);
    bytes -= static_cast<std::size_t>(moved);
  }
  return true;
}

NodeSharedMemory::~NodeSharedMemory() {
  if (mapping_ != nullptr) munmap(mapping_, mapping_bytes_);
}

}  // namespace distribute::internal
