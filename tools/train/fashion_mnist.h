// Fashion-MNIST from its IDX files (gzip-compressed or plain), as Debian's
// dataset-fashion-mnist package installs them.
#pragma once

#include <distribute/tensor.h>

#include <cstdint>
#include <string>
#include <utility>

namespace distribute::train {

inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

// Images as uint8 (n, 784), the file's bytes (a quarter of float32's memory
// traffic when batches are gathered); labels as int32 (n,) in [0, 10).
struct Examples {
  Tensor images;
  Tensor labels;
  std::int64_t size() const { return labels.num_elements(); }
};

// Rows `indices` (int64) of `examples`: images as float32 (b, 784) scaled to
// [0, 1], and their labels (b,).
std::pair<Tensor, Tensor> gather_rows(const Examples& examples, const Tensor& indices);

struct FashionMnist {
  Examples train;
  Examples test;
};

// Reads `<dir>/{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]`. A missing
// file is a NotFoundError naming it (and the package that installs it); a
// file that is not a valid IDX file of the expected kind, size and label
// range is an InvalidArgumentError naming the file and what is wrong.
FashionMnist load_fashion_mnist(const std::string& dir = kFashionMnistDir);

// One IDX pair (e.g. "<dir>/train"), for tests of the reader itself.
Examples load_idx_pair(const std::string& images_path, const std::string& labels_path);

}  // namespace distribute::train
