#!/usr/bin/env bash
# A hung test must end in a stack dump of every replica, not in a silent
# ctest timeout. Runs the deliberately hanging test with a 2 s watchdog.
set -u
bin=$1
test_name=HangWatchdogTest.DISABLED_ReplicasThatNeverReturnAreDumped
out=$(DISTRIBUTE_TEST_WATCHDOG=2 timeout 50 "$bin" --gtest_also_run_disabled_tests \
      --gtest_filter="$test_name" 2>&1)
rc=$?
printf '%s\n' "$out"
fail() { echo "FAIL: $*"; exit 1; }
[ "$rc" -ne 124 ] || fail "the watchdog did not fire: timeout(1) killed the test"
[ "$rc" -ne 0 ] || fail "a hung test exited with 0"
grep -q "hang watchdog: $test_name is still running after 2 s" <<<"$out" || fail "no watchdog report"
for r in 1 2; do
  grep -q "^--- thread [0-9]* \"dist replica $r\"" <<<"$out" || fail "no stack for replica $r's thread"
done
grep -q '(the test.s main thread)' <<<"$out" || fail "no stack for the main thread (replica 0)"
frames=$(grep -c 'wait_forever_in_replica' <<<"$out")
[ "$frames" -ge 3 ] || fail "expected the 3 replicas' stacks to show wait_forever_in_replica, found $frames"
echo "PASS: the hang was reported with the stacks of all 3 replicas"
