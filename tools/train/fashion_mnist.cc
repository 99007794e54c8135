#include "fashion_mnist.h"

#include <zlib.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <vector>

#include "core/kernel_clones.h"

namespace distribute::train {
namespace {

// The whole file, decompressed if it is gzip (zlib reads plain files as they are).
std::vector<unsigned char> read_all(const std::string& path) {
  if (!std::filesystem::exists(path)) {
    throw NotFoundError("Fashion-MNIST file " + path +
                        " does not exist (Debian's dataset-fashion-mnist package "
                        "installs it; scripts/setup.sh installs that package)");
  }
  std::unique_ptr<gzFile_s, int (*)(gzFile)> file(gzopen(path.c_str(), "rb"), gzclose);
  if (!file) throw NotFoundError("cannot open Fashion-MNIST file " + path);
  std::vector<unsigned char> out;
  unsigned char chunk[1 << 16];
  for (;;) {
    const int n = gzread(file.get(), chunk, sizeof chunk);
    if (n < 0) {
      int code = 0;
      std::string why = gzerror(file.get(), &code);
      // (zlib says "<path>: <what>": the path is in the message already.)
      if (why.rfind(path + ": ", 0) == 0) why.erase(0, path.size() + 2);
      throw InvalidArgumentError("Fashion-MNIST file " + path + " is corrupt: " + (why.empty() ? "read error" : why));
    }
    if (n == 0) break;
    out.insert(out.end(), chunk, chunk + n);
  }
  // The end of the file: zlib has checked the trailer (the CRC and length of
  // what it inflated: a mismatch is a read error above) if it met one; a
  // stream that ends before its trailer is Z_BUF_ERROR here, and its bytes
  // may be altered or cut short.
  int code = Z_OK;
  gzerror(file.get(), &code);
  if (code == Z_BUF_ERROR) {
    throw InvalidArgumentError("Fashion-MNIST file " + path +
                               " is corrupt: its gzip stream ends before its trailer (CRC and length), so its "
                               "contents cannot be checked");
  }
  return out;
}

std::uint32_t big_endian(const std::vector<unsigned char>& b, std::size_t at) {
  return (std::uint32_t{b[at]} << 24) | (std::uint32_t{b[at + 1]} << 16) | (std::uint32_t{b[at + 2]} << 8) | b[at + 3];
}

// Checks the IDX header (unsigned bytes, `rank` dimensions) and returns the dimensions.
std::vector<std::uint32_t> idx_dims(const std::vector<unsigned char>& bytes, int rank, const std::string& path) {
  auto bad = [&](const std::string& why) {
    return InvalidArgumentError("Fashion-MNIST file " + path + " is not a valid IDX file: " + why);
  };
  const std::size_t header = 4 + 4 * static_cast<std::size_t>(rank);
  if (bytes.size() < header) throw bad("it has " + std::to_string(bytes.size()) + " bytes, less than its header");
  if (bytes[0] != 0 || bytes[1] != 0 || bytes[2] != 0x08 || bytes[3] != rank) {
    throw bad("its magic number is not that of unsigned bytes in " + std::to_string(rank) + " dimensions");
  }
  std::vector<std::uint32_t> dims;
  std::uint64_t total = 1;
  for (int i = 0; i < rank; ++i) {
    dims.push_back(big_endian(bytes, 4 + 4 * static_cast<std::size_t>(i)));
    total *= dims.back();
  }
  if (bytes.size() - header != total) {
    throw bad("its header promises " + std::to_string(total) + " bytes of data, the file has " +
              std::to_string(bytes.size() - header));
  }
  return dims;
}

}  // namespace

Examples load_idx_pair(const std::string& images_path, const std::string& labels_path) {
  const std::vector<unsigned char> images = read_all(images_path);
  const auto image_dims = idx_dims(images, 3, images_path);
  const std::vector<unsigned char> labels = read_all(labels_path);
  const auto label_dims = idx_dims(labels, 1, labels_path);
  if (image_dims[1] != 28 || image_dims[2] != 28) {
    throw InvalidArgumentError("Fashion-MNIST file " + images_path + " holds images of " +
                               std::to_string(image_dims[1]) + "x" + std::to_string(image_dims[2]) + ", not 28x28");
  }
  if (image_dims[0] != label_dims[0]) {
    throw InvalidArgumentError("Fashion-MNIST files " + images_path + " and " + labels_path + " hold " +
                               std::to_string(image_dims[0]) + " images but " + std::to_string(label_dims[0]) +
                               " labels");
  }
  const auto n = static_cast<std::int64_t>(image_dims[0]);
  if (n == 0) {
    throw InvalidArgumentError("Fashion-MNIST files " + images_path + " and " + labels_path +
                               " hold no example: there is nothing to train on or to test");
  }
  Examples out{Tensor::uninitialized(DType::kUInt8, Shape{n, 784}), Tensor::uninitialized(DType::kInt32, Shape{n})};
  std::memcpy(out.images.mutable_raw_data(), images.data() + 16, out.images.nbytes());
  auto lab = out.labels.mutable_flat<int>();
  for (std::size_t i = 0; i < lab.size(); ++i) {
    if (labels[8 + i] > 9) {
      throw InvalidArgumentError("Fashion-MNIST file " + labels_path + " has label " + std::to_string(labels[8 + i]) +
                                 " at example " + std::to_string(i) + "; labels are 0 to 9");
    }
    lab[i] = labels[8 + i];
  }
  return out;
}

namespace {
// Bytes to floats in [0, 1]: one copy per instruction set.
DISTRIBUTE_KERNEL_CLONES void scale_row(const std::uint8_t* in, float* out, std::int64_t n) {
  for (std::int64_t j = 0; j < n; ++j) out[j] = static_cast<float>(in[j]) * (1.f / 255.f);
}
}  // namespace

std::pair<Tensor, Tensor> gather_rows(const Examples& examples, const Tensor& indices) {
  const std::int64_t rows = indices.num_elements();
  const std::int64_t width = examples.images.shape()[1];
  Tensor x = Tensor::uninitialized(DType::kFloat32, Shape{rows, width});
  Tensor y = Tensor::uninitialized(DType::kInt32, Shape{rows});
  const auto* src = examples.images.flat<std::uint8_t>().data();
  const int* labels = examples.labels.flat<int>().data();
  float* dst = x.mutable_flat<float>().data();
  int* dst_labels = y.mutable_flat<int>().data();
  const std::int64_t* idx = indices.flat<std::int64_t>().data();
  for (std::int64_t r = 0; r < rows; ++r) {
    if (idx[r] < 0 || idx[r] >= examples.size()) {
      throw OutOfRangeError("gather_rows: index " + std::to_string(idx[r]) + " is outside the " +
                            std::to_string(examples.size()) + " examples");
    }
    scale_row(src + idx[r] * width, dst + r * width, width);
    dst_labels[r] = labels[idx[r]];
  }
  return {x, y};
}

FashionMnist load_fashion_mnist(const std::string& dir) {
  auto path = [&](const std::string& stem) {
    const std::string plain = dir + "/" + stem;
    return std::filesystem::exists(plain) ? plain : plain + ".gz";
  };
  return {load_idx_pair(path("train-images-idx3-ubyte"), path("train-labels-idx1-ubyte")),
          load_idx_pair(path("t10k-images-idx3-ubyte"), path("t10k-labels-idx1-ubyte"))};
}

}  // namespace distribute::train
