// The bodies of core/file.hpp.
#pragma once

#include "hivemesh/core/error.hpp"
#include "hivemesh/core/file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <random>
#include <string>

namespace hivemesh {

HIVEMESH_DECL std::error_code write_all(int fd, const void* data, std::size_t size) noexcept {
    const auto* bytes = static_cast<const unsigned char*>(data);
    while (size > 0) {
        const ssize_t n = ::write(fd, bytes, size);
        if (n < 0) {
            if (errno == EINTR) continue;
            return last_system_error();
        }
        bytes += n;
        size -= static_cast<std::size_t>(n);
    }
    return {};
}

HIVEMESH_DECL std::size_t read_up_to(int fd, std::span<std::byte> buffer,
                                     std::error_code& ec) noexcept {
    std::size_t total = 0;
    while (total < buffer.size()) {
        const ssize_t n = ::read(fd, buffer.data() + total, buffer.size() - total);
        if (n < 0) {
            if (errno == EINTR) continue;
            ec = last_system_error();
            return total;
        }
        if (n == 0) break;
        total += static_cast<std::size_t>(n);
    }
    return total;
}

HIVEMESH_DECL void sync_directory_of(const std::filesystem::path& path) noexcept {
    const auto directory = path.has_parent_path() ? path.parent_path() : ".";
    file_descriptor dir(::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (dir.fd >= 0) ::fsync(dir.fd);
}

HIVEMESH_DECL std::error_code replace_file(const std::filesystem::path& path, byte_view content) {
    std::filesystem::path temporary = path;
    temporary +=
        ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(std::random_device{}());
    std::error_code ec;
    {
        file_descriptor file(
            ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644));
        if (file.fd < 0) return last_system_error();
        ec = write_all(file.fd, content.data(), content.size());
        if (!ec && ::fsync(file.fd) != 0) ec = last_system_error();
    }
    if (!ec && ::rename(temporary.c_str(), path.c_str()) != 0) ec = last_system_error();
    if (ec) {
        ::unlink(temporary.c_str());
        return ec;
    }
    sync_directory_of(path);
    return {};
}

HIVEMESH_DECL byte_buffer read_file(const std::filesystem::path& path, std::size_t max_size,
                                    std::error_code& ec) {
    ec.clear();
    file_descriptor file(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (file.fd < 0) {
        ec = last_system_error();
        return {};
    }
    struct stat info {};
    if (::fstat(file.fd, &info) != 0) {
        ec = last_system_error();
        return {};
    }
    if (!S_ISREG(info.st_mode)) {
        ec = std::make_error_code(std::errc::invalid_argument);
        return {};
    }
    if (static_cast<std::uintmax_t>(info.st_size) > max_size) {
        ec = errc::length_limit_exceeded;
        return {};
    }
    // One byte more than its size, to notice a file that grew since fstat.
    byte_buffer content(static_cast<std::size_t>(info.st_size) + 1);
    const std::size_t got = read_up_to(file.fd, content, ec);
    if (ec) return {};
    if (got != static_cast<std::size_t>(info.st_size)) { // it changed while we read it
        ec = std::make_error_code(std::errc::io_error);
        return {};
    }
    content.resize(got);
    return content;
}

} // namespace hivemesh
