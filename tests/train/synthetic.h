// Synthetic Fashion-MNIST-shaped examples for the training tests: images
// drawn from a seed, labels that depend on them (so there is something to
// learn), no dataset files needed.
#pragma once

#include <random>

#include "fashion_mnist.h"

namespace distribute::train::testing {

inline Examples synthetic_examples(std::int64_t n, std::uint64_t seed) {
  Examples out{Tensor::uninitialized(DType::kUInt8, Shape{n, 784}), Tensor::uninitialized(DType::kInt32, Shape{n})};
  std::mt19937_64 gen(seed);
  auto px = out.images.mutable_flat<std::uint8_t>();
  auto labels = out.labels.mutable_flat<int>();
  for (std::int64_t i = 0; i < n; ++i) {
    int bright = 0;
    for (std::int64_t j = 0; j < 784; ++j) {
      const auto v = static_cast<std::uint8_t>(gen() >> 56);
      px[static_cast<std::size_t>(i * 784 + j)] = v;
      if (j < 78 * 10 && j % 78 == 0) bright += v > 127 ? 1 : 0;
    }
    labels[static_cast<std::size_t>(i)] = bright;  // 0..10 -> clamp below
    if (labels[static_cast<std::size_t>(i)] > 9) labels[static_cast<std::size_t>(i)] = 9;
  }
  return out;
}

}  // namespace distribute::train::testing
