// Tests of tensor.h: Shape, construction (constant/iota/fill/scalar), element
// access, concat, sharing vs clone, equality, cast, and printing (TensorFlow's
// eager repr, which is numpy's repr of the value).
#include "distribute/tensor.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "testing/errors.h"

namespace distribute {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

template <class T>
std::vector<T> values_of(const Tensor& t) {
  auto f = t.flat<T>();
  return {f.begin(), f.end()};
}

// The message of the error `f` throws (InvalidArgumentError unless given).
template <class E = InvalidArgumentError, class F>
std::string error_message(F&& f) {
  return testing::error_message<E>(std::forward<F>(f));
}

// ---- Shape ---------------------------------------------------------------------

TEST(ShapeTest, ToStringUsesPythonTupleSpelling) {
  EXPECT_EQ(Shape{}.to_string(), "()");
  EXPECT_EQ(Shape{6}.to_string(), "(6,)");
  EXPECT_EQ((Shape{2, 3}).to_string(), "(2, 3)");
  EXPECT_EQ((Shape{0, 3, 1}).to_string(), "(0, 3, 1)");
  std::ostringstream os;
  os << Shape{4, 5};
  EXPECT_EQ(os.str(), "(4, 5)");
}

TEST(ShapeTest, NumElementsRankAndDims) {
  EXPECT_EQ(Shape{}.num_elements(), 1);
  EXPECT_EQ(Shape{}.rank(), 0);
  EXPECT_EQ((Shape{2, 3}).num_elements(), 6);
  EXPECT_EQ((Shape{2, 0, 3}).num_elements(), 0);
  Shape s{4, 7};
  EXPECT_EQ(s.rank(), 2);
  EXPECT_EQ(s[1], 7);
  EXPECT_EQ(s.dim(0), 4);
  EXPECT_EQ(s.dims(), (std::vector<std::int64_t>{4, 7}));
  EXPECT_EQ(s, Shape(std::vector<std::int64_t>{4, 7}));
  EXPECT_NE(s, (Shape{7, 4}));
}

TEST(ShapeTest, RejectsNegativeDimensionsAndBadDimIndex) {
  EXPECT_THROW(Shape({2, -1}), InvalidArgumentError);
  EXPECT_THROW(Shape(std::vector<std::int64_t>{-3}), InvalidArgumentError);
  Shape s{2, 3};
  EXPECT_THROW(s.dim(2), OutOfRangeError);
  EXPECT_THROW(s.dim(-1), OutOfRangeError);
  EXPECT_THROW(Shape{}.dim(0), OutOfRangeError);
}

TEST(ShapeTest, ElementAndByteCountsMustFitInInt64) {
  constexpr std::int64_t kHuge = std::int64_t{1} << 62;
  EXPECT_THROW(Shape({kHuge, 4}), InvalidArgumentError);
  EXPECT_THROW(Shape({kHuge, kHuge}), InvalidArgumentError);
  // Empty shapes too: the non-zero dimensions' product must fit, so that row
  // counts and strides of the shape do. (Found by the fuzzer under UBSan.)
  EXPECT_EQ(Shape({kHuge, 1, 0}).num_elements(), 0);
  EXPECT_THROW(Shape({kHuge, 0, kHuge}), InvalidArgumentError);
  EXPECT_THROW(Shape({kHuge, kHuge, 0}), InvalidArgumentError);
  // Sizes along the concatenation axis that add up past int64.
  const Tensor big(DType::kFloat32, Shape({kHuge, 0}));
  EXPECT_THROW(concat({big, big}, 0), InvalidArgumentError);
  EXPECT_EQ(Shape({kHuge, 1}).num_elements(), kHuge);
  // 2^61 float64s are 2^64 bytes: refused before anything is allocated.
  EXPECT_THROW(Tensor(DType::kFloat64, Shape({std::int64_t{1} << 61})), InvalidArgumentError);
}

// ---- Construction --------------------------------------------------------------

TEST(TensorConstantTest, CppTypesMapToTensorFlowDTypes) {
  Tensor i = constant({1, 2, 3});
  EXPECT_EQ(i.dtype(), DType::kInt32);
  EXPECT_EQ(i.shape(), Shape{3});
  EXPECT_EQ(values_of<std::int32_t>(i), (std::vector<std::int32_t>{1, 2, 3}));

  Tensor f = constant({1.5f, -2.f});
  EXPECT_EQ(f.dtype(), DType::kFloat32);
  EXPECT_EQ(values_of<float>(f), (std::vector<float>{1.5f, -2.f}));

  Tensor d = constant({0.25, 4.0});
  EXPECT_EQ(d.dtype(), DType::kFloat64);
  EXPECT_EQ(values_of<double>(d), (std::vector<double>{0.25, 4.0}));

  Tensor b = constant({true, false, true});
  EXPECT_EQ(b.dtype(), DType::kBool);
  EXPECT_EQ(values_of<bool>(b), (std::vector<bool>{true, false, true}));
  EXPECT_EQ(b.nbytes(), 3u);

  Tensor l = constant({std::int64_t{1} << 40, std::int64_t{-7}});
  EXPECT_EQ(l.dtype(), DType::kInt64);
  EXPECT_EQ(values_of<std::int64_t>(l), (std::vector<std::int64_t>{std::int64_t{1} << 40, -7}));

  EXPECT_EQ(constant(std::vector<std::int16_t>{1, 2}, Shape{2}).dtype(), DType::kInt16);
  EXPECT_EQ(constant(std::vector<std::uint8_t>{1, 2}, Shape{2}).dtype(), DType::kUInt8);
  EXPECT_EQ(constant(std::vector<float16>{float16(1.f)}, Shape{1}).dtype(), DType::kFloat16);
  EXPECT_EQ(constant(std::vector<bfloat16>{bfloat16(1.f)}, Shape{1}).dtype(), DType::kBFloat16);
}

TEST(TensorConstantTest, ScalarsHaveRankZero) {
  Tensor s = constant(7);
  EXPECT_EQ(s.dtype(), DType::kInt32);
  EXPECT_EQ(s.rank(), 0);
  EXPECT_EQ(s.shape(), Shape{});
  EXPECT_EQ(s.num_elements(), 1);
  EXPECT_EQ(s.scalar<std::int32_t>(), 7);
  EXPECT_EQ(constant(2.0).dtype(), DType::kFloat64);
  EXPECT_EQ(constant(2.0f).dtype(), DType::kFloat32);
  EXPECT_EQ(constant(true).dtype(), DType::kBool);
  EXPECT_EQ(constant(std::int64_t{5}).dtype(), DType::kInt64);
  EXPECT_EQ(constant(std::int64_t{5}).scalar<std::int64_t>(), 5);
}

TEST(TensorConstantTest, NestedInitializerListsAreRowMajor) {
  Tensor m = constant({{1, 2, 3}, {4, 5, 6}});
  EXPECT_EQ(m.shape(), (Shape{2, 3}));
  EXPECT_EQ(values_of<std::int32_t>(m), (std::vector<std::int32_t>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(m.at<std::int32_t>({1, 0}), 4);
  EXPECT_EQ(m.at<std::int32_t>({0, 2}), 3);

  Tensor c = constant({{{1.f, 2.f}, {3.f, 4.f}, {5.f, 6.f}}, {{7.f, 8.f}, {9.f, 10.f}, {11.f, 12.f}}});
  EXPECT_EQ(c.dtype(), DType::kFloat32);
  EXPECT_EQ(c.shape(), (Shape{2, 3, 2}));
  EXPECT_EQ(c.at<float>({1, 2, 0}), 11.f);
  EXPECT_EQ(c.at<float>({0, 1, 1}), 4.f);
}

TEST(TensorConstantTest, RaggedRowsThrow) {
  const std::string msg = error_message([] { constant({{1, 2, 3}, {4, 5}}); });
  EXPECT_NE(msg.find("different lengths"), std::string::npos) << msg;
  EXPECT_THROW(constant({{1.f}, {2.f, 3.f}}), InvalidArgumentError);
  EXPECT_THROW(constant({{{1, 2}, {3, 4}}, {{5, 6}}}), InvalidArgumentError);
  EXPECT_THROW(constant({{{1, 2}, {3, 4}}, {{5, 6}, {7}}}), InvalidArgumentError);
}

TEST(TensorConstantTest, VectorMustFillTheShape) {
  EXPECT_THROW(constant(std::vector<int>{1, 2, 3}, Shape{2, 2}), InvalidArgumentError);
  EXPECT_NO_THROW(constant(std::vector<int>{1}, Shape{}));
  Tensor t = constant(std::vector<int>{1, 2, 3, 4, 5, 6}, Shape{3, 2});
  EXPECT_EQ(t.at<std::int32_t>({2, 1}), 6);
}

TEST(TensorConstantTest, DefaultAndZeroFilledTensors) {
  Tensor e;
  EXPECT_EQ(e.dtype(), DType::kFloat32);
  EXPECT_EQ(e.shape(), Shape{0});
  EXPECT_EQ(e.num_elements(), 0);
  EXPECT_EQ(e.nbytes(), 0u);

  Tensor z(DType::kInt64, Shape{2, 3});
  EXPECT_EQ(z.dtype(), DType::kInt64);
  EXPECT_EQ(z.nbytes(), 48u);
  for (std::int64_t v : z.flat<std::int64_t>()) EXPECT_EQ(v, 0);
  EXPECT_EQ(z.device(), kHostDevice);

  Tensor on(DType::kFloat32, Shape{1}, "/job:localhost/replica:0/task:0/device:CPU:1");
  EXPECT_EQ(on.device(), "/job:localhost/replica:0/task:0/device:CPU:1");
  EXPECT_EQ(on.flat<float>()[0], 0.f);
}

TEST(TensorDeviceTest, DeviceScopeSetsTheDefaultDevice) {
  const std::string cpu1 = "/job:localhost/replica:0/task:0/device:CPU:1";
  const std::string cpu2 = "/job:localhost/replica:0/task:0/device:CPU:2";
  EXPECT_EQ(internal::default_device(), kHostDevice);
  {
    internal::DeviceScope scope(cpu1);
    EXPECT_EQ(internal::default_device(), cpu1);
    EXPECT_EQ(constant({1}).device(), cpu1);
    EXPECT_EQ(Tensor(DType::kInt8, Shape{2}).device(), cpu1);
    {
      internal::DeviceScope inner(cpu2);
      EXPECT_EQ(iota(DType::kFloat32, Shape{2}).device(), cpu2);
      EXPECT_EQ(constant({1}).with_device("").device(), cpu2);
      EXPECT_EQ(Tensor(DType::kInt8, Shape{1}, cpu1).device(), cpu1);  // an explicit device wins
    }
    EXPECT_EQ(fill(DType::kInt32, Shape{1}, 3).device(), cpu1);
  }
  EXPECT_EQ(constant({1}).device(), kHostDevice);
}

// ---- Element access --------------------------------------------------------------

TEST(TensorAccessTest, WrongDTypeThrows) {
  Tensor t = constant({1, 2, 3});
  const std::string msg = error_message([&] { t.at<float>({0}); });
  EXPECT_NE(msg.find("int32"), std::string::npos) << msg;
  EXPECT_NE(msg.find("float32"), std::string::npos) << msg;
  EXPECT_THROW(t.flat<std::int64_t>(), InvalidArgumentError);
  EXPECT_THROW(t.mutable_flat<std::uint8_t>(), InvalidArgumentError);
  EXPECT_THROW(constant(1).scalar<std::int64_t>(), InvalidArgumentError);
  EXPECT_THROW(constant(1.0).scalar<float>(), InvalidArgumentError);
  EXPECT_THROW(constant(true).scalar<std::uint8_t>(), InvalidArgumentError);
  EXPECT_EQ(t.flat<std::int32_t>().size(), 3u);
}

TEST(TensorAccessTest, AtIsBoundsChecked) {
  Tensor m = constant({{1, 2}, {3, 4}, {5, 6}});
  EXPECT_EQ(m.at<std::int32_t>({2, 1}), 6);
  EXPECT_THROW(m.at<std::int32_t>({3, 0}), OutOfRangeError);
  EXPECT_THROW(m.at<std::int32_t>({0, 2}), OutOfRangeError);
  EXPECT_THROW(m.at<std::int32_t>({-1, 0}), OutOfRangeError);
  EXPECT_THROW(m.at<std::int32_t>({1}), InvalidArgumentError);
  EXPECT_THROW(m.at<std::int32_t>({1, 1, 0}), InvalidArgumentError);
  EXPECT_EQ(constant(9).at<std::int32_t>({}), 9);
}

TEST(TensorAccessTest, ScalarNeedsExactlyOneElement) {
  EXPECT_EQ(constant(2.5f).scalar<float>(), 2.5f);
  EXPECT_EQ(constant({{42}}).scalar<std::int32_t>(), 42);  // one element of shape (1, 1)
  const std::string msg = error_message([] { constant({1, 2}).scalar<std::int32_t>(); });
  EXPECT_NE(msg.find("(2,)"), std::string::npos) << msg;
  EXPECT_THROW(constant(std::vector<int>{}, Shape{0}).scalar<std::int32_t>(), InvalidArgumentError);
}

TEST(TensorAccessTest, ElementAsDouble) {
  EXPECT_EQ(constant({true, false}).element_as_double(0), 1.0);
  EXPECT_EQ(constant({true, false}).element_as_double(1), 0.0);
  EXPECT_EQ(constant(std::vector<float16>{float16(0.5f), float16(-3.f)}, Shape{2}).element_as_double(1), -3.0);
  EXPECT_EQ(constant(std::vector<bfloat16>{bfloat16(0.25f)}, Shape{1}).element_as_double(0), 0.25);
  EXPECT_EQ(constant({std::int64_t{-5}}).element_as_double(0), -5.0);
  EXPECT_THROW(constant({1, 2}).element_as_double(2), OutOfRangeError);
  EXPECT_THROW(constant({1, 2}).element_as_double(-1), OutOfRangeError);
}

TEST(TensorAccessTest, ReshapeAndWithDeviceShareStorage) {
  Tensor t = iota(DType::kInt32, Shape{6});
  Tensor r = t.reshape(Shape{2, 3});
  EXPECT_EQ(r.shape(), (Shape{2, 3}));
  EXPECT_EQ(r.raw_data(), t.raw_data());
  EXPECT_EQ(r.at<std::int32_t>({1, 2}), 5);
  EXPECT_THROW(t.reshape(Shape{4}), InvalidArgumentError);
  EXPECT_THROW(t.reshape(Shape{}), InvalidArgumentError);
  Tensor d = t.with_device("/job:localhost/replica:0/task:0/device:CPU:3");
  EXPECT_EQ(d.device(), "/job:localhost/replica:0/task:0/device:CPU:3");
  EXPECT_EQ(d.raw_data(), t.raw_data());
  EXPECT_EQ(t.device(), kHostDevice);
  EXPECT_EQ(t.with_device("").device(), kHostDevice);
}

// ---- Sharing and clone -------------------------------------------------------

TEST(TensorStorageTest, CopiesShareStorageClonesDoNot) {
  Tensor a = constant({1, 2, 3});
  Tensor shared = a;
  Tensor deep = a.clone();
  EXPECT_EQ(shared.raw_data(), a.raw_data());
  EXPECT_NE(deep.raw_data(), a.raw_data());
  EXPECT_EQ(deep, a);
  EXPECT_EQ(deep.device(), a.device());

  a.mutable_flat<std::int32_t>()[1] = 20;
  EXPECT_EQ(shared.at<std::int32_t>({1}), 20);  // a write through one handle is seen by the other
  EXPECT_EQ(deep.at<std::int32_t>({1}), 2);     // but not by the clone
  EXPECT_NE(deep, a);

  deep.mutable_flat<std::int32_t>()[0] = -1;
  EXPECT_EQ(a.at<std::int32_t>({0}), 1);
  EXPECT_EQ(a.storage().use_count(), 2);
}

// A read-only tensor refuses writes with an error that names it; copies and
// views keep the flag, clone() does not; the handle it came from stays
// writable, and reading works as before.
TEST(TensorStorageTest, ReadOnlyTensorsRefuseWritesUntilCloned) {
  Tensor a = constant({1.f, 2.f, 3.f, 4.f});
  const Tensor frozen = a.as_read_only();
  EXPECT_FALSE(a.is_read_only());
  EXPECT_TRUE(frozen.is_read_only());
  EXPECT_EQ(frozen.raw_data(), a.raw_data());  // the same storage
  const std::string message =
      testing::error_message<FailedPreconditionError>([&] { static_cast<void>(frozen.mutable_raw_data()); });
  EXPECT_NE(message.find("Tensor float32 (4,) on " + std::string(kHostDevice) + " is read-only"), std::string::npos)
      << message;
  EXPECT_NE(message.find("clone()"), std::string::npos) << message;
  EXPECT_THROW(frozen.mutable_flat<float>(), FailedPreconditionError);
  EXPECT_THROW(frozen.mutable_flat<int>(), InvalidArgumentError);  // the dtype is checked first
  const Tensor copy = frozen;
  for (const Tensor& view : {copy, frozen.reshape(Shape{2, 2}), frozen.with_device("/device:CPU:1")}) {
    EXPECT_TRUE(view.is_read_only());
    EXPECT_THROW(view.mutable_raw_data(), FailedPreconditionError);
  }
  Tensor writable = frozen.clone();
  EXPECT_FALSE(writable.is_read_only());
  writable.mutable_flat<float>()[0] = 10.f;
  EXPECT_EQ(frozen.at<float>({0}), 1.f);
  a.mutable_flat<float>()[1] = 20.f;  // the writable handle still writes, and the read-only one sees it
  EXPECT_EQ(frozen.at<float>({1}), 20.f);
  EXPECT_EQ(frozen, a);
  // The rvalue form marks the tensor itself, without another reference.
  Tensor moved = Tensor(a).as_read_only();
  EXPECT_TRUE(moved.is_read_only());
  EXPECT_EQ(a.storage().use_count(), 4);  // a, frozen, copy and moved (the views are gone)
}

TEST(TensorStorageTest, CloneOfEmptyTensor) {
  Tensor e = constant(std::vector<float>{}, Shape{0, 4});
  Tensor c = e.clone();
  EXPECT_EQ(c.shape(), (Shape{0, 4}));
  EXPECT_EQ(c, e);
}

// ---- Equality ----------------------------------------------------------------

TEST(TensorEqualityTest, ComparesDTypeShapeAndBytes) {
  EXPECT_EQ(constant({1, 2}), constant({1, 2}));
  EXPECT_NE(constant({1, 2}), constant({1, 3}));
  EXPECT_NE(constant({1, 2}), constant({1.f, 2.f}));              // dtype
  EXPECT_NE(constant({1, 2, 3, 4}), constant({{1, 2}, {3, 4}}));  // shape, same bytes
  EXPECT_EQ(constant({1, 2, 3, 4}).reshape(Shape{2, 2}), constant({{1, 2}, {3, 4}}));
  EXPECT_EQ(constant({1.f}).with_device("/job:localhost/replica:0/task:0/device:CPU:1"), constant({1.f}));
  EXPECT_EQ(constant(std::vector<int>{}, Shape{0}), constant(std::vector<int>{}, Shape{0}));
  EXPECT_NE(constant(std::vector<int>{}, Shape{0}), constant(std::vector<int>{}, Shape{0, 1}));
}

TEST(TensorEqualityTest, IsBitwise) {
  EXPECT_EQ(constant({kNaN, 1.f}), constant({kNaN, 1.f}));  // NaN == NaN
  EXPECT_NE(constant({0.f}), constant({-0.f}));             // +0 != -0
  EXPECT_EQ(constant(std::numeric_limits<double>::quiet_NaN()), constant(std::numeric_limits<double>::quiet_NaN()));
  Tensor t = constant({kNaN});
  EXPECT_EQ(t, t);
}

// ---- concat --------------------------------------------------------------------

TEST(ConcatTest, Axis0WithRaggedSizes) {
  Tensor a = constant({{1, 2}, {3, 4}});
  Tensor b = constant({{5, 6}});
  Tensor c = constant({{7, 8}, {9, 10}, {11, 12}});
  Tensor r = concat({a, b, c}, 0);
  EXPECT_EQ(r.shape(), (Shape{6, 2}));
  EXPECT_EQ(values_of<std::int32_t>(r), (std::vector<std::int32_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}));
}

TEST(ConcatTest, Axis1WithRaggedSizes) {
  Tensor a = constant({{1}, {2}});
  Tensor b = constant({{10, 11, 12}, {20, 21, 22}});
  Tensor r = concat({a, b}, 1);
  EXPECT_EQ(r.shape(), (Shape{2, 4}));
  EXPECT_EQ(values_of<std::int32_t>(r), (std::vector<std::int32_t>{1, 10, 11, 12, 2, 20, 21, 22}));
  EXPECT_EQ(concat({b, a}, 1), constant({{10, 11, 12, 1}, {20, 21, 22, 2}}));
}

TEST(ConcatTest, NegativeAxisCountsFromTheEnd) {
  Tensor a = iota(DType::kFloat32, Shape{2, 2, 1});
  Tensor b = iota(DType::kFloat32, Shape{2, 2, 2}, 100);
  Tensor r = concat({a, b}, -1);
  EXPECT_EQ(r.shape(), (Shape{2, 2, 3}));
  EXPECT_EQ(r, concat({a, b}, 2));
  EXPECT_EQ(values_of<float>(r), (std::vector<float>{0, 100, 101, 1, 102, 103, 2, 104, 105, 3, 106, 107}));
  EXPECT_EQ(concat({a, a}, -3).shape(), (Shape{4, 2, 1}));
}

TEST(ConcatTest, SeedExample) {
  Tensor a = constant({1, 2, 3});
  Tensor c = concat({a, a}, 0);
  EXPECT_EQ(c.repr(), "<tf.Tensor: shape=(6,), dtype=int32, numpy=array([1, 2, 3, 1, 2, 3], dtype=int32)>");
  std::vector<Tensor> parts{a, a};
  EXPECT_EQ(concat(std::span<const Tensor>(parts), 0), c);
}

TEST(ConcatTest, EmptyPiecesAndSingleTensor) {
  Tensor a = constant({{1, 2}});
  Tensor none = constant(std::vector<int>{}, Shape{0, 2});
  EXPECT_EQ(concat({none, a, none}, 0), a);
  Tensor cols = constant(std::vector<int>{}, Shape{1, 0});
  EXPECT_EQ(concat({cols, a, cols}, 1), a);
  Tensor single = concat({a}, 0);
  EXPECT_EQ(single, a);
  EXPECT_NE(single.raw_data(), a.raw_data());
  EXPECT_EQ(concat({none, none}, 1).shape(), (Shape{0, 4}));
}

TEST(ConcatTest, Errors) {
  Tensor m = constant({{1, 2}, {3, 4}});
  std::string msg = error_message([&] { concat({m, constant({1, 2})}, 0); });
  EXPECT_NE(msg.find("Ranks"), std::string::npos) << msg;
  msg = error_message([&] { concat({m, constant({{1.f, 2.f}})}, 0); });
  EXPECT_NE(msg.find("dtype"), std::string::npos) << msg;
  EXPECT_NE(msg.find("float32"), std::string::npos) << msg;
  msg = error_message([&] { concat({m, constant({{1, 2, 3}})}, 0); });
  EXPECT_NE(msg.find("Dimension 1"), std::string::npos) << msg;
  msg = error_message([&] { concat({m, constant({{1}, {2}, {3}})}, 1); });
  EXPECT_NE(msg.find("Dimension 0"), std::string::npos) << msg;
  msg = error_message([&] { concat({m, m}, 2); });
  EXPECT_NE(msg.find("axis 2"), std::string::npos) << msg;
  EXPECT_THROW(concat({m, m}, -3), InvalidArgumentError);
  msg = error_message([] { concat({constant(1), constant(2)}, 0); });
  EXPECT_NE(msg.find("scalar"), std::string::npos) << msg;
  EXPECT_THROW(concat(std::span<const Tensor>(), 0), InvalidArgumentError);
}

class ConcatDTypeTest : public ::testing::TestWithParam<DType> {};

TEST_P(ConcatDTypeTest, Axis1MatchesExpectedLayout) {
  const DType d = GetParam();
  Tensor a = iota(d, Shape{3, 1}, 0, 1);   // 0 1 2
  Tensor b = iota(d, Shape{3, 2}, 10, 1);  // 10..15
  Tensor r = concat({a, b}, 1);
  ASSERT_EQ(r.dtype(), d);
  ASSERT_EQ(r.shape(), (Shape{3, 3}));
  const std::vector<double> want{0, 10, 11, 1, 12, 13, 2, 14, 15};
  for (std::int64_t i = 0; i < 9; ++i) {
    const double w = d == DType::kBool ? (want[static_cast<std::size_t>(i)] != 0) : want[static_cast<std::size_t>(i)];
    EXPECT_EQ(r.element_as_double(i), w) << "element " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, ConcatDTypeTest, ::testing::ValuesIn(kAllDTypes),
                         [](const ::testing::TestParamInfo<DType>& p) { return std::string(to_string(p.param)); });

// ---- cast, iota, fill ----------------------------------------------------------

TEST(CastTest, FloatsToIntegersTruncateTowardZero) {
  Tensor f = constant({-2.7f, -0.5f, 0.5f, 2.7f, 100.f});
  Tensor i = cast(f, DType::kInt32);
  EXPECT_EQ(i.dtype(), DType::kInt32);
  EXPECT_EQ(values_of<std::int32_t>(i), (std::vector<std::int32_t>{-2, 0, 0, 2, 100}));
  EXPECT_EQ(values_of<std::int64_t>(cast(constant({-1e12, 3.99}), DType::kInt64)),
            (std::vector<std::int64_t>{-1000000000000, 3}));
}

TEST(CastTest, BetweenKinds) {
  EXPECT_EQ(cast(constant({1, 0, -3}), DType::kBool), constant({true, false, true}));
  EXPECT_EQ(cast(constant({0.f, 0.1f}), DType::kBool), constant({false, true}));
  EXPECT_EQ(cast(constant({true, false}), DType::kInt32), constant({1, 0}));
  EXPECT_EQ(cast(constant({1, -2}), DType::kFloat64), constant({1.0, -2.0}));
  Tensor h = cast(constant({0.1f, 65504.f, 1e6f}), DType::kFloat16);
  ASSERT_EQ(h.dtype(), DType::kFloat16);
  EXPECT_EQ(h.flat<float16>()[0].bits, float16(0.1f).bits);
  EXPECT_EQ(h.flat<float16>()[1].bits, 0x7bff);
  EXPECT_EQ(h.flat<float16>()[2].bits, 0x7c00);
  Tensor back = cast(h, DType::kFloat32);
  EXPECT_EQ(back.flat<float>()[0], static_cast<float>(float16(0.1f)));
  EXPECT_EQ(cast(constant(std::vector<bfloat16>{bfloat16(3.f)}, Shape{1}), DType::kInt8),
            constant(std::vector<std::int8_t>{3}, Shape{1}));
}

TEST(CastTest, SameDTypeIsADeepCopy) {
  Tensor a = constant({1, 2});
  Tensor c = cast(a, DType::kInt32);
  EXPECT_EQ(c, a);
  EXPECT_NE(c.raw_data(), a.raw_data());
  Tensor on = a.with_device("/job:localhost/replica:0/task:0/device:CPU:2");
  EXPECT_EQ(cast(on, DType::kFloat32).device(), on.device());
}

// Integer-to-integer casts wrap modulo 2^bits, as tf.cast and numpy's astype do.
TEST(CastTest, IntegerNarrowingWraps) {
  EXPECT_EQ(cast(constant({300, -129, 127}), DType::kInt8), constant(std::vector<std::int8_t>{44, 127, 127}, Shape{3}));
  EXPECT_EQ(cast(constant({std::int64_t{4294967303}, std::int64_t{-1}}), DType::kInt32), constant({7, -1}));
  EXPECT_EQ(cast(constant({-1, 256, 257}), DType::kUInt8), constant(std::vector<std::uint8_t>{255, 0, 1}, Shape{3}));
}

// int64 values beyond 2^53 must not lose low bits on the way (they are not
// representable in double).
TEST(CastTest, LargeInt64NarrowingKeepsLowBits) {
  const std::int64_t big = (std::int64_t{1} << 53) + 1;
  EXPECT_EQ(cast(constant({big}), DType::kInt32), constant({1}));
  EXPECT_EQ(cast(constant({std::numeric_limits<std::int64_t>::max()}), DType::kInt16),
            constant(std::vector<std::int16_t>{-1}, Shape{1}));
}

TEST(IotaFillTest, IotaCountsFromStartByStep) {
  Tensor t = iota(DType::kInt32, Shape{2, 3});
  EXPECT_EQ(t, constant({{0, 1, 2}, {3, 4, 5}}));
  EXPECT_EQ(iota(DType::kFloat32, Shape{3}, 1.5, 0.5), constant({1.5f, 2.f, 2.5f}));
  EXPECT_EQ(iota(DType::kInt64, Shape{3}, 10, -4), constant({std::int64_t{10}, std::int64_t{6}, std::int64_t{2}}));
  EXPECT_EQ(iota(DType::kBool, Shape{3}), constant({false, true, true}));
  Tensor h = iota(DType::kFloat16, Shape{3}, 0, 0.5);
  EXPECT_EQ(h.element_as_double(2), 1.0);
  EXPECT_EQ(iota(DType::kInt32, Shape{0}).num_elements(), 0);
}

TEST(IotaFillTest, FillAndScalar) {
  Tensor f = fill(DType::kFloat64, Shape{2, 2}, 3.25);
  EXPECT_EQ(f, constant({{3.25, 3.25}, {3.25, 3.25}}));
  EXPECT_EQ(fill(DType::kBool, Shape{2}, 2.0), constant({true, true}));
  EXPECT_EQ(fill(DType::kUInt8, Shape{1}, 7), constant(std::vector<std::uint8_t>{7}, Shape{1}));
  Tensor s = scalar(DType::kInt16, -4);
  EXPECT_EQ(s.dtype(), DType::kInt16);
  EXPECT_EQ(s.rank(), 0);
  EXPECT_EQ(s.scalar<std::int16_t>(), -4);
  EXPECT_EQ(scalar(DType::kBFloat16, 0.5).scalar<bfloat16>().bits, bfloat16(0.5f).bits);
}

// ---- Printing ------------------------------------------------------------------

TEST(TensorReprTest, SeedExamples) {
  EXPECT_EQ(concat({constant({1, 2, 3}), constant({1, 2, 3})}, 0).repr(),
            "<tf.Tensor: shape=(6,), dtype=int32, numpy=array([1, 2, 3, 1, 2, 3], dtype=int32)>");
  EXPECT_EQ(constant(2.0f).repr(), "<tf.Tensor: shape=(), dtype=float32, numpy=2.0>");
  EXPECT_EQ(constant(0).repr(), "<tf.Tensor: shape=(), dtype=int32, numpy=0>");
  EXPECT_EQ(constant({{1, 2}, {3, 4}, {1, 2}, {3, 4}}).repr(),
            "<tf.Tensor: shape=(4, 2), dtype=int32, numpy=\n"
            "array([[1, 2],\n"
            "       [3, 4],\n"
            "       [1, 2],\n"
            "       [3, 4]], dtype=int32)>");
}

TEST(TensorReprTest, StreamAndFreeFunctionMatchRepr) {
  Tensor t = constant({1.f, 2.5f});
  std::ostringstream os;
  os << t;
  EXPECT_EQ(os.str(), t.repr());
  EXPECT_EQ(repr(t), t.repr());
  EXPECT_EQ(t.repr(), "<tf.Tensor: shape=(2,), dtype=float32, numpy=array([1. , 2.5], dtype=float32)>");
}

TEST(TensorReprTest, Scalars) {
  EXPECT_EQ(constant(true).repr(), "<tf.Tensor: shape=(), dtype=bool, numpy=True>");
  EXPECT_EQ(constant(false).numpy_repr(), "False");
  EXPECT_EQ(constant(-5).numpy_repr(), "-5");
  EXPECT_EQ(constant(std::numeric_limits<std::int64_t>::min()).numpy_repr(), "-9223372036854775808");
  EXPECT_EQ(scalar(DType::kFloat16, 0.1).repr(), "<tf.Tensor: shape=(), dtype=float16, numpy=0.1>");
  EXPECT_EQ(constant(0.1f).numpy_repr(), "0.1");
  EXPECT_EQ(constant(0.1).numpy_repr(), "0.1");
  EXPECT_EQ(constant(1.0 / 3).numpy_repr(), "0.3333333333333333");  // scalars print every digit
  EXPECT_EQ(constant(1e-5f).numpy_repr(), "1e-05");
  EXPECT_EQ(constant(1e16f).numpy_repr(), "1e+16");
  EXPECT_EQ(constant(1.5e16).numpy_repr(), "1.5e+16");
  EXPECT_EQ(constant(123456.0f).numpy_repr(), "123456.0");
  EXPECT_EQ(constant(-0.0f).numpy_repr(), "-0.0");
  EXPECT_EQ(constant(kNaN).numpy_repr(), "nan");
  EXPECT_EQ(constant(-kInf).numpy_repr(), "-inf");
  EXPECT_EQ(scalar(DType::kUInt8, 255).numpy_repr(), "255");
}

struct PrintCase {
  const char* name;
  std::function<Tensor()> make;
  const char* numpy;  // repr(value) as numpy prints it
};

std::string case_name(const ::testing::TestParamInfo<PrintCase>& info) { return info.param.name; }
void PrintTo(const PrintCase& c, std::ostream* os) { *os << c.name; }

// Expected strings are numpy's own output for the same values.
class NumpyReprTest : public ::testing::TestWithParam<PrintCase> {};

TEST_P(NumpyReprTest, MatchesNumpy) {
  const Tensor t = GetParam().make();
  EXPECT_EQ(t.numpy_repr(), GetParam().numpy);
  // The TensorFlow wrapper puts a multi-line value on its own line.
  const std::string numpy = GetParam().numpy;
  const std::string sep = numpy.find('\n') == std::string::npos ? "" : "\n";
  EXPECT_EQ(t.repr(), "<tf.Tensor: shape=" + t.shape().to_string() + ", dtype=" + std::string(to_string(t.dtype())) +
                          ", numpy=" + sep + numpy + ">");
}

INSTANTIATE_TEST_SUITE_P(
    Numpy, NumpyReprTest,
    ::testing::ValuesIn(std::vector<PrintCase>{
        // --- print_cases.txt
        {"Int32Vector",
         [] {
           return constant({1, 2, 3, 1, 2, 3});
         },
         "array([1, 2, 3, 1, 2, 3], dtype=int32)"},
        {"Int32Matrix4x2",
         [] {
           return constant({{1, 2}, {3, 4}, {1, 2}, {3, 4}});
         },
         "array([[1, 2],\n       [3, 4],\n       [1, 2],\n       [3, 4]], dtype=int32)"},
        {"Float32Padded",
         [] {
           return constant({1.f, 2.5f});
         },
         "array([1. , 2.5], dtype=float32)"},
        {"Float32Whole",
         [] {
           return constant({1.f, 2.f});
         },
         "array([1., 2.], dtype=float32)"},
        {"Int32NegativePadding",
         [] {
           return constant({-1, 2, -30});
         },
         "array([ -1,   2, -30], dtype=int32)"},
        {"Float32NegativePadding",
         [] {
           return constant({-1.5f, 2.f, -30.f});
         },
         "array([ -1.5,   2. , -30. ], dtype=float32)"},
        {"Int64OmitsDType",
         [] {
           return constant({std::int64_t{1}, std::int64_t{-2}});
         },
         "array([ 1, -2])"},
        {"Float64OmitsDType",
         [] {
           return constant({1.0, 2.5});
         },
         "array([1. , 2.5])"},
        {"BoolOmitsDType",
         [] {
           return constant({true, false});
         },
         "array([ True, False])"},
        {"BoolAllFalse",
         [] {
           return constant({false, false});
         },
         "array([False, False])"},
        {"EmptyInt32", [] { return constant(std::vector<int>{}, Shape{0}); }, "array([], dtype=int32)"},
        {"EmptyFloat64ShowsDType", [] { return constant(std::vector<double>{}, Shape{0}); },
         "array([], dtype=float64)"},
        {"EmptyMatrix",
         [] {
           return constant(std::vector<int>{}, Shape{0, 3});
         },
         "array([], shape=(0, 3), dtype=int32)"},
        {"Int32Wraps40", [] { return iota(DType::kInt32, Shape{40}); },
         "array([ 0,  1,  2,  3,  4,  5,  6,  7,  8,  9, 10, 11, 12, 13, 14, 15, 16,\n       17, 18, 19, 20, 21, 22, "
         "23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33,\n       34, 35, 36, 37, 38, 39], dtype=int32)"},
        {"Int64Wraps100", [] { return iota(DType::kInt64, Shape{100}); },
         "array([ 0,  1,  2,  3,  4,  5,  6,  7,  8,  9, 10, 11, 12, 13, 14, 15, 16,\n       17, 18, 19, 20, 21, 22, "
         "23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33,\n       34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, "
         "48, 49, 50,\n       51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67,\n       68, 69, 70, "
         "71, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 83, 84,\n       85, 86, 87, 88, 89, 90, 91, 92, 93, 94, 95, "
         "96, 97, 98, 99])"},
        {"Int64Fits23", [] { return iota(DType::kInt64, Shape{23}, 100); },
         "array([100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111, 112,\n       113, 114, 115, 116, 117, "
         "118, 119, 120, 121, 122])"},
        {"Int64Wraps24", [] { return iota(DType::kInt64, Shape{24}, 100); },
         "array([100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111, 112,\n       113, 114, 115, 116, 117, "
         "118, 119, 120, 121, 122, 123])"},
        {"Int64Exactly1000NotSummarised", [] { return iota(DType::kInt64, Shape{1000}); },
         "array([  0,   1,   2,   3,   4,   5,   6,   7,   8,   9,  10,  11,  12,\n        13,  14,  15,  16,  17,  "
         "18,  19,  20,  21,  22,  23,  24,  25,\n        26,  27,  28,  29,  30,  31,  32,  33,  34,  35,  36,  37,  "
         "38,\n        39,  40,  41,  42,  43,  44,  45,  46,  47,  48,  49,  50,  51,\n        52,  53,  54,  55,  "
         "56,  57,  58,  59,  60,  61,  62,  63,  64,\n        65,  66,  67,  68,  69,  70,  71,  72,  73,  74,  75,  "
         "76,  77,\n        78,  79,  80,  81,  82,  83,  84,  85,  86,  87,  88,  89,  90,\n        91,  92,  93,  "
         "94,  95,  96,  97,  98,  99, 100, 101, 102, 103,\n       104, 105, 106, 107, 108, 109, 110, 111, 112, 113, "
         "114, 115, 116,\n       117, 118, 119, 120, 121, 122, 123, 124, 125, 126, 127, 128, 129,\n       130, 131, "
         "132, 133, 134, 135, 136, 137, 138, 139, 140, 141, 142,\n       143, 144, 145, 146, 147, 148, 149, 150, 151, "
         "152, 153, 154, 155,\n       156, 157, 158, 159, 160, 161, 162, 163, 164, 165, 166, 167, 168,\n       169, "
         "170, 171, 172, 173, 174, 175, 176, 177, 178, 179, 180, 181,\n       182, 183, 184, 185, 186, 187, 188, 189, "
         "190, 191, 192, 193, 194,\n       195, 196, 197, 198, 199, 200, 201, 202, 203, 204, 205, 206, 207,\n       "
         "208, 209, 210, 211, 212, 213, 214, 215, 216, 217, 218, 219, 220,\n       221, 222, 223, 224, 225, 226, 227, "
         "228, 229, 230, 231, 232, 233,\n       234, 235, 236, 237, 238, 239, 240, 241, 242, 243, 244, 245, 246,\n     "
         "  247, 248, 249, 250, 251, 252, 253, 254, 255, 256, 257, 258, 259,\n       260, 261, 262, 263, 264, 265, "
         "266, 267, 268, 269, 270, 271, 272,\n       273, 274, 275, 276, 277, 278, 279, 280, 281, 282, 283, 284, "
         "285,\n       286, 287, 288, 289, 290, 291, 292, 293, 294, 295, 296, 297, 298,\n       299, 300, 301, 302, "
         "303, 304, 305, 306, 307, 308, 309, 310, 311,\n       312, 313, 314, 315, 316, 317, 318, 319, 320, 321, 322, "
         "323, 324,\n       325, 326, 327, 328, 329, 330, 331, 332, 333, 334, 335, 336, 337,\n       338, 339, 340, "
         "341, 342, 343, 344, 345, 346, 347, 348, 349, 350,\n       351, 352, 353, 354, 355, 356, 357, 358, 359, 360, "
         "361, 362, 363,\n       364, 365, 366, 367, 368, 369, 370, 371, 372, 373, 374, 375, 376,\n       377, 378, "
         "379, 380, 381, 382, 383, 384, 385, 386, 387, 388, 389,\n       390, 391, 392, 393, 394, 395, 396, 397, 398, "
         "399, 400, 401, 402,\n       403, 404, 405, 406, 407, 408, 409, 410, 411, 412, 413, 414, 415,\n       416, "
         "417, 418, 419, 420, 421, 422, 423, 424, 425, 426, 427, 428,\n       429, 430, 431, 432, 433, 434, 435, 436, "
         "437, 438, 439, 440, 441,\n       442, 443, 444, 445, 446, 447, 448, 449, 450, 451, 452, 453, 454,\n       "
         "455, 456, 457, 458, 459, 460, 461, 462, 463, 464, 465, 466, 467,\n       468, 469, 470, 471, 472, 473, 474, "
         "475, 476, 477, 478, 479, 480,\n       481, 482, 483, 484, 485, 486, 487, 488, 489, 490, 491, 492, 493,\n     "
         "  494, 495, 496, 497, 498, 499, 500, 501, 502, 503, 504, 505, 506,\n       507, 508, 509, 510, 511, 512, "
         "513, 514, 515, 516, 517, 518, 519,\n       520, 521, 522, 523, 524, 525, 526, 527, 528, 529, 530, 531, "
         "532,\n       533, 534, 535, 536, 537, 538, 539, 540, 541, 542, 543, 544, 545,\n       546, 547, 548, 549, "
         "550, 551, 552, 553, 554, 555, 556, 557, 558,\n       559, 560, 561, 562, 563, 564, 565, 566, 567, 568, 569, "
         "570, 571,\n       572, 573, 574, 575, 576, 577, 578, 579, 580, 581, 582, 583, 584,\n       585, 586, 587, "
         "588, 589, 590, 591, 592, 593, 594, 595, 596, 597,\n       598, 599, 600, 601, 602, 603, 604, 605, 606, 607, "
         "608, 609, 610,\n       611, 612, 613, 614, 615, 616, 617, 618, 619, 620, 621, 622, 623,\n       624, 625, "
         "626, 627, 628, 629, 630, 631, 632, 633, 634, 635, 636,\n       637, 638, 639, 640, 641, 642, 643, 644, 645, "
         "646, 647, 648, 649,\n       650, 651, 652, 653, 654, 655, 656, 657, 658, 659, 660, 661, 662,\n       663, "
         "664, 665, 666, 667, 668, 669, 670, 671, 672, 673, 674, 675,\n       676, 677, 678, 679, 680, 681, 682, 683, "
         "684, 685, 686, 687, 688,\n       689, 690, 691, 692, 693, 694, 695, 696, 697, 698, 699, 700, 701,\n       "
         "702, 703, 704, 705, 706, 707, 708, 709, 710, 711, 712, 713, 714,\n       715, 716, 717, 718, 719, 720, 721, "
         "722, 723, 724, 725, 726, 727,\n       728, 729, 730, 731, 732, 733, 734, 735, 736, 737, 738, 739, 740,\n     "
         "  741, 742, 743, 744, 745, 746, 747, 748, 749, 750, 751, 752, 753,\n       754, 755, 756, 757, 758, 759, "
         "760, 761, 762, 763, 764, 765, 766,\n       767, 768, 769, 770, 771, 772, 773, 774, 775, 776, 777, 778, "
         "779,\n       780, 781, 782, 783, 784, 785, 786, 787, 788, 789, 790, 791, 792,\n       793, 794, 795, 796, "
         "797, 798, 799, 800, 801, 802, 803, 804, 805,\n       806, 807, 808, 809, 810, 811, 812, 813, 814, 815, 816, "
         "817, 818,\n       819, 820, 821, 822, 823, 824, 825, 826, 827, 828, 829, 830, 831,\n       832, 833, 834, "
         "835, 836, 837, 838, 839, 840, 841, 842, 843, 844,\n       845, 846, 847, 848, 849, 850, 851, 852, 853, 854, "
         "855, 856, 857,\n       858, 859, 860, 861, 862, 863, 864, 865, 866, 867, 868, 869, 870,\n       871, 872, "
         "873, 874, 875, 876, 877, 878, 879, 880, 881, 882, 883,\n       884, 885, 886, 887, 888, 889, 890, 891, 892, "
         "893, 894, 895, 896,\n       897, 898, 899, 900, 901, 902, 903, 904, 905, 906, 907, 908, 909,\n       910, "
         "911, 912, 913, 914, 915, 916, 917, 918, 919, 920, 921, 922,\n       923, 924, 925, 926, 927, 928, 929, 930, "
         "931, 932, 933, 934, 935,\n       936, 937, 938, 939, 940, 941, 942, 943, 944, 945, 946, 947, 948,\n       "
         "949, 950, 951, 952, 953, 954, 955, 956, 957, 958, 959, 960, 961,\n       962, 963, 964, 965, 966, 967, 968, "
         "969, 970, 971, 972, 973, 974,\n       975, 976, 977, 978, 979, 980, 981, 982, 983, 984, 985, 986, 987,\n     "
         "  988, 989, 990, 991, 992, 993, 994, 995, 996, 997, 998, 999])"},
        {"Int64Summarised1001", [] { return iota(DType::kInt64, Shape{1001}); },
         "array([   0,    1,    2, ...,  998,  999, 1000])"},
        {"Int32Summarised2000", [] { return iota(DType::kInt32, Shape{2000}); },
         "array([   0,    1,    2, ..., 1997, 1998, 1999], dtype=int32)"},
        {"Float32Summarised", [] { return iota(DType::kFloat32, Shape{1001}, 0, 1.0 / 7); },
         "array([  0.        ,   0.14285715,   0.2857143 , ..., 142.57143   ,\n       142.71428   , 142.85715   ], "
         "dtype=float32)"},
        {"Int32Summarised2D",
         [] {
           return iota(DType::kInt32, Shape{40, 50});
         },
         "array([[   0,    1,    2, ...,   47,   48,   49],\n       [  50,   51,   52, ...,   97,   98,   99],\n       "
         "[ 100,  101,  102, ...,  147,  148,  149],\n       ...,\n       [1850, 1851, 1852, ..., 1897, 1898, 1899],\n "
         "      [1900, 1901, 1902, ..., 1947, 1948, 1949],\n       [1950, 1951, 1952, ..., 1997, 1998, 1999]], "
         "dtype=int32)"},
        {"Float32Summarised3D",
         [] {
           return iota(DType::kFloat32, Shape{2, 10, 100});
         },
         "array([[[0.000e+00, 1.000e+00, 2.000e+00, ..., 9.700e+01, 9.800e+01,\n         9.900e+01],\n        "
         "[1.000e+02, 1.010e+02, 1.020e+02, ..., 1.970e+02, 1.980e+02,\n         1.990e+02],\n        [2.000e+02, "
         "2.010e+02, 2.020e+02, ..., 2.970e+02, 2.980e+02,\n         2.990e+02],\n        ...,\n        [7.000e+02, "
         "7.010e+02, 7.020e+02, ..., 7.970e+02, 7.980e+02,\n         7.990e+02],\n        [8.000e+02, 8.010e+02, "
         "8.020e+02, ..., 8.970e+02, 8.980e+02,\n         8.990e+02],\n        [9.000e+02, 9.010e+02, 9.020e+02, ..., "
         "9.970e+02, 9.980e+02,\n         9.990e+02]],\n\n       [[1.000e+03, 1.001e+03, 1.002e+03, ..., 1.097e+03, "
         "1.098e+03,\n         1.099e+03],\n        [1.100e+03, 1.101e+03, 1.102e+03, ..., 1.197e+03, 1.198e+03,\n     "
         "    1.199e+03],\n        [1.200e+03, 1.201e+03, 1.202e+03, ..., 1.297e+03, 1.298e+03,\n         "
         "1.299e+03],\n        ...,\n        [1.700e+03, 1.701e+03, 1.702e+03, ..., 1.797e+03, 1.798e+03,\n         "
         "1.799e+03],\n        [1.800e+03, 1.801e+03, 1.802e+03, ..., 1.897e+03, 1.898e+03,\n         1.899e+03],\n    "
         "    [1.900e+03, 1.901e+03, 1.902e+03, ..., 1.997e+03, 1.998e+03,\n         1.999e+03]]], dtype=float32)"},
        {"Int32Rank3",
         [] {
           return iota(DType::kInt32, Shape{2, 3, 4});
         },
         "array([[[ 0,  1,  2,  3],\n        [ 4,  5,  6,  7],\n        [ 8,  9, 10, 11]],\n\n       [[12, 13, 14, "
         "15],\n        [16, 17, 18, 19],\n        [20, 21, 22, 23]]], dtype=int32)"},
        {"Float32Rank4",
         [] {
           return iota(DType::kFloat32, Shape{2, 2, 2, 2});
         },
         "array([[[[ 0.,  1.],\n         [ 2.,  3.]],\n\n        [[ 4.,  5.],\n         [ 6.,  7.]]],\n\n\n       [[[ "
         "8.,  9.],\n         [10., 11.]],\n\n        [[12., 13.],\n         [14., 15.]]]], dtype=float32)"},
        {"UInt8Rank3",
         [] {
           return iota(DType::kUInt8, Shape{3, 4, 5});
         },
         "array([[[ 0,  1,  2,  3,  4],\n        [ 5,  6,  7,  8,  9],\n        [10, 11, 12, 13, 14],\n        [15, "
         "16, 17, 18, 19]],\n\n       [[20, 21, 22, 23, 24],\n        [25, 26, 27, 28, 29],\n        [30, 31, 32, 33, "
         "34],\n        [35, 36, 37, 38, 39]],\n\n       [[40, 41, 42, 43, 44],\n        [45, 46, 47, 48, 49],\n       "
         " [50, 51, 52, 53, 54],\n        [55, 56, 57, 58, 59]]], dtype=uint8)"},
        {"Float32Scientific",
         [] {
           return constant({1.f, 1e10f});
         },
         "array([1.e+00, 1.e+10], dtype=float32)"},
        {"Float32ScientificPadsZeros",
         [] {
           return constant({1.5f, 1e10f});
         },
         "array([1.5e+00, 1.0e+10], dtype=float32)"},
        {"Float32ScientificSmall",
         [] {
           return constant({1.f, 1e-5f});
         },
         "array([1.e+00, 1.e-05], dtype=float32)"},
        {"Float32RatioBelow1000",
         [] {
           return constant({1.f, 1000.5f});
         },
         "array([1.0000e+00, 1.0005e+03], dtype=float32)"},
        {"Float32RatioAbove1000",
         [] {
           return constant({1.f, 1001.f});
         },
         "array([1.000e+00, 1.001e+03], dtype=float32)"},
        {"Float32AtLeast1e8", [] { return constant({1e8f}); }, "array([1.e+08], dtype=float32)"},
        {"Float64Below1e8", [] { return constant({99999999.0}); }, "array([99999999.])"},
        {"Float64Exactly1em4",
         [] {
           return constant({1e-4, 1.0});
         },
         "array([1.e-04, 1.e+00])"},
        {"Float16Tenth", [] { return constant(std::vector<float16>{float16(0.1f)}, Shape{1}); },
         "array([0.1], dtype=float16)"},
        {"Float16Extremes",
         [] {
           return constant(std::vector<float16>{float16(65504.f), float16(0.000061f)}, Shape{2});
         },
         "array([6.55e+04, 6.10e-05], dtype=float16)"},
        {"Float32NegativeZero",
         [] {
           return constant({-0.f, 1.f});
         },
         "array([-0.,  1.], dtype=float32)"},
        {"Float32NaN",
         [] {
           return constant({1.f, kNaN});
         },
         "array([ 1., nan], dtype=float32)"},
        {"Float32Infinities",
         [] {
           return constant({1.5f, kInf, -kInf});
         },
         "array([ 1.5,  inf, -inf], dtype=float32)"},
        {"Float32AllNaN",
         [] {
           return constant({kNaN, kNaN});
         },
         "array([nan, nan], dtype=float32)"},
        {"Float32ScientificWithNaN",
         [] {
           return constant({1e10f, kNaN});
         },
         "array([1.e+10,    nan], dtype=float32)"},
        {"Float32Zeros",
         [] {
           return constant({0.f, 0.f});
         },
         "array([0., 0.], dtype=float32)"},
        {"Float32ShortestDigits",
         [] {
           return constant({0.1f, 0.2f, 0.3f});
         },
         "array([0.1, 0.2, 0.3], dtype=float32)"},
        {"Float64ShortestDigits",
         [] {
           return constant({0.1, 0.2, 0.3});
         },
         "array([0.1, 0.2, 0.3])"},
        {"Float32Matrix",
         [] {
           return constant({{1.5f, 2.f}, {3.f, 4.f}});
         },
         "array([[1.5, 2. ],\n       [3. , 4. ]], dtype=float32)"},
        {"Float64Matrix",
         [] {
           return constant({{1.0, 2.0}, {3.0, 4.0}});
         },
         "array([[1., 2.],\n       [3., 4.]])"},
        {"BoolMatrix",
         [] {
           return constant({{true, false}, {true, true}});
         },
         "array([[ True, False],\n       [ True,  True]])"},
        {"Int8Extremes",
         [] {
           return constant(std::vector<std::int8_t>{-128, 127}, Shape{2});
         },
         "array([-128,  127], dtype=int8)"},
        {"Int64Extremes",
         [] {
           return constant({std::numeric_limits<std::int64_t>::min(), std::numeric_limits<std::int64_t>::max()});
         },
         "array([-9223372036854775808,  9223372036854775807])"},
        {"Float32Column5x1x1",
         [] {
           return iota(DType::kFloat32, Shape{5, 1, 1});
         },
         "array([[[0.]],\n\n       [[1.]],\n\n       [[2.]],\n\n       [[3.]],\n\n       [[4.]]], dtype=float32)"},
        {"Int32Summarised2x501",
         [] {
           return iota(DType::kInt32, Shape{2, 501});
         },
         "array([[   0,    1,    2, ...,  498,  499,  500],\n       [ 501,  502,  503, ...,  999, 1000, 1001]], "
         "dtype=int32)"},
    }),
    case_name);

// Cases where numpy's output is known exactly (numpy 1.24 and 2.x agree on all
// of them) and the implementation has deviated: kept separate so a failure
// names the numpy rule involved.
//   BoolAllTruePadsTrue: numpy pads True to " True" in every array, even all-True ones.
//   Float64ExponentsPaddedToCommonWidth: exponents share one width (e+000, e+100).
//   *AtMostEightFractionDigits: the default print precision is 8 (floatmode 'maxprec').
//   DTypeMovesToNewLine...: ", dtype=..." goes on its own line when the last line would pass 75 columns.
//   NestedRowsWrapNarrower: each nesting level narrows the line by one column (the closing ']').
//   *PadsWithTheValuesOwnDigits: in scientific notation, values with fewer digits are
//     padded with their own further digits (dragon4 min_digits), not with zeros.
//   *IntegerDigitsAreExact: positional array elements print every integer digit of
//     the value (min_digits=0), not the shortest round-trip digits.
class NumpyReprRulesTest : public ::testing::TestWithParam<PrintCase> {};

TEST_P(NumpyReprRulesTest, MatchesNumpy) { EXPECT_EQ(GetParam().make().numpy_repr(), GetParam().numpy); }

INSTANTIATE_TEST_SUITE_P(
    Numpy, NumpyReprRulesTest,
    ::testing::ValuesIn(std::vector<PrintCase>{
        {"BoolAllTruePadsTrue",
         [] {
           return constant({true, true});
         },
         "array([ True,  True])"},
        {"Float64ExponentsPaddedToCommonWidth",
         [] {
           return constant({1.0, 1e100});
         },
         "array([1.e+000, 1.e+100])"},
        {"Float64AtMostEightFractionDigits",
         [] {
           return constant({3.141592653589793, 2.0});
         },
         "array([3.14159265, 2.        ])"},
        {"Float32AtMostEightFractionDigits", [] { return constant({0.012345678f}); },
         "array([0.01234568], dtype=float32)"},
        {"ScientificAtMostEightFractionDigits",
         [] {
           return constant({1.23456789012, 1e10});
         },
         "array([1.23456789e+00, 1.00000000e+10])"},
        {"DTypeMovesToNewLineWhenLastLineIsFull", [] { return iota(DType::kFloat32, Shape{30}, 0.5, 1.0 / 3); },
         "array([ 0.5      ,  0.8333333,  1.1666666,  1.5      ,  1.8333334,\n        2.1666667,  2.5      ,  "
         "2.8333333,  3.1666667,  3.5      ,\n        3.8333333,  4.1666665,  4.5      ,  4.8333335,  5.1666665,\n     "
         "   5.5      ,  5.8333335,  6.1666665,  6.5      ,  6.8333335,\n        7.1666665,  7.5      ,  7.8333335,  "
         "8.166667 ,  8.5      ,\n        8.833333 ,  9.166667 ,  9.5      ,  9.833333 , 10.166667 ],\n      "
         "dtype=float32)"},
        {"NestedRowsWrapNarrower",
         [] {
           return iota(DType::kInt32, Shape{2, 50});
         },
         "array([[ 0,  1,  2,  3,  4,  5,  6,  7,  8,  9, 10, 11, 12, 13, 14, 15,\n        16, 17, 18, 19, 20, 21, 22, "
         "23, 24, 25, 26, 27, 28, 29, 30, 31,\n        32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, "
         "47,\n        48, 49],\n       [50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65,\n        66, "
         "67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81,\n        82, 83, 84, 85, 86, 87, 88, 89, 90, 91, "
         "92, 93, 94, 95, 96, 97,\n        98, 99]], dtype=int32)"},
        {"NestedRowsWrapNarrowerAndDTypeMoves",
         [] {
           return iota(DType::kInt8, Shape{2, 30});
         },
         "array([[ 0,  1,  2,  3,  4,  5,  6,  7,  8,  9, 10, 11, 12, 13, 14, 15,\n        16, 17, 18, 19, 20, 21, 22, "
         "23, 24, 25, 26, 27, 28, 29],\n       [30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45,\n      "
         "  46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59]],\n      dtype=int8)"},
        {"ScientificPadsWithTheValuesOwnDigits",
         [] {
           return constant({0.3f, 1.2345679e10f});
         },
         "array([3.0000001e-01, 1.2345679e+10], dtype=float32)"},
        {"Float16ScientificPadsWithTheValuesOwnDigits",
         [] {
           return constant(std::vector<float16>{float16(116.5f), float16(64.94f), float16(-0.0622f)}, Shape{3});
         },
         "array([ 1.165e+02,  6.494e+01, -6.219e-02], dtype=float16)"},
        {"Float16IntegerDigitsAreExact",
         [] {
           return constant(std::vector<float16>{float16(16736.f), float16(2050.f)}, Shape{2});
         },
         "array([16736.,  2050.], dtype=float16)"},
        {"Float32IntegerDigitsAreExact", [] { return constant({99999992.f}); }, "array([99999992.], dtype=float32)"},
    }),
    case_name);

TEST(TensorReprTest, LinesWrapAt75Columns) {
  for (std::int64_t n : {10, 40, 100, 500, 1000}) {
    const std::string s = iota(DType::kInt64, Shape{n}, 1000).numpy_repr();
    std::size_t start = 0;
    while (start < s.size()) {
      std::size_t end = s.find('\n', start);
      if (end == std::string::npos) end = s.size();
      EXPECT_LE(end - start, 75u) << "n=" << n << " line: " << s.substr(start, end - start);
      start = end + 1;
    }
  }
}

TEST(TensorReprTest, SummarisesMoreThan1000Elements) {
  EXPECT_EQ(iota(DType::kInt64, Shape{1000}).numpy_repr().find("..."), std::string::npos);
  const std::string s = iota(DType::kInt64, Shape{1001}).numpy_repr();
  EXPECT_EQ(s, "array([   0,    1,    2, ...,  998,  999, 1000])");
}

TEST(TensorToListStringTest, MatchesPythonToList) {
  EXPECT_EQ(constant({{0, 1}, {2, 3}}).to_list_string(), "[[0, 1], [2, 3]]");
  EXPECT_EQ(constant(2.0f).to_list_string(), "2.0");
  EXPECT_EQ(constant(true).to_list_string(), "True");
  EXPECT_EQ(constant({true, false}).to_list_string(), "[True, False]");
  EXPECT_EQ(constant(7).to_list_string(), "7");
  EXPECT_EQ(constant({std::numeric_limits<std::int64_t>::max()}).to_list_string(), "[9223372036854775807]");
  EXPECT_EQ(constant(std::vector<int>{}, Shape{0}).to_list_string(), "[]");
  EXPECT_EQ(constant(std::vector<int>{}, Shape{2, 0}).to_list_string(), "[[], []]");
  EXPECT_EQ(constant({1.5, -0.0, std::numeric_limits<double>::quiet_NaN(), 1e16, 1e-05}).to_list_string(),
            "[1.5, -0.0, nan, 1e+16, 1e-05]");
  EXPECT_EQ(constant({{1.f, 2.f}}).to_list_string(), "[[1.0, 2.0]]");
  EXPECT_EQ(iota(DType::kInt8, Shape{2, 2, 1}).to_list_string(), "[[[0], [1]], [[2], [3]]]");
}

// Python's tolist() would widen float32 and float16 to double and print
// [0.10000000149011612]; we print the shortest digits of the dtype's own
// value instead (documented in tensor.h), which is what a reader means.
TEST(TensorToListStringTest, NarrowFloatsPrintTheirOwnShortestDigits) {
  EXPECT_EQ(constant({0.1f}).to_list_string(), "[0.1]");
  EXPECT_EQ(constant(std::vector<float16>{float16(0.1f)}, Shape{1}).to_list_string(), "[0.1]");
  EXPECT_EQ(constant({0.5f, 2.f}).to_list_string(), "[0.5, 2.0]");
}

}  // namespace
}  // namespace distribute
