#include "backends/process.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

extern char** environ;

namespace gradfuzz::backends {

namespace {

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

/// An unlinked temporary file opened for appending: the child writes at the end even after
/// the parent truncates it.
int make_stderr_file() {
  const char* dir = std::getenv("TMPDIR");
  std::string path = std::string(dir && *dir ? dir : "/tmp") + "/gradfuzz-stderr-XXXXXX";
  const int fd = ::mkstemp(path.data());
  if (fd < 0) throw std::runtime_error("cannot create a temporary file for a child's stderr in " + path);
  ::unlink(path.c_str());
  const int flags = ::fcntl(fd, F_GETFL);
  ::fcntl(fd, F_SETFL, flags | O_APPEND);
  ::fcntl(fd, F_SETFD, FD_CLOEXEC);
  return fd;
}

}  // namespace

std::string describe_wait_status(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* name = ::strsignal(sig);
    return "killed by signal " + std::to_string(sig) + " (" + (name ? name : "?") + ")";
  }
  return "ended with wait status " + std::to_string(status);
}

ChildProcess::ChildProcess(const Options& options) : group_(options.new_process_group) {
  if (options.argv.empty()) throw std::invalid_argument("ChildProcess: empty argv");
  int in_pipe[2];
  int out_pipe[2];
  if (::pipe2(in_pipe, O_CLOEXEC) != 0) throw std::runtime_error("pipe: " + std::string(std::strerror(errno)));
  if (::pipe2(out_pipe, O_CLOEXEC) != 0) {
    ::close(in_pipe[0]);
    ::close(in_pipe[1]);
    throw std::runtime_error("pipe: " + std::string(std::strerror(errno)));
  }
  stderr_file_ = make_stderr_file();

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in_pipe[0], 0);
  posix_spawn_file_actions_adddup2(&actions, out_pipe[1], 1);
  posix_spawn_file_actions_adddup2(&actions, stderr_file_, 2);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  short flags = POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK;
  if (group_) {
    flags |= POSIX_SPAWN_SETPGROUP;
    posix_spawnattr_setpgroup(&attr, 0);
  }
  posix_spawnattr_setflags(&attr, flags);
  // The child starts with default dispositions (the parent ignores SIGPIPE) and no blocked
  // signals.
  sigset_t all;
  sigset_t none;
  sigfillset(&all);
  sigemptyset(&none);
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setsigmask(&attr, &none);

  std::map<std::string, std::string> env;
  for (char** e = environ; e && *e; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (eq) env[std::string(*e, static_cast<size_t>(eq - *e))] = eq + 1;
  }
  for (const auto& [k, v] : options.env) env[k] = v;
  std::vector<std::string> env_text;
  for (const auto& [k, v] : env) env_text.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (auto& s : env_text) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = options.argv;
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  const int rc = ::posix_spawnp(&pid_, argv[0], &actions, &attr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  ::close(in_pipe[0]);
  ::close(out_pipe[1]);
  if (rc != 0) {
    ::close(in_pipe[1]);
    ::close(out_pipe[0]);
    close_fd(stderr_file_);
    pid_ = -1;
    throw std::runtime_error("cannot start '" + options.argv[0] + "': " + std::strerror(rc));
  }
  stdin_fd_ = in_pipe[1];
  stdout_fd_ = out_pipe[0];
}

ChildProcess::~ChildProcess() {
  if (pid_ > 0 && exit_description_.empty()) terminate();
  close_fd(stdin_fd_);
  close_fd(stdout_fd_);
  close_fd(stderr_file_);
}

void ChildProcess::reap(bool block) {
  if (pid_ <= 0 || !exit_description_.empty()) return;
  int status = 0;
  pid_t r;
  do {
    r = ::waitpid(pid_, &status, block ? 0 : WNOHANG);
  } while (r < 0 && errno == EINTR);
  if (r == pid_) exit_description_ = describe_wait_status(status);
  if (r < 0) exit_description_ = "could not be waited for: " + std::string(std::strerror(errno));
}

bool ChildProcess::running() {
  reap(false);
  return pid_ > 0 && exit_description_.empty();
}

void ChildProcess::kill(int signal) {
  if (pid_ <= 0) return;
  // Killing the group also takes what the child started (a worker's adapter); the group
  // outlives a dead leader, so this holds after the child itself exited.
  if (group_) ::kill(-pid_, signal);
  if (exit_description_.empty()) ::kill(pid_, signal);
}

std::string ChildProcess::terminate() {
  kill(SIGKILL);
  close_fd(stdin_fd_);
  reap(true);
  return exit_description_;
}

std::string ChildProcess::stderr_tail(size_t max_bytes) const {
  if (stderr_file_ < 0) return "";
  struct stat st {};
  if (::fstat(stderr_file_, &st) != 0 || st.st_size <= 0) return "";
  const off_t size = st.st_size;
  const off_t start = size > static_cast<off_t>(max_bytes) ? size - static_cast<off_t>(max_bytes) : 0;
  std::string text(static_cast<size_t>(size - start), '\0');
  const ssize_t n = ::pread(stderr_file_, text.data(), text.size(), start);
  text.resize(n > 0 ? static_cast<size_t>(n) : 0);
  return text;
}

void ChildProcess::clear_stderr() {
  if (stderr_file_ >= 0) {
    if (::ftruncate(stderr_file_, 0) != 0) {
      // Best effort: a tail that also shows older output is still useful.
    }
  }
}

}  // namespace gradfuzz::backends
