// The CPUs this process may run on, and the NUMA nodes they sit in, as the
// kernel reports them (sched_getaffinity, /sys/devices/system/node). The
// engine sizes its waits by the first (a container or `taskset` can leave a
// process far fewer CPUs than the machine has: std::thread::
// hardware_concurrency counts the machine's); the tools print both.
#pragma once

#include <string>
#include <vector>

namespace distribute::internal {

// CPUs in this process's affinity mask; the machine's count if the mask
// cannot be read; at least 1.
int usable_cpus();

struct NumaNode {
  int id = 0;
  std::vector<int> cpus;  // the node's CPUs that this process may use
};

// The NUMA nodes that hold at least one usable CPU, in id order, read from
// `sysfs_node_dir` (nodeN/cpulist). A machine without that folder (a kernel
// built without NUMA) is one node with every usable CPU.
std::vector<NumaNode> numa_nodes(const std::string& sysfs_node_dir = "/sys/devices/system/node");

// A kernel CPU list ("0-3,8,10-11") as CPU numbers; empty for text that is
// not one.
std::vector<int> parse_cpu_list(const std::string& text);

// "16 CPUs, 1 NUMA node" (and "of 64" where the process may use fewer than
// the machine has), for the tools' headers.
std::string describe_host_cpus();

}  // namespace distribute::internal
