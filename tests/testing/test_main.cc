// GoogleTest main of the in-process test binaries: GoogleTest's own, plus the
// hang watchdog (a stack dump of every thread instead of a silent timeout).
#include <gtest/gtest.h>

#include "testing/hang_watchdog.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  // ctest gives each of these tests 60 s; the dump comes first.
  distribute::testing::install_hang_watchdog(50);
  return RUN_ALL_TESTS();
}
