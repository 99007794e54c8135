// Packing of a flattened nest for all_reduce: values of one dtype share a
// buffer so that many small values cost one collective. Within each dtype,
// values keep their order and a new pack starts only once the current pack
// holds more than bytes_per_pack bytes (TensorFlow's group_by_size rule), so
// every pack but the last of a dtype is at least bytes_per_pack;
// bytes_per_pack == 0 puts every value of a dtype in one pack.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "distribute/tensor.h"

namespace distribute::internal {

struct Pack {
  DType dtype = DType::kFloat32;
  std::vector<std::size_t> leaves;  // indices into the flattened values
  std::size_t count = 0;            // elements in the pack
};

// Dtype groups appear in the order of their first value.
std::vector<Pack> plan_packs(const std::vector<Tensor>& values, std::int64_t bytes_per_pack);

}  // namespace distribute::internal
