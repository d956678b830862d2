// Files: a descriptor that closes itself, whole reads and writes that retry interrupted calls,
// and replacing a file atomically, for the identity files and checkpoints (POSIX).
#pragma once

#include "hivemesh/core/bytes.hpp"
#include "hivemesh/core/config.hpp"

#include <cerrno>
#include <cstddef>
#include <filesystem>
#include <span>
#include <system_error>
#include <unistd.h>

namespace hivemesh {

/// errno as a std::error_code of the system category.
inline std::error_code last_system_error() noexcept {
    return {errno, std::system_category()};
}

/// Closes a file descriptor when it goes out of scope.
struct file_descriptor {
    int fd = -1;
    explicit file_descriptor(int descriptor) noexcept
        : fd(descriptor) {}
    file_descriptor(const file_descriptor&) = delete;
    file_descriptor& operator=(const file_descriptor&) = delete;
    ~file_descriptor() {
        if (fd >= 0) ::close(fd);
    }
};

/// Writes all `size` bytes, retrying interrupted and short writes.
HIVEMESH_DECL std::error_code write_all(int fd, const void* data, std::size_t size) noexcept;

/// Reads at most `buffer.size()` bytes; returns how many were read (fewer only at the end of
/// the file or on an error, which is set in `ec`).
HIVEMESH_DECL std::size_t read_up_to(int fd, std::span<std::byte> buffer,
                                     std::error_code& ec) noexcept;

/// fsyncs the directory holding `path`, so that a new entry in it survives a crash; best
/// effort (a failure loses nothing the caller relies on).
HIVEMESH_DECL void sync_directory_of(const std::filesystem::path& path) noexcept;

/// Replaces the file at `path` with `content` so that a crash at any moment leaves either the
/// old file or the new one whole: writes a temporary file beside it (mode 0644, less the
/// umask), fsyncs it, renames it over `path` and fsyncs the directory. Returns the system's
/// error (then `path` is unchanged and no temporary file is left).
HIVEMESH_DECL std::error_code replace_file(const std::filesystem::path& path, byte_view content);

/// The whole content of the file at `path`, or the system's error; a file larger than
/// `max_size` bytes gives errc::length_limit_exceeded without being read.
HIVEMESH_DECL byte_buffer read_file(const std::filesystem::path& path, std::size_t max_size,
                                    std::error_code& ec);

} // namespace hivemesh

#if !defined(HIVEMESH_SEPARATE_COMPILATION)
#include "hivemesh/core/impl/file.ipp"
#endif
