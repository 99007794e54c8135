#include "mlp.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>

#include "core/kernel_clones.h"

namespace distribute::train {

Mlp::Mlp(std::vector<int> layer_sizes, std::uint64_t seed) : sizes_(std::move(layer_sizes)) {
  if (sizes_.size() < 2) throw InvalidArgumentError("Mlp: need at least an input and an output size");
  for (int n : sizes_) {
    if (n < 1) throw InvalidArgumentError("Mlp: layer sizes must be >= 1");
  }
  std::mt19937_64 gen(seed);
  for (std::size_t k = 0; k + 1 < sizes_.size(); ++k) {
    const int in = sizes_[k];
    const int out = sizes_[k + 1];
    // Glorot uniform, from the generator's top 24 bits (the same on every platform).
    const double limit = std::sqrt(6.0 / (in + out));
    Tensor kernel = Tensor::uninitialized(DType::kFloat32, Shape{in, out});
    for (float& w : kernel.mutable_flat<float>()) {
      const double u = static_cast<double>(gen() >> 40) / static_cast<double>(1 << 24);
      w = static_cast<float>((2 * u - 1) * limit);
    }
    const std::string name = "dense_" + std::to_string(k);
    variables_.emplace_back(kernel, VariableOptions{.name = name + "/kernel"});
    variables_.emplace_back(Tensor(DType::kFloat32, Shape{out}), VariableOptions{.name = name + "/bias"});
  }
}

std::int64_t Mlp::num_parameters() const {
  std::int64_t n = 0;
  for (const Variable& v : variables_) n += v.shape().num_elements();
  return n;
}

namespace {

// The element-wise work beside the GEMMs, one copy per instruction set each.
DISTRIBUTE_KERNEL_CLONES void add_bias(float* rows, const float* bias, int b, int n, bool relu) {
  for (int r = 0; r < b; ++r) {
    float* row = rows + static_cast<std::size_t>(r) * static_cast<std::size_t>(n);
    if (relu) {
      for (int j = 0; j < n; ++j) row[j] = std::max(row[j] + bias[j], 0.f);
    } else {
      for (int j = 0; j < n; ++j) row[j] += bias[j];
    }
  }
}

DISTRIBUTE_KERNEL_CLONES void column_sums(const float* rows, int b, int n, float* out) {
  std::fill(out, out + n, 0.f);
  for (int r = 0; r < b; ++r) {
    const float* row = rows + static_cast<std::size_t>(r) * static_cast<std::size_t>(n);
    for (int j = 0; j < n; ++j) out[j] += row[j];
  }
}

// delta = 0 where the ReLU was off; a select, not a conditional store, so that it vectorises.
DISTRIBUTE_KERNEL_CLONES void relu_mask(float* delta, const float* activation, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) delta[i] = activation[i] > 0.f ? delta[i] : 0.f;
}

void check_batch(const Tensor& x, const Tensor& y, int inputs) {
  if (x.dtype() != DType::kFloat32 || x.rank() != 2 || x.shape()[1] != inputs || y.dtype() != DType::kInt32 ||
      y.rank() != 1 || y.shape()[0] != x.shape()[0]) {
    throw InvalidArgumentError("Mlp: need float32 rows (b, " + std::to_string(inputs) +
                               ") and int32 labels (b,); "
                               "got " +
                               std::string(to_string(x.dtype())) + x.shape().to_string() + " and " +
                               std::string(to_string(y.dtype())) + y.shape().to_string());
  }
}

}  // namespace

Mlp::Totals Mlp::forward(const Tensor& x, const Tensor& y, Workspace& ws, bool keep_softmax_delta,
                         double loss_divisor) const {
  check_batch(x, y, sizes_.front());
  const int b = static_cast<int>(x.shape()[0]);
  const std::size_t layers = sizes_.size() - 1;
  ws.activations.resize(layers);
  Totals totals;
  if (b == 0) return totals;
  const float* in = x.flat<float>().data();
  for (std::size_t k = 0; k < layers; ++k) {
    const int n_in = sizes_[k];
    const int n_out = sizes_[k + 1];
    std::vector<float>& out = ws.activations[k];
    out.resize(static_cast<std::size_t>(b) * static_cast<std::size_t>(n_out));
    const float* w = variables_[2 * k].value().flat<float>().data();
    const float* bias = variables_[2 * k + 1].value().flat<float>().data();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, b, n_out, n_in, 1.f, in, n_in, w, n_out, 0.f, out.data(),
                n_out);
    add_bias(out.data(), bias, b, n_out, /*relu=*/k + 1 < layers);
    in = out.data();
  }
  // Softmax cross-entropy on the logits; the delta (softmax - one_hot) / divisor.
  const int classes = sizes_.back();
  std::vector<float>& logits = ws.activations.back();
  const int* labels = y.flat<int>().data();
  if (keep_softmax_delta) ws.delta.resize(logits.size());
  for (int r = 0; r < b; ++r) {
    const float* z = logits.data() + static_cast<std::size_t>(r) * static_cast<std::size_t>(classes);
    const int label = labels[r];
    if (label < 0 || label >= classes) {
      throw InvalidArgumentError("Mlp: label " + std::to_string(label) + " at row " + std::to_string(r) +
                                 " is outside [0, " + std::to_string(classes) + ")");
    }
    const float top = *std::max_element(z, z + classes);
    double sum = 0;
    for (int j = 0; j < classes; ++j) sum += std::exp(static_cast<double>(z[j] - top));
    const double log_sum = std::log(sum) + top;
    totals.loss_sum += log_sum - z[label];
    totals.correct += (std::max_element(z, z + classes) - z) == label ? 1 : 0;
    if (keep_softmax_delta) {
      float* d = ws.delta.data() + static_cast<std::size_t>(r) * static_cast<std::size_t>(classes);
      for (int j = 0; j < classes; ++j) {
        const double p = std::exp(static_cast<double>(z[j]) - log_sum);
        d[j] = static_cast<float>((p - (j == label ? 1.0 : 0.0)) / loss_divisor);
      }
    }
  }
  return totals;
}

Mlp::Totals Mlp::evaluate(const Tensor& x, const Tensor& y, Workspace& ws) const {
  return forward(x, y, ws, /*keep_softmax_delta=*/false, 1);
}

Mlp::Totals Mlp::forward_backward(const Tensor& x, const Tensor& y, double loss_divisor, Workspace& ws) const {
  if (ws.gradients.size() != variables_.size()) {
    ws.gradients.clear();
    for (const Variable& v : variables_) ws.gradients.emplace_back(v.dtype(), v.shape());
  }
  const Totals totals = forward(x, y, ws, /*keep_softmax_delta=*/true, loss_divisor);
  const int b = static_cast<int>(x.shape()[0]);
  if (b == 0) {
    for (const Tensor& g : ws.gradients) std::memset(g.mutable_raw_data(), 0, g.nbytes());
    return totals;
  }
  for (std::size_t k = sizes_.size() - 1; k-- > 0;) {
    const int n_in = sizes_[k];
    const int n_out = sizes_[k + 1];
    const float* in = k == 0 ? x.flat<float>().data() : ws.activations[k - 1].data();
    float* d_kernel = ws.gradients[2 * k].mutable_flat<float>().data();
    float* d_bias = ws.gradients[2 * k + 1].mutable_flat<float>().data();
    // d_kernel = in^T delta; d_bias = column sums of delta.
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n_in, n_out, b, 1.f, in, n_in, ws.delta.data(), n_out, 0.f,
                d_kernel, n_out);
    column_sums(ws.delta.data(), b, n_out, d_bias);
    if (k == 0) break;
    // next_delta = (delta W^T) masked by the ReLU of layer k - 1's output.
    const float* w = variables_[2 * k].value().flat<float>().data();
    ws.next_delta.resize(static_cast<std::size_t>(b) * static_cast<std::size_t>(n_in));
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, b, n_in, n_out, 1.f, ws.delta.data(), n_out, w, n_out, 0.f,
                ws.next_delta.data(), n_in);
    relu_mask(ws.next_delta.data(), ws.activations[k - 1].data(), ws.next_delta.size());
    ws.delta.swap(ws.next_delta);
  }
  return totals;
}

std::vector<GradientAndVariable> Mlp::gradients_and_variables(const Workspace& ws) const {
  std::vector<GradientAndVariable> out;
  out.reserve(variables_.size());
  for (std::size_t i = 0; i < variables_.size(); ++i) out.emplace_back(ws.gradients.at(i), variables_[i]);
  return out;
}

}  // namespace distribute::train
