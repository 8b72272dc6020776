#pragma once

#include <cstddef>
#include <filesystem>
#include <string>
#include <vector>

namespace gradfuzz::campaign {

// File-system helpers on POSIX calls. std::filesystem's free functions are avoided (only
// std::filesystem::path is used, as a value): the LibTorch 2.11 PyPI wheel's libtorch.so
// exports its own copies of them (remove_all, create_directories, status, ...), the dynamic
// linker may bind those instead of libstdc++'s, and some crash (remove_all on a non-empty
// directory calls through a null pointer).

/// Removes `path` and everything below it; missing paths and failures are ignored.
void remove_tree(const std::filesystem::path& path) noexcept;

/// Removes one file; a missing file and failures are ignored.
void remove_file(const std::filesystem::path& path) noexcept;

/// Creates a fresh, empty directory $TMPDIR/<prefix>XXXXXX (mkdtemp; /tmp without TMPDIR).
/// Throws std::runtime_error naming the template when the system refuses.
std::filesystem::path make_temp_dir(const std::string& prefix);

/// mkdir -p. Throws std::runtime_error naming the directory when the system refuses.
void make_directories(const std::filesystem::path& dir);

/// The case a campaign is running, in one file per process that every case overwrites in
/// place. A crash of the process running a case must leave that case on disk; a new file per
/// case (temporary file, rename, unlink) did that too, but ext4's inode allocation made those
/// three calls cost as much as running the case. Here each case is one pwrite at offset 0 of
/// the whole JSON document padded with spaces to the longest document written so far, so the
/// file holds exactly one complete, parseable case (JSON allows trailing whitespace) before
/// and after every write; a process that dies after the write returned leaves it in the page
/// cache. Durability against power loss is not the point: findings are written with fsync.
class InflightFile {
 public:
  /// Creates the directory, opens (creates) the file and takes an exclusive lock on it for
  /// the object's lifetime (the kernel drops it when the process dies: owner_is_gone()).
  /// Throws std::runtime_error naming the file when the system refuses.
  explicit InflightFile(std::filesystem::path path);
  ~InflightFile();
  InflightFile(const InflightFile&) = delete;
  InflightFile& operator=(const InflightFile&) = delete;

  /// Replaces the file's content with `text` in one write. Throws std::runtime_error.
  void write(const std::string& text);
  /// Closes and deletes the file: the campaign ended without a case killing it.
  void remove() noexcept;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  int fd_ = -1;
  size_t length_ = 0;
};

/// Whether no live process holds the lock of the in-flight file at `path` (its owner ended).
/// False when the file cannot be opened.
bool owner_is_gone(const std::filesystem::path& path);

/// Regular files directly in `dir`, sorted by name (none when it does not exist).
std::vector<std::filesystem::path> regular_files(const std::filesystem::path& dir);

/// Number of regular files directly in `dir` (0 when it does not exist).
size_t count_regular_files(const std::filesystem::path& dir);

}  // namespace gradfuzz::campaign
