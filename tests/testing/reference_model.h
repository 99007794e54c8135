// The reference model: a plain, single-threaded statement of what each
// collective returns, written from docs/semantics.md (§6.4 arithmetic, §6.6
// all_gather), used only by tests. It shares no code with the library: it
// combines element by element in replica order, in the documented types.
#pragma once

#include <distribute/distribute.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

namespace distribute::testing {

namespace reference_detail {

template <class T>
constexpr bool kHalf = std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>;

// One element of op over xs (one value per replica, replica order).
template <class T>
T combine(ReduceOp op, const T* xs, std::size_t n, std::int64_t divisor) {
  if constexpr (std::is_same_v<T, bool>) {
    bool any = false, all = true;
    std::int64_t trues = 0;
    for (std::size_t r = 0; r < n; ++r) {
      const bool x = xs[r];
      any = any || x;
      all = all && x;
      trues += x ? 1 : 0;
    }
    if (op == ReduceOp::kSum || op == ReduceOp::kMax) return any;
    if (op == ReduceOp::kMean) return trues / divisor != 0;
    return all;  // MIN, PRODUCT
  } else if constexpr (kHalf<T>) {
    float acc = static_cast<float>(xs[0]);
    for (std::size_t r = 1; r < n; ++r) {
      const float x = static_cast<float>(xs[r]);
      switch (op) {
        case ReduceOp::kSum:
        case ReduceOp::kMean: acc = acc + x; break;
        case ReduceOp::kProduct: acc = acc * x; break;
        case ReduceOp::kMin: acc = x < acc ? x : acc; break;
        case ReduceOp::kMax: acc = acc < x ? x : acc; break;
      }
    }
    if (op == ReduceOp::kMean) acc = acc / static_cast<float>(divisor);
    return T(acc);
  } else if constexpr (std::is_floating_point_v<T>) {
    T acc = xs[0];
    for (std::size_t r = 1; r < n; ++r) {
      switch (op) {
        case ReduceOp::kSum:
        case ReduceOp::kMean: acc = acc + xs[r]; break;
        case ReduceOp::kProduct: acc = acc * xs[r]; break;
        case ReduceOp::kMin: acc = xs[r] < acc ? xs[r] : acc; break;
        case ReduceOp::kMax: acc = acc < xs[r] ? xs[r] : acc; break;
      }
    }
    if (op == ReduceOp::kMean) acc = acc / static_cast<T>(divisor);
    return acc;
  } else {
    // Integers: SUM and PRODUCT wrap (two's complement, computed unsigned);
    // MEAN is the exact mean truncated toward zero.
    using U = std::make_unsigned_t<T>;
    if (op == ReduceOp::kMean) {
      __extension__ __int128 sum = 0;
      for (std::size_t r = 0; r < n; ++r) sum += xs[r];
      return static_cast<T>(sum / divisor);
    }
    std::uint64_t acc = static_cast<U>(xs[0]);
    T best = xs[0];
    for (std::size_t r = 1; r < n; ++r) {
      const auto u = static_cast<std::uint64_t>(static_cast<U>(xs[r]));
      if (op == ReduceOp::kSum) acc = acc + u;
      if (op == ReduceOp::kProduct) acc = acc * u;
      if (op == ReduceOp::kMin && xs[r] < best) best = xs[r];
      if (op == ReduceOp::kMax && best < xs[r]) best = xs[r];
    }
    if (op == ReduceOp::kMin || op == ReduceOp::kMax) return best;
    return static_cast<T>(static_cast<U>(acc));
  }
}

}  // namespace reference_detail

// What every replica's all_reduce (and Strategy::reduce without an axis)
// returns for these per-replica values (same dtype and shape); MEAN divides
// by `divisor` (the number of values if 0).
inline Tensor reference_reduce(ReduceOp op, const std::vector<Tensor>& values, std::int64_t divisor = 0) {
  const Tensor& first = values.front();
  const std::int64_t d = divisor > 0 ? divisor : static_cast<std::int64_t>(values.size());
  Tensor out(first.dtype(), first.shape());
  visit_dtype(first.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const auto xs = std::make_unique<T[]>(values.size());
    for (std::int64_t i = 0; i < first.num_elements(); ++i) {
      for (std::size_t r = 0; r < values.size(); ++r) xs[r] = static_cast<const T*>(values[r].raw_data())[i];
      const T v = reference_detail::combine<T>(op, xs.get(), values.size(), d);
      std::memcpy(static_cast<T*>(out.mutable_raw_data()) + i, &v, sizeof(T));
    }
  });
  return out;
}

// The same under MultiWorkerMirroredStrategy with `local` replicas per
// worker (docs/semantics.md §4.1): floating-point SUM, MEAN and PRODUCT
// combine each worker's replicas first (MEAN as a SUM), round to the dtype,
// then combine the workers in order (MEAN divides once); everything else is
// as one process computes it (integer and bool MEAN are exact).
inline Tensor reference_reduce_multi_worker(ReduceOp op, const std::vector<Tensor>& values, int local) {
  const bool staged = is_floating(values.front().dtype()) && local > 1 &&
                      (op == ReduceOp::kSum || op == ReduceOp::kMean || op == ReduceOp::kProduct);
  if (!staged) return reference_reduce(op, values);
  std::vector<Tensor> per_worker;
  for (std::size_t w = 0; w * static_cast<std::size_t>(local) < values.size(); ++w) {
    const auto begin = values.begin() + static_cast<std::ptrdiff_t>(w * static_cast<std::size_t>(local));
    per_worker.push_back(
        reference_reduce(op == ReduceOp::kMean ? ReduceOp::kSum : op, std::vector<Tensor>(begin, begin + local)));
  }
  return reference_reduce(op, per_worker, static_cast<std::int64_t>(values.size()));
}

// What every replica's all_gather (and Strategy::gather) returns: the values
// concatenated along `axis` (already normalised to [0, rank)), in replica order.
inline Tensor reference_gather(const std::vector<Tensor>& values, int axis) {
  const Tensor& first = values.front();
  std::vector<std::int64_t> dims = first.shape().dims();
  dims[static_cast<std::size_t>(axis)] = 0;
  for (const Tensor& v : values) dims[static_cast<std::size_t>(axis)] += v.shape()[axis];
  Tensor out(first.dtype(), Shape(dims));
  std::int64_t outer = 1;
  for (int a = 0; a < axis; ++a) outer *= dims[static_cast<std::size_t>(a)];
  auto* dst = static_cast<std::byte*>(out.mutable_raw_data());
  for (std::int64_t o = 0; o < outer; ++o) {
    for (const Tensor& v : values) {
      const std::size_t block = outer == 0 ? 0 : v.nbytes() / static_cast<std::size_t>(outer);
      if (block)
        std::memcpy(dst, static_cast<const std::byte*>(v.raw_data()) + static_cast<std::size_t>(o) * block, block);
      dst += block;
    }
  }
  return out;
}

// Random values of `dtype` and `shape`: integers over their whole range (so
// that SUM and PRODUCT wrap), floats small multiples of 1/8 with either sign
// (no NaN, no -0), bools at random.
inline Tensor random_tensor(std::mt19937_64& gen, DType dtype, const Shape& shape) {
  Tensor t(dtype, shape);
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    T* p = static_cast<T*>(t.mutable_raw_data());
    for (std::int64_t i = 0; i < t.num_elements(); ++i) {
      const std::uint64_t bits = gen();
      if constexpr (std::is_same_v<T, bool>) {
        p[i] = (bits & 1) != 0;
      } else if constexpr (std::is_integral_v<T>) {
        T v;
        std::memcpy(&v, &bits, sizeof v);
        p[i] = v;
      } else {
        const double v = static_cast<double>(static_cast<int>(bits % 801) - 400) / 8.0;
        if constexpr (reference_detail::kHalf<T>) {
          p[i] = T(static_cast<float>(v == 0 ? 0.0 : v));
        } else {
          p[i] = static_cast<T>(v == 0 ? 0.0 : v);
        }
      }
    }
  });
  return t;
}

// Same dtype, shape and bytes.
inline bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         (a.nbytes() == 0 || std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0);
}

// ---- random cases -------------------------------------------------------------

// The seeds of a randomized test: `cases` of them from `first_default`, or
// DISTRIBUTE_RANDOMIZED_CASES of them from DISTRIBUTE_TEST_SEED, to rerun the
// case a failure names.
inline std::vector<std::uint64_t> test_seeds(std::uint64_t first_default, std::uint64_t cases) {
  auto env_or = [](const char* name, std::uint64_t fallback) {
    const char* v = std::getenv(name);
    return v != nullptr && *v != '\0' ? std::strtoull(v, nullptr, 10) : fallback;
  };
  const std::uint64_t first = env_or("DISTRIBUTE_TEST_SEED", first_default);
  std::vector<std::uint64_t> out;
  for (std::uint64_t i = 0; i < env_or("DISTRIBUTE_RANDOMIZED_CASES", cases); ++i) out.push_back(first + i);
  return out;
}

// "seed 12 (rerun: DISTRIBUTE_TEST_SEED=12 DISTRIBUTE_RANDOMIZED_CASES=1)".
inline std::string rerun_hint(std::uint64_t seed) {
  return "seed " + std::to_string(seed) + " (rerun: DISTRIBUTE_TEST_SEED=" + std::to_string(seed) +
         " DISTRIBUTE_RANDOMIZED_CASES=1)";
}

inline int uniform(std::mt19937_64& gen, int lo, int hi) {
  return lo + static_cast<int>(gen() % static_cast<std::uint64_t>(hi - lo + 1));
}

// A random nest structure whose leaves are numbered 0, 1, ... (lists, tuples, dicts).
inline Nest<int> random_structure(std::mt19937_64& gen, int& next, int depth = 0) {
  const int kind = depth >= 2 ? 0 : uniform(gen, 0, 3);
  if (kind == 0) return Nest<int>(next++);
  const int width = uniform(gen, 1, 3);
  std::vector<Nest<int>> items;
  for (int i = 0; i < width; ++i) items.push_back(random_structure(gen, next, depth + 1));
  if (kind == 1) return Nest<int>::list(items);
  if (kind == 2) return Nest<int>::tuple(items);
  Nest<int>::Items keyed;
  for (int i = 0; i < width; ++i)
    keyed.emplace_back(std::string(1, static_cast<char>('a' + i)), items[static_cast<std::size_t>(i)]);
  return Nest<int>::dict(keyed);
}

// One collective with random arguments for n replicas: a nest structure,
// inputs[replica][leaf], the op, the pack size and (for all_gather) the axis.
struct RandomCase {
  Nest<int> structure;
  std::vector<std::vector<Tensor>> inputs;
  ReduceOp op = ReduceOp::kSum;
  std::int64_t bytes_per_pack = 0;
  int axis = 0;        // as passed (may be negative)
  int normalized = 0;  // in [0, 3)

  Nest<Tensor> value_of(int replica) const {
    return Nest<Tensor>::pack_sequence_as(structure, inputs[static_cast<std::size_t>(replica)]);
  }
  std::vector<Tensor> column(std::size_t leaf) const {
    std::vector<Tensor> out;
    for (const auto& per : inputs) out.push_back(per[leaf]);
    return out;
  }
  std::size_t leaves() const { return inputs.front().size(); }
};

// all_reduce: every replica has the same dtypes and shapes (ranks 0 to 3).
// all_gather (`ragged`): rank 3, and each replica's own size along the axis.
inline RandomCase random_case(std::mt19937_64& gen, int n, bool ragged) {
  static const std::int64_t kPackSizes[] = {0, 1, 16, 100, 1 << 20};
  RandomCase c;
  int leaves = 0;
  c.structure = random_structure(gen, leaves);
  c.op = kAllReduceOps[gen() % std::size(kAllReduceOps)];
  c.bytes_per_pack = kPackSizes[gen() % std::size(kPackSizes)];
  c.axis = uniform(gen, -3, 2);
  c.normalized = c.axis < 0 ? c.axis + 3 : c.axis;
  std::vector<DType> dtypes;
  std::vector<std::vector<std::int64_t>> dims;
  for (int i = 0; i < leaves; ++i) {
    dtypes.push_back(kAllDTypes[gen() % std::size(kAllDTypes)]);
    dims.emplace_back(static_cast<std::size_t>(ragged ? 3 : uniform(gen, 0, 3)));
    for (auto& d : dims.back()) d = uniform(gen, 0, 5);
  }
  c.inputs.resize(static_cast<std::size_t>(n));
  for (auto& per : c.inputs) {
    for (int i = 0; i < leaves; ++i) {
      std::vector<std::int64_t> d = dims[static_cast<std::size_t>(i)];
      if (ragged) d[static_cast<std::size_t>(c.normalized)] = uniform(gen, 0, 4);
      per.push_back(random_tensor(gen, dtypes[static_cast<std::size_t>(i)], Shape(d)));
    }
  }
  return c;
}

}  // namespace distribute::testing
