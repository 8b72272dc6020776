#pragma once

#include <stdexcept>
#include <string>

namespace gradfuzz::campaign {

/// Exit status of every gradfuzz command (fuzzer.md "Command line").
enum class ExitCode : int {
  kOk = 0,        // no finding
  kFindings = 1,  // at least one failing case
  kUsage = 2,     // bad flags or unusable input (malformed case file, unknown name, missing CUDA)
  kInternal = 3,  // a bug in gradfuzz (internal assertion, unexpected exception)
};

/// Usage or input problem: the CLI prints the message and exits with ExitCode::kUsage.
/// Messages name the file and, for case files, the JSON path of the problem.
class InputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A failure inside gradfuzz itself (ExitCode::kInternal); `repro` is the case file left on
/// disk for it, when there is one.
class InternalError : public std::runtime_error {
 public:
  InternalError(const std::string& message, std::string repro)
      : std::runtime_error(message), repro_(std::move(repro)) {}
  const std::string& repro() const { return repro_; }

 private:
  std::string repro_;
};

}  // namespace gradfuzz::campaign
