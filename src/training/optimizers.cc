#include "distribute/optimizers.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <iostream>
#include <numbers>
#include <string>

#include "core/kernel_clones.h"
#include "distribute/context.h"
#include "distribute/replica_context.h"

namespace distribute {

namespace {

bool finite_in(double v, double lo, double hi) { return std::isfinite(v) && v >= lo && v <= hi; }

std::string describe(const Tensor& t) { return std::string(to_string(t.dtype())) + t.shape().to_string(); }

// The checks a replica can make on its own arguments before the merge_call.
void check_pairs(const std::vector<GradientAndVariable>& grads_and_vars, const Strategy& strategy) {
  if (grads_and_vars.empty()) throw InvalidArgumentError("No gradients provided for any variable.");
  for (std::size_t k = 0; k < grads_and_vars.size(); ++k) {
    const auto& [maybe_grad, var] = grads_and_vars[k];
    internal::Access::check_strategy(var, strategy, "apply_gradients");
    if (!maybe_grad) continue;
    const Tensor& grad = *maybe_grad;
    if (var.dtype() != DType::kFloat32 && var.dtype() != DType::kFloat64) {
      throw InvalidArgumentError("apply_gradients: variable '" + var.name() + "' has dtype " +
                                 std::string(to_string(var.dtype())) +
                                 "; optimizers update float32 and float64 "
                                 "variables");
    }
    if (grad.dtype() != var.dtype() || grad.shape() != var.shape()) {
      throw InvalidArgumentError("apply_gradients: gradient " + std::to_string(k) + " for variable '" + var.name() +
                                 "' (" + std::string(to_string(var.dtype())) + var.shape().to_string() + ") is " +
                                 describe(grad));
    }
  }
}

// The merge_fn side: every replica passed the same variables in the same order.
void check_same_variables(const PerReplica<std::vector<GradientAndVariable>>& per, const Strategy& s) {
  const auto& first = per.primary();
  for (std::size_t r = 1; r < per.size(); ++r) {
    const auto& other = per.values()[r];
    const std::string who = "replica " + std::to_string(s.first_replica_id() + static_cast<int>(r));
    if (other.size() != first.size()) {
      throw InvalidArgumentError("apply_gradients: replica " + std::to_string(s.first_replica_id()) + " passed " +
                                 std::to_string(first.size()) + " variables, " + who + " passed " +
                                 std::to_string(other.size()));
    }
    for (std::size_t k = 0; k < first.size(); ++k) {
      if (!(other[k].second == first[k].second)) {
        throw InvalidArgumentError("apply_gradients: variable " + std::to_string(k) + " is '" + first[k].second.name() +
                                   "' on replica " + std::to_string(s.first_replica_id()) + " but '" +
                                   other[k].second.name() + "' on " + who);
      }
    }
  }
}

// Keras' filter_empty_gradients: the pairs that have a gradient; none at
// all is an error naming every variable.
std::vector<GradientAndVariable> with_gradients(const std::vector<GradientAndVariable>& grads_and_vars) {
  std::vector<GradientAndVariable> kept;
  kept.reserve(grads_and_vars.size());
  for (const auto& pair : grads_and_vars) {
    if (pair.first) kept.push_back(pair);
  }
  if (kept.empty()) {
    std::string names;
    for (const auto& pair : grads_and_vars) names += (names.empty() ? "'" : ", '") + pair.second.name() + "'";
    throw InvalidArgumentError("No gradients provided for any variable: (" + names + ")");
  }
  return kept;
}

// The shortest text that reads back as v ("0.1", "nan").
std::string number(double v) {
  char text[32];
  const auto end = std::to_chars(text, text + sizeof text, v).ptr;
  return {text, end};
}

void check_steps(std::string_view schedule, std::int64_t decay_steps) {
  if (decay_steps <= 0) {
    throw InvalidArgumentError(std::string(schedule) + ": decay_steps must be > 0, got " + std::to_string(decay_steps));
  }
}

void check_rate(std::string_view where, std::string_view what, double v) {
  if (!std::isfinite(v)) {
    throw InvalidArgumentError(std::string(where) + ": " + std::string(what) + " must be finite, got " + number(v));
  }
}

}  // namespace

// ---- learning rate schedules --------------------------------------------------------

ExponentialDecay::ExponentialDecay(double initial_learning_rate, std::int64_t decay_steps, double decay_rate,
                                   bool staircase)
    : initial_(initial_learning_rate), decay_steps_(decay_steps), decay_rate_(decay_rate), staircase_(staircase) {
  check_rate("ExponentialDecay", "initial_learning_rate", initial_);
  check_steps("ExponentialDecay", decay_steps_);
  check_rate("ExponentialDecay", "decay_rate", decay_rate_);
  if (decay_rate_ <= 0)
    throw InvalidArgumentError("ExponentialDecay: decay_rate must be > 0, got " + number(decay_rate_));
}

double ExponentialDecay::operator()(std::int64_t step) const {
  double p = static_cast<double>(step) / static_cast<double>(decay_steps_);
  if (staircase_) p = std::floor(p);
  return initial_ * std::pow(decay_rate_, p);
}

std::string ExponentialDecay::describe() const {
  return "ExponentialDecay(initial_learning_rate=" + number(initial_) +
         ", decay_steps=" + std::to_string(decay_steps_) + ", decay_rate=" + number(decay_rate_) +
         ", staircase=" + (staircase_ ? "True" : "False") + ")";
}

PiecewiseConstantDecay::PiecewiseConstantDecay(std::vector<std::int64_t> boundaries, std::vector<double> values)
    : boundaries_(std::move(boundaries)), values_(std::move(values)) {
  if (values_.size() != boundaries_.size() + 1) {
    throw InvalidArgumentError(
        "PiecewiseConstantDecay: the length of boundaries should be 1 less than the length of values (" +
        std::to_string(boundaries_.size()) + " boundaries, " + std::to_string(values_.size()) + " values)");
  }
  for (std::size_t i = 1; i < boundaries_.size(); ++i) {
    if (boundaries_[i] <= boundaries_[i - 1]) {
      throw InvalidArgumentError("PiecewiseConstantDecay: boundaries must increase; boundary " + std::to_string(i) +
                                 " (" + std::to_string(boundaries_[i]) + ") follows " +
                                 std::to_string(boundaries_[i - 1]));
    }
  }
  for (double v : values_) check_rate("PiecewiseConstantDecay", "every value", v);
}

double PiecewiseConstantDecay::operator()(std::int64_t step) const {
  std::size_t i = 0;
  while (i < boundaries_.size() && step > boundaries_[i]) ++i;
  return values_[i];
}

std::string PiecewiseConstantDecay::describe() const {
  std::string b;
  std::string v;
  for (auto x : boundaries_) b += (b.empty() ? "" : ", ") + std::to_string(x);
  for (auto x : values_) v += (v.empty() ? "" : ", ") + number(x);
  return "PiecewiseConstantDecay(boundaries=[" + b + "], values=[" + v + "])";
}

CosineDecay::CosineDecay(double initial_learning_rate, std::int64_t decay_steps, double alpha)
    : initial_(initial_learning_rate), decay_steps_(decay_steps), alpha_(alpha) {
  check_rate("CosineDecay", "initial_learning_rate", initial_);
  check_steps("CosineDecay", decay_steps_);
  if (!(alpha_ >= 0 && alpha_ <= 1))
    throw InvalidArgumentError("CosineDecay: alpha must be in [0, 1], got " + number(alpha_));
}

double CosineDecay::operator()(std::int64_t step) const {
  const double s = static_cast<double>(std::min(std::max<std::int64_t>(step, 0), decay_steps_));
  const double cosine = 0.5 * (1 + std::cos(std::numbers::pi * s / static_cast<double>(decay_steps_)));
  return initial_ * ((1 - alpha_) * cosine + alpha_);
}

std::string CosineDecay::describe() const {
  return "CosineDecay(initial_learning_rate=" + number(initial_) + ", decay_steps=" + std::to_string(decay_steps_) +
         ", alpha=" + number(alpha_) + ")";
}

LearningRate::LearningRate(std::shared_ptr<const LearningRateSchedule> schedule) : schedule_(std::move(schedule)) {
  if (!schedule_) throw InvalidArgumentError("learning_rate: no schedule (a null pointer)");
}

std::string LearningRate::describe() const { return schedule_ ? schedule_->describe() : number(value_); }

// ---- Optimizer ------------------------------------------------------------------------

Optimizer::Optimizer(std::string_view optimizer, LearningRate learning_rate)
    : learning_rate_(std::move(learning_rate)) {
  if (!learning_rate_.schedule()) check_rate(optimizer, "learning_rate", learning_rate_.value());
}

Optimizer::~Optimizer() = default;

LearningRate Optimizer::learning_rate() const {
  std::lock_guard lock(learning_rate_mu_);
  return learning_rate_;
}

void Optimizer::set_learning_rate(LearningRate learning_rate) {
  if (!learning_rate.schedule()) check_rate(name(), "learning_rate", learning_rate.value());
  std::lock_guard lock(learning_rate_mu_);
  learning_rate_ = std::move(learning_rate);
}

double Optimizer::current_learning_rate() const { return learning_rate().at(iterations()); }

void Optimizer::set_iterations(std::int64_t iterations) {
  if (iterations < 0) {
    throw InvalidArgumentError(std::string(name()) + ": iterations must be >= 0, got " + std::to_string(iterations));
  }
  iterations_.store(iterations);
}

void Optimizer::apply_gradients(const std::vector<GradientAndVariable>& given_pairs,
                                const CommunicationOptions& options) {
  ReplicaContext* ctx = get_replica_context();
  if (ctx == nullptr) {
    throw FailedPreconditionError(
        "`apply_gradients()` cannot be called in cross-replica context. Use "
        "`tf.distribute.Strategy.run` to enter replica context.");
  }
  check_pairs(given_pairs, ctx->strategy());
  const std::vector<GradientAndVariable> grads_and_vars = with_gradients(given_pairs);
  using Clock = std::chrono::steady_clock;
  const bool timed = ctx->local_replica_id() == 0;
  const auto t0 = timed ? Clock::now() : Clock::time_point{};
  // 1. One merge_call: the replicas agree on the variables before any data
  //    moves, the slots of new variables are made (a cross-replica act), and
  //    the step is counted once (and taken back below if its gradients fail
  //    to reduce: a step that fails there is not one).
  struct Plan {
    std::int64_t step = 0;
    double learning_rate = 0;
    std::vector<std::vector<Variable>> slots;  // per variable, in slot_names() order
  };
  const std::shared_ptr<const Plan> plan = ctx->merge_call(
      [this, &given_pairs](Strategy& s, const PerReplica<std::vector<GradientAndVariable>>& per) {
        check_same_variables(per, s);
        auto made = std::make_shared<Plan>();
        for (const auto& [grad, var] : per.primary()) made->slots.push_back(slots_of(var).slots);
        const LearningRate rate = learning_rate();
        const std::int64_t before = iterations_.load();
        made->learning_rate = rate.at(before);
        if (!std::isfinite(made->learning_rate)) {
          throw InvalidArgumentError(std::string(name()) + ": the learning rate " + rate.describe() + " at step " +
                                     std::to_string(before) + " is " + number(made->learning_rate));
        }
        warn_of_missing_gradients(given_pairs);
        made->step = ++iterations_;
        return std::shared_ptr<const Plan>(std::move(made));
      },
      grads_and_vars);
  // 2. One batched all-reduce (SUM, packed by bytes_per_pack) of every
  //    gradient across every replica in sync: each replica reduces its share
  //    of the packs in parallel, and every replica gets the same bits.
  const auto t1 = timed ? Clock::now() : Clock::time_point{};
  std::vector<Tensor> grads;
  grads.reserve(grads_and_vars.size());
  for (const auto& pair : grads_and_vars) grads.push_back(*pair.first);
  std::vector<Tensor> summed;
  try {
    summed = ctx->all_reduce(ReduceOp::kSum, grads, options);
  } catch (...) {
    if (ctx->local_replica_id() == 0) --iterations_;  // merge_fn ran once per worker: one replica takes it back
    throw;
  }
  const auto t2 = timed ? Clock::now() : Clock::time_point{};
  // 3. Each replica updates its own component of every variable and slot,
  //    so every component is updated once, all in parallel and alike.
  const auto i = static_cast<std::size_t>(ctx->local_replica_id());
  std::vector<Tensor> slot_components;
  for (std::size_t k = 0; k < grads_and_vars.size(); ++k) {
    Variable var = grads_and_vars[k].second;
    slot_components.clear();
    for (const Variable& slot : plan->slots[k]) slot_components.push_back(slot.values()[i]);
    apply_dense(internal::Access::mutable_component(var, i), summed[k], slot_components, plan->step,
                plan->learning_rate);
  }
  if (timed) {
    auto seconds = [](Clock::time_point a, Clock::time_point b) {
      return std::chrono::duration<double>(b - a).count();
    };
    timings_.merge_call_seconds += seconds(t0, t1);
    timings_.all_reduce_seconds += seconds(t1, t2);
    timings_.update_seconds += seconds(t2, Clock::now());
  }
}

void Optimizer::warn_of_missing_gradients(const std::vector<GradientAndVariable>& grads_and_vars) {
  std::string names;
  for (const auto& [grad, var] : grads_and_vars) {
    if (grad || !warned_no_gradient_.emplace(var.id(), true).second) continue;
    names += (names.empty() ? "'" : ", '") + var.name() + "'";
  }
  if (!names.empty()) {
    std::cerr << "distribute: " << name() << ".apply_gradients: gradients do not exist for variables [" << names
              << "] when minimizing the loss; they are left as they are (said once per variable)\n"
              << std::flush;
  }
}

Optimizer::Slots& Optimizer::slots_of(const Variable& var) {
  auto it = slots_.find(var.id());
  if (it != slots_.end()) return *it->second;
  auto made = std::make_unique<Slots>(Slots{var, {}});
  for (const std::string& slot : slot_names()) {
    made->slots.emplace_back(Tensor(var.dtype(), var.shape()),
                             VariableOptions{.name = var.name() + "/" + slot, .trainable = false});
  }
  return *slots_.emplace(var.id(), std::move(made)).first->second;
}

Variable Optimizer::get_slot(const Variable& var, std::string_view slot) const {
  const auto names = slot_names();
  auto it = slots_.find(var.id());
  for (std::size_t j = 0; j < names.size() && it != slots_.end(); ++j) {
    if (names[j] == slot) return it->second->slots[j];
  }
  throw NotFoundError(std::string(name()) + " has no slot '" + std::string(slot) + "' for variable '" + var.name() +
                      "'" + (it == slots_.end() ? " (it has not updated that variable yet)" : ""));
}

// ---- SGD ----------------------------------------------------------------------

SGD::SGD(Options options) : Optimizer("SGD", options.learning_rate), options_(std::move(options)) {
  if (!finite_in(options_.momentum, 0, 1)) {
    throw InvalidArgumentError("`momentum` must be between [0, 1]. Received: momentum=" +
                               std::to_string(options_.momentum));
  }
}

std::vector<std::string> SGD::slot_names() const {
  if (options_.momentum == 0) return {};
  return {"momentum"};
}

namespace {
template <class T>
void sgd_kernel(T* w, const T* g, T* accum, std::size_t n, T lr, T momentum, bool nesterov) {
  if (accum == nullptr) {
    for (std::size_t i = 0; i < n; ++i) w[i] -= lr * g[i];
    return;
  }
  for (std::size_t i = 0; i < n; ++i) {
    const T a = accum[i] * momentum - lr * g[i];
    accum[i] = a;
    w[i] += nesterov ? a * momentum - lr * g[i] : a;
  }
}

template <class T>
void adam_kernel(T* w, const T* g, T* m, T* v, std::size_t n, T alpha, T beta_1, T beta_2, T epsilon) {
  const T one = 1;
  for (std::size_t i = 0; i < n; ++i) {
    m[i] += (g[i] - m[i]) * (one - beta_1);
    v[i] += (g[i] * g[i] - v[i]) * (one - beta_2);
    w[i] -= alpha * m[i] / (std::sqrt(v[i]) + epsilon);
  }
}

// The kernels' entry points, one copy per instruction set each.
DISTRIBUTE_KERNEL_CLONES void sgd_update(float* w, const float* g, float* accum, std::size_t n, float lr,
                                         float momentum, bool nesterov) {
  sgd_kernel(w, g, accum, n, lr, momentum, nesterov);
}
DISTRIBUTE_KERNEL_CLONES void sgd_update(double* w, const double* g, double* accum, std::size_t n, double lr,
                                         double momentum, bool nesterov) {
  sgd_kernel(w, g, accum, n, lr, momentum, nesterov);
}
DISTRIBUTE_KERNEL_CLONES void adam_update(float* w, const float* g, float* m, float* v, std::size_t n, float alpha,
                                          float beta_1, float beta_2, float epsilon) {
  adam_kernel(w, g, m, v, n, alpha, beta_1, beta_2, epsilon);
}
DISTRIBUTE_KERNEL_CLONES void adam_update(double* w, const double* g, double* m, double* v, std::size_t n, double alpha,
                                          double beta_1, double beta_2, double epsilon) {
  adam_kernel(w, g, m, v, n, alpha, beta_1, beta_2, epsilon);
}

template <class F>
void float_types(DType dtype, F&& f) {
  if (dtype == DType::kFloat32) {
    f(float{});
  } else {
    f(double{});
  }
}
}  // namespace

void SGD::apply_dense(const Tensor& var, const Tensor& grad, std::span<const Tensor> slots, std::int64_t,
                      double learning_rate) const {
  float_types(var.dtype(), [&](auto tag) {
    using T = decltype(tag);
    sgd_update(var.mutable_flat<T>().data(), grad.flat<T>().data(),
               slots.empty() ? nullptr : slots[0].mutable_flat<T>().data(),
               static_cast<std::size_t>(var.num_elements()), static_cast<T>(learning_rate),
               static_cast<T>(options_.momentum), options_.nesterov);
  });
}

// ---- Adam ---------------------------------------------------------------------

Adam::Adam(Options options) : Optimizer("Adam", options.learning_rate), options_(std::move(options)) {
  if (!finite_in(options_.beta_1, 0, 1) || options_.beta_1 == 1 || !finite_in(options_.beta_2, 0, 1) ||
      options_.beta_2 == 1) {
    throw InvalidArgumentError("Adam: beta_1 and beta_2 must be in [0, 1); got " + std::to_string(options_.beta_1) +
                               " and " + std::to_string(options_.beta_2));
  }
  if (!finite_in(options_.epsilon, 0, 1e300)) throw InvalidArgumentError("Adam: epsilon must be >= 0 and finite");
}

std::vector<std::string> Adam::slot_names() const { return {"m", "v"}; }

void Adam::apply_dense(const Tensor& var, const Tensor& grad, std::span<const Tensor> slots, std::int64_t step,
                       double learning_rate) const {
  const double t = static_cast<double>(step);
  const double alpha = learning_rate * std::sqrt(1 - std::pow(options_.beta_2, t)) / (1 - std::pow(options_.beta_1, t));
  float_types(var.dtype(), [&](auto tag) {
    using T = decltype(tag);
    adam_update(var.mutable_flat<T>().data(), grad.flat<T>().data(), slots[0].mutable_flat<T>().data(),
                slots[1].mutable_flat<T>().data(), static_cast<std::size_t>(var.num_elements()), static_cast<T>(alpha),
                static_cast<T>(options_.beta_1), static_cast<T>(options_.beta_2), static_cast<T>(options_.epsilon));
  });
}

}  // namespace distribute
