// The training program's parts: the IDX reader, the MLP's gradients, and
// the equivalence of replica layouts (same seed, same global batch, same
// parameters after 50 steps).
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "blas.h"
#include "equivalence.h"
#include "fashion_mnist.h"
#include "mlp.h"
#include "testing/strategies.h"

namespace distribute::train {
namespace {

// Every GEMM on its caller's thread: OpenBLAS's own worker threads are not
// instrumented, and these tests also run under ThreadSanitizer.
const bool kOneBlasThread = [] {
  set_blas_threads(1);
  return true;
}();

using ::distribute::testing::expect_throw;
using ::distribute::testing::mirrored;
using testing::kEquivalenceTolerance;
using testing::max_abs_difference;
using testing::train_parameters;

// ---- equivalence ------------------------------------------------------------------

TEST(EquivalenceTest, ReplicaLayoutsReachTheSameParameters) {
  set_blas_threads(1);
  const std::vector<Tensor> one = train_parameters(default_strategy());
  for (int n : {2, 4}) {
    auto s = mirrored(n);
    const double diff = max_abs_difference(train_parameters(*s), one);
    EXPECT_LE(diff, kEquivalenceTolerance) << n << " replicas";
    std::printf("%d replicas: max |difference| from 1 replica after %d steps: %.3g\n", n, testing::kEquivalenceSteps,
                diff);
  }
}

// The tolerance is tight enough to catch the bugs the test exists for.
TEST(EquivalenceTest, TheToleranceCatchesAveragedDroppedOrDuplicatedGradients) {
  set_blas_threads(1);
  const std::vector<Tensor> one = train_parameters(default_strategy());
  // Gradients averaged over 2 replicas instead of summed: as if each were halved.
  TrainConfig halved = testing::equivalence_config();
  halved.learning_rate /= 2;
  EXPECT_GT(max_abs_difference(train_parameters(default_strategy(), halved), one), 100 * kEquivalenceTolerance);
  // A replica's rows dropped, or counted twice: a different batch each step.
  TrainConfig other_rows = testing::equivalence_config();
  other_rows.global_batch = testing::kEquivalenceBatch / 2;
  EXPECT_GT(max_abs_difference(train_parameters(default_strategy(), other_rows), one), 100 * kEquivalenceTolerance);
}

// ---- the MLP ------------------------------------------------------------------------

// Central differences agree with the analytic gradient.
TEST(MlpTest, GradientsMatchFiniteDifferences) {
  auto s = mirrored(1);
  std::optional<Mlp> mlp;
  {
    auto scope = s->scope();
    mlp.emplace(std::vector<int>{6, 5, 3}, 3);
  }
  const Tensor x = iota(DType::kFloat32, Shape{4, 6}, -1, 0.1);
  const Tensor y = constant({0, 2, 1, 2});
  auto loss_at = [&]() {
    return s
        ->run([&] {
          Mlp::Workspace ws;
          return mlp->evaluate(x, y, ws).loss_sum;
        })
        .values()[0];
  };
  std::vector<Tensor> grads = s->run([&] {
                                 Mlp::Workspace ws;
                                 mlp->forward_backward(x, y, 4.0, ws);
                                 std::vector<Tensor> out;
                                 for (const Tensor& g : ws.gradients) out.push_back(g.clone());
                                 return out;
                               }).values()[0];
  for (std::size_t k = 0; k < mlp->variables().size(); ++k) {
    Variable v = mlp->variables()[k];
    for (std::int64_t i = 0; i < v.shape().num_elements(); i += 3) {
      float& w = internal::Access::mutable_component(v, 0).mutable_flat<float>()[static_cast<std::size_t>(i)];
      const float saved = w;
      const float h = 1e-2f;
      w = saved + h;
      const double up = loss_at();
      w = saved - h;
      const double down = loss_at();
      w = saved;
      const double numeric = (up - down) / (2 * h) / 4.0;
      EXPECT_NEAR(grads[k].flat<float>()[static_cast<std::size_t>(i)], numeric, 2e-3) << v.name() << " element " << i;
    }
  }
}

TEST(MlpTest, EmptyBatchGivesZeroGradientsAndBadInputIsRefused) {
  auto s = mirrored(1);
  std::optional<Mlp> mlp;
  {
    auto scope = s->scope();
    mlp.emplace(std::vector<int>{4, 3}, 1);
  }
  s->run([&] {
    Mlp::Workspace ws;
    const auto t = mlp->forward_backward(Tensor(DType::kFloat32, Shape{0, 4}), Tensor(DType::kInt32, Shape{0}), 1, ws);
    EXPECT_EQ(t.loss_sum, 0);
    for (const Tensor& g : ws.gradients) EXPECT_EQ(g, Tensor(DType::kFloat32, g.shape()));
    EXPECT_THROW(mlp->evaluate(Tensor(DType::kFloat32, Shape{2, 5}), constant({0, 1}), ws), InvalidArgumentError);
    EXPECT_THROW(mlp->evaluate(Tensor(DType::kFloat32, Shape{2, 4}), constant({0, 7}), ws), InvalidArgumentError);
  });
}

// ---- OpenBLAS's kernels ---------------------------------------------------------------

TEST(BlasFitTest, CoreNamesHaveTheirKernelsLevelInAnyCase) {
  EXPECT_EQ(blas_core_level("Prescott"), SimdLevel::kSse);
  EXPECT_EQ(blas_core_level("sandybridge"), SimdLevel::kAvx);
  EXPECT_EQ(blas_core_level("HASWELL"), SimdLevel::kAvx2);
  EXPECT_EQ(blas_core_level("Zen"), SimdLevel::kAvx2);
  EXPECT_EQ(blas_core_level("SkylakeX"), SimdLevel::kAvx512);
  EXPECT_EQ(blas_core_level("Cooperlake"), SimdLevel::kAvx512);
  EXPECT_EQ(blas_core_level("NEOVERSEN1"), SimdLevel::kUnknown);
  EXPECT_EQ(blas_core_level(""), SimdLevel::kUnknown);
}

// A known core below the CPU's level gets the generic core of that level;
// one that fits, is above, or is unknown is left alone.
TEST(BlasFitTest, ABetterCoreOnlyWhereOpenBlasPickedOneBelowTheCpu) {
  EXPECT_EQ(better_blas_core("Prescott", SimdLevel::kAvx512), "SkylakeX");  // the device machine's Xeon
  EXPECT_EQ(better_blas_core("Haswell", SimdLevel::kAvx512), "SkylakeX");   // an AVX-512 AMD EPYC
  EXPECT_EQ(better_blas_core("Nehalem", SimdLevel::kAvx2), "Haswell");
  EXPECT_EQ(better_blas_core("Prescott", SimdLevel::kAvx), "SandyBridge");
  EXPECT_EQ(better_blas_core("Haswell", SimdLevel::kAvx2), std::nullopt);
  EXPECT_EQ(better_blas_core("Zen", SimdLevel::kAvx2), std::nullopt);
  EXPECT_EQ(better_blas_core("SapphireRapids", SimdLevel::kAvx512), std::nullopt);
  EXPECT_EQ(better_blas_core("SkylakeX", SimdLevel::kAvx2), std::nullopt);
  EXPECT_EQ(better_blas_core("Prescott", SimdLevel::kSse), std::nullopt);
  EXPECT_EQ(better_blas_core("ARMV8", SimdLevel::kAvx512), std::nullopt);
  EXPECT_EQ(better_blas_core("Prescott", SimdLevel::kUnknown), std::nullopt);
}

TEST(BlasFitTest, TheCpuLevelIsKnownAndNamed) {
  const SimdLevel cpu = cpu_simd_level();
  EXPECT_NE(cpu, SimdLevel::kUnknown);
  EXPECT_NE(to_string(cpu), "unknown");
  EXPECT_NE(blas_description().find(" kernels, "), std::string::npos) << blas_description();
}

// ---- the IDX reader -------------------------------------------------------------------

// Each test writes into a folder of its own: ctest runs tests in parallel, and two tests
// sharing a file name once read each other's half-written labels.
class ScratchDir {
 public:
  ScratchDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = std::filesystem::path(::testing::TempDir()) / (std::string("distribute_") + info->test_suite_name() + "." +
                                                          info->name() + "." + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  ~ScratchDir() {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

 private:
  std::filesystem::path dir_;
};

void write_gz(const std::string& path, const std::vector<unsigned char>& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
  gzclose(f);
}

std::vector<unsigned char> idx(std::vector<std::uint32_t> dims, unsigned char fill) {
  std::vector<unsigned char> out = {0, 0, 0x08, static_cast<unsigned char>(dims.size())};
  std::size_t total = 1;
  for (std::uint32_t d : dims) {
    for (int shift : {24, 16, 8, 0}) out.push_back(static_cast<unsigned char>(d >> shift));
    total *= d;
  }
  out.insert(out.end(), total, fill);
  return out;
}

TEST(FashionMnistTest, ReadsGzippedIdxAndGathersScaledRows) {
  const ScratchDir scratch;
  const auto temp_path = [&](const std::string& name) { return scratch.path(name); };
  write_gz(temp_path("img.gz"), idx({3, 28, 28}, 255));
  write_gz(temp_path("lab.gz"), idx({3}, 7));
  const Examples e = load_idx_pair(temp_path("img.gz"), temp_path("lab.gz"));
  EXPECT_EQ(e.size(), 3);
  const auto [x, y] = gather_rows(e, constant(std::vector<std::int64_t>{2, 0}, Shape{2}));
  EXPECT_EQ(x.shape(), Shape({2, 784}));
  EXPECT_EQ(x.flat<float>()[0], 1.f);
  EXPECT_EQ(y, constant({7, 7}));
}

TEST(FashionMnistTest, MissingOrCorruptFilesAreClearErrors) {
  const ScratchDir scratch;
  const auto temp_path = [&](const std::string& name) { return scratch.path(name); };
  std::string msg = expect_throw<NotFoundError>([] { load_fashion_mnist("/nonexistent-dir"); });
  EXPECT_NE(msg.find("/nonexistent-dir/train-images-idx3-ubyte.gz does not exist"), std::string::npos) << msg;
  EXPECT_NE(msg.find("dataset-fashion-mnist"), std::string::npos) << msg;
  write_gz(temp_path("lab.gz"), idx({3}, 1));
  auto bad_magic = idx({3, 28, 28}, 1);
  bad_magic[2] = 0x09;  // not unsigned bytes
  write_gz(temp_path("bad_magic.gz"), bad_magic);
  msg = expect_throw<InvalidArgumentError>([&] { load_idx_pair(temp_path("bad_magic.gz"), temp_path("lab.gz")); });
  EXPECT_NE(msg.find("magic number"), std::string::npos) << msg;
  auto truncated = idx({3, 28, 28}, 1);
  truncated.resize(truncated.size() - 5);
  write_gz(temp_path("short.gz"), truncated);
  msg = expect_throw<InvalidArgumentError>([&] { load_idx_pair(temp_path("short.gz"), temp_path("lab.gz")); });
  EXPECT_NE(msg.find("promises 2352 bytes of data, the file has 2347"), std::string::npos) << msg;
  write_gz(temp_path("img2.gz"), idx({2, 28, 28}, 1));
  msg = expect_throw<InvalidArgumentError>([&] { load_idx_pair(temp_path("img2.gz"), temp_path("lab.gz")); });
  EXPECT_NE(msg.find("hold 2 images but 3 labels"), std::string::npos) << msg;
  write_gz(temp_path("lab_big.gz"), idx({3}, 12));
  write_gz(temp_path("img3.gz"), idx({3, 28, 28}, 1));
  msg = expect_throw<InvalidArgumentError>([&] { load_idx_pair(temp_path("img3.gz"), temp_path("lab_big.gz")); });
  EXPECT_NE(msg.find("has label 12"), std::string::npos) << msg;
  // Not gzip and not IDX: a plain file of garbage.
  std::ofstream(temp_path("garbage")) << "hello";
  msg = expect_throw<InvalidArgumentError>([&] { load_idx_pair(temp_path("garbage"), temp_path("lab.gz")); });
  EXPECT_NE(msg.find("less than its header"), std::string::npos) << msg;
}

}  // namespace
}  // namespace distribute::train
