// The caching allocator behind tensor storage (src/core/storage.h).
#include "core/storage.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <new>
#include <thread>

#if defined(DISTRIBUTE_STORAGE_ASAN)
#include <sanitizer/asan_interface.h>
#endif

namespace distribute::internal {
namespace {

TEST(StorageTest, AlignedAndNullForZeroBytes) {
  EXPECT_EQ(allocate_storage(0), nullptr);
  for (std::size_t bytes : {std::size_t{1}, std::size_t{100}, std::size_t{4096}, std::size_t{1} << 20}) {
    auto p = allocate_storage(bytes);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p.get()) % kStorageAlignment, 0u) << bytes;
  }
}

// Sizes no machine can hold fail cleanly, before the size classes overflow.
TEST(StorageTest, ImpossibleSizesThrowBadAlloc) {
  for (std::size_t bytes : {(std::size_t{1} << 62) + 1, std::size_t{1} << 63, ~std::size_t{0}}) {
    EXPECT_THROW(allocate_storage(bytes), std::bad_alloc) << bytes;
  }
}

// Every size class around a power of two, from the smallest (64 bytes, the
// alignment) up, gets a block of at least the size asked, reused for a
// request of the same class (small ones by the thread's own cache).
// (On a thread of its own, so that its thread cache is handed back when it
// ends and the other tests see none of its blocks.)
TEST(StorageTest, SizesAroundPowersOfTwoGetTheirOwnClass) {
  std::thread([] {
    for (int log = 0; log <= 22; ++log) {
      const std::size_t power = std::size_t{1} << log;
      for (std::size_t bytes : {power - 1, power, power + 1, power + power / 4, power + power / 4 + 1}) {
        if (bytes == 0) continue;
        auto a = allocate_storage(bytes);
        ASSERT_NE(a, nullptr);
        a.get()[bytes - 1] = std::byte{1};  // the whole request is ours (ASan checks the bound)
        std::byte* first = a.get();
        a.reset();
        auto b = allocate_storage(bytes);
        EXPECT_EQ(b.get(), first) << bytes;
      }
    }
  }).join();
  release_cached_storage();
}

TEST(StorageTest, AFreedBlockIsReusedByTheSameThread) {
  std::byte* first;
  {
    auto a = allocate_storage(300000);
    first = a.get();
  }
  auto b = allocate_storage(299000);  // same size class (4 per power of two)
  EXPECT_EQ(b.get(), first);
}

TEST(StorageTest, BlocksFreedByAnotherThreadReachTheSharedCache) {
  release_cached_storage();
  const StorageStats before = storage_stats();
  std::thread([] {
    // More blocks of one class than a thread keeps: the rest go to the shared cache.
    std::vector<std::shared_ptr<std::byte>> blocks;
    for (int i = 0; i < 12; ++i) blocks.push_back(allocate_storage(3 << 20));
  }).join();
  const StorageStats after = storage_stats();
  EXPECT_GE(after.fresh_blocks - before.fresh_blocks, 12u);
  // The exiting thread handed its own cache back too: all 12 blocks are idle here now.
  EXPECT_GE(after.cached_bytes, std::size_t{36} << 20);
  auto again = allocate_storage(3 << 20);  // a class this thread never cached
  EXPECT_GT(storage_stats().reused_blocks, after.reused_blocks);
  release_cached_storage();
  EXPECT_EQ(storage_stats().cached_bytes, 0u);
}

// A thread that lives on and frees, one at a time, the blocks handed to it.
class Freer {
 public:
  Freer() : thread_([this] { loop(); }) {}
  ~Freer() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  // Returns once the freeing thread has dropped `block`.
  void free(std::shared_ptr<std::byte> block) {
    std::unique_lock<std::mutex> lock(mu_);
    slot_ = std::move(block);
    cv_.notify_all();
    cv_.wait(lock, [this] { return slot_ == nullptr; });
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait(lock, [this] { return done_ || slot_ != nullptr; });
      if (done_) return;
      slot_.reset();
      cv_.notify_all();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::shared_ptr<std::byte> slot_;
  bool done_ = false;
  std::thread thread_;
};

// A merge_fn allocates every replica's result on one thread; each replica
// frees its own on its thread. Those frees must reach the allocating thread
// again: a thread keeps only blocks it took itself.
TEST(StorageTest, BlocksAllocatedElsewhereAreNotHoardedByTheFreeingThread) {
  release_cached_storage();
  constexpr std::size_t kBytes = 5 << 20;  // a class no other test here uses
  Freer freer;
  for (int step = 0; step < 20; ++step) {
    std::shared_ptr<std::byte> block = allocate_storage(kBytes);
    const StorageStats before = storage_stats();
    freer.free(std::move(block));
    // The block went to the shared cache at once, not into the freeing thread's.
    EXPECT_EQ(storage_stats().cached_bytes, before.cached_bytes + kBytes) << "step " << step;
  }
  // From the second step on, each allocation reused the block freed the step before.
  const std::uint64_t fresh_before = storage_stats().fresh_blocks;
  for (int step = 0; step < 20; ++step) freer.free(allocate_storage(kBytes));
  EXPECT_EQ(storage_stats().fresh_blocks, fresh_before) << "steady state must take no fresh memory";
  // A block the freeing thread took itself stays in its own cache.
  std::thread([] {
    const StorageStats before = storage_stats();
    allocate_storage(kBytes).reset();
    EXPECT_EQ(storage_stats().cached_bytes, before.cached_bytes - kBytes);
  }).join();
  release_cached_storage();
}

// Storage that threads share (an all_gather output) goes back to the shared
// cache whoever lets go of it last, the allocating thread included: the next
// allocation, from any thread, finds it there.
TEST(StorageTest, SharedStorageGoesBackToTheSharedCacheFromAnyThread) {
  release_cached_storage();
  constexpr std::size_t kBytes = 7 << 20;  // a class no other test here uses
  Freer freer;
  std::byte* first = nullptr;
  std::thread([&] {
    std::shared_ptr<std::byte> block = allocate_shared_storage(kBytes);
    first = block.get();
    freer.free(std::move(block));  // another thread lets go of it
  }).join();
  EXPECT_EQ(storage_stats().cached_bytes, kBytes);
  const std::uint64_t fresh = storage_stats().fresh_blocks;
  for (int step = 0; step < 10; ++step) {
    std::shared_ptr<std::byte> block = allocate_shared_storage(kBytes);
    EXPECT_EQ(block.get(), first) << "step " << step;
    const StorageStats before = storage_stats();
    block.reset();  // the allocating thread lets go: the shared cache all the same
    EXPECT_EQ(storage_stats().cached_bytes, before.cached_bytes + kBytes) << "step " << step;
  }
  EXPECT_EQ(storage_stats().fresh_blocks, fresh);
  EXPECT_EQ(allocate_shared_storage(0), nullptr);
  EXPECT_THROW(allocate_shared_storage(std::size_t{1} << 63), std::bad_alloc);
  release_cached_storage();
}

// A transport that could not cancel a receive after a failure quarantines
// its area (MpiCommunicator::release): storage overlapping it must never be
// handed out again, while every other block is reused as before.
TEST(StorageTest, QuarantinedStorageIsNeverReused) {
  const std::size_t kept_before = quarantined_blocks();
  std::byte* hot = nullptr;
  {
    auto block = allocate_storage(300000);
    // A view into the block holds it too (as the values of a pack do).
    std::shared_ptr<std::byte> view(block, block.get() + 4096);
    quarantine_storage(view.get() + 100, 5000);
    hot = block.get();
    block.reset();
    EXPECT_EQ(quarantined_blocks(), kept_before) << "kept aside only when its last user lets go";
  }
  EXPECT_EQ(quarantined_blocks(), kept_before + 1);
  auto again = allocate_storage(299000);  // the same size class: the cache would hand `hot` back
  EXPECT_NE(again.get(), hot);
  // A small block (cached by its thread only) is kept aside too.
  {
    auto small = allocate_storage(100);
    quarantine_storage(small.get(), 1);
  }
  EXPECT_EQ(quarantined_blocks(), kept_before + 2);
  // Blocks outside every quarantined range are reused as before.
  std::byte* cold = nullptr;
  {
    auto c = allocate_storage(1 << 20);
    cold = c.get();
  }
  auto d = allocate_storage(1 << 20);
  EXPECT_EQ(d.get(), cold);
  d.reset();
  EXPECT_EQ(quarantined_blocks(), kept_before + 2);
}

bool poisoned(const std::byte* p) {
#if defined(DISTRIBUTE_STORAGE_ASAN)
  return __asan_address_is_poisoned(p) != 0;
#else
  (void)p;
  return false;
#endif
}

// Under AddressSanitizer a block idle in a cache is poisoned, and so is the
// slack of a block in use past the bytes asked for; a block handed out again
// is usable up to the new request. Small blocks (the thread's cache), large
// ones, and shared storage (the shared cache) alike. (Small shared storage
// goes back to the system, which poisons it for ASan's own reasons.)
TEST(StorageSanitizerTest, IdleBlocksAndTheSlackPastARequestArePoisoned) {
  if (!kIdleStoragePoisoned) GTEST_SKIP() << "only AddressSanitizer builds poison idle storage";
  std::thread([] {
    for (const bool shared : {false, true}) {
      for (const std::size_t bytes : {std::size_t{100}, std::size_t{300000}}) {
        if (shared && bytes < kCachedMinBytes) continue;
        const auto allocate = [&](std::size_t n) { return shared ? allocate_shared_storage(n) : allocate_storage(n); };
        SCOPED_TRACE(testing::Message() << (shared ? "shared, " : "") << bytes << " bytes");
        std::shared_ptr<std::byte> a = allocate(bytes);
        std::byte* p = a.get();
        EXPECT_FALSE(poisoned(p));
        EXPECT_FALSE(poisoned(p + bytes - 1));
        EXPECT_TRUE(poisoned(p + bytes)) << "the size class's slack";
        a.reset();
        EXPECT_TRUE(poisoned(p));
        EXPECT_TRUE(poisoned(p + bytes - 1));
        // The same class again: the same block, usable up to the smaller request.
        std::shared_ptr<std::byte> b = allocate(bytes - 3);
        ASSERT_EQ(b.get(), p);
        EXPECT_FALSE(poisoned(p));
        EXPECT_FALSE(poisoned(p + bytes - 4));
        EXPECT_TRUE(poisoned(p + bytes - 3));
      }
    }
  }).join();
  release_cached_storage();
}

// What the poisoning is for: a read through a pointer kept past the last
// user of its storage is reported, though the block is only back in the cache.
TEST(StorageSanitizerDeathTest, AReadOfStorageItsLastUserLetGoOfIsReported) {
  if (!kIdleStoragePoisoned) GTEST_SKIP() << "only AddressSanitizer builds poison idle storage";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        std::shared_ptr<std::byte> block = allocate_storage(8192);
        std::shared_ptr<std::byte> view(block, block.get() + 4096);  // as a Tensor's view holds it
        const volatile std::byte* kept = view.get();
        block.reset();
        view.reset();
        std::byte read = *kept;
        (void)read;
      },
      "use-after-poison");
}

// A quarantined block is kept aside unpoisoned: a transport may still write
// into it after a failure, which is no fault to report.
TEST(StorageSanitizerTest, QuarantinedBlocksStayUnpoisoned) {
  if (!kIdleStoragePoisoned) GTEST_SKIP() << "only AddressSanitizer builds poison idle storage";
  std::byte* p = nullptr;
  {
    std::shared_ptr<std::byte> block = allocate_storage(200000);
    p = block.get();
    quarantine_storage(p, 16);
  }
  EXPECT_FALSE(poisoned(p));
  EXPECT_FALSE(poisoned(p + 199999));
}

}  // namespace
}  // namespace distribute::internal
