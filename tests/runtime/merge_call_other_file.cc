// A merge_fn whose type has the same name as one in merge_call_test.cc,
// distribute::(anonymous namespace)::SameName, in another file: the same
// names, another type.
#include "runtime/merge_call_other_file.h"

namespace distribute {
namespace {
struct SameName {
  int operator()(Strategy&, const PerReplica<int>&) const { return 2; }
};
}  // namespace

int testing::merge_call_from_another_file(ReplicaContext& ctx) { return ctx.merge_call(SameName{}, 1); }

}  // namespace distribute
