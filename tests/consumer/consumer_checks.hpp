// What both consumer programs check (add_subdirectory/main.cpp, find_package/main.cpp): the
// usage requirements hivemesh::hivemesh carries and the dependencies it brings. Each
// main.cpp adds its own checks with check() and returns finish().
#pragma once

// hivemesh::hivemesh (or hivemesh.pc) must bring its dependencies' headers and libraries.
#include <asio/version.hpp>
#include <sodium.h>
#include <xxhash.h>
#include <zstd.h>

#include <cstdio>

static_assert(__cplusplus >= 202002L, "hivemesh's usage requirements must ask for C++20");
#ifndef ASIO_STANDALONE
#error "hivemesh's usage requirements must define ASIO_STANDALONE"
#endif

namespace consumer {

inline int failures = 0;

inline void check(bool ok, const char* what) {
    if (!ok) {
        std::fprintf(stderr, "FAILED: %s\n", what);
        ++failures;
    }
}

/// The dependencies link and are recent enough.
inline void check_dependencies() {
    check(sodium_init() >= 0, "libsodium links and initialises");
    check(XXH64("", 0, 0) == 0xEF46DB3751D8E999ULL, "xxHash links");
    check(ZSTD_versionNumber() >= 10400, "zstd links");
    check(ASIO_VERSION >= 101800, "Asio is at least 1.18");
}

/// main()'s result: prints "hivemesh consumer: ok" and gives 0 when every check passed.
inline int finish() {
    if (failures != 0) return 1;
    std::puts("hivemesh consumer: ok");
    return 0;
}

} // namespace consumer
