// Optimizers: Keras' update rules, gradients summed over every replica once,
// every component updated once, and the errors of bad calls.
#include <distribute/distribute.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "testing/strategies.h"

namespace distribute {
namespace {

using testing::expect_throw;
using testing::mirrored;

std::vector<float> floats(const Tensor& t) {
  auto f = t.flat<float>();
  return {f.begin(), f.end()};
}

// Replica r's gradient at step s: (r + 1) * (s + 1) * base, in float.
Tensor gradient(int replica, int step, const std::vector<float>& base) {
  std::vector<float> g;
  for (float b : base) g.push_back(static_cast<float>((replica + 1) * (step + 1)) * b);
  return constant(g, Shape{static_cast<std::int64_t>(g.size())});
}

// The gradient apply_gradients sees: the SUM over replicas, added in replica order.
std::vector<float> summed(int replicas, int step, const std::vector<float>& base) {
  std::vector<float> sum(base.size(), 0.f);
  for (int r = 0; r < replicas; ++r) {
    const std::vector<float> g = floats(gradient(r, step, base));
    for (std::size_t i = 0; i < sum.size(); ++i) sum[i] = r == 0 ? g[i] : sum[i] + g[i];
  }
  return sum;
}

const std::vector<float> kInit = {1.f, -2.f, 0.5f, 3.f};
const std::vector<float> kBase = {0.25f, -0.5f, 1.f, 0.125f};

// Runs `steps` steps of `opt` on n replicas; returns the variable.
MirroredVariable train(Optimizer& opt, int n, int steps) {
  auto s = mirrored(n);
  std::optional<MirroredVariable> w;
  {
    auto scope = s->scope();
    w.emplace(constant(kInit, Shape{4}), VariableOptions{.name = "w"});
  }
  for (int step = 0; step < steps; ++step) {
    s->run([&](ReplicaContext& ctx) {
      opt.apply_gradients({{gradient(ctx.replica_id_in_sync_group(), step, kBase), *w}});
    });
  }
  // Every component was updated once per step, identically.
  for (const Tensor& c : w->values()) EXPECT_EQ(c, w->values()[0]);
  EXPECT_EQ(opt.iterations(), steps);
  return *w;
}

TEST(SGDTest, PlainStepSubtractsLearningRateTimesTheSummedGradient) {
  for (int n : testing::kReplicaCounts) {
    SGD sgd({.learning_rate = 0.1});
    const MirroredVariable w = train(sgd, n, 2);
    std::vector<float> want = kInit;
    for (int step = 0; step < 2; ++step) {
      const auto g = summed(n, step, kBase);
      for (std::size_t i = 0; i < want.size(); ++i) want[i] -= 0.1f * g[i];
    }
    EXPECT_EQ(floats(w.values()[0]), want) << n << " replicas";
    EXPECT_THROW(sgd.get_slot(w, "momentum"), NotFoundError);  // no momentum, no slot
  }
}

TEST(SGDTest, MomentumAndNesterovFollowKeras) {
  for (bool nesterov : {false, true}) {
    for (int n : {1, 2, 3}) {
      SGD sgd({.learning_rate = 0.05, .momentum = 0.9, .nesterov = nesterov});
      const MirroredVariable w = train(sgd, n, 3);
      std::vector<float> want = kInit;
      std::vector<float> accum(4, 0.f);
      for (int step = 0; step < 3; ++step) {
        const auto g = summed(n, step, kBase);
        for (std::size_t i = 0; i < 4; ++i) {
          accum[i] = accum[i] * 0.9f - 0.05f * g[i];
          want[i] += nesterov ? accum[i] * 0.9f - 0.05f * g[i] : accum[i];
        }
      }
      EXPECT_EQ(floats(w.values()[0]), want) << n << " replicas, nesterov " << nesterov;
      const Variable slot = sgd.get_slot(w, "momentum");
      EXPECT_EQ(slot.name(), "w/momentum");
      EXPECT_FALSE(slot.trainable());
      for (const Tensor& c : slot.values()) EXPECT_EQ(floats(c), accum);
    }
  }
}

TEST(AdamTest, StepsFollowKerasWithEpsilonAfterBiasCorrection) {
  for (int n : {1, 2, 4}) {
    Adam adam({.learning_rate = 0.01});
    const MirroredVariable w = train(adam, n, 3);
    std::vector<float> want = kInit, m(4, 0.f), v(4, 0.f);
    for (int step = 0; step < 3; ++step) {
      const auto g = summed(n, step, kBase);
      const double t = step + 1;
      const auto alpha = static_cast<float>(0.01 * std::sqrt(1 - std::pow(0.999, t)) / (1 - std::pow(0.9, t)));
      for (std::size_t i = 0; i < 4; ++i) {
        m[i] += (g[i] - m[i]) * (1.f - 0.9f);
        v[i] += (g[i] * g[i] - v[i]) * (1.f - 0.999f);
        want[i] -= alpha * m[i] / (std::sqrt(v[i]) + 1e-7f);
      }
    }
    const auto got = floats(w.values()[0]);
    for (std::size_t i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(got[i], want[i]) << n << " replicas, element " << i;
    EXPECT_EQ(floats(adam.get_slot(w, "m").values()[0]), m);
    EXPECT_EQ(floats(adam.get_slot(w, "v").values()[0]), v);
  }
}

// The test that fails if gradients were averaged, or a replica's were dropped
// or counted twice: n replicas with g / n each must match one replica with g.
TEST(OptimizerTest, ReplicasShareTheGradientOfTheGlobalBatch) {
  const std::vector<float> g = {0.5f, -1.f, 2.f, 0.25f};
  std::vector<float> want;
  {
    SGD sgd({.learning_rate = 0.5, .momentum = 0.5});
    auto s = mirrored(1);
    std::optional<MirroredVariable> w;
    {
      auto scope = s->scope();
      w.emplace(constant(kInit, Shape{4}));
    }
    for (int step = 0; step < 3; ++step) s->run([&] { sgd.apply_gradients({{constant(g, Shape{4}), *w}}); });
    want = floats(w->values()[0]);
  }
  for (int n : {2, 4, 8}) {
    SGD sgd({.learning_rate = 0.5, .momentum = 0.5});
    auto s = mirrored(n);
    std::optional<MirroredVariable> w;
    {
      auto scope = s->scope();
      w.emplace(constant(kInit, Shape{4}));
    }
    std::vector<float> share;
    for (float x : g) share.push_back(x / static_cast<float>(n));  // exact: n is a power of two
    for (int step = 0; step < 3; ++step) s->run([&] { sgd.apply_gradients({{constant(share, Shape{4}), *w}}); });
    for (const Tensor& c : w->values()) EXPECT_EQ(floats(c), want) << n << " replicas";
  }
}

TEST(OptimizerTest, ManyVariablesInOneCallWithPacking) {
  auto s = mirrored(3);
  std::vector<Variable> vars;
  {
    auto scope = s->scope();
    for (int k = 0; k < 12; ++k) vars.emplace_back(fill(DType::kFloat32, Shape{k + 1}, k), VariableOptions{});
    vars.emplace_back(constant(1.0), VariableOptions{});  // a float64 variable among them
  }
  SGD sgd({.learning_rate = 1});
  s->run([&](ReplicaContext& ctx) {
    std::vector<GradientAndVariable> gv;
    for (const Variable& v : vars) gv.emplace_back(fill(v.dtype(), v.shape(), ctx.replica_id_in_sync_group() + 1), v);
    sgd.apply_gradients(gv, {.bytes_per_pack = 16});
  });
  for (int k = 0; k < 12; ++k) {
    for (const Tensor& c : vars[static_cast<std::size_t>(k)].values()) {
      EXPECT_EQ(c, fill(DType::kFloat32, Shape{k + 1}, k - 6)) << "variable " << k;
    }
  }
  EXPECT_EQ(vars.back().values()[2].scalar<double>(), -5.0);
  EXPECT_EQ(sgd.iterations(), 1);
}

// A step whose gradients cannot be reduced (here an invalid bytes_per_pack,
// refused by the all-reduce on every replica) is not counted and changes
// nothing: the next step is Adam's step 1, bias correction and all.
TEST(OptimizerTest, AStepThatFailsIsNotCounted) {
  auto s = mirrored(2);
  std::optional<MirroredVariable> w;
  {
    auto scope = s->scope();
    w.emplace(constant(kInit, Shape{4}), VariableOptions{.name = "w"});
  }
  Adam adam({.learning_rate = 0.01});
  // Every replica reads the count after its call, inside the step (under
  // TSan: a read by one replica and a write by another would be a race).
  auto step = [&](const CommunicationOptions& options) {
    return s->run([&](ReplicaContext& ctx) {
      adam.apply_gradients({{gradient(ctx.replica_id_in_sync_group(), 0, kBase), *w}}, options);
      return adam.iterations();
    });
  };
  EXPECT_THROW(step({.bytes_per_pack = -1}), InvalidArgumentError);
  EXPECT_EQ(adam.iterations(), 0);
  for (const Tensor& c : w->values()) EXPECT_EQ(floats(c), kInit);
  const PerReplica<std::int64_t> seen = step({});
  for (const std::int64_t count : seen.values()) EXPECT_EQ(count, 1);
  EXPECT_EQ(adam.iterations(), 1);
  Adam fresh({.learning_rate = 0.01});
  const MirroredVariable want = train(fresh, 2, 1);
  for (const Tensor& c : w->values()) EXPECT_EQ(floats(c), floats(want.values()[0]));
}

TEST(OptimizerTest, OutsideAnyStrategyUpdatesAPlainVariable) {
  Variable w(constant({1.f, 2.f}));
  SGD sgd({.learning_rate = 0.5});
  sgd.apply_gradients({{constant({2.f, 2.f}), w}});
  EXPECT_EQ(w.read_value(), constant({0.f, 1.f}));
}

TEST(OptimizerTest, BadCallsRaiseClearErrors) {
  auto s = mirrored(2);
  std::optional<MirroredVariable> w, b, count;
  {
    auto scope = s->scope();
    w.emplace(constant({1.f, 2.f}), VariableOptions{.name = "w"});
    b.emplace(constant(0.f), VariableOptions{.name = "b"});
    count.emplace(constant(0), VariableOptions{.name = "count"});
  }
  SGD sgd;
  std::string msg;
  {
    auto scope = s->scope();
    msg = expect_throw<FailedPreconditionError>([&] { sgd.apply_gradients({{constant({1.f, 1.f}), *w}}); });
    EXPECT_NE(msg.find("`apply_gradients()` cannot be called in cross-replica context"), std::string::npos) << msg;
  }
  msg = expect_throw<InvalidArgumentError>([&] { s->run([&] { sgd.apply_gradients({}); }); });
  EXPECT_NE(msg.find("No gradients provided for any variable."), std::string::npos) << msg;
  msg = expect_throw<InvalidArgumentError>([&] { s->run([&] { sgd.apply_gradients({{constant(1), *count}}); }); });
  EXPECT_NE(msg.find("variable 'count' has dtype int32"), std::string::npos) << msg;
  msg = expect_throw<InvalidArgumentError>([&] { s->run([&] { sgd.apply_gradients({{constant({1.f}), *w}}); }); });
  EXPECT_NE(msg.find("gradient 0 for variable 'w' (float32(2,)) is float32(1,)"), std::string::npos) << msg;
  msg = expect_throw<InvalidArgumentError>([&] {
    s->run([&](ReplicaContext& ctx) {
      if (ctx.replica_id_in_sync_group() == 0) {
        sgd.apply_gradients({{constant({1.f, 1.f}), *w}, {constant(1.f), *b}});
      } else {
        sgd.apply_gradients({{constant(1.f), *b}, {constant({1.f, 1.f}), *w}});
      }
    });
  });
  EXPECT_NE(msg.find("variable 0 is 'w' on replica 0 but 'b' on replica 1"), std::string::npos) << msg;
  EXPECT_EQ(w->values()[1], constant({1.f, 2.f}));  // nothing was applied
  EXPECT_EQ(sgd.iterations(), 0);
  auto other = mirrored(2);
  msg = expect_throw<FailedPreconditionError>([&] { other->run([&] { sgd.apply_gradients({{constant(1.f), *b}}); }); });
  EXPECT_NE(msg.find("Mixing different tf.distribute.Strategy objects"), std::string::npos) << msg;
  EXPECT_NE(
      expect_throw<InvalidArgumentError>([] { SGD bad({.momentum = 1.5}); }).find("`momentum` must be between [0, 1]"),
      std::string::npos);
  EXPECT_THROW(Adam({.beta_1 = 1.0}), InvalidArgumentError);
}

// ---- learning rates, iterations and missing gradients (Keras' behaviour) ----

TEST(LearningRateScheduleTest, ValuesFollowKerasFormulas) {
  const ExponentialDecay smooth(0.1, 10, 0.5);
  EXPECT_DOUBLE_EQ(smooth(0), 0.1);
  EXPECT_DOUBLE_EQ(smooth(10), 0.05);
  EXPECT_DOUBLE_EQ(smooth(5), 0.1 * std::pow(0.5, 0.5));
  const ExponentialDecay stairs(0.1, 10, 0.5, /*staircase=*/true);
  EXPECT_DOUBLE_EQ(stairs(9), 0.1);
  EXPECT_DOUBLE_EQ(stairs(25), 0.025);
  const PiecewiseConstantDecay piecewise({100, 200}, {1.0, 0.5, 0.1});
  EXPECT_EQ(piecewise(0), 1.0);
  EXPECT_EQ(piecewise(100), 1.0);  // up to and including the boundary
  EXPECT_EQ(piecewise(101), 0.5);
  EXPECT_EQ(piecewise(200), 0.5);
  EXPECT_EQ(piecewise(201), 0.1);
  const CosineDecay cosine(1.0, 100, 0.1);
  EXPECT_DOUBLE_EQ(cosine(0), 1.0);
  EXPECT_DOUBLE_EQ(cosine(50), 0.9 * 0.5 + 0.1);
  EXPECT_DOUBLE_EQ(cosine(100), 0.1);
  EXPECT_DOUBLE_EQ(cosine(1000), 0.1);  // held at the end
  EXPECT_EQ(smooth.describe(),
            "ExponentialDecay(initial_learning_rate=0.1, decay_steps=10, decay_rate=0.5, "
            "staircase=False)");
}

TEST(LearningRateScheduleTest, BadArgumentsAreClearErrors) {
  std::string msg = expect_throw<InvalidArgumentError>([] { ExponentialDecay(0.1, 0, 0.5); });
  EXPECT_NE(msg.find("ExponentialDecay: decay_steps must be > 0, got 0"), std::string::npos) << msg;
  msg = expect_throw<InvalidArgumentError>([] { PiecewiseConstantDecay({10, 20}, {1.0, 0.5}); });
  EXPECT_NE(msg.find("2 boundaries, 2 values"), std::string::npos) << msg;
  msg = expect_throw<InvalidArgumentError>([] { PiecewiseConstantDecay({20, 10}, {1.0, 0.5, 0.1}); });
  EXPECT_NE(msg.find("boundaries must increase"), std::string::npos) << msg;
  msg = expect_throw<InvalidArgumentError>([] { CosineDecay(0.1, 10, 2.0); });
  EXPECT_NE(msg.find("alpha must be in [0, 1], got 2"), std::string::npos) << msg;
  msg = expect_throw<InvalidArgumentError>([] { SGD({.learning_rate = std::nan("")}); });
  EXPECT_NE(msg.find("SGD: learning_rate must be finite, got nan"), std::string::npos) << msg;
}

// A schedule is evaluated at `iterations` before the step (step 0 first),
// and the rate can be read and set between steps.
TEST(OptimizerTest, TheLearningRateIsANumberOrAScheduleAtIterations) {
  SGD sgd({.learning_rate = PiecewiseConstantDecay({0}, {0.5, 0.25})});
  EXPECT_EQ(sgd.current_learning_rate(), 0.5);
  ASSERT_NE(sgd.learning_rate().schedule(), nullptr);
  const MirroredVariable w = train(sgd, 2, 3);
  std::vector<float> want = kInit;
  for (int step = 0; step < 3; ++step) {
    const auto g = summed(2, step, kBase);
    const float lr = step == 0 ? 0.5f : 0.25f;
    for (std::size_t i = 0; i < want.size(); ++i) want[i] -= lr * g[i];
  }
  EXPECT_EQ(floats(w.values()[0]), want);
  EXPECT_EQ(sgd.current_learning_rate(), 0.25);
  sgd.set_learning_rate(0.125);
  EXPECT_EQ(sgd.learning_rate().schedule(), nullptr);
  EXPECT_EQ(sgd.learning_rate().value(), 0.125);
  EXPECT_THROW(sgd.set_learning_rate(std::numeric_limits<double>::infinity()), InvalidArgumentError);
  EXPECT_EQ(sgd.current_learning_rate(), 0.125);
}

// A restored optimizer goes on: set_iterations(k) then one step equals the
// (k+1)-th step of an uninterrupted run, for Adam's bias correction and a
// schedule alike.
TEST(OptimizerTest, SettingIterationsContinuesTheScheduleAndBiasCorrection) {
  const ExponentialDecay decay(0.01, 2, 0.5);
  Adam whole({.learning_rate = decay});
  const MirroredVariable want = train(whole, 2, 3);
  // The same three steps, with the count set back and forth in between.
  Adam resumed({.learning_rate = decay});
  auto s = mirrored(2);
  std::optional<MirroredVariable> w;
  {
    auto scope = s->scope();
    w.emplace(constant(kInit, Shape{4}), VariableOptions{.name = "w"});
  }
  for (int step = 0; step < 3; ++step) {
    resumed.set_iterations(step);
    s->run([&](ReplicaContext& ctx) {
      resumed.apply_gradients({{gradient(ctx.replica_id_in_sync_group(), step, kBase), *w}});
    });
  }
  EXPECT_EQ(floats(w->values()[0]), floats(want.values()[0]));
  EXPECT_EQ(resumed.iterations(), 3);
  EXPECT_THROW(resumed.set_iterations(-1), InvalidArgumentError);
  // Set ahead: the next step's rate and bias correction are step 10's.
  Adam ahead({.learning_rate = decay});
  ahead.set_iterations(10);
  EXPECT_DOUBLE_EQ(ahead.current_learning_rate(), 0.01 * std::pow(0.5, 5));
}

// A schedule whose value is not finite fails that step on every replica,
// and the step is not counted.
TEST(OptimizerTest, ANonFiniteScheduledRateFailsTheStep) {
  struct Broken final : LearningRateSchedule {
    double operator()(std::int64_t step) const override { return step < 1 ? 0.1 : std::nan(""); }
    std::string describe() const override { return "Broken()"; }
  };
  SGD sgd({.learning_rate = Broken()});
  train(sgd, 2, 1);
  auto s = mirrored(2);
  std::optional<MirroredVariable> w;
  {
    auto scope = s->scope();
    w.emplace(constant(kInit, Shape{4}), VariableOptions{.name = "w"});
  }
  const std::string msg = expect_throw<InvalidArgumentError>([&] {
    s->run([&] { sgd.apply_gradients({{constant(kBase, Shape{4}), *w}}); });
  });
  EXPECT_NE(msg.find("the learning rate Broken() at step 1 is nan"), std::string::npos) << msg;
  EXPECT_EQ(sgd.iterations(), 1);
  for (const Tensor& c : w->values()) EXPECT_EQ(floats(c), kInit);
}

// As Keras: a pair without a gradient is skipped with a warning naming its
// variable (once); no gradient at all is an error naming every variable.
TEST(OptimizerTest, MissingGradientsAreSkippedWithAWarning) {
  auto s = mirrored(2);
  std::optional<MirroredVariable> w, frozen;
  {
    auto scope = s->scope();
    w.emplace(constant(kInit, Shape{4}), VariableOptions{.name = "w"});
    frozen.emplace(constant(kInit, Shape{4}), VariableOptions{.name = "frozen"});
  }
  SGD sgd({.learning_rate = 0.5});
  ::testing::internal::CaptureStderr();
  for (int step = 0; step < 2; ++step) {
    s->run([&] { sgd.apply_gradients({{constant(kBase, Shape{4}), *w}, {std::nullopt, *frozen}}); });
  }
  const std::string warned = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(warned.find("gradients do not exist for variables ['frozen']"), std::string::npos) << warned;
  EXPECT_EQ(warned.find("frozen"), warned.rfind("frozen")) << "warned twice: " << warned;
  for (const Tensor& c : frozen->values()) EXPECT_EQ(floats(c), kInit);
  std::vector<float> want = kInit;
  for (int step = 0; step < 2; ++step) {
    for (std::size_t i = 0; i < want.size(); ++i) want[i] -= 0.5f * (kBase[i] + kBase[i]);
  }
  EXPECT_EQ(floats(w->values()[0]), want);
  EXPECT_EQ(sgd.iterations(), 2);
  const std::string msg = expect_throw<InvalidArgumentError>([&] {
    s->run([&] { sgd.apply_gradients({{std::nullopt, *w}, {std::nullopt, *frozen}}); });
  });
  EXPECT_NE(msg.find("No gradients provided for any variable: ('w', 'frozen')"), std::string::npos) << msg;
  EXPECT_EQ(sgd.iterations(), 2);
}

}  // namespace
}  // namespace distribute
