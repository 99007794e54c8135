// A multi-layer perceptron (dense layers, ReLU between them, softmax
// cross-entropy on the last) whose parameters are MirroredVariables, with
// its forward and backward passes on OpenBLAS's GEMMs. Each replica runs
// the passes on its own rows with its own Workspace; gradients then go to
// Optimizer::apply_gradients.
#pragma once

#include <distribute/distribute.h>

#include <cstdint>
#include <vector>

namespace distribute::train {

class Mlp {
 public:
  // Creates the parameters under the current strategy (call inside
  // strategy.scope()): for each layer k, "dense_k/kernel" (in, out) drawn
  // Glorot-uniform from `seed`, and "dense_k/bias" (out,) zeros.
  Mlp(std::vector<int> layer_sizes, std::uint64_t seed);

  const std::vector<Variable>& variables() const { return variables_; }
  const std::vector<int>& layer_sizes() const { return sizes_; }
  std::int64_t num_parameters() const;

  // One replica's buffers, reused from step to step.
  struct Workspace {
    std::vector<std::vector<float>> activations;  // per layer output, rows x width
    std::vector<float> delta, next_delta;
    std::vector<Tensor> gradients;  // one per variable, in variables() order
  };

  struct Totals {
    double loss_sum = 0;       // sum of the rows' cross-entropy losses
    std::int64_t correct = 0;  // rows whose arg-max is the label
  };

  // Forward and backward on rows x (b, in) with labels y (b,), in the
  // calling replica's context. Leaves in ws.gradients the gradients of
  // (sum of the rows' losses) / loss_divisor: with loss_divisor the global
  // batch's row count, summing the replicas' gradients gives the gradient of
  // the global batch's mean loss. An empty batch gives zero gradients.
  Totals forward_backward(const Tensor& x, const Tensor& y, double loss_divisor, Workspace& ws) const;
  // Forward only.
  Totals evaluate(const Tensor& x, const Tensor& y, Workspace& ws) const;
  // The (gradient, variable) pairs of the last forward_backward.
  std::vector<GradientAndVariable> gradients_and_variables(const Workspace& ws) const;

 private:
  Totals forward(const Tensor& x, const Tensor& y, Workspace& ws, bool keep_softmax_delta, double loss_divisor) const;
  std::vector<int> sizes_;
  std::vector<Variable> variables_;  // kernel_0, bias_0, kernel_1, bias_1, ...
};

}  // namespace distribute::train
