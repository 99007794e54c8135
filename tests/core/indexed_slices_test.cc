// Tests of indexed_slices.h: validation, to_dense (duplicates add up),
// equality and printing.
#include "distribute/indexed_slices.h"

#include <gtest/gtest.h>

#include <limits>
#include <sstream>
#include <string>

#include "testing/errors.h"

namespace distribute {
namespace {

std::string construction_error(Tensor values, Tensor indices, Shape dense_shape) {
  return testing::error_message<InvalidArgumentError>(
      [&] { IndexedSlices s(std::move(values), std::move(indices), std::move(dense_shape)); });
}

TEST(IndexedSlicesTest, Accessors) {
  IndexedSlices g(constant({{1.f, 2.f}}), constant({3}), Shape{10, 2});
  EXPECT_EQ(g.values(), constant({{1.f, 2.f}}));
  EXPECT_EQ(g.indices(), constant({3}));
  EXPECT_EQ(g.dense_shape(), (Shape{10, 2}));
  EXPECT_EQ(g.dtype(), DType::kFloat32);
}

TEST(IndexedSlicesTest, ValidationErrors) {
  const Tensor rows = constant({{1.f, 2.f}, {3.f, 4.f}});
  std::string msg = construction_error(rows, constant({0.f, 1.f}), Shape{4, 2});
  EXPECT_NE(msg.find("int32 or int64"), std::string::npos) << msg;
  EXPECT_NE(msg.find("float32"), std::string::npos) << msg;

  msg = construction_error(rows, constant({{0, 1}}), Shape{4, 2});
  EXPECT_NE(msg.find("rank 1"), std::string::npos) << msg;

  msg = construction_error(constant(1.f), constant(std::vector<int>{}, Shape{0}), Shape{4});
  EXPECT_NE(msg.find("rank >= 1"), std::string::npos) << msg;

  msg = construction_error(rows, constant({0, 1, 2}), Shape{4, 2});
  EXPECT_NE(msg.find("number of slices"), std::string::npos) << msg;
  EXPECT_NE(msg.find("(2, 2)"), std::string::npos) << msg;  // the message shows the shapes
  EXPECT_NE(msg.find("(3,)"), std::string::npos) << msg;

  msg = construction_error(rows, constant({0, 1}), Shape{4, 2, 1});
  EXPECT_NE(msg.find("different ranks"), std::string::npos) << msg;

  msg = construction_error(rows, constant({0, 1}), Shape{4, 3});
  EXPECT_NE(msg.find("dense_shape[1:]"), std::string::npos) << msg;

  msg = construction_error(rows, constant({0, 4}), Shape{4, 2});
  EXPECT_NE(msg.find("index 4 at position 1"), std::string::npos) << msg;

  msg = construction_error(rows, constant({std::int64_t{-1}, std::int64_t{0}}), Shape{4, 2});
  EXPECT_NE(msg.find("index -1 at position 0"), std::string::npos) << msg;

  EXPECT_FALSE(construction_error(constant({1.f}), constant({0}), Shape{0}).empty());
}

TEST(IndexedSlicesTest, AcceptsInt32AndInt64IndicesAndEmptySlices) {
  EXPECT_NO_THROW(IndexedSlices(constant({{1.f, 2.f}}), constant({3}), Shape{10, 2}));
  EXPECT_NO_THROW(IndexedSlices(constant({{1.f, 2.f}}), constant({std::int64_t{9}}), Shape{10, 2}));
  IndexedSlices none(constant(std::vector<float>{}, Shape{0, 2}), constant(std::vector<int>{}, Shape{0}), Shape{3, 2});
  Tensor d = none.to_dense();
  EXPECT_EQ(d, Tensor(DType::kFloat32, Shape{3, 2}));
}

TEST(IndexedSlicesTest, ToDenseSumsDuplicateRows) {
  IndexedSlices g(constant({{1.f, 2.f}, {10.f, 20.f}, {100.f, 200.f}}), constant({3, 0, 3}), Shape{5, 2});
  Tensor d = g.to_dense();
  EXPECT_EQ(d.shape(), (Shape{5, 2}));
  EXPECT_EQ(d, constant({{10.f, 20.f}, {0.f, 0.f}, {0.f, 0.f}, {101.f, 202.f}, {0.f, 0.f}}));
}

TEST(IndexedSlicesTest, ToDenseIntegerRowsOfHigherRank) {
  // values (3, 1, 2) into dense (2, 1, 2), int64 indices.
  Tensor values = constant({{{1, 2}}, {{3, 4}}, {{5, 6}}});
  IndexedSlices g(values, constant({std::int64_t{1}, std::int64_t{1}, std::int64_t{1}}), Shape{2, 1, 2});
  EXPECT_EQ(g.to_dense(), constant({{{0, 0}}, {{9, 12}}}));
}

// Duplicate integer rows wrap (two's complement), with no undefined
// behaviour (UBSan aborts on a signed overflow).
TEST(IndexedSlicesTest, ToDenseIntegerDuplicatesWrap) {
  constexpr std::int32_t kMax32 = std::numeric_limits<std::int32_t>::max();
  IndexedSlices g32(constant({kMax32, 1}), constant({0, 0}), Shape{1});
  EXPECT_EQ(g32.to_dense(), constant({std::numeric_limits<std::int32_t>::min()}));
  constexpr std::int64_t kMin64 = std::numeric_limits<std::int64_t>::min();
  IndexedSlices g64(constant({kMin64, std::int64_t{-1}}), constant({1, 1}), Shape{2});
  EXPECT_EQ(g64.to_dense(), constant({std::int64_t{0}, std::numeric_limits<std::int64_t>::max()}));
  IndexedSlices g8(cast(constant({100, 100}), DType::kInt8), constant({0, 0}), Shape{1});
  EXPECT_EQ(g8.to_dense(), cast(constant({-56}), DType::kInt8));
}

// The indices' storage stays writable through the tensor they were made
// from (and through indices().mutable_flat): an index changed after the
// constructor checked it raises instead of writing outside the dense tensor.
TEST(IndexedSlicesTest, ToDenseChecksIndicesChangedAfterMaking) {
  Tensor indices = constant({3, 1});
  IndexedSlices g(constant({{1.f, 2.f}, {3.f, 4.f}}), indices, Shape{10, 2});
  indices.mutable_flat<std::int32_t>()[1] = 1'000'000;
  const std::string msg = testing::error_message<InvalidArgumentError>([&] { g.to_dense(); });
  EXPECT_NE(msg.find("index 1000000 at position 1 is outside [0, 10)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("changed after the IndexedSlices was made"), std::string::npos) << msg;
  g.indices().mutable_flat<std::int32_t>()[1] = -1;
  EXPECT_THROW(g.to_dense(), InvalidArgumentError);
  g.indices().mutable_flat<std::int32_t>()[1] = 9;  // back in range
  EXPECT_EQ(g.to_dense().flat<float>()[18], 3.f);
}

TEST(IndexedSlicesTest, ToDenseOfVectors) {
  IndexedSlices g(constant({1.5, 2.5, -1.0}), constant({2, 0, 2}), Shape{4});
  EXPECT_EQ(g.to_dense(), constant({2.5, 0.0, 0.5, 0.0}));
}

TEST(IndexedSlicesTest, ToDenseKeepsDTypeAndDevice) {
  const std::string dev = "/job:localhost/replica:0/task:0/device:CPU:1";
  IndexedSlices g(cast(constant({{1, 2}, {3, 4}}), DType::kFloat16).with_device(dev), constant({1, 1}), Shape{2, 2});
  Tensor d = g.to_dense();
  EXPECT_EQ(d.dtype(), DType::kFloat16);
  EXPECT_EQ(d.device(), dev);
  EXPECT_EQ(cast(d, DType::kFloat32), constant({{0.f, 0.f}, {4.f, 6.f}}));
}

TEST(IndexedSlicesTest, Equality) {
  IndexedSlices a(constant({{1.f, 2.f}}), constant({3}), Shape{10, 2});
  IndexedSlices same(constant({{1.f, 2.f}}), constant({3}), Shape{10, 2});
  EXPECT_TRUE(a == same);
  EXPECT_FALSE(a == IndexedSlices(constant({{1.f, 2.5f}}), constant({3}), Shape{10, 2}));
  EXPECT_FALSE(a == IndexedSlices(constant({{1.f, 2.f}}), constant({4}), Shape{10, 2}));
  EXPECT_FALSE(a == IndexedSlices(constant({{1.f, 2.f}}), constant({std::int64_t{3}}), Shape{10, 2}));
  EXPECT_FALSE(a == IndexedSlices(constant({{1.f, 2.f}}), constant({3}), Shape{11, 2}));
}

// The same storage, read-only, the caller's own unchanged; the flag stays
// on copies, and writes through it are refused.
TEST(IndexedSlicesTest, AsReadOnlySharesTheStorage) {
  const IndexedSlices g(constant({{1.f, 2.f}, {3.f, 4.f}}), constant({3, 0}), Shape{10, 2});
  const IndexedSlices r = g.as_read_only();
  EXPECT_TRUE(r == g);
  EXPECT_EQ(r.values().raw_data(), g.values().raw_data());
  EXPECT_EQ(r.indices().raw_data(), g.indices().raw_data());
  EXPECT_EQ(r.dense_shape(), g.dense_shape());
  EXPECT_TRUE(r.values().is_read_only());
  EXPECT_TRUE(r.indices().is_read_only());
  EXPECT_FALSE(g.values().is_read_only());
  EXPECT_FALSE(g.indices().is_read_only());
  const IndexedSlices copy = r;
  EXPECT_THROW(copy.values().mutable_raw_data(), FailedPreconditionError);
  EXPECT_THROW(copy.indices().mutable_raw_data(), FailedPreconditionError);
}

TEST(IndexedSlicesTest, Repr) {
  IndexedSlices g(constant({{1.f, 2.f}}), constant({3}), Shape{10, 2});
  const std::string want =
      "IndexedSlices(indices=<tf.Tensor: shape=(1,), dtype=int32, numpy=array([3], dtype=int32)>, "
      "values=<tf.Tensor: shape=(1, 2), dtype=float32, numpy=array([[1., 2.]], dtype=float32)>, "
      "dense_shape=(10, 2))";
  EXPECT_EQ(g.repr(), want);
  EXPECT_EQ(repr(g), want);
  std::ostringstream os;
  os << g;
  EXPECT_EQ(os.str(), want);
}

}  // namespace
}  // namespace distribute
