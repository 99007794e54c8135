#include <gtest/gtest.h>

#include <thread>

#include "testing/strategies.h"

namespace distribute {
namespace {

TEST(CommunicationOptionsTest, Defaults) {
  CommunicationOptions o;
  EXPECT_EQ(o.bytes_per_pack, 0);
  EXPECT_FALSE(o.timeout.has_value());
  EXPECT_EQ(o.implementation, CommunicationImplementation::kAuto);
  EXPECT_NO_THROW(o.validate());
}

TEST(CommunicationOptionsTest, ValidateRejectsNegativeValues) {
  auto msg = testing::expect_throw<InvalidArgumentError>([] { CommunicationOptions{.bytes_per_pack = -1}.validate(); });
  EXPECT_EQ(msg, "Argument `bytes_per_pack` must be >=0, Received -1.");
  EXPECT_THROW(CommunicationOptions{.timeout = std::chrono::seconds(-1)}.validate(), InvalidArgumentError);
  EXPECT_THROW(MirroredStrategy({"CPU:0"}, {.bytes_per_pack = -2}), InvalidArgumentError);
}

TEST(CommunicationOptionsTest, MergeOverridesOnlyNonDefaultFields) {
  CommunicationOptions base{
      .bytes_per_pack = 100, .timeout = std::chrono::seconds(5), .implementation = CommunicationImplementation::kRing};
  CommunicationOptions same = base.merge({});
  EXPECT_EQ(same.bytes_per_pack, 100);
  EXPECT_DOUBLE_EQ(same.timeout->count(), 5);
  EXPECT_EQ(same.implementation, CommunicationImplementation::kRing);
  CommunicationOptions over = base.merge({.bytes_per_pack = 7,
                                          .timeout = std::chrono::milliseconds(250),
                                          .implementation = CommunicationImplementation::kNccl});
  EXPECT_EQ(over.bytes_per_pack, 7);
  EXPECT_DOUBLE_EQ(over.timeout->count(), 0.25);
  EXPECT_EQ(over.implementation, CommunicationImplementation::kNccl);
}

TEST(CommunicationOptionsTest, StringsAreCaseInsensitive) {
  EXPECT_EQ(communication_implementation_from_string("nccl"), CommunicationImplementation::kNccl);
  EXPECT_EQ(communication_implementation_from_string("Ring"), CommunicationImplementation::kRing);
  EXPECT_EQ(communication_implementation_from_string("AUTO"), CommunicationImplementation::kAuto);
  EXPECT_THROW(communication_implementation_from_string("mpi"), InvalidArgumentError);
  EXPECT_EQ(to_string(CommunicationImplementation::kNccl), "NCCL");
}

TEST(ReduceOpTest, NamesAndParsing) {
  for (ReduceOp op : kAllReduceOps) EXPECT_EQ(reduce_op_from_string(to_string(op)), op);
  EXPECT_EQ(reduce_op_from_string("mean"), ReduceOp::kMean);
  EXPECT_EQ(reduce_op_from_string("sum"), ReduceOp::kSum);
  EXPECT_THROW(reduce_op_from_string("median"), InvalidArgumentError);
}

TEST(CommunicationOptionsTest, ZeroTimeoutDisablesTheStrategyDefault) {
  auto s = testing::mirrored(2, {.timeout = std::chrono::milliseconds(30)});
  auto r = s->run([](ReplicaContext& ctx) {
    if (ctx.replica_id_in_sync_group() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    return ctx.all_reduce(ReduceOp::kSum, constant(1), {.timeout = std::chrono::seconds(0)});
  });
  EXPECT_EQ(r[0], constant(2));
}

TEST(ErrorsTest, ThrowErrorMapsEveryCode) {
  for (ErrorCode code :
       {ErrorCode::kCancelled, ErrorCode::kInvalidArgument, ErrorCode::kDeadlineExceeded, ErrorCode::kNotFound,
        ErrorCode::kFailedPrecondition, ErrorCode::kAborted, ErrorCode::kOutOfRange, ErrorCode::kUnimplemented,
        ErrorCode::kInternal, ErrorCode::kUnavailable, ErrorCode::kResourceExhausted, ErrorCode::kDataLoss}) {
    try {
      throw_error(code, "m");
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), code);
      EXPECT_EQ(e.message(), "m");
      EXPECT_NE(to_string(code), "Error");
    }
  }
}

}  // namespace
}  // namespace distribute
