// What the value layer's own files share about tensors and that users never
// call: the interned device names and the checked byte count.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "distribute/dtype.h"
#include "distribute/tensor.h"

namespace distribute::internal {

// A stable copy of a device name, shared by every tensor on that device (the
// registry only grows; device names are few).
const std::string* intern_device(std::string_view device);
// The bytes of a dtype x shape tensor; InvalidArgumentError where they do
// not fit in int64.
std::size_t checked_nbytes(DType dtype, const Shape& shape);

}  // namespace distribute::internal
