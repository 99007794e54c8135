// File: distribute.h
//
// The umbrella header of `distribute`, TensorFlow's tf.distribute replica
// model in C++. Include this one header:
//
//   #include <distribute/distribute.h>
//   using namespace distribute;
//
//   MirroredStrategy strategy({"CPU:0", "CPU:1"});
//   auto result = strategy.run([] {
//     auto* ctx = get_replica_context();
//     return ctx->all_gather(constant({1, 2, 3}), /*axis=*/0);
//   });
//   std::cout << result << "\n";   // PerReplica:{ 0: ..., 1: ... }
#pragma once

#include "distribute/checkpoint.h"
#include "distribute/context.h"
#include "distribute/devices.h"
#include "distribute/distributed_values.h"
#include "distribute/dlpack.h"
#include "distribute/dtype.h"
#include "distribute/errors.h"
#include "distribute/indexed_slices.h"
#include "distribute/input.h"
#include "distribute/mirrored_strategy.h"
#include "distribute/multi_worker_mirrored_strategy.h"
#include "distribute/nest.h"
#include "distribute/optimizers.h"
#include "distribute/options.h"
#include "distribute/preemption.h"
#include "distribute/reduce_op.h"
#include "distribute/replica_context.h"
#include "distribute/strategy.h"
#include "distribute/tensor.h"
#include "distribute/variables.h"
