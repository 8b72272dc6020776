#include "campaign/mps.h"

#include <chrono>
#include <stdexcept>
#include <thread>

#include "backends/process.h"
#include "campaign/files.h"

namespace gradfuzz::campaign {

namespace {

/// Runs `argv` with `env` added and waits for it (at most `timeout_s`); "" when it exited
/// with status 0, else how it ended and what it wrote to stderr.
std::string run_to_end(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
                       double timeout_s) {
  backends::ChildProcess::Options options;
  options.argv = argv;
  options.env = env;
  backends::ChildProcess child(options);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (child.running()) {
    if (std::chrono::steady_clock::now() > deadline) {
      return "did not exit within " + std::to_string(static_cast<int>(timeout_s)) + " s (" + child.terminate() + ")";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (child.exit_description() == "exited with status 0") return "";
  const std::string tail = child.stderr_tail();
  return child.exit_description() + (tail.empty() ? std::string() : ": " + tail);
}

}  // namespace

MpsDaemon::MpsDaemon(const std::string& control) : control_(control), dir_(make_temp_dir("gradfuzz-mps-")) {
  std::filesystem::create_directories(dir_ / "pipe");
  std::filesystem::create_directories(dir_ / "log");
  std::string failure;
  try {
    // -d: the control daemon forks into the background; this process exits once it runs.
    failure = run_to_end({control_, "-d"}, env(), 30);
  } catch (const std::exception& e) {
    failure = e.what();
  }
  if (!failure.empty()) {
    remove_tree(dir_);
    throw MpsUnavailable("--mps: cannot start the CUDA MPS control daemon (" + control_ + " -d): " + failure);
  }
}

MpsDaemon::~MpsDaemon() {
  try {
    // The control program reads commands from stdin; "quit" stops the daemon and its servers.
    run_to_end({"/bin/sh", "-c", "echo quit | \"$0\"", control_}, env(), 30);
  } catch (const std::exception&) {
    // Nothing more to do: the daemon's folder goes either way.
  }
  remove_tree(dir_);
}

std::map<std::string, std::string> MpsDaemon::env() const {
  return {{"CUDA_MPS_PIPE_DIRECTORY", (dir_ / "pipe").string()}, {"CUDA_MPS_LOG_DIRECTORY", (dir_ / "log").string()}};
}

}  // namespace gradfuzz::campaign
