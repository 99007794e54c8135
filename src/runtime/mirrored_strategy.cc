#include "distribute/mirrored_strategy.h"

#include <algorithm>
#include <cctype>
#include <thread>

namespace distribute {
namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

bool parse_index(std::string_view text, int& out) {
  if (text.empty() || text.size() > 9) return false;
  int v = 0;
  for (char c : text) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
    v = v * 10 + (c - '0');
  }
  out = v;
  return true;
}

}  // namespace

std::string canonical_device_name(std::string_view device) {
  const std::string original(device);
  auto bad = [&](const std::string& why) -> std::string {
    throw InvalidArgumentError("device '" + original + "': " + why +
                               ". Expected a CPU device such as \"CPU:0\", \"/cpu:1\" or "
                               "\"/job:localhost/replica:0/task:0/device:CPU:2\"");
  };
  std::string type;
  int index = -1;
  std::size_t pos = 0;
  while (pos <= device.size()) {
    std::size_t next = device.find('/', pos);
    if (next == std::string_view::npos) next = device.size();
    const std::string_view part = device.substr(pos, next - pos);
    pos = next + 1;
    if (part.empty()) continue;
    const std::size_t colon = part.find(':');
    if (colon == std::string_view::npos) return bad("'" + std::string(part) + "' is not a field of a device name");
    const std::string key = lower(part.substr(0, colon));
    std::string_view rest = part.substr(colon + 1);
    int n = 0;
    if (key == "job") {
      if (rest != "localhost") {
        throw InvalidArgumentError("device '" + original +
                                   "': MirroredStrategy runs on this process only (job 'localhost'); use "
                                   "MultiWorkerMirroredStrategy for other workers");
      }
    } else if (key == "replica" || key == "task") {
      if (!parse_index(rest, n)) return bad("bad " + key + " number");
      if (n != 0) {
        throw InvalidArgumentError("device '" + original + "': " + key + " " + std::to_string(n) +
                                   " is another process; only replica:0/task:0 is local");
      }
    } else {
      std::string dev_type = key;
      if (key == "device") {
        const std::size_t c2 = rest.find(':');
        if (c2 == std::string_view::npos) return bad("'device:' needs TYPE:INDEX");
        dev_type = lower(rest.substr(0, c2));
        rest = rest.substr(c2 + 1);
      }
      if (!parse_index(rest, n)) return bad("'" + std::string(rest) + "' is not a device index");
      if (dev_type == "gpu") {
        throw InvalidArgumentError("device '" + original +
                                   "': this build of distribute has no GPU support (it was built without CUDA); "
                                   "use CPU devices (\"CPU:0\", \"CPU:1\", ...)");
      }
      if (dev_type != "cpu") return bad("unknown device type '" + dev_type + "'");
      type = "CPU";
      index = n;
    }
  }
  if (type.empty()) return bad("no device type and index");
  return "/job:localhost/replica:0/task:0/device:" + type + ":" + std::to_string(index);
}

namespace {
std::vector<std::string> canonical_devices(const std::vector<std::string>& devices) {
  if (devices.empty()) {
    throw InvalidArgumentError("Got an empty `devices` list and unable to recognize any local devices.");
  }
  std::vector<std::string> out;
  for (const auto& d : devices) out.push_back(canonical_device_name(d));
  std::vector<std::string> sorted = out;
  std::sort(sorted.begin(), sorted.end());
  const auto dup = std::adjacent_find(sorted.begin(), sorted.end());
  if (dup != sorted.end()) {
    std::string list;
    for (const auto& d : devices) list += (list.empty() ? "" : ", ") + d;
    throw InvalidArgumentError("No duplicates allowed in `devices` argument: [" + list + "] names " + *dup +
                               " twice");
  }
  return out;
}

std::vector<std::string> all_cpus() {
  const unsigned n = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::string> devices;
  for (unsigned i = 0; i < n; ++i) devices.push_back("CPU:" + std::to_string(i));
  return devices;
}
}  // namespace

DefaultStrategy::DefaultStrategy() : Strategy({std::string(kHostDevice)}, 1, 0, {}) {}

Strategy& default_strategy() {
  static DefaultStrategy* instance = new DefaultStrategy();  // never destroyed: threads may use it at exit
  return *instance;
}

bool is_default_strategy(const Strategy& s) { return &s == &default_strategy(); }

OneDeviceStrategy::OneDeviceStrategy(const std::string& device, CommunicationOptions options)
    : Strategy({canonical_device_name(device)}, 1, 0, std::move(options)) {}

MirroredStrategy::MirroredStrategy() : MirroredStrategy(all_cpus()) {}

MirroredStrategy::MirroredStrategy(const std::vector<std::string>& devices, CommunicationOptions options)
    : Strategy(canonical_devices(devices), static_cast<int>(devices.size()), 0, std::move(options)) {}

}  // namespace distribute
