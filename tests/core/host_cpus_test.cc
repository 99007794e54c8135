// The CPUs and NUMA nodes the tools report and the engine sizes its waits by:
// kernel CPU lists, a fake sysfs node folder, and this process's own mask.
#include "core/host_cpus.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace distribute::internal {
namespace {

TEST(HostCpusTest, ParsesKernelCpuLists) {
  EXPECT_EQ(parse_cpu_list("0"), std::vector<int>({0}));
  EXPECT_EQ(parse_cpu_list("0-3\n"), std::vector<int>({0, 1, 2, 3}));
  EXPECT_EQ(parse_cpu_list("8,0-1,10-11"), std::vector<int>({0, 1, 8, 10, 11}));
  EXPECT_EQ(parse_cpu_list("1,1-2"), std::vector<int>({1, 2}));
  EXPECT_TRUE(parse_cpu_list("").empty());  // a node with no CPU (memory only)
  for (const char* bad : {"x", "3-1", "1,", "-2", "1--2", "0-a"}) {
    EXPECT_TRUE(parse_cpu_list(bad).empty()) << bad;
  }
}

// This process's usable CPUs, as sched_getaffinity counts them.
std::vector<int> my_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  EXPECT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  }
  return cpus;
}

TEST(HostCpusTest, CountsTheCpusThisProcessMayUse) {
  EXPECT_EQ(usable_cpus(), static_cast<int>(my_cpus().size()));
  const std::string d = describe_host_cpus();
  EXPECT_NE(d.find(std::to_string(usable_cpus()) + (usable_cpus() == 1 ? " CPU" : " CPUs")), std::string::npos) << d;
  EXPECT_NE(d.find("NUMA node"), std::string::npos) << d;
}

// Nodes from a sysfs-like folder: each keeps only the CPUs this process may
// use, nodes left with none (or memory-only) are dropped, and no folder at
// all is one node of every usable CPU.
TEST(HostCpusTest, NodesKeepTheUsableCpusInIdOrder) {
  const std::vector<int> mine = my_cpus();
  ASSERT_FALSE(mine.empty());
  const auto dir = std::filesystem::temp_directory_path() / ("host_cpus_test_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  const auto node = [&](const std::string& name, const std::string& cpulist) {
    std::filesystem::create_directories(dir / name);
    std::ofstream(dir / name / "cpulist") << cpulist << "\n";
  };
  // node1: the first usable CPU; node0: the others (if any) and one beyond
  // any mask; node2: memory only; node3: only a CPU nobody may use.
  std::string rest;
  for (std::size_t i = 1; i < mine.size(); ++i) rest += std::to_string(mine[i]) + ",";
  node("node1", std::to_string(mine[0]));
  node("node0", rest + "100000");
  node("node2", "");
  node("node3", "100001");
  node("possible", "0-3");  // not a node folder
  const std::vector<NumaNode> nodes = numa_nodes(dir.string());
  ASSERT_EQ(nodes.size(), mine.size() > 1 ? 2u : 1u);
  if (mine.size() > 1) {
    EXPECT_EQ(nodes[0].id, 0);
    EXPECT_EQ(nodes[0].cpus, std::vector<int>(mine.begin() + 1, mine.end()));
  }
  EXPECT_EQ(nodes.back().id, 1);
  EXPECT_EQ(nodes.back().cpus, std::vector<int>({mine[0]}));

  const std::vector<NumaNode> none = numa_nodes((dir / "no_such_folder").string());
  ASSERT_EQ(none.size(), 1u);
  EXPECT_EQ(none[0].cpus, mine);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace distribute::internal
