#include "testing/hang_watchdog.h"

#include <cxxabi.h>
#include <dirent.h>
#include <dlfcn.h>
#include <execinfo.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace distribute::testing {
namespace {

constexpr int kMaxFrames = 64;

// One thread at a time is asked for its stack. The handler only calls
// backtrace() into this buffer (warmed up at install, so it does not
// allocate); naming the frames happens later on the watchdog's own thread.
std::atomic<pid_t> g_asked{0};
void* g_frames[kMaxFrames];
std::atomic<int> g_frame_count{-1};

pid_t current_tid() { return static_cast<pid_t>(::syscall(SYS_gettid)); }

int dump_signal() { return SIGRTMIN + 6; }

void record_stack(int) {
  const int saved_errno = errno;
  if (g_asked.load() == current_tid()) g_frame_count.store(::backtrace(g_frames, kMaxFrames));
  errno = saved_errno;
}

std::string demangle(const char* symbol) {
  int status = 0;
  char* name = abi::__cxa_demangle(symbol, nullptr, nullptr, &status);
  std::string out = status == 0 && name != nullptr ? name : symbol;
  std::free(name);
  return out;
}

std::string thread_name(pid_t tid) {
  std::ifstream comm("/proc/self/task/" + std::to_string(tid) + "/comm");
  std::string name;
  std::getline(comm, name);
  return name;
}

std::vector<pid_t> thread_ids() {
  std::vector<pid_t> ids;
  if (DIR* dir = ::opendir("/proc/self/task")) {
    while (const dirent* entry = ::readdir(dir)) {
      if (entry->d_name[0] != '.') ids.push_back(static_cast<pid_t>(std::atoi(entry->d_name)));
    }
    ::closedir(dir);
  }
  std::sort(ids.begin(), ids.end());
  return ids;
}

// Names frames with addr2line (function, file and line, static functions
// too), module by module; falls back to the dynamic symbol or module+offset.
std::vector<std::string> describe_frames(const std::vector<void*>& frames) {
  // The test program's frames: dladdr names it as it was started, which may
  // be a relative path; /proc/self/exe in addr2line would be addr2line.
  Dl_info self{};
  ::dladdr(reinterpret_cast<void*>(&describe_frames), &self);
  char program[4096] = {};
  if (::readlink("/proc/self/exe", program, sizeof program - 1) < 0) program[0] = '\0';
  std::vector<std::string> out(frames.size());
  std::map<std::string, std::vector<std::size_t>> by_module;
  std::vector<std::uintptr_t> offsets(frames.size(), 0);
  for (std::size_t i = 0; i < frames.size(); ++i) {
    Dl_info info{};
    if (::dladdr(frames[i], &info) == 0 || info.dli_fname == nullptr) {
      out[i] = "?? " + std::to_string(reinterpret_cast<std::uintptr_t>(frames[i]));
      continue;
    }
    // A return address points after its call: step back into the call.
    offsets[i] = reinterpret_cast<std::uintptr_t>(frames[i]) - reinterpret_cast<std::uintptr_t>(info.dli_fbase) -
                 (i == 0 ? 0 : 1);
    std::string module = info.dli_fbase == self.dli_fbase ? program : info.dli_fname;
    char fallback[64];
    std::snprintf(fallback, sizeof fallback, "+0x%zx", static_cast<std::size_t>(offsets[i]));
    out[i] = (info.dli_sname ? demangle(info.dli_sname) + " in " : std::string()) + module + fallback;
    by_module[module].push_back(i);
  }
  // With -i addr2line adds a line per inlined caller; a 0 address after each
  // frame ("?? ??:0") marks where one frame's lines end.
  for (const auto& [module, indices] : by_module) {
    std::string command = "addr2line -C -f -i -p -e '" + module + "'";
    for (std::size_t i : indices) {
      char hex[40];
      std::snprintf(hex, sizeof hex, " 0x%zx 0", static_cast<std::size_t>(offsets[i]));
      command += hex;
    }
    command += " 2>/dev/null";
    FILE* pipe = ::popen(command.c_str(), "r");
    if (pipe == nullptr) continue;
    const auto next_line = [pipe](std::string& text) {
      char line[4096];
      if (std::fgets(line, sizeof line, pipe) == nullptr) return false;
      text = line;
      while (!text.empty() && text.back() == '\n') text.pop_back();
      return true;
    };
    std::string text;
    for (std::size_t i : indices) {
      if (!next_line(text)) break;
      std::string lines = text;
      while (next_line(text) && text != "?? ??:0") lines += "\n        " + text;
      // Without line information (a stripped library) addr2line may name the
      // wrong function; dladdr's dynamic symbol or module+offset is honest.
      const bool no_lines = lines.find('\n') == std::string::npos && lines.ends_with(" at ??:?");
      if (lines.rfind("??", 0) != 0 && !(no_lines && module != program)) out[i] = lines;
    }
    ::pclose(pipe);
  }
  return out;
}

}  // namespace

void dump_every_thread_and_exit(const std::string& what) {
  std::fprintf(stderr,
               "\n*** hang watchdog: %s (pid %d).\n"
               "*** The stack of every thread follows; replica threads are named \"dist replica N\"\n"
               "*** (replica 0 runs on the thread that called Strategy::run).\n",
               what.c_str(), static_cast<int>(::getpid()));
  struct sigaction action {};
  action.sa_handler = record_stack;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  ::sigaction(dump_signal(), &action, nullptr);
  const pid_t me = current_tid();
  for (pid_t tid : thread_ids()) {
    if (tid == me) continue;
    g_frame_count.store(-1);
    g_asked.store(tid);
    ::syscall(SYS_tgkill, ::getpid(), tid, dump_signal());
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (g_frame_count.load() < 0 && std::chrono::steady_clock::now() < give_up) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    g_asked.store(0);
    const int count = g_frame_count.load();
    std::fprintf(stderr, "\n--- thread %d \"%s\"%s\n", static_cast<int>(tid), thread_name(tid).c_str(),
                 tid == ::getpid() ? " (the test's main thread)" : "");
    if (count < 0) {
      std::fprintf(stderr, "    (did not answer within 2 s: the signal is blocked there)\n");
      continue;
    }
    // Frame 0 is record_stack itself.
    const std::vector<void*> frames(g_frames + std::min(count, 1), g_frames + count);
    const std::vector<std::string> names = describe_frames(frames);
    for (std::size_t i = 0; i < names.size(); ++i) std::fprintf(stderr, "    #%zu %s\n", i, names[i].c_str());
  }
  std::fprintf(stderr, "\n*** hang watchdog: failed (hung); exiting.\n");
  std::fflush(stderr);
  std::fflush(stdout);
  ::_exit(1);
}

namespace {

class Watchdog : public ::testing::EmptyTestEventListener {
 public:
  explicit Watchdog(int seconds) : seconds_(seconds), thread_([this] { watch(); }) {}
  ~Watchdog() override { stop(); }

  void OnTestStart(const ::testing::TestInfo& test) override {
    std::lock_guard<std::mutex> lock(mu_);
    test_ = std::string(test.test_suite_name()) + "." + test.name();
    deadline_ = std::chrono::steady_clock::now() + std::chrono::seconds(seconds_);
    armed_ = true;
    cv_.notify_all();
  }
  void OnTestEnd(const ::testing::TestInfo&) override {
    std::lock_guard<std::mutex> lock(mu_);
    armed_ = false;
    cv_.notify_all();
  }
  void OnTestProgramEnd(const ::testing::UnitTest&) override { stop(); }

 private:
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
      cv_.notify_all();
    }
    if (thread_.joinable()) thread_.join();
  }

  void watch() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stopping_) {
      if (!armed_) {
        cv_.wait(lock);
      } else if (cv_.wait_until(lock, deadline_) == std::cv_status::timeout && armed_ && !stopping_ &&
                 std::chrono::steady_clock::now() >= deadline_) {
        dump_every_thread_and_exit(test_ + " is still running after " + std::to_string(seconds_) + " s");
      }
    }
  }

  const int seconds_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::string test_;
  std::chrono::steady_clock::time_point deadline_{};
  bool armed_ = false;
  bool stopping_ = false;
  std::thread thread_;  // last: starts after the state above exists
};

}  // namespace

void install_hang_watchdog(int default_seconds) {
  int seconds = default_seconds;
  if (const char* env = std::getenv("DISTRIBUTE_TEST_WATCHDOG"); env != nullptr && *env != '\0') {
    seconds = std::atoi(env);
  }
  if (seconds <= 0) return;
  void* warm[1];
  ::backtrace(warm, 1);  // loads the unwinder now, not inside the signal handler
  ::testing::UnitTest::GetInstance()->listeners().Append(new Watchdog(seconds));
}

}  // namespace distribute::testing
