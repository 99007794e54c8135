#!/usr/bin/env bash
# distribute-bench's command line: numbers are range-checked before they are
# narrowed, a sweep has at most 1000 sizes, and a size that cannot fit in
# memory is refused up front (exit 2, a message naming the flag and the
# size), never a crash or an endless run.
# usage: cli_test.sh path/to/distribute-bench
set -u
bin=$1
. "$(dirname "$0")/../testing/expect_exit.sh"

expect 2 "--replicas must be from 1 to 4096, got 4294967298" --replicas 4294967298
expect 2 "--iters must be from 1 to 2147483647, got 0" --iters 0
expect 2 "--warmup must be from 0 to 2147483647, got 2147483648" --warmup 2147483648
expect 2 "--iters needs a whole number from 1 to 2147483647, got '5x'" --iters 5x
expect 2 "-f must be > 1" -f 1
expect 2 "-f needs a finite number > 0, got 'nan'" -f nan
expect 2 "makes more than 1000 message sizes; use a larger -f" -f 1.0001
expect 2 "-e 1e30 is 1e\+30 bytes, more than the 9,223,372,036,854,775,807 allowed" -e 1e30
expect 2 "-e 18446744073709551616 is 1.845e\+19 bytes" -e 18446744073709551616
expect 2 "-b \(2,048 bytes\) must be <= -e \(1,024 bytes\)" -b 2K -e 1K
expect 2 "-b 1.5 is not a whole number of bytes" -b 1.5
expect 2 "-e 4,000,000,000,000,000,000 bytes needs at least .* GiB for its input and output on 2 replicas, more than this machine's" \
  -b 4000000000000000000 -e 4000000000000000000 --replicas 2
# Output: a folder that does not exist is found before the sweep; a full disk at the end.
expect 2 "--csv /nonexistent/folder/b.csv: cannot create it in /nonexistent/folder" --csv /nonexistent/folder/b.csv
expect 2 "could not write the CSV file /dev/full: No space left on device" -b 8 -e 8 --iters 1 --warmup 0 --csv /dev/full
expect 0 "size\(B\)" --op all_reduce --replicas 2 -b 8 -e 64 -f 8 --iters 1 --warmup 0
exit $((fails > 0))
