#pragma once

#include <filesystem>
#include <map>
#include <stdexcept>
#include <string>

namespace gradfuzz::campaign {

/// The MPS control daemon could not be started (the message names the program and why).
class MpsUnavailable : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A CUDA MPS control daemon of this campaign's own (`--mps`, docs/GPU.md "Many workers on
/// one GPU"): with it the kernels of all worker processes on a GPU run in one hardware
/// context, side by side, instead of time-sliced between one context per process. Its pipe
/// and log directories are a fresh temporary folder, so it neither meets nor stops another
/// daemon of the machine; the workers find it through env(). The MPS server it starts on
/// the first CUDA client goes with it: destruction sends "quit" and removes the folder.
/// Caveat (NVIDIA's MPS documentation): a fatal GPU fault of one client ends the work of
/// every client on that GPU, so one crashing case also fails the cases other workers run.
class MpsDaemon {
 public:
  /// Starts `control -d` (default: nvidia-cuda-mps-control, looked up in PATH). Throws
  /// MpsUnavailable naming the program and what happened when it cannot be started or does
  /// not report a running daemon.
  explicit MpsDaemon(const std::string& control = "nvidia-cuda-mps-control");
  ~MpsDaemon();
  MpsDaemon(const MpsDaemon&) = delete;
  MpsDaemon& operator=(const MpsDaemon&) = delete;

  /// CUDA_MPS_PIPE_DIRECTORY and CUDA_MPS_LOG_DIRECTORY for the clients.
  std::map<std::string, std::string> env() const;

 private:
  std::string control_;
  std::filesystem::path dir_;
};

}  // namespace gradfuzz::campaign
