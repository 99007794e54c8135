// The page-fault count, the median and the bus bandwidth factor shared by
// the one-process sweep and the multi-worker mode.
#include "measure.h"

#include <sys/resource.h>

#include <algorithm>

namespace distribute::bench {

long minor_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

double bus_factor(const std::string& op, int n) {
  if (n == 1) return op == "broadcast" ? 1 : 0;
  if (op == "all_reduce") return 2.0 * (n - 1) / n;
  if (op == "all_gather" || op == "reduce_scatter") return static_cast<double>(n - 1) / n;
  return 1;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace distribute::bench
