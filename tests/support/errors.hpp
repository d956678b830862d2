// Errors for the tests.
#pragma once

#include <system_error>

namespace hivemesh::test {

/// The code of the std::system_error that `f()` throws, or no error if it throws none.
template <class F>
std::error_code thrown_code(F&& f) {
    try {
        f();
    } catch (const std::system_error& e) {
        return e.code();
    }
    return {};
}

} // namespace hivemesh::test
