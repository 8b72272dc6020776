#include "campaign/files.h"

#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace gradfuzz::campaign {

namespace {

int remove_entry(const char* path, const struct stat*, int, struct FTW*) {
  std::remove(path);  // failures ignored: best-effort cleanup
  return 0;
}

}  // namespace

void remove_tree(const std::filesystem::path& path) noexcept {
  // FTW_DEPTH: children before their directory; FTW_PHYS: never follow symlinks out of the tree.
  ::nftw(path.c_str(), remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

void remove_file(const std::filesystem::path& path) noexcept { ::unlink(path.c_str()); }

std::filesystem::path make_temp_dir(const std::string& prefix) {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/" + prefix + "XXXXXX";
  std::vector<char> buffer(pattern.begin(), pattern.end());
  buffer.push_back('\0');
  if (!::mkdtemp(buffer.data())) {
    throw std::runtime_error("cannot create temporary directory " + pattern + ": " + std::strerror(errno));
  }
  return std::filesystem::path(buffer.data());
}

void make_directories(const std::filesystem::path& dir) {
  struct stat info {};
  if (dir.empty() || (::stat(dir.c_str(), &info) == 0 && S_ISDIR(info.st_mode))) return;
  const std::filesystem::path parent = dir.parent_path();
  if (!parent.empty() && parent != dir) make_directories(parent);
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    throw std::runtime_error("cannot create directory " + dir.string() + ": " + std::strerror(errno));
  }
}

InflightFile::InflightFile(std::filesystem::path path) : path_(std::move(path)) {
  make_directories(path_.parent_path());
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw std::runtime_error("cannot write " + path_.string() + ": " + std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    throw std::runtime_error("cannot lock " + path_.string() + ": " + std::strerror(errno));
  }
}

InflightFile::~InflightFile() {
  if (fd_ >= 0) ::close(fd_);
}

void InflightFile::write(const std::string& text) {
  std::string padded = text;
  if (padded.size() < length_) padded.append(length_ - padded.size(), ' ');
  size_t written = 0;
  while (written < padded.size()) {
    const ssize_t n = ::pwrite(fd_, padded.data() + written, padded.size() - written, static_cast<off_t>(written));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw std::runtime_error("cannot write " + path_.string() + ": " + std::strerror(errno));
    written += static_cast<size_t>(n);
  }
  length_ = padded.size();
}

void InflightFile::remove() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  ::unlink(path_.c_str());
}

bool owner_is_gone(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool gone = ::flock(fd, LOCK_EX | LOCK_NB) == 0;
  ::close(fd);  // releases the lock, if taken
  return gone;
}

std::vector<std::filesystem::path> regular_files(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> out;
  DIR* handle = ::opendir(dir.c_str());
  if (!handle) return out;
  while (const dirent* entry = ::readdir(handle)) {
    struct stat info {};
    const std::filesystem::path child = dir / entry->d_name;
    if (::stat(child.c_str(), &info) == 0 && S_ISREG(info.st_mode)) out.push_back(child);
  }
  ::closedir(handle);
  std::sort(out.begin(), out.end());
  return out;
}

size_t count_regular_files(const std::filesystem::path& dir) {
  DIR* handle = ::opendir(dir.c_str());
  if (!handle) return 0;
  size_t n = 0;
  while (const dirent* entry = ::readdir(handle)) {
    struct stat info {};
    const std::filesystem::path child = dir / entry->d_name;
    if (::stat(child.c_str(), &info) == 0 && S_ISREG(info.st_mode)) ++n;
  }
  ::closedir(handle);
  return n;
}

}  // namespace gradfuzz::campaign
