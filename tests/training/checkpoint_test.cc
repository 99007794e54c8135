// Checkpoints: TensorFlow's semantics of distributed variables (saved once,
// restored under any layout), the object graph's keys, restore-on-create,
// the load status' assertions, CheckpointManager, the errors of bad input,
// and crash safety (every write, fsync and rename point, and kill -9).
#include <distribute/distribute.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "comm/threads/shared_memory_communicator.h"
#include "core/crc32c.h"
#include "runtime/worker_agreement.h"
#include "testing/strategies.h"
#include "testing/threads.h"
#include "training/checkpoint_io.h"

namespace distribute {
namespace {

namespace fs = std::filesystem;
namespace io = internal::checkpoint_io;
using testing::expect_throw;
using testing::mirrored;
using train::Checkpoint;
using train::CheckpointManager;
using train::CheckpointOptions;
using train::CheckpointReader;

// A fresh directory under the build's temporary space, removed afterwards.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "distribute-ckpt-XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

// Values whose every bit matters (not representable exactly in fewer bits).
Tensor noisy(int n, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d;
  std::vector<float> v;
  for (int i = 0; i < n; ++i) v.push_back(d(gen));
  return constant(v, Shape{n});
}

// A layout to save or restore under: a default-strategy variable, one device, or n mirrored replicas.
struct Layout {
  std::string name;
  int replicas;  // 0: the default strategy; -1: OneDeviceStrategy
};

std::unique_ptr<Strategy> make_strategy(const Layout& l) {
  if (l.replicas == 0) return nullptr;
  if (l.replicas < 0) return std::make_unique<OneDeviceStrategy>("CPU:0");
  return mirrored(l.replicas);
}

// A model of two variables and Adam, trained `steps` steps under `s` (null:
// the default strategy) with gradients that depend on the step only.
struct Model {
  std::unique_ptr<Strategy> strategy;
  std::optional<Variable> w;
  std::optional<Variable> b;
  std::unique_ptr<Adam> adam;

  explicit Model(const Layout& l) : strategy(make_strategy(l)), adam(std::make_unique<Adam>()) {
    std::optional<StrategyScope> scope;
    if (strategy) scope.emplace(strategy->scope());
    w.emplace(noisy(6, 1), VariableOptions{.name = "w"});
    b.emplace(constant(std::vector<double>{0.5, -0.25}, Shape{2}), VariableOptions{.name = "b"});
  }
  void train(int steps, int first_step = 0) {
    for (int step = first_step; step < first_step + steps; ++step) {
      auto fn = [&] {
        const double scale = 1.0 / (strategy ? strategy->num_replicas_in_sync() : 1);
        Tensor gw = noisy(6, 100 + static_cast<std::uint32_t>(step));
        // Each replica's share of the gradient.
        std::vector<float> g(gw.flat<float>().begin(), gw.flat<float>().end());
        for (float& x : g) x = static_cast<float>(x * scale);
        adam->apply_gradients(
            {{constant(g, Shape{6}), *w}, {constant(std::vector<double>{0.125 * scale, -1.0 * scale}, Shape{2}), *b}});
      };
      if (strategy) {
        strategy->run(fn);
      } else {
        fn();
      }
    }
  }
  std::unique_ptr<Checkpoint> checkpoint() {
    return std::make_unique<Checkpoint>(std::initializer_list<std::pair<std::string, train::Trackable>>{
        {"model/w", *w}, {"model/b", *b}, {"optimizer", *adam}});
  }
};

const std::vector<Layout> kLayouts = {
    {"default", 0}, {"one_device", -1}, {"mirrored1", 1}, {"mirrored2", 2}, {"mirrored4", 4}};

// Saved under every layout, restored under every layout: every component of
// every variable and slot, and the step count, come back bit for bit.
TEST(CheckpointTest, RestoresUnderEveryLayoutBitForBit) {
  for (const Layout& from : kLayouts) {
    TempDir dir;
    Model saved(from);
    saved.train(3);
    auto ckpt = saved.checkpoint();
    const std::string path = ckpt->save(dir / "ckpt");
    EXPECT_EQ(path, dir / "ckpt-1");
    for (const Layout& to : kLayouts) {
      SCOPED_TRACE(from.name + " -> " + to.name);
      Model restored(to);
      auto ck2 = restored.checkpoint();
      ck2->restore(path).assert_consumed();
      for (const Tensor& c : restored.w->values()) EXPECT_TRUE(same_bits(c, saved.w->values()[0]));
      for (const Tensor& c : restored.b->values()) EXPECT_TRUE(same_bits(c, saved.b->values()[0]));
      for (const char* slot : {"m", "v"}) {
        const Variable s = restored.adam->get_slot(*restored.w, slot);
        for (const Tensor& c : s.values()) EXPECT_TRUE(same_bits(c, saved.adam->get_slot(*saved.w, slot).values()[0]));
      }
      EXPECT_EQ(restored.adam->iterations(), 3);
      EXPECT_EQ(ck2->save_counter(), 1);
    }
  }
}

// A run saved after 2 steps and resumed (in a fresh model, under the same
// layout) ends bit-identical to a run of 4 steps without a stop.
TEST(CheckpointTest, AResumedRunContinuesBitForBit) {
  for (const Layout& layout : {kLayouts[0], kLayouts[3]}) {
    TempDir dir;
    Model straight(layout);
    straight.train(4);
    std::string path;
    {
      Model first(layout);
      first.train(2);
      path = first.checkpoint()->save(dir / "ckpt");
    }
    Model resumed(layout);
    auto ckpt = resumed.checkpoint();
    // Restored before the first step: Adam's slots are made by the restore.
    ckpt->restore(path).assert_consumed();
    resumed.train(2, /*first_step=*/2);
    EXPECT_TRUE(same_bits(resumed.w->values()[0], straight.w->values()[0])) << layout.name;
    EXPECT_TRUE(same_bits(resumed.b->values()[0], straight.b->values()[0])) << layout.name;
    EXPECT_EQ(resumed.adam->iterations(), 4);
  }
}

// TensorFlow's keys: the object graph's paths, slots under .OPTIMIZER_SLOT,
// the optimizer's iterations and the save counter.
TEST(CheckpointTest, KeysFollowTensorFlowsObjectGraph) {
  TempDir dir;
  Model m({"mirrored2", 2});
  m.train(1);
  Variable step(constant(std::int64_t{7}), {.name = "global_step"});
  auto ckpt = m.checkpoint();
  ckpt->track("step", step);
  ckpt->track("odd.name", Variable(constant(1.f), {.name = "odd"}));
  CheckpointReader reader(ckpt->save(dir / "ckpt"));
  std::vector<std::string> keys;
  for (const auto& e : reader.entries()) keys.push_back(e.key);
  const std::vector<std::string> expected = {"model/b/.ATTRIBUTES/VARIABLE_VALUE",
                                             "model/b/.OPTIMIZER_SLOT/optimizer/m/.ATTRIBUTES/VARIABLE_VALUE",
                                             "model/b/.OPTIMIZER_SLOT/optimizer/v/.ATTRIBUTES/VARIABLE_VALUE",
                                             "model/w/.ATTRIBUTES/VARIABLE_VALUE",
                                             "model/w/.OPTIMIZER_SLOT/optimizer/m/.ATTRIBUTES/VARIABLE_VALUE",
                                             "model/w/.OPTIMIZER_SLOT/optimizer/v/.ATTRIBUTES/VARIABLE_VALUE",
                                             "odd..name/.ATTRIBUTES/VARIABLE_VALUE",
                                             "optimizer/iter/.ATTRIBUTES/VARIABLE_VALUE",
                                             "save_counter/.ATTRIBUTES/VARIABLE_VALUE",
                                             "step/.ATTRIBUTES/VARIABLE_VALUE"};
  EXPECT_EQ(keys, expected);
  EXPECT_EQ(reader.entry("step/.ATTRIBUTES/VARIABLE_VALUE").full_name, "global_step");
  EXPECT_EQ(reader.entry("model/w/.OPTIMIZER_SLOT/optimizer/m/.ATTRIBUTES/VARIABLE_VALUE").full_name, "w/m");
  EXPECT_EQ(reader.get_tensor("optimizer/iter/.ATTRIBUTES/VARIABLE_VALUE").scalar<std::int64_t>(), 1);
  EXPECT_EQ(reader.get_tensor("step/.ATTRIBUTES/VARIABLE_VALUE").scalar<std::int64_t>(), 7);
  EXPECT_EQ(reader.layout(), "MirroredStrategy, 1 worker x 2 replicas");
  EXPECT_TRUE(reader.verify().empty());
}

// values_test's cases (spec §1.11, 1-5): SyncOnRead SUM saves the sum and
// restores value / N on each replica; MEAN saves the mean; a mirrored
// variable saves its value once; each restores into a plain variable and back.
TEST(CheckpointTest, SyncOnReadAndMirroredAsTensorFlow) {
  TempDir dir;
  auto s = mirrored(2);
  std::optional<SyncOnReadVariable> sum, mean;
  std::optional<MirroredVariable> mirror;
  {
    auto scope = s->scope();
    sum.emplace(constant(0.f), VariableOptions{.name = "sum", .aggregation = VariableAggregation::kSum});
    mean.emplace(constant(0.f), VariableOptions{.name = "mean", .aggregation = VariableAggregation::kMean});
    mirror.emplace(constant(0.f), VariableOptions{.name = "mirror", .aggregation = VariableAggregation::kSum});
  }
  s->run([&](ReplicaContext& ctx) {
    sum->assign(constant(3.f + static_cast<float>(ctx.replica_id_in_sync_group())));
    mean->assign(constant(3.f + static_cast<float>(ctx.replica_id_in_sync_group())));
  });
  Checkpoint ckpt({{"sum", *sum}, {"mean", *mean}, {"mirror", *mirror}});
  mirror->assign(constant(3.f));
  const std::string path = ckpt.save(dir / "ckpt");
  CheckpointReader reader(path);
  EXPECT_EQ(reader.get_tensor("sum/.ATTRIBUTES/VARIABLE_VALUE").scalar<float>(), 7.f);
  EXPECT_EQ(reader.get_tensor("mean/.ATTRIBUTES/VARIABLE_VALUE").scalar<float>(), 3.5f);
  EXPECT_EQ(reader.get_tensor("mirror/.ATTRIBUTES/VARIABLE_VALUE").scalar<float>(), 3.f);

  s->run([&](ReplicaContext& ctx) {
    sum->assign(constant(5.f + static_cast<float>(ctx.replica_id_in_sync_group())));
    mean->assign(constant(5.f + static_cast<float>(ctx.replica_id_in_sync_group())));
  });
  mirror->assign(constant(5.f));
  ckpt.restore(path).assert_consumed();
  for (const Tensor& c : sum->values()) EXPECT_EQ(c.scalar<float>(), 3.5f);
  for (const Tensor& c : mean->values()) EXPECT_EQ(c.scalar<float>(), 3.5f);
  for (const Tensor& c : mirror->values()) EXPECT_EQ(c.scalar<float>(), 3.f);
  EXPECT_EQ(sum->read_value().scalar<float>(), 7.f);

  // Into plain variables (the default strategy) and back into the SUM variable.
  Variable plain_sum(constant(8.f), {.name = "p"});
  Variable plain_mirror(constant(8.f), {.name = "q"});
  Checkpoint plain({{"sum", plain_sum}, {"mean", Variable(constant(0.f))}, {"mirror", plain_mirror}});
  plain.restore(path).assert_consumed();
  EXPECT_EQ(plain_sum.read_value().scalar<float>(), 7.f);
  EXPECT_EQ(plain_mirror.read_value().scalar<float>(), 3.f);
  plain_sum.assign(constant(3.5f));
  const std::string plain_path = plain.write(dir / "plain");
  Checkpoint back({{"sum", *sum}});
  back.read(plain_path).expect_partial();
  for (const Tensor& c : sum->values()) EXPECT_EQ(c.scalar<float>(), 1.75f);
}

// A SyncOnRead variable with aggregation NONE cannot be saved, as in TF.
TEST(CheckpointTest, AggregationNoneOnReadCannotBeSaved) {
  TempDir dir;
  auto s = mirrored(2);
  std::optional<SyncOnReadVariable> v;
  {
    auto scope = s->scope();
    v.emplace(constant(1.f), VariableOptions{.name = "none"});
  }
  Checkpoint ckpt({{"v", *v}});
  expect_throw<InvalidArgumentError>([&] { ckpt.save(dir / "ckpt"); });
  EXPECT_FALSE(train::latest_checkpoint(dir.path()));
  EXPECT_EQ(ckpt.save_counter(), 0);
}

// TF's restore-on-create: values for objects tracked after the restore are
// restored when tracked; initial_value() gives a variable its saved value to
// be created with, and tracking it then restores nothing again.
TEST(CheckpointTest, RestoreOnCreate) {
  TempDir dir;
  Variable v(constant(std::vector<float>{1, 1, 1}, Shape{3}), {.name = "v"});
  Variable u(constant(2.f), {.name = "u"});
  const std::string path = Checkpoint({{"v", v}, {"u", u}}).save(dir / "ckpt");

  Checkpoint later;
  auto status = later.restore(path);
  EXPECT_NO_THROW(status.assert_existing_objects_matched());
  // Nothing but the counter matched yet.
  EXPECT_NE(expect_throw<FailedPreconditionError>([&] { status.assert_consumed(); }).find("(root).u"),
            std::string::npos);
  EXPECT_NE(expect_throw<FailedPreconditionError>([&] { status.assert_nontrivial_match(); }).find("Nothing"),
            std::string::npos);
  Variable u2(constant(0.f), {.name = "u2"});
  later.track("u", u2);
  EXPECT_EQ(u2.read_value().scalar<float>(), 2.f);
  const std::optional<Tensor> init = later.initial_value("v");
  ASSERT_TRUE(init);
  Variable v2(*init, {.name = "v2"});
  v2.assign(constant(std::vector<float>{0, 0, 0}, Shape{3}));
  later.track("v", v2);
  EXPECT_EQ(v2.read_value(), constant(std::vector<float>{0, 0, 0}, Shape{3}));  // not restored twice
  status.assert_consumed();
  EXPECT_FALSE(later.initial_value("missing"));
}

// An empty variable (no elements, so perhaps no buffer) saves and restores
// like any other, directly and on creation, under one replica and several:
// distribute-train's history is empty until its first epoch ends.
TEST(CheckpointTest, EmptyVariablesRoundTrip) {
  TempDir dir;
  Variable empty(constant(std::vector<float>{}, Shape{0}), {.name = "empty"});
  Variable wide(constant(std::vector<std::int64_t>{}, Shape{0, 3}), {.name = "wide"});
  const std::string path = Checkpoint({{"empty", empty}, {"wide", wide}}).save(dir / "ckpt");
  for (int replicas : {1, 2}) {
    auto s = mirrored(replicas);
    auto scope = s->scope();
    Variable e2(constant(std::vector<float>{}, Shape{0}), {.name = "e2"});
    Checkpoint c({{"empty", e2}});
    auto status = c.restore(path);
    EXPECT_EQ(e2.read_value().shape(), Shape{0});
    const std::optional<Tensor> init = c.initial_value("wide");
    ASSERT_TRUE(init);
    EXPECT_EQ(init->shape(), (Shape{0, 3}));
    Variable w2(*init, {.name = "w2"});
    c.track("wide", w2);
    EXPECT_EQ(w2.read_value().dtype(), DType::kInt64);
    status.assert_consumed();
  }
}

// A newer restore wins over an older one for objects tracked later
// (checkpoint_test.testDeferredSlotRestoration).
TEST(CheckpointTest, TheNewestRestoreWins) {
  TempDir dir;
  Variable v(constant(12.f), {.name = "v"});
  Checkpoint c({{"var", v}});
  const std::string first = c.write(dir / "a");
  v.assign(constant(13.f));
  const std::string second = c.write(dir / "b");
  Checkpoint fresh;
  auto s = fresh.read(second);
  auto n = fresh.read(first);
  Variable v2(constant(0.f));
  fresh.track("var", v2);
  EXPECT_EQ(v2.read_value().scalar<float>(), 12.f);
  n.assert_consumed();
  // The older one's value was overridden, not missed.
  EXPECT_NO_THROW(s.assert_existing_objects_matched());
  s.expect_partial();
}

TEST(CheckpointTest, AssertionsNameWhatDidNotMatch) {
  TempDir dir;
  Variable v1(constant(2.f)), v2(constant(3.f));
  SGD sgd({.learning_rate = 0.1, .momentum = 0.9});
  sgd.apply_gradients({{constant(1.f), v1}});
  const std::string path = Checkpoint({{"v1", v1}, {"v2", v2}, {"optimizer", sgd}}).save(dir / "ckpt");

  // A checkpoint value nobody restores (v2, the momentum slot) fails assert_consumed, naming it.
  Variable only(constant(0.f));
  Checkpoint partial({{"v1", only}});
  auto status = partial.restore(path);
  EXPECT_EQ(only.read_value().scalar<float>(), v1.read_value().scalar<float>());
  status.assert_existing_objects_matched();
  const std::string unresolved = expect_throw<FailedPreconditionError>([&] { status.assert_consumed(); });
  EXPECT_NE(unresolved.find("(root).v2"), std::string::npos) << unresolved;
  EXPECT_NE(unresolved.find("(root).optimizer's state 'momentum' for (root).v1"), std::string::npos) << unresolved;
  EXPECT_EQ(unresolved.find("(root).v1 ('v1/.ATTRIBUTES"), std::string::npos) << unresolved;
  status.expect_partial();

  // An object the checkpoint has no value for fails assert_existing_objects_matched.
  Variable extra(constant(0.f));
  Checkpoint more({{"v1", Variable(constant(0.f))}, {"v2", Variable(constant(0.f))}, {"v3", extra}});
  auto s2 = more.restore(path);
  const std::string unmatched = expect_throw<FailedPreconditionError>([&] { s2.assert_existing_objects_matched(); });
  EXPECT_NE(unmatched.find("(root).v3"), std::string::npos) << unmatched;
  s2.expect_partial();
}

TEST(CheckpointTest, ShapeOrDtypeMismatchNamesTheKeyAndBoth) {
  TempDir dir;
  const std::string path = Checkpoint({{"w", Variable(constant(std::vector<float>{1, 2}, Shape{2}))}}).write(dir / "c");
  Variable wrong_shape(constant(std::vector<float>{0, 0, 0}, Shape{3}), {.name = "w3"});
  Checkpoint a({{"w", wrong_shape}});
  const std::string m = expect_throw<InvalidArgumentError>([&] { a.read(path); });
  EXPECT_NE(m.find("'w/.ATTRIBUTES/VARIABLE_VALUE' holds float32(2,)"), std::string::npos) << m;
  EXPECT_NE(m.find("variable 'w3' is float32(3,)"), std::string::npos) << m;
  Variable wrong_dtype(constant(std::vector<double>{0, 0}, Shape{2}));
  Checkpoint b({{"w", wrong_dtype}});
  EXPECT_NE(expect_throw<InvalidArgumentError>([&] { b.read(path); }).find("float64(2,)"), std::string::npos);
}

TEST(CheckpointTest, NoCheckpointThereIsNotFound) {
  TempDir dir;
  Checkpoint c({{"v", Variable(constant(1.f))}});
  const std::string m = expect_throw<NotFoundError>([&] { c.restore(dir / "ckpt-1"); });
  EXPECT_NE(m.find(dir / "ckpt-1"), std::string::npos) << m;
  EXPECT_NE(m.find("checkpoint suffix"), std::string::npos) << m;
  EXPECT_NE(expect_throw<NotFoundError>([&] { c.restore(dir.path()); }).find(dir.path()), std::string::npos);
  EXPECT_THROW(CheckpointReader(dir / "nothing"), NotFoundError);
  EXPECT_FALSE(train::latest_checkpoint(dir.path()));
}

// Corrupted, truncated or malformed files are DataLossError naming the file
// and the tensor, and restore nothing (the variable keeps its value).
TEST(CheckpointTest, CorruptionIsDataLossAndRestoresNothing) {
  TempDir dir;
  Variable w(noisy(1000, 3), {.name = "w"});
  Variable b(constant(5.f), {.name = "b"});
  Checkpoint ckpt({{"w", w}, {"b", b}});
  const std::string path = ckpt.write(dir / "c");
  const CheckpointReader reader(path);
  const std::string shard = dir / reader.entries().front().file;
  const std::string original = io::read_small_file(shard, 1 << 30);
  auto damaged = [&](const std::function<void(std::string&)>& change) {
    std::string bytes = original;
    change(bytes);
    std::ofstream(shard, std::ios::binary | std::ios::trunc) << bytes;
  };
  const Tensor w_before = w.read_value();
  w.assign(constant(std::vector<float>(1000, 0.f), Shape{1000}));
  b.assign(constant(0.f));

  // One flipped bit in w's data.
  damaged([](std::string& s) { s[s.size() - 100] = static_cast<char>(s[s.size() - 100] ^ 1); });
  std::string m = expect_throw<DataLossError>([&] { ckpt.read(path); });
  EXPECT_NE(m.find(shard), std::string::npos) << m;
  EXPECT_NE(m.find("'w/.ATTRIBUTES/VARIABLE_VALUE'"), std::string::npos) << m;
  EXPECT_NE(m.find("corrupted"), std::string::npos) << m;
  EXPECT_EQ(b.read_value().scalar<float>(), 0.f);  // nothing restored, not even the sound tensor
  EXPECT_EQ(CheckpointReader(path).verify().size(), 1U);

  damaged([](std::string& s) { s.resize(s.size() - 10); });  // truncated
  m = expect_throw<DataLossError>([&] { ckpt.read(path); });
  EXPECT_NE(m.find("truncated"), std::string::npos) << m;
  damaged([](std::string& s) {
    s[0] = static_cast<char>(0xff);
    s[5] = 1;
  });  // header length
  EXPECT_NE(expect_throw<DataLossError>([&] { ckpt.read(path); }).find("bad header"), std::string::npos);
  damaged([](std::string& s) { s[9] = '#'; });  // header JSON
  EXPECT_NE(expect_throw<DataLossError>([&] { ckpt.read(path); }).find("bad header"), std::string::npos);
  damaged([](std::string&) {});
  {
    const std::string manifest = path + ".index.json";
    const std::string text = io::read_small_file(manifest, 1 << 20);
    std::ofstream(manifest, std::ios::trunc) << text.substr(0, text.size() / 2);
    EXPECT_NE(expect_throw<DataLossError>([&] { ckpt.read(path); }).find(manifest), std::string::npos);
    std::ofstream(manifest, std::ios::trunc) << text;
  }
  ckpt.read(path).assert_consumed();
  EXPECT_TRUE(same_bits(w.read_value(), w_before));
  EXPECT_EQ(b.read_value().scalar<float>(), 5.f);
}

TEST(CheckpointTest, BadNamesAndCallsAreRefused) {
  Variable v(constant(1.f));
  EXPECT_THROW(Checkpoint({{"a//b", v}}), InvalidArgumentError);
  EXPECT_THROW(Checkpoint({{"", v}}), InvalidArgumentError);
  EXPECT_THROW(Checkpoint({{"save_counter", v}}), InvalidArgumentError);
  EXPECT_THROW(Checkpoint({{"a", v}, {"a", v}}), InvalidArgumentError);
  Checkpoint c({{"a", v}});
  // Tracking a name again names the new object, as TF's ckpt.a = other.
  Variable other(constant(7.f));
  c.track("a", other);
  auto s = mirrored(2);
  TempDir dir;
  EXPECT_THROW(s->run([&] { c.save(dir / "x"); }), FailedPreconditionError);
  EXPECT_THROW(c.write(dir.path() + "/"), InvalidArgumentError);
  EXPECT_EQ(CheckpointReader(c.write(dir / "y")).get_tensor("a/.ATTRIBUTES/VARIABLE_VALUE").scalar<float>(), 7.f);
}

TEST(CheckpointTest, Crc32cIsCastagnolis) {
  EXPECT_EQ(internal::crc32c("123456789", 9), 0xE3069283U);
  const std::string text(1000, 'x');
  const std::uint32_t whole = internal::crc32c(text.data(), text.size());
  EXPECT_EQ(internal::crc32c_extend(internal::crc32c(text.data(), 333), text.data() + 333, 667), whole);
  EXPECT_EQ(internal::crc32c(nullptr, 0), 0U);
}

// ---- CheckpointManager (checkpoint_management_test's cases) --------------------

std::vector<std::string> names_of(const std::vector<std::string>& paths) {
  std::vector<std::string> out;
  for (const auto& p : paths) out.push_back(fs::path(p).filename().string());
  return out;
}

bool exists(const std::string& prefix) { return fs::exists(prefix + ".index.json"); }

TEST(CheckpointManagerTest, KeepsTheNewestMaxToKeep) {
  TempDir dir;
  Variable v(constant(0.f));
  Checkpoint c({{"v", v}});
  CheckpointManager m(c, dir.path(), 3);
  EXPECT_FALSE(m.latest_checkpoint());
  for (int i = 1; i <= 4; ++i) {
    v.assign(constant(static_cast<float>(i)));
    EXPECT_EQ(m.save(), dir / ("ckpt-" + std::to_string(i)));
  }
  EXPECT_EQ(names_of(m.checkpoints()), (std::vector<std::string>{"ckpt-2", "ckpt-3", "ckpt-4"}));
  EXPECT_FALSE(exists(dir / "ckpt-1"));
  // Its shard went with it: only the kept checkpoints' files remain.
  int shards = 0;
  for (const auto& e : fs::directory_iterator(dir.path())) shards += e.path().extension() == ".safetensors";
  EXPECT_EQ(shards, 3);
  EXPECT_EQ(m.latest_checkpoint(), dir / "ckpt-4");
  EXPECT_EQ(train::latest_checkpoint(dir.path()), dir / "ckpt-4");
  v.assign(constant(0.f));
  c.restore(*m.latest_checkpoint()).assert_consumed();
  EXPECT_EQ(v.read_value().scalar<float>(), 4.f);
}

TEST(CheckpointManagerTest, KeepAllThenThree) {
  TempDir dir;
  Checkpoint c({{"v", Variable(constant(0.f))}});
  {
    CheckpointManager m(c, dir.path(), std::nullopt);
    for (int i = 0; i < 3; ++i) m.save();
  }
  {
    CheckpointManager m(c, dir.path(), std::nullopt);
    m.save();
    EXPECT_EQ(names_of(m.checkpoints()), (std::vector<std::string>{"ckpt-1", "ckpt-2", "ckpt-3", "ckpt-4"}));
  }
  CheckpointManager m(c, dir.path(), 3);
  EXPECT_EQ(m.checkpoints().size(), 4U);
  m.save();
  EXPECT_EQ(names_of(m.checkpoints()), (std::vector<std::string>{"ckpt-3", "ckpt-4", "ckpt-5"}));
  EXPECT_FALSE(exists(dir / "ckpt-1"));
  EXPECT_FALSE(exists(dir / "ckpt-2"));
}

TEST(CheckpointManagerTest, KeepsOnePerNHours) {
  TempDir dir;
  double now = 3;
  Checkpoint c({{"v", Variable(constant(0.f))}});
  CheckpointManager m(c, dir.path(), 2, {.keep_checkpoint_every_n_hours = 1, .clock = [&] { return now; }});
  for (const double t : {10000., 11000., 12000., 13610., 14000.}) {
    now = t;
    m.save();
  }
  // ckpt-1 (t 10000 >= 2 + 3600) was preserved, ckpt-2 swept, ckpt-3 swept
  // (12000 - 3600 < 10000), and the newest two are managed.
  EXPECT_TRUE(exists(dir / "ckpt-1"));
  EXPECT_FALSE(exists(dir / "ckpt-2"));
  EXPECT_FALSE(exists(dir / "ckpt-3"));
  EXPECT_EQ(names_of(m.checkpoints()), (std::vector<std::string>{"ckpt-4", "ckpt-5"}));
}

TEST(CheckpointManagerTest, CheckpointIntervalCountsSteps) {
  TempDir dir;
  Variable step(constant(std::int64_t{0}));
  Checkpoint c({{"step", step}});
  CheckpointManager m(c, dir.path(), std::nullopt, {.step_counter = step, .checkpoint_interval = 2});
  std::vector<bool> saved;
  for (std::int64_t s = 0; s < 6; ++s) {
    step.assign(constant(s));
    saved.push_back(m.save().has_value());
  }
  EXPECT_EQ(saved, (std::vector<bool>{true, false, true, false, true, false}));
  EXPECT_TRUE(m.save(std::nullopt, /*check_interval=*/false));   // step 5, before its interval
  EXPECT_FALSE(m.save(std::nullopt, /*check_interval=*/false));  // the same step twice: never
  EXPECT_EQ(CheckpointReader(*m.latest_checkpoint()).step(), 5);
  EXPECT_THROW(CheckpointManager(c, dir / "other", 1, {.checkpoint_interval = 2}), InvalidArgumentError);
  EXPECT_THROW(CheckpointManager(c, dir / "other", 0), InvalidArgumentError);
}

TEST(CheckpointManagerTest, RestoreOrInitialize) {
  TempDir dir;
  Variable v(constant(0.f));
  Checkpoint c({{"v", v}});
  int initialized = 0;
  {
    CheckpointManager m(c, dir.path(), 1, {.init_fn = [&] { ++initialized; }});
    EXPECT_FALSE(m.restore_or_initialize());
    EXPECT_EQ(initialized, 1);
    v.assign(constant(9.f));
    m.save(std::int64_t{41});
    EXPECT_EQ(m.latest_checkpoint(), dir / "ckpt-41");
  }
  v.assign(constant(0.f));
  Checkpoint c2({{"v", v}});
  CheckpointManager m(c2, dir.path(), 1, {.init_fn = [&] { ++initialized; }});
  EXPECT_EQ(m.restore_or_initialize(), dir / "ckpt-41");
  EXPECT_EQ(initialized, 1);
  EXPECT_EQ(v.read_value().scalar<float>(), 9.f);
  EXPECT_EQ(c2.save_counter(), 1);
}

TEST(CheckpointManagerTest, TwoManagersOnOneDirectoryAreRefused) {
  TempDir dir;
  Checkpoint c({{"v", Variable(constant(0.f))}});
  CheckpointManager first(c, dir.path(), 1);
  const std::string m = expect_throw<FailedPreconditionError>([&] { CheckpointManager second(c, dir.path(), 1); });
  EXPECT_NE(m.find("in use by another CheckpointManager (pid " + std::to_string(::getpid())), std::string::npos) << m;
  // In another process too (a second job).
  const pid_t child = ::fork();
  if (child == 0) {
    try {
      CheckpointManager other(c, dir.path(), 1);
    } catch (const FailedPreconditionError&) {
      ::_exit(0);
    }
    ::_exit(1);
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

TEST(CheckpointManagerTest, AnUnusableDirectoryIsRefusedAtOnce) {
  TempDir dir;
  std::ofstream(dir / "file") << "x";
  Checkpoint c({{"v", Variable(constant(0.f))}});
  EXPECT_THROW(CheckpointManager(c, dir / "file/sub", 1), FailedPreconditionError);
}

// ---- crash safety ---------------------------------------------------------------

// The tests below fork a child that starts threads (a strategy's replicas):
// ThreadSanitizer does not support that in a multi-threaded process; the
// release and AddressSanitizer runs cover them.
#if defined(__SANITIZE_THREAD__)
#define SKIP_FORK_WITH_THREADS() GTEST_SKIP() << "ThreadSanitizer: no threads after a fork of a threaded process"
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define SKIP_FORK_WITH_THREADS() GTEST_SKIP() << "ThreadSanitizer: no threads after a fork of a threaded process"
#endif
#endif
#ifndef SKIP_FORK_WITH_THREADS
#define SKIP_FORK_WITH_THREADS() static_cast<void>(0)
#endif

// What the child processes below save: w holds `value` everywhere, and the
// step counter the same value, so a restored checkpoint is self-consistent.
struct Saver {
  std::unique_ptr<Strategy> strategy = mirrored(2);
  std::optional<MirroredVariable> w;
  Variable step{constant(std::int64_t{0}), {.name = "step"}};
  std::unique_ptr<Checkpoint> ckpt;
  explicit Saver(float value) {
    {
      auto scope = strategy->scope();
      w.emplace(constant(std::vector<float>(4096, value), Shape{4096}), VariableOptions{.name = "w"});
    }
    step.assign(constant(static_cast<std::int64_t>(value)));
    ckpt = std::make_unique<Checkpoint>(
        std::initializer_list<std::pair<std::string, train::Trackable>>{{"w", *w}, {"step", step}});
  }
  void set(float value) {
    w->assign(constant(std::vector<float>(4096, value), Shape{4096}));
    step.assign(constant(static_cast<std::int64_t>(value)));
  }
};

// The latest checkpoint of `dir` restores, its CRCs hold, and its values are
// those of one whole save: returns the value.
float check_latest(const std::string& dir) {
  const auto latest = train::latest_checkpoint(dir);
  if (!latest) return -1;
  EXPECT_TRUE(CheckpointReader(*latest).verify().empty());
  Saver fresh(0);
  fresh.ckpt->restore(*latest).assert_consumed();
  const float v = fresh.w->values()[0].flat<float>()[0];
  for (float x : fresh.w->values()[1].flat<float>()) EXPECT_EQ(x, v);
  EXPECT_EQ(fresh.step.read_value().scalar<std::int64_t>(), static_cast<std::int64_t>(v));
  return v;
}

// The files a directory holds that belong to no whole checkpoint.
std::vector<std::string> leftovers(const std::string& dir) {
  std::set<std::string> known = {"checkpoint.json", ".checkpoint.lock"};
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.size() > 11 && name.ends_with(".index.json")) {
      known.insert(name);
      const CheckpointReader reader(dir + "/" + name.substr(0, name.size() - 11));
      for (const auto& entry : reader.entries()) known.insert(entry.file);
    }
  }
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (!known.contains(e.path().filename().string())) out.push_back(e.path().filename().string());
  }
  return out;
}

// Operations of one manager save after the first, with max_to_keep 1 (the
// previous checkpoint swept): counted, not assumed.
std::int64_t operations_of_a_save(const std::string& dir) {
  Saver s(1);
  CheckpointManager m(*s.ckpt, dir, 1);
  m.save();
  const std::int64_t before = io::operations();
  m.save();
  return io::operations() - before;
}

// An I/O error at every write, fsync, rename and unlink point of a save:
// the save raises it, the previous checkpoint stays the latest and sound,
// and nothing of the failed save is left behind. Asynchronous saves alike:
// their thread counts its points as the caller's, and sync() raises.
void error_at_every_point(bool async) {
  TempDir count_dir;
  const std::int64_t points = operations_of_a_save(count_dir.path());
  std::cout << "a manager's save with a sweep: " << points << " fault points\n";
  ASSERT_GE(points, 8);  // shard create/write/fsync, manifest create/write/fsync/rename, dir fsync, index ...
  const CheckpointOptions options{.experimental_enable_async_checkpoint = async};
  for (std::int64_t k = 0; k < points; ++k) {
    SCOPED_TRACE("fault at operation " + std::to_string(k));
    TempDir dir;
    Saver s(1);
    CheckpointManager m(*s.ckpt, dir.path(), 1);
    m.save();
    s.set(2);
    io::inject_fault(k, io::Fault::kFail);
    bool failed = false;
    try {
      m.save(std::nullopt, true, options);
      if (async) s.set(3);  // the save holds the values of its call
      m.sync();
    } catch (const UnavailableError& e) {
      failed = true;
      EXPECT_NE(std::string(e.what()).find("injected fault"), std::string::npos) << e.what();
    }
    io::inject_fault(0, io::Fault::kNone);
    if (failed) {
      EXPECT_EQ(check_latest(dir.path()), 1.f);
      EXPECT_EQ(leftovers(dir.path()), std::vector<std::string>{});
      EXPECT_EQ(m.latest_checkpoint(), dir / "ckpt-1");
      // The manager goes on: the next save works.
      s.set(2);
      EXPECT_EQ(m.save(std::nullopt, true, options), dir / "ckpt-2");
      m.sync();
    } else {
      // A fault while sweeping the old checkpoint, once the new one is
      // whole and recorded: the save stands (with a warning).
      EXPECT_EQ(m.latest_checkpoint(), dir / "ckpt-2");
    }
    EXPECT_EQ(check_latest(dir.path()), 2.f);
  }
}

TEST(CheckpointCrashTest, AnErrorAtEveryPointLeavesThePreviousCheckpoint) { error_at_every_point(false); }
TEST(CheckpointAsyncTest, AnErrorAtEveryPointLeavesThePreviousCheckpoint) { error_at_every_point(true); }

// Waits for `child` (which must not outlive `seconds`); its wait status.
int wait_for(pid_t child, int seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  int status = 0;
  while (::waitpid(child, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(child, SIGKILL);
      ::waitpid(child, &status, 0);
      ADD_FAILURE() << "child " << child << " ran past " << seconds << " s";
      return status;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return status;
}

// The process killed (SIGKILL) at every point of a save: the directory then
// holds either the previous checkpoint or the new one, whole.
TEST(CheckpointCrashTest, DeathAtEveryPointLeavesAWholeCheckpoint) {
  SKIP_FORK_WITH_THREADS();
  TempDir count_dir;
  const std::int64_t points = operations_of_a_save(count_dir.path());
  for (std::int64_t k = 0; k <= points; ++k) {
    SCOPED_TRACE("killed at operation " + std::to_string(k));
    TempDir dir;
    {
      Saver s(1);
      CheckpointManager m(*s.ckpt, dir.path(), 1);
      m.save();
    }
    const pid_t child = ::fork();
    if (child == 0) {
      Saver s(1);
      CheckpointManager m(*s.ckpt, dir.path(), 1);
      m.restore_or_initialize();
      s.set(2);
      io::inject_fault(k, io::Fault::kCrash);
      m.save();
      ::_exit(0);
    }
    const int status = wait_for(child, 30);
    if (k < points) {
      EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
    } else {
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
    }
    const float v = check_latest(dir.path());
    EXPECT_TRUE(v == 1.f || v == 2.f) << v;
    if (k == points) {
      EXPECT_EQ(v, 2.f);
    }
  }
}

// kill -9 at random moments of a process that saves in a loop: every time,
// the latest checkpoint is whole and self-consistent, and a new manager
// goes on from it.
void kill_nine_at_random_moments(bool async) {
  TempDir dir;
  std::mt19937 gen(async ? 20261207 : 20261206);
  std::uniform_int_distribution<int> pause_us(2000, 60000);
  float last = 0;
  for (int round = 0; round < 12; ++round) {
    const pid_t child = ::fork();
    if (child == 0) {
      Saver s(0);
      CheckpointManager m(*s.ckpt, dir.path(), 2);
      m.restore_or_initialize();
      for (float v = s.w->values()[0].flat<float>()[0] + 1;; v += 1) {
        s.set(v);
        m.save(std::nullopt, true, {.experimental_enable_async_checkpoint = async});
        s.set(-5);  // what an asynchronous save must not hold
      }
    }
    std::this_thread::sleep_for(std::chrono::microseconds(pause_us(gen)));
    ::kill(child, SIGKILL);
    const int status = wait_for(child, 30);
    EXPECT_TRUE(WIFSIGNALED(status));
    const float v = check_latest(dir.path());
    if (v == -1 && last == 0) continue;  // killed before its first save was whole
    EXPECT_GE(v, last);                  // never back before what was whole already
    last = std::max(last, v);
  }
  EXPECT_GT(last, 0.f);
}

TEST(CheckpointCrashTest, KillNineAtRandomMoments) {
  SKIP_FORK_WITH_THREADS();
  kill_nine_at_random_moments(false);
}

TEST(CheckpointAsyncTest, KillNineAtRandomMoments) {
  SKIP_FORK_WITH_THREADS();
  kill_nine_at_random_moments(true);
}

// A full disk (RLIMIT_FSIZE) during a save: ResourceExhaustedError, the
// previous checkpoint intact.
TEST(CheckpointCrashTest, AFullDiskFailsTheSaveAndKeepsThePrevious) {
  SKIP_FORK_WITH_THREADS();
  TempDir dir;
  {
    Saver s(1);
    CheckpointManager m(*s.ckpt, dir.path(), 3);
    m.save();
  }
  const pid_t child = ::fork();
  if (child == 0) {
    ::signal(SIGXFSZ, SIG_IGN);
    Saver s(2);
    CheckpointManager m(*s.ckpt, dir.path(), 3);
    Variable big(constant(std::vector<float>(1 << 20, 1.f), Shape{1 << 20}));
    s.ckpt->track("big", big);
    rlimit limit{256 * 1024, 256 * 1024};
    ::setrlimit(RLIMIT_FSIZE, &limit);
    try {
      m.save();
    } catch (const ResourceExhaustedError& e) {
      ::_exit(std::string(e.what()).find("File too large") != std::string::npos ? 0 : 2);
    } catch (...) {
      ::_exit(3);
    }
    ::_exit(1);
  }
  const int status = wait_for(child, 30);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_EQ(check_latest(dir.path()), 1.f);
  EXPECT_EQ(leftovers(dir.path()), std::vector<std::string>{});
}

// ---- asynchronous saves ----------------------------------------------------

// An asynchronous save holds the values of its call, whatever the training
// does after it; the next save waits for it; restore finds it; the host
// buffers are reused (one copy of the state), and sync() records it.
TEST(CheckpointAsyncTest, HoldsTheValuesOfItsCall) {
  TempDir dir;
  Model model(Layout{"mirrored2", 2});
  model.train(3);
  const Tensor at_save = model.w->values()[0].clone();
  auto ckpt = model.checkpoint();
  CheckpointManager manager(*ckpt, dir.path(), 3);
  const CheckpointOptions async{.experimental_enable_async_checkpoint = true};
  EXPECT_EQ(manager.save(std::nullopt, true, async), dir / "ckpt-1");
  model.train(2, 3);  // while the thread writes
  const Tensor later = model.w->values()[0].clone();
  ASSERT_FALSE(same_bits(later, at_save));
  EXPECT_EQ(manager.save(std::nullopt, true, async), dir / "ckpt-2");  // waits for ckpt-1 first
  EXPECT_EQ(manager.latest_checkpoint(), dir / "ckpt-1");
  manager.sync();
  EXPECT_EQ(manager.latest_checkpoint(), dir / "ckpt-2");
  EXPECT_EQ(manager.checkpoints(), (std::vector<std::string>{dir / "ckpt-1", dir / "ckpt-2"}));
  for (const auto& [prefix, want] :
       std::vector<std::pair<std::string, Tensor>>{{dir / "ckpt-1", at_save}, {dir / "ckpt-2", later}}) {
    Model fresh(Layout{"mirrored1", 1});
    fresh.checkpoint()->restore(prefix).assert_consumed();
    EXPECT_TRUE(same_bits(fresh.w->values()[0], want)) << prefix;
  }
  // Checkpoint::save alike; its restore() completes the save in flight first.
  TempDir other;
  const std::string plain = ckpt->save(other / "plain", async);
  EXPECT_EQ(plain, other / "plain-3");
  model.train(1, 5);
  ASSERT_FALSE(same_bits(model.w->values()[0], later));
  ckpt->restore(plain).assert_consumed();
  EXPECT_TRUE(same_bits(model.w->values()[0], later));
  EXPECT_TRUE(same_bits(model.w->values()[1], later));
}

// A Checkpoint or manager destroyed with a save in flight waits for it.
TEST(CheckpointAsyncTest, DestroyedWithASaveInFlight) {
  TempDir dir;
  Model model(Layout{"mirrored2", 2});
  model.train(2);
  {
    auto ckpt = model.checkpoint();
    CheckpointManager manager(*ckpt, dir.path(), 1);
    manager.save(std::nullopt, true, {.experimental_enable_async_checkpoint = true});
  }
  EXPECT_EQ(train::latest_checkpoint(dir.path()), dir / "ckpt-1");
  EXPECT_TRUE(CheckpointReader(dir / "ckpt-1").verify().empty());
  {
    auto ckpt = model.checkpoint();
    ckpt->write(dir / "w", {.experimental_enable_async_checkpoint = true});
  }
  EXPECT_TRUE(CheckpointReader(dir / "w").verify().empty());
}

// The objects tracked may change while a save is in flight (a name given a
// new object, new names that grow the list): the save writes what its call
// saw, and its thread reads nothing of the tracked list (ThreadSanitizer and
// ASan runs see a race or a use after free otherwise).
TEST(CheckpointAsyncTest, TrackingWhileASaveIsInFlight) {
  std::vector<Variable> extra;
  extra.reserve(64);
  for (int i = 0; i < 64; ++i) extra.emplace_back(constant(static_cast<float>(i)));
  Model model(Layout{"mirrored2", 2});
  auto ckpt = model.checkpoint();
  TempDir dir;
  CheckpointManager manager(*ckpt, dir.path(), 3);
  manager.save(std::nullopt, true, {.experimental_enable_async_checkpoint = true});
  for (int i = 0; i < 64; ++i) ckpt->track("extra" + std::to_string(i), extra[static_cast<std::size_t>(i)]);
  ckpt->track("extra0", extra[63]);  // a name tracked already, now another object
  manager.sync();
  const CheckpointReader first(dir / "ckpt-1");
  EXPECT_FALSE(first.has_tensor("extra0/.ATTRIBUTES/VARIABLE_VALUE"));
  EXPECT_EQ(first.layout(), "MirroredStrategy, 1 worker x 2 replicas");
  manager.save();
  const CheckpointReader second(dir / "ckpt-2");
  EXPECT_EQ(second.get_tensor("extra0/.ATTRIBUTES/VARIABLE_VALUE").scalar<float>(), 63.f);
  EXPECT_EQ(second.get_tensor("extra5/.ATTRIBUTES/VARIABLE_VALUE").scalar<float>(), 5.f);
}

// ---- across workers (threads standing for them, as tests/runtime/multi_worker_test.cc) ----

// Runs body(worker, strategy) on `workers` threads, each with its own
// MultiWorkerMirroredStrategy of `local` replicas; returns each worker's error.
std::vector<std::exception_ptr> run_workers(int workers, int local,
                                            const std::function<void(int, MultiWorkerMirroredStrategy&)>& body) {
  auto group = std::make_shared<internal::LocalGroup>(workers);
  std::vector<std::shared_ptr<Communicator>> links;
  for (int w = 0; w < workers; ++w) links.push_back(std::make_shared<internal::SharedMemoryCommunicator>(group, w));
  return testing::run_threads(workers, [&](int w) {
    MultiWorkerMirroredStrategy s(local, links[static_cast<std::size_t>(w)], {.timeout = testing::kTestTimeout});
    body(w, s);
  });
}

// The model of a worker: w (float32) and b (SyncOnRead SUM) trained by Adam.
struct WorkerModel {
  std::optional<MirroredVariable> w;
  std::optional<SyncOnReadVariable> seen;
  Adam adam;
  explicit WorkerModel(Strategy& s) {
    auto scope = s.scope();
    w.emplace(noisy(300, 5), VariableOptions{.name = "w"});
    seen.emplace(constant(0.f), VariableOptions{.name = "seen", .aggregation = VariableAggregation::kSum});
  }
  void train(Strategy& s, int steps) {
    for (int step = 0; step < steps; ++step) {
      s.run([&](ReplicaContext& ctx) {
        adam.apply_gradients(
            {{noisy(300, 200 + static_cast<std::uint32_t>(step * 8 + ctx.replica_id_in_sync_group())), *w}});
        seen->assign_add(constant(1.f));
      });
    }
  }
  std::unique_ptr<Checkpoint> checkpoint() {
    return std::make_unique<Checkpoint>(std::initializer_list<std::pair<std::string, train::Trackable>>{
        {"w", *w}, {"seen", *seen}, {"optimizer", adam}});
  }
};

// Every worker saves; each tensor is written once, spread over the workers'
// shards; the checkpoint restores in one process (4 replicas, or the default
// strategy) bit for bit, and back into workers x replicas.
TEST(CheckpointWorkersTest, SavedAcrossWorkersRestoresAnywhere) {
  for (const auto& [workers, local] : std::vector<std::pair<int, int>>{{2, 1}, {2, 2}}) {
    SCOPED_TRACE(std::to_string(workers) + " workers x " + std::to_string(local));
    TempDir dir;
    std::vector<Tensor> w_of(static_cast<std::size_t>(workers)), m_of(static_cast<std::size_t>(workers));
    const auto errors = run_workers(workers, local, [&](int worker, MultiWorkerMirroredStrategy& s) {
      WorkerModel model(s);
      model.train(s, 2);
      auto ckpt = model.checkpoint();
      CheckpointManager manager(*ckpt, dir.path(), 2);
      EXPECT_EQ(manager.save(), dir / "ckpt-1");
      w_of[static_cast<std::size_t>(worker)] = model.w->values()[0].clone();
      m_of[static_cast<std::size_t>(worker)] = model.adam.get_slot(*model.w, "m").values()[0].clone();
    });
    for (const auto& e : errors) ASSERT_FALSE(e) << testing::message_of(e);
    EXPECT_TRUE(same_bits(w_of[0], w_of[1]));
    CheckpointReader reader(dir / "ckpt-1");
    EXPECT_TRUE(reader.verify().empty());
    std::set<std::string> files;
    for (const auto& e : reader.entries()) files.insert(e.file);
    EXPECT_EQ(files.size(), 2U);  // both workers wrote a share
    EXPECT_EQ(reader.layout(), "MultiWorkerMirroredStrategy, " + std::to_string(workers) + " workers x " +
                                   std::to_string(local) + (local == 1 ? " replica" : " replicas"));
    // seen: every replica added 1 per step.
    EXPECT_EQ(reader.get_tensor("seen/.ATTRIBUTES/VARIABLE_VALUE").scalar<float>(),
              static_cast<float>(2 * workers * local));

    auto single = mirrored(4);
    WorkerModel restored(*single);
    auto ckpt = restored.checkpoint();
    ckpt->restore(dir / "ckpt-1").assert_consumed();
    for (const Tensor& c : restored.w->values()) EXPECT_TRUE(same_bits(c, w_of[0]));
    EXPECT_TRUE(same_bits(restored.adam.get_slot(*restored.w, "m").values()[3], m_of[0]));
    EXPECT_EQ(restored.seen->read_value().scalar<float>(), static_cast<float>(2 * workers * local));
    EXPECT_EQ(restored.adam.iterations(), 2);
    // And back into the workers, from a checkpoint of the single process.
    const std::string back = ckpt->write(dir / "single");
    const auto again = run_workers(workers, local, [&](int, MultiWorkerMirroredStrategy& s) {
      WorkerModel model(s);
      model.checkpoint()->read(back).assert_consumed();
      for (const Tensor& c : model.w->values()) EXPECT_TRUE(same_bits(c, w_of[0]));
      EXPECT_EQ(model.seen->read_value().scalar<float>(), static_cast<float>(2 * workers * local));
    });
    for (const auto& e : again) ASSERT_FALSE(e) << testing::message_of(e);
  }
}

// A write that fails on one worker fails the save on every worker, naming
// it, and leaves the previous checkpoint the latest and whole. A shard that
// another worker wrote for the failed save is gone after the next save.
TEST(CheckpointWorkersTest, AFailureOnOneWorkerIsRaisedByAll) {
  for (const int failing : {1, 0}) {
    SCOPED_TRACE("worker " + std::to_string(failing) + " fails");
    TempDir dir;
    std::vector<std::string> messages(2);
    std::vector<std::vector<std::string>> after_failure(2);
    const auto errors = run_workers(2, 1, [&](int worker, MultiWorkerMirroredStrategy& s) {
      WorkerModel model(s);
      auto ckpt = model.checkpoint();
      CheckpointManager manager(*ckpt, dir.path(), 2);
      manager.save();
      if (worker == failing) io::inject_fault(1, io::Fault::kFail);  // its shard's first write
      try {
        manager.save();
        ADD_FAILURE() << "worker " << worker << ": the save did not fail";
      } catch (const UnavailableError& e) {
        messages[static_cast<std::size_t>(worker)] = e.what();
      }
      io::inject_fault(0, io::Fault::kNone);
      EXPECT_EQ(manager.latest_checkpoint(), dir / "ckpt-1");
      EXPECT_EQ(train::latest_checkpoint(dir.path()), dir / "ckpt-1");
      // The workers go on together.
      EXPECT_EQ(manager.save(), dir / "ckpt-2");
    });
    for (const auto& e : errors) ASSERT_FALSE(e) << testing::message_of(e);
    for (const std::string& m : messages) {
      EXPECT_NE(m.find("worker " + std::to_string(failing)), std::string::npos) << m;
      EXPECT_NE(m.find("injected fault"), std::string::npos) << m;
    }
    EXPECT_EQ(leftovers(dir.path()), std::vector<std::string>{});
    EXPECT_TRUE(CheckpointReader(dir / "ckpt-2").verify().empty());
  }
}

// A worker lost after worker 0 committed the manifest (killed while it
// awaited the outcome): the save fails on the workers, but the checkpoint
// on disk is whole, is the latest, and restores. Before, worker 0 took its
// shard back after the commit, and the latest checkpoint named a missing
// file (found by ctest train_resume_mpirun_np2).
TEST(CheckpointWorkersTest, AWorkerLostAfterTheCommitLeavesItWhole) {
  TempDir dir;
  std::vector<Tensor> w_of(2);
  std::vector<int> failed(2, 0);
  const auto errors = run_workers(2, 1, [&](int worker, MultiWorkerMirroredStrategy& s) {
    WorkerModel model(s);
    model.train(s, 1);
    auto ckpt = model.checkpoint();
    CheckpointManager manager(*ckpt, dir.path(), 2);
    const std::int64_t before = io::operations();
    manager.save();
    // Worker 1's last point of a save is its wait for the commit.
    const std::int64_t points = io::operations() - before;
    model.train(s, 1);
    w_of[static_cast<std::size_t>(worker)] = model.w->values()[0].clone();
    if (worker == 1) io::inject_fault(points - 1, io::Fault::kFail);
    try {
      manager.save();
    } catch (const UnavailableError& e) {
      failed[static_cast<std::size_t>(worker)] = 1;
      EXPECT_NE(std::string(e.what()).find("await the commit"), std::string::npos) << e.what();
    }
    io::inject_fault(0, io::Fault::kNone);
  });
  for (const auto& e : errors) ASSERT_FALSE(e) << testing::message_of(e);
  EXPECT_EQ(failed, (std::vector<int>{1, 1}));
  ASSERT_EQ(train::latest_checkpoint(dir.path()), dir / "ckpt-2");
  CheckpointReader reader(dir / "ckpt-2");
  EXPECT_EQ(reader.verify(), std::vector<std::string>{});
  std::set<std::string> files;
  for (const auto& e : reader.entries()) files.insert(e.file);
  EXPECT_EQ(files.size(), 2U);  // both shards, worker 0's among them
  auto single = mirrored(2);
  WorkerModel restored(*single);
  restored.checkpoint()->restore(dir / "ckpt-2").assert_consumed();
  for (const Tensor& c : restored.w->values()) EXPECT_TRUE(same_bits(c, w_of[0]));
  EXPECT_EQ(restored.adam.iterations(), 2);
  EXPECT_EQ(leftovers(dir.path()), std::vector<std::string>{});
}

// Asynchronous saves across workers: the shards are written in the
// background, the commit is made by the next save or sync() on every
// worker; a write that fails on one worker is raised by sync() on all.
TEST(CheckpointWorkersTest, AsynchronousSavesCommitAtTheNextSyncPoint) {
  TempDir dir;
  std::vector<Tensor> w_at(2);
  std::vector<std::string> messages(2);
  const auto errors = run_workers(2, 2, [&](int worker, MultiWorkerMirroredStrategy& s) {
    WorkerModel model(s);
    model.train(s, 1);
    auto ckpt = model.checkpoint();
    CheckpointManager manager(*ckpt, dir.path(), 3);
    const CheckpointOptions async{.experimental_enable_async_checkpoint = true};
    manager.save(std::nullopt, true, async);
    w_at[static_cast<std::size_t>(worker)] = model.w->values()[0].clone();
    model.train(s, 2);  // collectives while the shards are written
    manager.sync();
    EXPECT_EQ(manager.latest_checkpoint(), dir / "ckpt-1");
    if (worker == 1) io::inject_fault(1, io::Fault::kFail);  // its next shard's first write
    manager.save(std::nullopt, true, async);
    model.train(s, 1);
    try {
      manager.sync();
      ADD_FAILURE() << "worker " << worker << ": the save did not fail";
    } catch (const UnavailableError& e) {
      messages[static_cast<std::size_t>(worker)] = e.what();
    }
    io::inject_fault(0, io::Fault::kNone);
    EXPECT_EQ(manager.latest_checkpoint(), dir / "ckpt-1");
    EXPECT_EQ(manager.save(std::nullopt, true, async), dir / "ckpt-2");
    manager.sync();
  });
  for (const auto& e : errors) ASSERT_FALSE(e) << testing::message_of(e);
  EXPECT_TRUE(same_bits(w_at[0], w_at[1]));
  for (const std::string& m : messages) EXPECT_NE(m.find("injected fault"), std::string::npos) << m;
  EXPECT_NE(messages[0].find("worker 1"), std::string::npos) << messages[0];
  auto single = mirrored(1);
  WorkerModel restored(*single);
  restored.checkpoint()->restore(dir / "ckpt-1").assert_consumed();
  EXPECT_TRUE(same_bits(restored.w->values()[0], w_at[0]));
  EXPECT_TRUE(CheckpointReader(dir / "ckpt-2").verify().empty());
  EXPECT_EQ(leftovers(dir.path()), std::vector<std::string>{});
}

// ---- Datasets ---------------------------------------------------------------

// `batches` global batches of 4 rows a pass; row r of batch b in pass p
// holds p * 1000 + b * 4 + r, the pass counted by the DatasetFn itself (as
// a shuffle seeded per epoch would be).
DatasetFn counting_passes(int batches) {
  return [batches, pass = 0]() mutable {
    const int p = pass++;
    return BatchFn([batches, p, b = 0]() mutable -> std::optional<Nest<Tensor>> {
      if (b == batches) return std::nullopt;
      std::vector<float> rows;
      for (int r = 0; r < 4; ++r) rows.push_back(static_cast<float>(p * 1000 + b * 4 + r));
      ++b;
      return Nest<Tensor>(constant(rows, Shape{4}));
    });
  };
}

// Every local replica's rows of one step, in replica order.
std::vector<float> rows_of(const PerReplica<Nest<Tensor>>& batch) {
  std::vector<float> rows;
  for (const Nest<Tensor>& n : batch.values()) {
    const auto f = n.leaf().flat<float>();
    rows.insert(rows.end(), f.begin(), f.end());
  }
  return rows;
}

// A training loop over `d` as a user writes it: epochs from the completed
// count `epoch` holds, each a range-for over a pass. `at_step(steps so far)`
// runs after each step and after each epoch (saves go there).
std::vector<std::vector<float>> loop(DistributedDataset& d, Variable& epoch, int epochs,
                                     const std::function<void(std::size_t)>& at_step = {}) {
  std::vector<std::vector<float>> seen;
  for (auto e = epoch.read_value().scalar<std::int64_t>(); e < epochs; ++e) {
    for (const auto& batch : d) {
      seen.push_back(rows_of(batch));
      if (at_step) at_step(seen.size());
    }
    epoch.assign(constant(e + 1));
    if (at_step) at_step(seen.size());
  }
  return seen;
}

// Saved after any step, or between epochs, and restored under another
// layout into a dataset made alike: the loop goes on with exactly the
// batches that an uninterrupted loop gives next.
TEST(CheckpointDatasetTest, AResumedLoopGivesTheBatchesThatFollow) {
  TempDir dir;
  auto two = mirrored(2);
  DistributedDataset d = two->experimental_distribute_dataset(counting_passes(5), 4);
  Variable epoch(constant(std::int64_t{0}));
  Checkpoint ckpt({{"data", d}, {"epoch", epoch}});
  std::vector<std::size_t> steps_at;  // the steps taken before each save
  const auto all = loop(d, epoch, 3, [&](std::size_t steps) {
    ckpt.write(dir / ("at-" + std::to_string(steps_at.size())));
    steps_at.push_back(steps);
  });
  ASSERT_EQ(all.size(), 15U);
  ASSERT_EQ(steps_at.size(), 18U);  // after each of 5 steps and each of 3 epochs
  EXPECT_EQ(all[7][0], 1008.f);     // pass 1, batch 2
  for (std::size_t i = 0; i < steps_at.size(); ++i) {
    for (const int replicas : {1, 4}) {
      SCOPED_TRACE("save " + std::to_string(i) + " restored under " + std::to_string(replicas) + " replicas");
      auto s = mirrored(replicas);
      DistributedDataset again = s->experimental_distribute_dataset(counting_passes(5), 4);
      Variable resumed_epoch(constant(std::int64_t{0}));
      Checkpoint restored({{"data", again}, {"epoch", resumed_epoch}});
      restored.read(dir / ("at-" + std::to_string(i))).assert_consumed();
      const auto rest = loop(again, resumed_epoch, 3);
      const std::vector<std::vector<float>> expected(all.begin() + static_cast<std::ptrdiff_t>(steps_at[i]), all.end());
      EXPECT_EQ(rest, expected);
    }
  }
  // The position as saved: the last checkpoint ended pass 2 after 5 steps.
  const Tensor at = CheckpointReader(dir / ("at-" + std::to_string(steps_at.size() - 1)))
                        .get_tensor("data/.ATTRIBUTES/ITERATOR_STATE");
  EXPECT_EQ(at.dtype(), DType::kInt64);
  EXPECT_EQ(std::vector<std::int64_t>(at.flat<std::int64_t>().begin(), at.flat<std::int64_t>().end()),
            (std::vector<std::int64_t>{2, 5, 1}));
}

// A dataset read from, a one-shot source for a later pass, a source that
// gives fewer or more batches than it gave when saved: each a
// FailedPreconditionError naming the dataset; the first two change nothing.
TEST(CheckpointDatasetTest, APositionThatCannotBeTakenIsAClearError) {
  TempDir dir;
  auto s = mirrored(2);
  {
    DistributedDataset d = s->experimental_distribute_dataset(counting_passes(5), 4);
    for (int e = 0; e < 2; ++e) {
      for (const auto& b : d) (void)b;
    }
    auto it = d.begin();  // pass 2, its first step
    ++it;
    ++it;
    ASSERT_EQ((*it).values()[0].leaf().flat<float>()[0], 2008.f);  // pass 2, step 3
    Checkpoint({{"data", d}}).write(dir / "pass2");
  }
  {
    DistributedDataset d = s->experimental_distribute_dataset(counting_passes(5), 4);
    for (const auto& b : d) (void)b;  // pass 0, ended
    Checkpoint({{"data", d}}).write(dir / "ended");
  }
  auto message = [&](DistributedDataset& d, const std::string& prefix) {
    Checkpoint c({{"data", d}});
    try {
      c.read(prefix);
    } catch (const FailedPreconditionError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  {
    DistributedDataset used = s->experimental_distribute_dataset(counting_passes(5), 4);
    (void)used.get_next();
    const std::string m = message(used, dir / "pass2");
    EXPECT_NE(m.find("dataset 'data' cannot take its saved position: the dataset has been read from"),
              std::string::npos)
        << m;
    EXPECT_EQ(rows_of(*used.get_next())[0], 4.f);  // where it was
  }
  {
    DistributedDataset one_shot = s->experimental_distribute_dataset(counting_passes(5)(), 4);
    const std::string m = message(one_shot, dir / "pass2");
    EXPECT_NE(m.find("saved in pass 2 of a dataset iterated again"), std::string::npos) << m;
    EXPECT_EQ(rows_of(*one_shot.get_next())[0], 0.f);
  }
  {
    DistributedDataset shorter = s->experimental_distribute_dataset(counting_passes(2), 4);
    const std::string m = message(shorter, dir / "pass2");
    EXPECT_NE(m.find("dataset 'data': the checkpoint's position is step 3 of pass 2, but the source's pass ends "
                     "after 2 batches"),
              std::string::npos)
        << m;
  }
  {
    DistributedDataset longer = s->experimental_distribute_dataset(counting_passes(6), 4);
    const std::string m = message(longer, dir / "ended");
    EXPECT_NE(m.find("step 5 at the end of pass 0, but the source's pass goes on past that end"), std::string::npos)
        << m;
  }
  {
    // A fresh one-shot source takes a position in its pass: here its end,
    // after which it is exhausted as the saved one was.
    DistributedDataset one_shot = s->experimental_distribute_dataset(counting_passes(5)(), 4);
    Checkpoint({{"data", one_shot}}).read(dir / "ended").assert_consumed();
    EXPECT_FALSE(one_shot.get_next().has_value());
    EXPECT_THROW(one_shot.begin(), FailedPreconditionError);
  }
  {
    // One dataset under two names (as Python's dataset and its iterator)
    // moves once.
    DistributedDataset d = s->experimental_distribute_dataset(counting_passes(5), 4);
    (void)d.get_next();
    Checkpoint({{"data", d}, {"iterator", d}}).write(dir / "twice");
    DistributedDataset again = s->experimental_distribute_dataset(counting_passes(5), 4);
    Checkpoint({{"data", again}, {"iterator", again}}).read(dir / "twice").assert_consumed();
    EXPECT_EQ(rows_of(*again.get_next())[0], 4.f);
  }
}

// Under two workers every worker saves its dataset's position (one, as
// get_next keeps them in step); restored under two workers each goes on
// with its own rows, and under one process with the global batches.
TEST(CheckpointWorkersTest, DatasetsResumeAcrossWorkersAndLayouts) {
  TempDir dir;
  std::vector<std::vector<std::vector<float>>> tail_of(2), pipeline_tail_of(2);
  auto pipeline = [](const InputContext& c) {
    return BatchFn([id = c.input_pipeline_id(), b = 0]() mutable -> std::optional<Nest<Tensor>> {
      if (b == 4) return std::nullopt;
      return Nest<Tensor>(constant(std::vector<float>{static_cast<float>(id * 100 + b++)}, Shape{1}));
    });
  };
  const auto saved = run_workers(2, 1, [&](int worker, MultiWorkerMirroredStrategy& s) {
    WorkerModel model(s);
    DistributedDataset d = s.experimental_distribute_dataset(counting_passes(12), 4);
    DistributedDataset p = s.distribute_datasets_from_function(pipeline);
    Variable epoch(constant(std::int64_t{0}));
    Checkpoint ckpt({{"w", *model.w}, {"data", d}, {"pipeline", p}, {"epoch", epoch}});
    for (int i = 0; i < 7; ++i) (void)d.get_next();  // pass 0 read with get_next: step 7
    for (int i = 0; i < 2; ++i) (void)p.get_next();
    ckpt.write(dir / "mid");
    for (int i = 0; i < 3; ++i) tail_of[static_cast<std::size_t>(worker)].push_back(rows_of(*d.get_next()));
    for (int i = 0; i < 2; ++i) pipeline_tail_of[static_cast<std::size_t>(worker)].push_back(rows_of(*p.get_next()));
  });
  for (const auto& e : saved) ASSERT_FALSE(e) << testing::message_of(e);
  const auto again = run_workers(2, 1, [&](int worker, MultiWorkerMirroredStrategy& s) {
    WorkerModel model(s);
    DistributedDataset d = s.experimental_distribute_dataset(counting_passes(12), 4);
    DistributedDataset p = s.distribute_datasets_from_function(pipeline);
    Checkpoint ckpt({{"w", *model.w}, {"data", d}, {"pipeline", p}});
    ckpt.read(dir / "mid").expect_partial();
    std::vector<std::vector<float>> tail, pipeline_tail;
    for (int i = 0; i < 3; ++i) tail.push_back(rows_of(*d.get_next()));
    for (int i = 0; i < 2; ++i) pipeline_tail.push_back(rows_of(*p.get_next()));
    EXPECT_FALSE(p.get_next().has_value());
    EXPECT_EQ(tail, tail_of[static_cast<std::size_t>(worker)]);
    EXPECT_EQ(pipeline_tail, pipeline_tail_of[static_cast<std::size_t>(worker)]);
  });
  for (const auto& e : again) ASSERT_FALSE(e) << testing::message_of(e);
  EXPECT_EQ(tail_of[0][0], (std::vector<float>{28, 29}));  // pass 0, batch 7, worker 0's two rows
  EXPECT_EQ(pipeline_tail_of[1][0], (std::vector<float>{102}));
  auto single = mirrored(2);
  DistributedDataset d = single->experimental_distribute_dataset(counting_passes(12), 4);
  Checkpoint({{"data", d}}).read(dir / "mid").expect_partial();
  EXPECT_EQ(rows_of(*d.get_next()), (std::vector<float>{28, 29, 30, 31}));
}

// Workers whose tracked datasets stand at different steps (worker 1 read
// another dataset in the same collectives) are refused on every worker.
TEST(CheckpointWorkersTest, DatasetsAtDifferentPositionsAreRefused) {
  TempDir dir;
  std::vector<std::string> messages(2);
  const auto errors = run_workers(2, 1, [&](int worker, MultiWorkerMirroredStrategy& s) {
    WorkerModel model(s);
    DistributedDataset a = s.experimental_distribute_dataset(counting_passes(5), 4);
    DistributedDataset b = s.experimental_distribute_dataset(counting_passes(5), 4);
    (void)(worker == 0 ? a : b).get_next();
    Checkpoint ckpt({{"w", *model.w}, {"data", a}});
    try {
      ckpt.write(dir / "mixed");
    } catch (const InvalidArgumentError& e) {
      messages[static_cast<std::size_t>(worker)] = e.what();
    }
  });
  for (const auto& e : errors) ASSERT_FALSE(e) << testing::message_of(e);
  for (const std::string& m : messages) {
    EXPECT_NE(m.find("worker 1 saves other tensors than worker 0"), std::string::npos) << m;
    EXPECT_NE(m.find("datasets be at one position"), std::string::npos) << m;
  }
  EXPECT_FALSE(fs::exists(dir / "mixed.index.json"));
}

// ---- Preemption ---------------------------------------------------------------

// A SIGTERM during a step of one process: the step ends, the checkpoint is
// saved, the process exits with 42; run again, it goes on from that step
// and ends bit for bit where an uninterrupted run ends.
TEST(PreemptionTest, SigtermEndsTheStepSavesAndExitsWith42) {
  SKIP_FORK_WITH_THREADS();
  constexpr int kSteps = 12;
  Model plain({"mirrored2", 2});
  plain.train(kSteps);
  TempDir dir;
  // In a child: trains to kSteps from the handler's count, raising SIGTERM
  // inside step `signal_at`; exits 3 if it did not start at `expect_start`.
  auto child = [&](int signal_at, std::int64_t expect_start) {
    const pid_t pid = ::fork();
    if (pid != 0) return pid;
    Model m({"mirrored2", 2});
    auto ckpt = m.checkpoint();
    CheckpointManager manager(*ckpt, dir.path(), 1);
    // (A forked child of the test runner leaves by _exit: std::exit, the
    // default, would run the runner's static destructors, which wait for its
    // threads that the fork did not copy.)
    train::PreemptionCheckpointHandler handler(*m.strategy, manager, {.exit_fn = [] { ::_exit(42); }});
    if (handler.total_run_calls() != expect_start) ::_exit(3);
    for (auto step = handler.total_run_calls(); step < kSteps; ++step) {
      handler.run([&] {
        if (step == signal_at) ::raise(SIGTERM);  // before the step's collectives
        m.train(1, static_cast<int>(step));
      });
    }
    ckpt->write(dir / "final");
    ::_exit(0);
  };
  int status = wait_for(child(5, 0), 60);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 42);
  const auto latest = train::latest_checkpoint(dir.path());
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(CheckpointReader(*latest).get_tensor("checkpointed_runs/.ATTRIBUTES/VARIABLE_VALUE").scalar<std::int64_t>(),
            6);
  status = wait_for(child(-1, 6), 60);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  ASSERT_EQ(WEXITSTATUS(status), 0);
  CheckpointReader final(dir / "final");
  EXPECT_TRUE(same_bits(final.get_tensor("model/w/.ATTRIBUTES/VARIABLE_VALUE"), plain.w->values()[0]));
  EXPECT_TRUE(same_bits(final.get_tensor("model/b/.ATTRIBUTES/VARIABLE_VALUE"), plain.b->values()[0]));
  EXPECT_TRUE(same_bits(final.get_tensor("model/w/.OPTIMIZER_SLOT/optimizer/v/.ATTRIBUTES/VARIABLE_VALUE"),
                        plain.adam->get_slot(*plain.w, "v").values()[0]));
  EXPECT_EQ(final.get_tensor("optimizer/iter/.ATTRIBUTES/VARIABLE_VALUE").scalar<std::int64_t>(), kSteps);
}

// Every save of the manager's checkpoint holds the handler's count, a
// periodic one too: a run resumed from it (after a kill -9, say) counts on
// from there.
TEST(PreemptionTest, EverySaveHoldsTheRunCount) {
  TempDir dir;
  auto handled = [&](int steps) {
    Model m({"mirrored2", 2});
    auto ckpt = m.checkpoint();
    CheckpointManager manager(*ckpt, dir.path(), 1);
    train::PreemptionCheckpointHandler handler(*m.strategy, manager);
    const std::int64_t start = handler.total_run_calls();
    for (int step = 0; step < steps; ++step) handler.run([&] { m.train(1, static_cast<int>(start) + step); });
    manager.save();
    return start;
  };
  EXPECT_EQ(handled(3), 0);
  EXPECT_EQ(handled(2), 3);
  EXPECT_EQ(handled(0), 5);
}

// One step of a worker's model: Adam on gradients of the global step.
void worker_step(MultiWorkerMirroredStrategy& s, WorkerModel& model, std::int64_t step) {
  s.run([&](ReplicaContext& ctx) {
    model.adam.apply_gradients(
        {{noisy(300, 200 + static_cast<std::uint32_t>(step * 8 + ctx.replica_id_in_sync_group())), *model.w}});
    model.seen->assign_add(constant(1.f));
  });
}

// Worker 1 alone is asked to stop: both workers end the same step, save one
// checkpoint and exit; both resume from it and end where workers that were
// never stopped end, bit for bit.
TEST(PreemptionTest, OneWorkerAskedToStopStopsEveryWorkerAfterTheSameStep) {
  constexpr std::int64_t kSteps = 8;
  struct Exited {};
  TempDir dir;
  std::vector<Tensor> plain_w(2), resumed_w(2);
  std::vector<std::int64_t> stopped_after(2, -1), resumed_from(2, -1);
  auto train = [&](const std::string& where, int asked, std::vector<std::int64_t>* starts, std::vector<Tensor>& out) {
    return run_workers(2, 2, [&](int worker, MultiWorkerMirroredStrategy& s) {
      WorkerModel model(s);
      auto ckpt = model.checkpoint();
      CheckpointManager manager(*ckpt, where, 1);
      // (An exchange after every step: the request is seen after the step it came in.)
      train::PreemptionCheckpointHandler handler(s, manager,
                                                 {.exit_fn = [] { throw Exited{}; }, .max_steps_between_exchanges = 1});
      if (starts != nullptr) (*starts)[static_cast<std::size_t>(worker)] = handler.total_run_calls();
      try {
        for (auto step = handler.total_run_calls(); step < kSteps; ++step) {
          handler.run([&] {
            if (worker == 1 && step == asked) handler.request_stop();
            worker_step(s, model, step);
          });
        }
      } catch (const Exited&) {
        stopped_after[static_cast<std::size_t>(worker)] = handler.total_run_calls();
        return;
      }
      out[static_cast<std::size_t>(worker)] = model.w->values()[0].clone();
    });
  };
  {
    TempDir never_stopped;
    for (const auto& e : train(never_stopped.path(), -1, nullptr, plain_w)) ASSERT_FALSE(e) << testing::message_of(e);
  }
  std::vector<Tensor> unused(2);
  for (const auto& e : train(dir.path(), 3, nullptr, unused)) ASSERT_FALSE(e) << testing::message_of(e);
  EXPECT_EQ(stopped_after, (std::vector<std::int64_t>{4, 4}));  // steps 0 to 3, on both
  const auto latest = train::latest_checkpoint(dir.path());
  ASSERT_TRUE(latest.has_value());
  CheckpointReader reader(*latest);
  EXPECT_EQ(reader.get_tensor("checkpointed_runs/.ATTRIBUTES/VARIABLE_VALUE").scalar<std::int64_t>(), 4);
  EXPECT_EQ(reader.get_tensor("optimizer/iter/.ATTRIBUTES/VARIABLE_VALUE").scalar<std::int64_t>(), 4);
  for (const auto& e : train(dir.path(), -1, &resumed_from, resumed_w)) ASSERT_FALSE(e) << testing::message_of(e);
  EXPECT_EQ(resumed_from, (std::vector<std::int64_t>{4, 4}));
  for (int w = 0; w < 2; ++w) EXPECT_TRUE(same_bits(resumed_w[static_cast<std::size_t>(w)], plain_w[0])) << w;
}

// When nothing is asked the handler adds no exchange to a step that agrees
// among the workers anyway (a distributed dataset's get_next), and one to a
// step that makes no such agreement (apply_gradients alone, whose
// collectives check their signatures in their data), which then carries a
// request.
TEST(PreemptionTest, ExchangesOnlyWhereTheStepMakesNoAgreement) {
  TempDir dir;
  std::vector<std::uint64_t> plain(2), handled(2), bare(2);
  std::vector<int> stopped(2, 0);  // (not vector<bool>: its bits share a word across threads)
  const auto errors = run_workers(2, 1, [&](int worker, MultiWorkerMirroredStrategy& s) {
    const auto w = static_cast<std::size_t>(worker);
    WorkerModel model(s);
    DistributedDataset data = s.experimental_distribute_dataset(counting_passes(100), 4);
    auto agreements = [&] { return internal::worker_agreements(s); };
    auto fed_step = [&](std::int64_t step) {
      (void)data.get_next();
      worker_step(s, model, step);
    };
    fed_step(0);  // (the first also makes Adam's slots: agreements of its own)
    std::uint64_t before = agreements();
    fed_step(1);
    plain[w] = agreements() - before;
    auto ckpt = model.checkpoint();
    CheckpointManager manager(*ckpt, dir.path(), 1);
    struct Exited {};
    train::PreemptionCheckpointHandler handler(s, manager, {.exit_fn = [] { throw Exited{}; }});
    before = agreements();
    handler.run([&] { fed_step(2); });
    handled[w] = agreements() - before;
    before = agreements();
    handler.run([&] { worker_step(s, model, 3); });
    bare[w] = agreements() - before;
    try {
      handler.run([&] {
        if (worker == 0) handler.request_stop();
        worker_step(s, model, 4);
      });
    } catch (const Exited&) {
      stopped[w] = 1;
    }
  });
  for (const auto& e : errors) ASSERT_FALSE(e) << testing::message_of(e);
  EXPECT_GT(plain[0], 0U);
  EXPECT_EQ(handled, plain);
  EXPECT_EQ(bare, (std::vector<std::uint64_t>{1, 1}));
  EXPECT_EQ(stopped, (std::vector<int>{1, 1}));
}
// Steps that make no agreement: the handler's own exchanges come at the same
// steps on every worker, spaced as its TerminationConfig bounds them; a
// request waits for the next one, and every worker stops after that step.
TEST(PreemptionTest, ExchangesAreSpacedAndARequestWaitsForTheNext) {
  TempDir dir;
  std::vector<std::uint64_t> exchanges(2);
  std::vector<std::int64_t> stopped_after(2, -1);
  const auto errors = run_workers(2, 1, [&](int worker, MultiWorkerMirroredStrategy& s) {
    const auto w = static_cast<std::size_t>(worker);
    WorkerModel model(s);
    worker_step(s, model, 0);  // (makes Adam's slots: agreements of its own)
    auto ckpt = model.checkpoint();
    CheckpointManager manager(*ckpt, dir.path(), 1);
    struct Exited {};
    // A budget no exchange fits: the bound of 4 steps spaces them.
    train::PreemptionCheckpointHandler handler(s, manager,
                                               {.exit_fn = [] { throw Exited{}; },
                                                .exchange_budget = 1e-9,
                                                .max_stop_delay_seconds = 1e9,
                                                .max_steps_between_exchanges = 4});
    const std::uint64_t before = internal::worker_agreements(s);
    try {
      for (std::int64_t step = 1; step <= 20; ++step) {
        handler.run([&] {
          if (worker == 0 && step == 7) handler.request_stop();
          worker_step(s, model, step);
        });
        if (step == 6) exchanges[w] = internal::worker_agreements(s) - before;
      }
    } catch (const Exited&) {
      stopped_after[w] = handler.total_run_calls();
    }
  });
  for (const auto& e : errors) ASSERT_FALSE(e) << testing::message_of(e);
  // After steps 1 and 2 (the first exchange is measured by the second), then every 4th.
  EXPECT_EQ(exchanges, (std::vector<std::uint64_t>{3, 3}));
  EXPECT_EQ(stopped_after, (std::vector<std::int64_t>{10, 10}));  // asked in step 7, seen after step 10
}

// A handler given another strategy than the workers that save the
// checkpoint (the default one) would stop its worker alone: refused.
TEST(PreemptionTest, AStrategyOtherThanTheCheckpointsWorkersIsRefused) {
  TempDir dir;
  std::vector<std::string> messages(2);
  const auto errors = run_workers(2, 1, [&](int worker, MultiWorkerMirroredStrategy& s) {
    WorkerModel model(s);
    auto ckpt = model.checkpoint();
    CheckpointManager manager(*ckpt, dir.path(), 1);
    try {
      train::PreemptionCheckpointHandler handler(default_strategy(), manager);
    } catch (const InvalidArgumentError& e) {
      messages[static_cast<std::size_t>(worker)] = e.what();
    }
    EXPECT_TRUE(manager.save().has_value());  // nothing of the refused handler stays behind
  });
  for (const auto& e : errors) ASSERT_FALSE(e) << testing::message_of(e);
  for (const std::string& m : messages) EXPECT_NE(m.find("whose workers save together"), std::string::npos) << m;
}

TEST(PreemptionTest, AConfigThatCannotSpaceExchangesIsRefused) {
  TempDir dir;
  Model m({"mirrored2", 2});
  auto ckpt = m.checkpoint();
  CheckpointManager manager(*ckpt, dir.path(), 1);
  for (const train::TerminationConfig& bad :
       {train::TerminationConfig{.exchange_budget = 0}, train::TerminationConfig{.max_stop_delay_seconds = -1},
        train::TerminationConfig{.max_steps_between_exchanges = 0}}) {
    try {
      train::PreemptionCheckpointHandler handler(*m.strategy, manager, bad);
      ADD_FAILURE() << "accepted";
    } catch (const InvalidArgumentError& e) {
      EXPECT_NE(std::string(e.what()).find("TerminationConfig needs exchange_budget > 0"), std::string::npos)
          << e.what();
    }
  }
  // Nothing of a refused handler stays behind: a save after it works.
  EXPECT_TRUE(manager.save().has_value());
}
}  // namespace
}  // namespace distribute
