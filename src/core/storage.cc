#include "core/storage.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/whole_number.h"

#if defined(DISTRIBUTE_STORAGE_ASAN)
#include <sanitizer/asan_interface.h>
#endif

namespace distribute::internal {
namespace {

// Size classes: 4 per power of two (at most 25% slack), like jemalloc's.
constexpr std::size_t size_class(std::size_t bytes) {
  std::size_t top = std::size_t{1} << (63 - __builtin_clzll(bytes));  // highest power of two <= bytes
  const std::size_t step = top >= 4 ? top / 4 : 1;
  return (bytes + step - 1) / step * step;
}

// The number of a size class, 0 to 255: 4 per power of two.
constexpr std::size_t class_index(std::size_t cls) {
  const int log = 63 - __builtin_clzll(cls);
  const std::size_t offset = cls - (std::size_t{1} << log);
  return 4 * static_cast<std::size_t>(log) + (log >= 2 ? offset >> (log - 2) : offset);
}
// The size class of number `index`.
constexpr std::size_t class_bytes(std::size_t index) {
  const std::size_t top = std::size_t{1} << (index / 4);
  const std::size_t step = top >= 4 ? top / 4 : 1;
  return top + (index % 4) * step;
}
// Every class of storage (64 bytes up) has its own number, and back.
static_assert([] {
  for (std::size_t bytes = kStorageAlignment; bytes < (std::size_t{1} << 60); bytes = bytes * 5 / 4 + 1) {
    const std::size_t cls = size_class(bytes);
    if (class_index(cls) >= 256 || class_bytes(class_index(cls)) != cls) return false;
  }
  return true;
}());

// Marks [p, p + bytes) unusable (idle in a cache) or usable again: no-ops
// without AddressSanitizer.
#if defined(DISTRIBUTE_STORAGE_ASAN)
void poison(const void* p, std::size_t bytes) { __asan_poison_memory_region(p, bytes); }
void unpoison(const void* p, std::size_t bytes) { __asan_unpoison_memory_region(p, bytes); }
#else
void poison(const void*, std::size_t) {}
void unpoison(const void*, std::size_t) {}
#endif

void* system_allocate(std::size_t bytes) { return ::operator new (bytes, std::align_val_t{kStorageAlignment}); }
// `bytes`: the block's size class (a cached block may still be poisoned).
void system_free(void* p, std::size_t bytes) {
  unpoison(p, bytes);
  ::operator delete (p, std::align_val_t{kStorageAlignment});
}

// A setting that is not a whole number leaves the default here (the first
// allocation is no place to throw); creating a strategy reports it.
std::size_t cache_limit_from_env() {
  return parse_whole_number(std::getenv("DISTRIBUTE_STORAGE_CACHE_BYTES")).value_or(std::size_t{2} << 30);  // 2 GiB
}

class StorageCache {
 public:
  void* take(std::size_t cls) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = free_.find(cls);
      if (it != free_.end() && !it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        cached_bytes_ -= cls;
        ++reused_;
        return p;
      }
      ++fresh_;
    }
    return system_allocate(cls);
  }

  void give_back(void* p, std::size_t cls) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (cached_bytes_ + cls <= limit_) {
        free_[cls].push_back(p);
        cached_bytes_ += cls;
        return;
      }
    }
    system_free(p, cls);
  }

  StorageStats stats() {
    std::lock_guard<std::mutex> lock(mu_);
    return {fresh_, reused_, cached_bytes_, limit_};
  }

  void release() {
    std::unordered_map<std::size_t, std::vector<void*>> blocks;
    {
      std::lock_guard<std::mutex> lock(mu_);
      blocks.swap(free_);
      cached_bytes_ = 0;
    }
    for (auto& [cls, list] : blocks) {
      for (void* p : list) system_free(p, cls);
    }
  }

 private:
  std::mutex mu_;
  std::unordered_map<std::size_t, std::vector<void*>> free_;
  std::size_t cached_bytes_ = 0;
  const std::size_t limit_ = cache_limit_from_env();
  std::uint64_t fresh_ = 0;
  std::uint64_t reused_ = 0;
};

// Never destroyed: tensors may be freed by threads still running at exit.
StorageCache& cache() {
  static StorageCache* instance = new StorageCache();
  return *instance;
}

// A per-thread front of the cache. A replica thread gets back the blocks it
// freed itself, so the cache lines of its output buffers stay in the caches
// of the cores that wrote them last step instead of moving between cores
// (measured: 32 KiB all-reduces through the API took 7 us with one shared free
// list and 2.5 us with per-thread lists).
//
// A thread keeps only blocks it allocated itself. Blocks another thread
// allocated (a merge_fn's results, freed by each replica) go back to the
// shared cache, where the allocating thread finds them: a thread that only
// frees would otherwise hoard them, and the allocating one take fresh memory
// (first-touch page faults) until the hoards were full.
constexpr std::size_t kThreadCacheBytes = 256 << 20;
constexpr std::size_t kThreadCacheBlocksPerClass = 8;

// Indexed by size class (class_index), not hashed: the lookup is on every
// allocation and free of a collective's output, and a hash map's modulo was
// a visible part of the API's fixed cost.
struct ThreadCache {
  std::array<std::vector<void*>, std::size_t{4} * 64> free;
  std::size_t bytes = 0;
  ~ThreadCache();
};
// Trivially destructible, so it can be read even while thread-locals are
// being destroyed: once set, blocks bypass this thread's cache.
thread_local bool thread_cache_gone = false;

// Blocks below kCachedMinBytes live in thread caches only: the shared cache
// (and its lock, and its statistics) is for blocks whose fresh pages fault.
bool shared_class(std::size_t cls) { return cls >= kCachedMinBytes; }

// Past the thread caches: the shared cache, or the system for small blocks.
void* take_elsewhere(std::size_t cls) { return shared_class(cls) ? cache().take(cls) : system_allocate(cls); }
void give_back_elsewhere(void* p, std::size_t cls) {
  if (shared_class(cls)) {
    cache().give_back(p, cls);
  } else {
    system_free(p, cls);
  }
}

ThreadCache::~ThreadCache() {
  thread_cache_gone = true;
  for (auto& list : free) {
    const std::size_t cls = class_bytes(static_cast<std::size_t>(&list - free.data()));
    for (void* p : list) give_back_elsewhere(p, cls);
  }
}

ThreadCache* thread_cache() {
  if (thread_cache_gone) return nullptr;
  thread_local ThreadCache tc;
  return &tc;
}

// A number for the calling thread, never reused (a thread's id may be).
std::uint64_t this_thread_number() {
  static std::atomic<std::uint64_t> next{1};
  thread_local const std::uint64_t number = next.fetch_add(1, std::memory_order_relaxed);
  return number;
}

void* take_block(std::size_t cls) {
  if (ThreadCache* tc = thread_cache()) {
    auto& list = tc->free[class_index(cls)];
    if (!list.empty()) {
      void* p = list.back();
      list.pop_back();
      tc->bytes -= cls;
      return p;
    }
  }
  return take_elsewhere(cls);
}

// `owner`: the number of the thread that allocated the block.
void give_back_block(void* p, std::size_t cls, std::uint64_t owner) {
  if (owner == this_thread_number()) {
    if (ThreadCache* tc = thread_cache()) {
      auto& list = tc->free[class_index(cls)];
      if (list.size() < kThreadCacheBlocksPerClass && tc->bytes + cls <= kThreadCacheBytes) {
        list.push_back(p);
        tc->bytes += cls;
        return;
      }
    }
  }
  give_back_elsewhere(p, cls);
}

// Ranges a transport may still write into, and the blocks kept aside for
// them (held here, so that they stay reachable: no leak report at exit).
struct Quarantine {
  std::mutex mu;
  std::vector<std::pair<const std::byte*, const std::byte*>> ranges;  // [begin, end)
  std::vector<void*> kept;
};
Quarantine& quarantine() {
  static Quarantine* instance = new Quarantine();  // never destroyed, as the cache
  return *instance;
}
// The bounds of every quarantined range, so that a free outside them (every
// free, until a failure quarantines something) costs two loads, no lock.
constexpr std::uintptr_t kNoQuarantine = ~std::uintptr_t{0};
std::atomic<std::uintptr_t> quarantine_low{kNoQuarantine};
std::atomic<std::uintptr_t> quarantine_high{0};

// Keeps the block [p, p + bytes) aside if it overlaps a quarantined range.
bool kept_aside(std::byte* p, std::size_t bytes) {
  const std::uintptr_t low = quarantine_low.load(std::memory_order_acquire);
  if (low == kNoQuarantine) return false;
  const auto at = reinterpret_cast<std::uintptr_t>(p);
  if (at + bytes <= low || at >= quarantine_high.load(std::memory_order_relaxed)) return false;
  Quarantine& q = quarantine();
  std::lock_guard<std::mutex> lock(q.mu);
  for (const auto& [begin, end] : q.ranges) {
    if (begin < p + bytes && p < end) {
      try {
        q.kept.push_back(p);
      } catch (const std::bad_alloc&) {
        // Out of memory: the block stays aside all the same, unrecorded.
      }
      return true;
    }
  }
  return false;
}

// A block of class `cls` handed out for `bytes`: those are usable, the slack
// after them is not. (A quarantined block is never poisoned: a transport may
// still write into it, and that is no fault of ours to report.)
void hand_out(std::byte* p, std::size_t bytes, std::size_t cls) {
  poison(p + bytes, cls - bytes);
  unpoison(p, bytes);
}

}  // namespace

std::string bytes_text(std::size_t bytes) {
  const std::string plain = std::to_string(bytes);
  std::string digits;
  for (std::size_t i = 0; i < plain.size(); ++i) {
    if (i > 0 && (plain.size() - i) % 3 == 0) digits += ',';
    digits += plain[i];
  }
  static const char* const kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double value = static_cast<double>(bytes);
  int unit = -1;
  while (value >= 1024 && unit < 5) {
    value /= 1024;
    ++unit;
  }
  if (unit < 0) return digits + (bytes == 1 ? " byte" : " bytes");
  char scaled[32];
  std::snprintf(scaled, sizeof scaled, " (%.1f %s)", value, kUnits[unit]);
  return digits + " bytes" + scaled;
}

std::shared_ptr<std::byte> allocate_storage(std::size_t bytes) {
  if (bytes == 0) return nullptr;
  // No machine has this much memory, and the size classes would overflow.
  if (bytes > (std::size_t{1} << 62)) throw std::bad_alloc();
  // Small blocks too come from the thread's cache: an aligned allocation from
  // the system costs about 600 instructions (glibc's memalign), more than the
  // rest of a small collective's API call.
  const std::size_t cls = size_class(std::max(bytes, kStorageAlignment));
  auto* p = static_cast<std::byte*>(take_block(cls));
  hand_out(p, bytes, cls);
  return std::shared_ptr<std::byte>(p, [cls, owner = this_thread_number()](std::byte* q) {
    if (kept_aside(q, cls)) return;
    poison(q, cls);
    give_back_block(q, cls, owner);
  });
}

std::shared_ptr<std::byte> allocate_shared_storage(std::size_t bytes) {
  if (bytes == 0) return nullptr;
  if (bytes > (std::size_t{1} << 62)) throw std::bad_alloc();
  const std::size_t cls = size_class(std::max(bytes, kStorageAlignment));
  auto* p = static_cast<std::byte*>(take_elsewhere(cls));
  hand_out(p, bytes, cls);
  // Owner 0 is no thread's number: the block goes back past every thread's cache.
  return std::shared_ptr<std::byte>(p, [cls](std::byte* q) {
    if (kept_aside(q, cls)) return;
    poison(q, cls);
    give_back_block(q, cls, 0);
  });
}

void quarantine_storage(const void* data, std::size_t bytes) {
  if (data == nullptr || bytes == 0) return;
  Quarantine& q = quarantine();
  const auto* begin = static_cast<const std::byte*>(data);
  std::lock_guard<std::mutex> lock(q.mu);
  q.ranges.emplace_back(begin, begin + bytes);
  // The high bound first: a free that sees the new low bound sees it too.
  const auto low = reinterpret_cast<std::uintptr_t>(begin);
  quarantine_high.store(std::max(quarantine_high.load(std::memory_order_relaxed), low + bytes),
                        std::memory_order_relaxed);
  quarantine_low.store(std::min(quarantine_low.load(std::memory_order_relaxed), low), std::memory_order_release);
}

std::size_t quarantined_blocks() {
  Quarantine& q = quarantine();
  std::lock_guard<std::mutex> lock(q.mu);
  return q.kept.size();
}

// Counts the global cache only: blocks idle in thread caches are not in cached_bytes.
StorageStats storage_stats() { return cache().stats(); }

void release_cached_storage() { cache().release(); }

}  // namespace distribute::internal
