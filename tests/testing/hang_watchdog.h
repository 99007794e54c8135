// A hung test becomes a report instead of a silent ctest timeout: when one
// test runs longer than its limit, the watchdog prints the stack of every
// thread of the process (replica threads by name, "dist replica N") and
// exits with a failure.
//
// The limit is DISTRIBUTE_TEST_WATCHDOG seconds per test (0 turns the
// watchdog off), else the default the test main passes: below ctest's
// TIMEOUT, so that the dump comes before ctest kills the process.
#pragma once

#include <string>

namespace distribute::testing {

// Prints `what` hung, then the stack of every thread of the process, and
// exits with status 1. For programs that watch themselves (distribute-soak).
[[noreturn]] void dump_every_thread_and_exit(const std::string& what);

// Registers a GoogleTest listener that arms the watchdog at the start of each
// test and disarms it at its end. Call once, after InitGoogleTest.
void install_hang_watchdog(int default_seconds);

}  // namespace distribute::testing
