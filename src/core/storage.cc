#include "core/storage.h"

#include <new>

namespace distribute::internal {

std::shared_ptr<std::byte> allocate_storage(std::size_t bytes) {
  if (bytes == 0) return nullptr;
  auto* p = static_cast<std::byte*>(::operator new(bytes, std::align_val_t{kStorageAlignment}));
  return std::shared_ptr<std::byte>(p, [](std::byte* q) { ::operator delete(q, std::align_val_t{kStorageAlignment}); });
}

}  // namespace distribute::internal
