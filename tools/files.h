#pragma once

#include <cstddef>
#include <filesystem>
#include <string>

namespace gradfuzz::tools {

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

/// Writes `text` to `path` atomically (a temporary file in the same directory, then rename)
/// without fsync: after the writing process dies, `path` holds either nothing or the whole
/// text (the page cache survives the process), though not necessarily after a power loss.
/// Creates the directory. Throws std::runtime_error naming the file when the system refuses.
void write_file_atomic_no_sync(const std::filesystem::path& path, const std::string& text);

/// Number of regular files directly in `dir` (0 when it does not exist).
size_t count_regular_files(const std::filesystem::path& dir);

}  // namespace gradfuzz::tools
