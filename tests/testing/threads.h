// Test helper: runs f(rank) on n threads (rank 0 on the calling thread's
// sibling, all joined before returning) and collects every exception, so a
// test can assert what each rank saw.
#pragma once

#include <exception>
#include <functional>
#include <thread>
#include <vector>

namespace distribute::testing {

inline std::vector<std::exception_ptr> run_threads(int n, const std::function<void(int)>& f) {
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        f(r);
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

// The message of the exception, or "" if there was none.
inline std::string message_of(const std::exception_ptr& e) {
  if (!e) return "";
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    return ex.what();
  } catch (...) {
    return "(not a std::exception)";
  }
}

}  // namespace distribute::testing
