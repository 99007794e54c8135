// Flags every worker of a multi-worker job must share (batch sizes, epochs,
// the seed, the sweep of a benchmark): checked once at the start, so that
// workers given different ones raise a clear error together instead of
// training on different batches, or hanging when one finishes early.
#pragma once

#include <distribute/distribute.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace distribute::tools {

using Flags = std::vector<std::pair<std::string, std::string>>;  // (name, value), in one order on every worker

// Every replica all-gathers its worker's flags; every worker then finds the
// same first difference and raises InvalidArgumentError naming the flag and
// each worker's value. One collective run; a strategy of one worker checks
// nothing.
inline void agree_on_flags(Strategy& strategy, const Flags& flags) {
  const int local = strategy.num_local_replicas();
  const int workers = strategy.num_replicas_in_sync() / local;
  if (workers < 2) return;
  std::string text;
  for (const auto& [name, value] : flags) text += name + "=" + value + '\n';
  const Tensor mine = [&] {
    Tensor t = Tensor::uninitialized(DType::kUInt8, Shape{static_cast<std::int64_t>(text.size())});
    if (!text.empty()) std::memcpy(t.mutable_raw_data(), text.data(), text.size());
    return t;
  }();
  const Tensor length = constant({static_cast<std::int64_t>(text.size())});
  // Gathered in a run; compared after it, outside the replicas, so that the
  // error (the same on every worker) leaves the workers' link usable.
  const PerReplica<std::vector<std::string>> gathered = strategy.run([&](ReplicaContext& ctx) {
    const Tensor lengths = ctx.all_gather(length, 0);
    const Tensor all = ctx.all_gather(mine, 0);
    // Replica g's text; worker w's is that of its first replica.
    std::vector<std::string> texts;
    const auto* bytes = static_cast<const char*>(all.raw_data());
    std::size_t at = 0;
    for (std::int64_t g = 0; g < lengths.num_elements(); ++g) {
      const auto n = static_cast<std::size_t>(lengths.flat<std::int64_t>()[static_cast<std::size_t>(g)]);
      if (g % local == 0) texts.emplace_back(bytes + at, n);
      at += n;
    }
    return texts;
  });
  const std::vector<std::string>& texts = gathered.primary();
  for (int w = 1; w < workers; ++w) {
    if (texts[static_cast<std::size_t>(w)] == texts[0]) continue;
    // The first flag that differs, with every worker's value of it.
    auto value_of = [](const std::string& all_flags, const std::string& name) {
      const std::string key = name + "=";
      std::size_t line = 0;
      while (line < all_flags.size()) {
        const std::size_t end = all_flags.find('\n', line);
        if (all_flags.compare(line, key.size(), key) == 0)
          return all_flags.substr(line + key.size(), end - line - key.size());
        line = end + 1;
      }
      return std::string("(not given)");
    };
    for (const auto& [name, value] : flags) {
      static_cast<void>(value);
      std::string values;
      bool differ = false;
      for (int q = 0; q < workers; ++q) {
        const std::string v = value_of(texts[static_cast<std::size_t>(q)], name);
        differ |= v != value_of(texts[0], name);
        values += (q ? ", worker " : "worker ") + std::to_string(q) + ": " + v;
      }
      if (differ)
        throw InvalidArgumentError("every worker must be given the same " + name + ", but they have " + values);
    }
    throw InvalidArgumentError("the workers were given different flags (worker 0: " + texts[0] + "; worker " +
                               std::to_string(w) + ": " + texts[static_cast<std::size_t>(w)] + ")");
  }
}

}  // namespace distribute::tools
