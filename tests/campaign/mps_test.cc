// --mps: the worker pool's own CUDA MPS control daemon, with a stand-in control program that
// logs how it is called (this machine has no GPU and no MPS).
#include "campaign/mps.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "campaign/files.h"
#include "campaign/worker_pool.h"
#include "tools/cli.h"

namespace gradfuzz::campaign {
namespace {

using ::testing::HasSubstr;

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

class Mps : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = make_temp_dir("gradfuzz-mps-test-");
    log_ = dir_ / "control.log";
    control_ = (dir_ / "control").string();
    // Logs each call (its arguments, the pipe directory and whether it exists, what came on
    // stdin); "-d" returns at once as the real daemon's foreground does.
    std::ofstream(control_) << "#!/bin/sh\n"
                            << "echo \"call $* pipe=$CUDA_MPS_PIPE_DIRECTORY\" >> " << log_.string() << "\n"
                            << "[ -d \"$CUDA_MPS_PIPE_DIRECTORY\" ] && echo pipe-exists >> " << log_.string() << "\n"
                            << "[ \"$1\" = -d ] && exit 0\n"
                            << "cat >> " << log_.string() << "\n";
    ::chmod(control_.c_str(), 0755);
  }
  void TearDown() override { remove_tree(dir_); }

  std::filesystem::path dir_;
  std::filesystem::path log_;
  std::string control_;
};

TEST_F(Mps, TheDaemonStartsWithAPipeDirectoryOfItsOwnAndQuitsWhenDestroyed) {
  std::string pipe;
  {
    MpsDaemon daemon(control_);
    pipe = daemon.env().at("CUDA_MPS_PIPE_DIRECTORY");
    EXPECT_TRUE(std::filesystem::is_directory(pipe));
    EXPECT_TRUE(std::filesystem::is_directory(daemon.env().at("CUDA_MPS_LOG_DIRECTORY")));
    EXPECT_EQ(read_file(log_), "call -d pipe=" + pipe + "\npipe-exists\n");
  }
  EXPECT_EQ(read_file(log_), "call -d pipe=" + pipe + "\npipe-exists\ncall  pipe=" + pipe + "\npipe-exists\nquit\n");
  EXPECT_FALSE(std::filesystem::exists(pipe));  // the folder goes with it
}

TEST_F(Mps, AControlProgramThatFailsOrIsMissingIsAnErrorNamingIt) {
  std::ofstream(control_) << "#!/bin/sh\necho 'An MPS daemon is already running' >&2\nexit 3\n";
  try {
    MpsDaemon daemon(control_);
    FAIL() << "started";
  } catch (const MpsUnavailable& e) {
    EXPECT_THAT(e.what(), HasSubstr(control_ + " -d"));
    EXPECT_THAT(e.what(), HasSubstr("exited with status 3"));
    EXPECT_THAT(e.what(), HasSubstr("already running"));
  }
  EXPECT_THROW(MpsDaemon((dir_ / "no-such-program").string()), MpsUnavailable);
}

TEST_F(Mps, ThePoolsWorkersFindTheDaemonAndItStopsAfterThem) {
  WorkerPoolOptions options;
  options.workers = 2;
  options.backend.name = "model";
  options.mps = true;
  options.mps_control = control_;
  {
    WorkerPool pool(options);
    const std::string log = read_file(log_);
    ASSERT_THAT(log, HasSubstr("call -d pipe="));
    const std::string pipe = log.substr(log.find("pipe=") + 5, log.find('\n') - log.find("pipe=") - 5);
    for (int pid : pool.worker_pids()) {
      std::string environ = read_file("/proc/" + std::to_string(pid) + "/environ");
      std::replace(environ.begin(), environ.end(), '\0', '\n');
      EXPECT_THAT(environ, HasSubstr("CUDA_MPS_PIPE_DIRECTORY=" + pipe + "\n")) << "worker " << pid;
    }
    EXPECT_THAT(read_file(log_), ::testing::Not(HasSubstr("quit")));
  }
  EXPECT_THAT(read_file(log_), HasSubstr("quit\n"));
}

TEST_F(Mps, TheFlagNeedsWorkerProcessesAndNoSanitizer) {
  std::ostringstream out;
  std::ostringstream err;
  EXPECT_EQ(tools::run_cli({"fuzz", "--mps", "--workers", "0", "--cases", "1", "--corpus", (dir_ / "c").string()}, out,
                           err, /*terminal=*/false),
            2);
  EXPECT_THAT(err.str(), HasSubstr("--mps: shares a GPU among worker processes"));
  err.str("");
  EXPECT_EQ(tools::run_cli({"fuzz", "--mps", "--sanitize", "memcheck", "--workers", "1", "--cases", "1", "--corpus",
                            (dir_ / "c").string()},
                           out, err, /*terminal=*/false),
            2);
  EXPECT_THAT(err.str(), HasSubstr("--mps: compute-sanitizer does not run under MPS"));
}

}  // namespace
}  // namespace gradfuzz::campaign
