// A program of another project: the seed's first example, against the installed headers and library.
#include <distribute/distribute.h>

#include <iostream>

int main() {
  distribute::MirroredStrategy strategy({"CPU:0", "CPU:1"});
  auto result = strategy.run([](distribute::ReplicaContext& ctx) {
    return ctx.all_reduce(distribute::ReduceOp::kSum, distribute::constant({1, 2, 3}));
  });
  std::cout << "consumer: " << result[1].to_list_string() << "\n";
  return result[1] == distribute::constant({2, 4, 6}) ? 0 : 1;
}
