// Running the test process out of file descriptors, and giving them back.
#pragma once

#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

namespace hivemesh::test {

/// Leaves the process no free descriptor: take_all() fills every free descriptor number up
/// to the highest in use, then lowers the soft limit past it; release() (or the
/// destructor) undoes both.
struct descriptor_squeeze {
    rlimit before{};
    bool saved = ::getrlimit(RLIMIT_NOFILE, &before) == 0;
    std::vector<int> fillers;

    void take_all() {
        REQUIRE(saved);
        int highest = 0;
        for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd"))
            highest = std::max(highest, std::stoi(entry.path().filename().string()));
        while (true) {
            const int fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
            REQUIRE(fd >= 0);
            fillers.push_back(fd);
            if (fd >= highest) break;
        }
        rlimit tight = before;
        tight.rlim_cur = static_cast<rlim_t>(fillers.back()) + 1;
        REQUIRE(::setrlimit(RLIMIT_NOFILE, &tight) == 0);
        REQUIRE(::open("/dev/null", O_RDONLY | O_CLOEXEC) == -1);
    }
    void release() {
        if (saved) ::setrlimit(RLIMIT_NOFILE, &before);
        for (int fd : fillers)
            ::close(fd);
        fillers.clear();
    }
    ~descriptor_squeeze() { release(); }
};

} // namespace hivemesh::test
