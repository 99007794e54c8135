#include "core/host_cpus.h"

#include <sched.h>

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <string_view>
#include <system_error>
#include <thread>

namespace distribute::internal {
namespace {

// The CPUs of the affinity mask; if it cannot be read, the machine's (at
// least one).
std::vector<int> usable_cpu_list() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
    }
  }
  if (cpus.empty()) {
    for (unsigned c = 0; c < std::max(1u, std::thread::hardware_concurrency()); ++c) {
      cpus.push_back(static_cast<int>(c));
    }
  }
  return cpus;
}

bool parse_int(std::string_view s, int& out) {
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && end == s.data() + s.size() && out >= 0;
}

}  // namespace

int usable_cpus() { return static_cast<int>(usable_cpu_list().size()); }

std::vector<int> parse_cpu_list(const std::string& text) {
  std::vector<int> cpus;
  std::string_view rest(text);
  while (!rest.empty() && (rest.back() == '\n' || rest.back() == ' ')) rest.remove_suffix(1);
  if (rest.empty()) return cpus;
  while (true) {
    const std::size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    const std::size_t dash = item.find('-');
    int first = 0;
    int last = 0;
    if (!parse_int(item.substr(0, dash), first)) return {};
    last = first;
    if (dash != std::string_view::npos && (!parse_int(item.substr(dash + 1), last) || last < first)) return {};
    for (int c = first; c <= last; ++c) cpus.push_back(c);
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  return cpus;
}

std::vector<NumaNode> numa_nodes(const std::string& sysfs_node_dir) {
  const std::vector<int> usable = usable_cpu_list();
  std::vector<NumaNode> nodes;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(sysfs_node_dir, ec)) {
    const std::string name = entry.path().filename().string();
    int id = 0;
    if (name.rfind("node", 0) != 0 || !parse_int(std::string_view(name).substr(4), id)) continue;
    std::ifstream in(entry.path() / "cpulist");
    std::string text;
    if (!in || !std::getline(in, text)) continue;
    NumaNode node{.id = id, .cpus = {}};
    for (int c : parse_cpu_list(text)) {
      if (std::binary_search(usable.begin(), usable.end(), c)) node.cpus.push_back(c);
    }
    if (!node.cpus.empty()) nodes.push_back(std::move(node));
  }
  if (nodes.empty()) nodes.push_back(NumaNode{.id = 0, .cpus = usable});
  std::sort(nodes.begin(), nodes.end(), [](const NumaNode& a, const NumaNode& b) { return a.id < b.id; });
  return nodes;
}

std::string describe_host_cpus() {
  const int usable = usable_cpus();
  const auto machine = static_cast<int>(std::thread::hardware_concurrency());
  const std::size_t nodes = numa_nodes().size();
  std::string s = std::to_string(usable) + (usable == 1 ? " CPU" : " CPUs");
  if (machine > usable) s += " of " + std::to_string(machine);
  return s + ", " + std::to_string(nodes) + (nodes == 1 ? " NUMA node" : " NUMA nodes");
}

}  // namespace distribute::internal
