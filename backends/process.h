#pragma once

#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

namespace gradfuzz::backends {

/// A child process with pipes to its stdin and stdout; its stderr goes to an unlinked
/// temporary file (so a chatty child never blocks on a full pipe) whose recent content
/// stderr_tail() reads. Used for the Python adapter and for campaign workers.
class ChildProcess {
 public:
  struct Options {
    /// argv[0] is looked up in PATH when it has no slash.
    std::vector<std::string> argv;
    /// Added to (or replacing in) the inherited environment.
    std::map<std::string, std::string> env;
    /// Start a new process group (the child and everything it starts can be killed at once).
    bool new_process_group = false;
  };

  /// Spawns the child (posix_spawn: safe in a multi-threaded parent). Throws
  /// std::runtime_error naming the program when it cannot be started.
  explicit ChildProcess(const Options& options);
  /// Kills (SIGKILL, the whole group when it has its own) and reaps the child.
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  int stdin_fd() const { return stdin_fd_; }
  int stdout_fd() const { return stdout_fd_; }

  /// Whether the child has not exited yet (reaps it if it has).
  bool running();
  /// Sends `signal` to the child (to its process group when it has one).
  void kill(int signal);
  /// Kills the child and reaps it; returns a description: "exited with status 3",
  /// "killed by signal 11 (Segmentation fault)".
  std::string terminate();
  /// How the child ended, once it has ("" while running).
  const std::string& exit_description() const { return exit_description_; }
  /// The last `max_bytes` of what the child wrote to stderr since the last clear_stderr().
  std::string stderr_tail(size_t max_bytes = 4096) const;
  /// Forgets the stderr written so far (before each case, so a crash shows that case's).
  void clear_stderr();

 private:
  void reap(bool block);

  pid_t pid_ = -1;
  bool group_ = false;
  int stdin_fd_ = -1;
  int stdout_fd_ = -1;
  int stderr_file_ = -1;
  std::string exit_description_;
};

/// "exited with status N" or "killed by signal N (name)" for a waitpid status.
std::string describe_wait_status(int status);

}  // namespace gradfuzz::backends
