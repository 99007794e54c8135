// Storage for tensor bytes: 64-byte aligned so kernels may use aligned vector
// loads, shared so that copies and views of a Tensor need no copy of the bytes.
//
// Blocks are cached: when the last Tensor using a block goes away, the block
// goes back to a free list of its size class instead of to the system.
// On these machines first touch of fresh memory costs about 16 us per 4 KiB
// page (0.25 GB/s), so a collective that gets fresh output pages every call
// would run at a tenth of memory speed; with the cache, a steady-state step
// reuses the same pages and takes no page faults.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

// Under AddressSanitizer, blocks idle in the cache are poisoned, so a read or
// write through a pointer into storage that its last Tensor let go of is
// reported (use-after-poison), as a use after free would be without the
// cache; so is an access past the bytes asked for, into the size class's slack.
#if defined(__SANITIZE_ADDRESS__)
#define DISTRIBUTE_STORAGE_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DISTRIBUTE_STORAGE_ASAN 1
#endif
#endif

namespace distribute::internal {

#if defined(DISTRIBUTE_STORAGE_ASAN)
inline constexpr bool kIdleStoragePoisoned = true;
#else
inline constexpr bool kIdleStoragePoisoned = false;
#endif

inline constexpr std::size_t kStorageAlignment = 64;
// Blocks from this size up are cached in a cache shared by every thread (and
// counted in StorageStats); smaller ones only in the allocating thread's own
// cache, since malloc's reused heap does not fault for them, but an aligned
// allocation from it is slow.
inline constexpr std::size_t kCachedMinBytes = 4096;

// Uninitialised bytes; nullptr for 0 bytes. std::bad_alloc when the system
// has no memory to give (Tensor turns it into ResourceExhaustedError).
std::shared_ptr<std::byte> allocate_storage(std::size_t bytes);
// A byte count for messages: "3,221,225,472 bytes (3.0 GiB)".
std::string bytes_text(std::size_t bytes);
// The same, for storage that several threads share and let go of in any
// order (an all_gather output of every replica): it comes from and goes back
// to the cache shared by every thread. (A block of allocate_storage goes back
// to its allocating thread's own cache if that thread lets go of it last, and
// to the shared cache otherwise: with the allocating thread changing from
// call to call, a thread could find its cache empty while the last block sat
// in another's, and take fresh pages.)
std::shared_ptr<std::byte> allocate_shared_storage(std::size_t bytes);

struct StorageStats {
  std::uint64_t fresh_blocks = 0;   // cached-size blocks taken from the system
  std::uint64_t reused_blocks = 0;  // cached-size blocks served from the cache
  std::size_t cached_bytes = 0;     // bytes now idle in the cache
  std::size_t cache_limit = 0;      // most bytes the cache keeps idle
};
StorageStats storage_stats();
// Returns every idle cached block to the system.
void release_cached_storage();

// After a failure, a transport may be left with a receive it could not
// cancel, still able to write into [data, data + bytes) (a message between
// hosts that arrives in pieces). Storage that overlaps the range is never
// reused: when its last user lets it go, it is kept aside for good (a bounded
// leak, after failures only) instead of going back to the cache or the
// system. Other memory in the range is the caller's to keep alive.
void quarantine_storage(const void* data, std::size_t bytes);
// Blocks kept aside so far (for tests).
std::size_t quarantined_blocks();

}  // namespace distribute::internal
