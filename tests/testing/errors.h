// Test helper: the message of the exception of type E that f() throws; a
// test failure (and "") if f throws something else or nothing.
#pragma once

#include <gtest/gtest.h>

#include <exception>
#include <string>

namespace distribute::testing {

template <class E, class F>
std::string error_message(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw the wrong type: " << e.what();
    return {};
  }
  ADD_FAILURE() << "did not throw";
  return {};
}

}  // namespace distribute::testing
