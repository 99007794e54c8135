// The faults of the fault-injection tests (tests/runtime/fault_injection_test.cc
// and the multi-worker cases): a program of collectives whose steps of one
// kind all have the same dtype and shape, so that only an injected fault can
// make the replicas disagree.
#pragma once

#include <distribute/distribute.h>

namespace distribute::testing {

enum class Kind { kAllReduce, kAllGather, kMergeCall };
enum class Fault { kThrow, kSkip, kOtherCollective, kOtherDtype, kOtherShape, kSlow };
inline const char* const kFaultNames[] = {
    "throws", "skips the collective", "calls another collective", "passes another dtype", "passes another shape",
    "is slow"};

// One collective of the program; every step of a kind has the same dtype
// and shape, so only the injected fault can make the replicas disagree.
inline void call(ReplicaContext& ctx, Kind kind, DType dtype, bool other_shape) {
  switch (kind) {
    case Kind::kAllReduce: ctx.all_reduce(ReduceOp::kSum, fill(dtype, Shape{other_shape ? 4 : 3}, 1)); return;
    case Kind::kAllGather: ctx.all_gather(fill(dtype, Shape{2, other_shape ? 3 : 2}, 1), 0); return;
    case Kind::kMergeCall:
      ctx.merge_call([](Strategy&, const PerReplica<int>& ids) { return static_cast<int>(ids.size()); },
                     ctx.replica_id_in_sync_group());
      return;
  }
}

}  // namespace distribute::testing
