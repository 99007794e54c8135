// A reference to a strategy that knows when the strategy is gone. Variables
// and distributed datasets hold one: used after their strategy is destroyed
// they raise FailedPreconditionError instead of reading freed memory, and a
// new strategy made at the same address is not taken for theirs.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "distribute/strategy.h"

namespace distribute::internal {

class StrategyRef {
 public:
  explicit StrategyRef(Strategy& s);

  // The strategy, or FailedPreconditionError naming the holder ("variable",
  // "w") if it was destroyed.
  Strategy& get(std::string_view kind, std::string_view name = {}) const {
    if (alive_.expired()) throw_destroyed(kind, name);
    return *strategy_;
  }
  // Whether `s` is this strategy (false once it is destroyed).
  bool is(const Strategy& s) const { return &s == strategy_ && !alive_.expired(); }

 private:
  [[noreturn]] void throw_destroyed(std::string_view kind, std::string_view name) const;

  Strategy* strategy_;
  std::weak_ptr<const void> alive_;
  std::string described_;  // the strategy's describe(), for the message
};

}  // namespace distribute::internal
