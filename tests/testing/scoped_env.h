// Test helper: sets an environment variable (or unsets it, given nullptr) for
// its lifetime and puts back what was there, however the test leaves, so that
// the other tests of the same process see the environment they started with.
#pragma once

#include <cstdlib>
#include <optional>
#include <string>

namespace distribute::testing {

class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    set(value);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
  ~ScopedEnv() { set(old_ ? old_->c_str() : nullptr); }

  // Changes the value (still put back at the end).
  void set(const char* value) const {
    value ? static_cast<void>(::setenv(name_.c_str(), value, 1)) : static_cast<void>(::unsetenv(name_.c_str()));
  }

 private:
  std::string name_;
  std::optional<std::string> old_;
};

}  // namespace distribute::testing
