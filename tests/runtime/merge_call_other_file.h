// merge_call with a merge_fn named as one in merge_call_test.cc, from another file.
#pragma once

#include <distribute/distribute.h>

namespace distribute::testing {

int merge_call_from_another_file(ReplicaContext& ctx);

}  // namespace distribute::testing
