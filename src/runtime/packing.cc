#include "runtime/packing.h"

#include <algorithm>

namespace distribute::internal {

std::vector<Pack> plan_packs(const std::vector<Tensor>& values, std::int64_t bytes_per_pack) {
  std::vector<Pack> packs;
  std::vector<DType> dtypes;  // in order of first appearance
  for (const Tensor& v : values) {
    if (std::find(dtypes.begin(), dtypes.end(), v.dtype()) == dtypes.end()) dtypes.push_back(v.dtype());
  }
  for (DType dtype : dtypes) {
    const std::size_t first_of_dtype = packs.size();
    for (std::size_t i = 0; i < values.size(); ++i) {
      if (values[i].dtype() != dtype) continue;
      const bool start_new =
          packs.size() == first_of_dtype ||
          (bytes_per_pack > 0 && static_cast<std::int64_t>(packs.back().count * size_of(dtype)) > bytes_per_pack);
      if (start_new) packs.push_back(Pack{dtype, {}, 0});
      packs.back().leaves.push_back(i);
      packs.back().count += static_cast<std::size_t>(values[i].num_elements());
    }
  }
  return packs;
}

}  // namespace distribute::internal
