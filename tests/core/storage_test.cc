// The caching allocator behind tensor storage (src/core/storage.h).
#include "core/storage.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <thread>

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

}  // namespace
}  // namespace distribute::internal
