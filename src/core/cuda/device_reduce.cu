// The reduction kernel: one thread per element (grid-stride), the sources
// combined in order in the accumulator type, as the CPU kernels do.
#include <string>

#include "core/cuda/cuda_check.h"
#include "core/cuda/device_reduce.h"
#include "core/reduce_arith.h"
#include "distribute/errors.h"

namespace distribute::internal {
namespace {

struct Sources {
  const void* ptr[kMaxDeviceReduceSources];
  int count;
};

template <class T, class A, class Combine, class Finish>
__global__ void reduce_kernel(T* dst, Sources srcs, std::size_t n, Combine combine, Finish finish) {
  const std::size_t stride = static_cast<std::size_t>(blockDim.x) * gridDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const T* s0 = static_cast<const T*>(srcs.ptr[0]);
    if (srcs.count == 1) {
      dst[i] = store<T>(finish(load<A>(s0[i])));
      continue;
    }
    A acc = combine(load<A>(s0[i]), load<A>(static_cast<const T*>(srcs.ptr[1])[i]));
    for (int j = 2; j < srcs.count; ++j) acc = combine(acc, load<A>(static_cast<const T*>(srcs.ptr[j])[i]));
    dst[i] = store<T>(finish(acc));
  }
}

struct Launch {
  void* dst;
  const Sources& srcs;
  std::size_t count;
  cudaStream_t stream;

  template <class T, class A, class Combine, class Finish>
  void run(Combine combine, Finish finish) const {
    constexpr unsigned kThreads = 256;
    // Enough blocks to fill the GPU several times over; the loop strides past that.
    const std::size_t wanted = (count + kThreads - 1) / kThreads;
    const auto blocks = static_cast<unsigned>(wanted < 65536 ? wanted : 65536);
    reduce_kernel<T, A><<<blocks, kThreads, 0, stream>>>(static_cast<T*>(dst), srcs, count, combine, finish);
    check_cuda(cudaGetLastError(), "reduce kernel launch (" + std::to_string(count) + " elements, " +
                                       std::to_string(srcs.count) + " sources)");
  }
};

template <class T>
void reduce_typed(const Launch& launch, ReduceOp op, std::int64_t divisor) {
  if constexpr (std::is_same_v<T, bool>) {
    if (op == ReduceOp::kSum || op == ReduceOp::kMax) {
      launch.run<T, bool>(AnyOf{}, Same{});
    } else if (op == ReduceOp::kMean && divisor != launch.srcs.count) {
      launch.run<T, std::int64_t>(CountTrue{}, BoolMeanOf{divisor});
    } else {
      launch.run<T, bool>(AllOf{}, Same{});
    }
  } else {
    using Sum = typename Accumulator<T>::sum;
    using Mean = typename Accumulator<T>::mean;
    switch (op) {
      case ReduceOp::kSum: launch.run<T, Sum>(Add<Sum>{}, Same{}); return;
      case ReduceOp::kProduct: launch.run<T, Sum>(Multiply<Sum>{}, Same{}); return;
      case ReduceOp::kMin: launch.run<T, Mean>(Min<Mean>{}, Same{}); return;
      case ReduceOp::kMax: launch.run<T, Mean>(Max<Mean>{}, Same{}); return;
      case ReduceOp::kMean: launch.run<T, Mean>(Add<Mean>{}, DivideBy<Mean>{static_cast<Mean>(divisor)}); return;
    }
  }
}

}  // namespace

void reduce_sources_on_device(void* dst, std::span<const void* const> srcs, std::size_t count, DType dtype, ReduceOp op,
                              std::int64_t mean_divisor, cudaStream_t stream) {
  if (count == 0 || srcs.empty()) return;
  if (srcs.size() > kMaxDeviceReduceSources) {
    throw InvalidArgumentError("a device reduction combines at most " + std::to_string(kMaxDeviceReduceSources) +
                               " buffers at once, not " + std::to_string(srcs.size()));
  }
  Sources sources{};
  for (std::size_t j = 0; j < srcs.size(); ++j) sources.ptr[j] = srcs[j];
  sources.count = static_cast<int>(srcs.size());
  const std::int64_t divisor = mean_divisor > 0 ? mean_divisor : static_cast<std::int64_t>(srcs.size());
  const Launch launch{dst, sources, count, stream};
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    reduce_typed<T>(launch, op, divisor);
  });
}

}  // namespace distribute::internal
