"""The seed's examples (the reference page of tf.distribute.ReplicaContext),
as the page writes them; only the import line differs.

    PYTHONPATH=build/release/python DISTRIBUTE_GPUS_AS_CPUS=1 python3 examples/seed.py

DISTRIBUTE_GPUS_AS_CPUS=1 runs "GPU:0" and "GPU:1" on CPUs where no GPU is
visible (docs/python.md).
"""

import distribute.compat as tf

# --- tf.distribute.ReplicaContext --------------------------------------------
strategy = tf.distribute.MirroredStrategy(['GPU:0', 'GPU:1'])
def func():
  replica_context = tf.distribute.get_replica_context()
  return replica_context.replica_id_in_sync_group
print(strategy.run(func))

# --- all_gather: one tensor ----------------------------------------------------
strategy = tf.distribute.MirroredStrategy(["GPU:0", "GPU:1"])
@tf.function
def gather_value():
  ctx = tf.distribute.get_replica_context()
  local_value = tf.constant([1, 2, 3])
  return ctx.all_gather(local_value, axis=0)
result = strategy.run(gather_value)
print(result)
print(strategy.experimental_local_results(result))

# --- all_gather: a nest --------------------------------------------------------
@tf.function
def gather_nest():
  ctx = tf.distribute.get_replica_context()
  value_1 = tf.constant([1, 2, 3])
  value_2 = tf.constant([[1, 2], [3, 4]])
  # all_gather a nest of `tf.distribute.DistributedValues`
  return ctx.all_gather([value_1, value_2], axis=0)
result = strategy.run(gather_nest)
lists = [[v.numpy().tolist() for v in replica] for replica in strategy.experimental_local_results(result)]
assert lists[0] == lists[1]
print("gather_nest:", lists[0], "on every replica")

# --- all_gather: different shapes on different replicas ------------------------
def gather_ragged():
  ctx = tf.distribute.get_replica_context()
  if ctx.replica_id_in_sync_group == 0:
    value = {'a': tf.constant([0]), 'b': tf.constant([[0, 1]])}
  else:
    value = {'a': tf.constant([1]), 'b': tf.constant([[2, 3], [4, 5]])}
  return ctx.all_gather(value, axis=0)
gathered = [{k: v.numpy().tolist() for k, v in replica.items()}
            for replica in strategy.experimental_local_results(strategy.run(gather_ragged))]
assert gathered[0] == gathered[1]
print("ragged:", gathered[0], "on every replica")

# --- all_reduce ----------------------------------------------------------------
strategy = tf.distribute.MirroredStrategy(["GPU:0", "GPU:1"])
def step_fn():
  ctx = tf.distribute.get_replica_context()
  value = tf.identity(1.)
  return ctx.all_reduce(tf.distribute.ReduceOp.SUM, value)
print(strategy.experimental_local_results(strategy.run(step_fn)))

def step_fn():
  ctx = tf.distribute.get_replica_context()
  value1 = tf.identity(1.)
  value2 = tf.identity(2.)
  return ctx.all_reduce(tf.distribute.ReduceOp.SUM, [value1, value2])
print(tuple([float(v) for v in replica] for replica in strategy.experimental_local_results(strategy.run(step_fn))))

# --- merge_call outside a distributed context ----------------------------------
strategy = tf.distribute.get_strategy()
merged = tf.distribute.get_replica_context().merge_call(lambda s, a, b: a + b, args=(1, 2))
print("merge_call in the default context:", merged)
