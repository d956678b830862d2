// What the benchmark and example programs share: their command lines are CLI11's and their
// JSON reports nlohmann::json's (CMake target hivemesh_programs; never the library's).
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <string>

namespace hivemesh::program {

/// Ends the program once CLI11 refused the command line or was asked for help: CLI11 prints
/// the help (status 0) or its message and a pointer to --help (status 2, the status of a usage
/// error in these programs).
[[noreturn]] inline void exit_after(const CLI::App& app, const CLI::ParseError& error) {
    std::exit(app.exit(error) == 0 ? 0 : 2);
}

/// A CLI11 check that a number is finite and above zero, or with `zero_too` at least zero.
/// CLI11 alone lets NaN through CLI::PositiveNumber and turns "-1" into the largest
/// std::size_t; text that is no number is left to its conversion to refuse.
inline CLI::Validator finite_sign_check(bool zero_too) {
    return CLI::Validator(
        [zero_too](std::string& text) -> std::string {
            char* end = nullptr;
            const double value = std::strtod(text.c_str(), &end);
            if (end == text.c_str()) return {};
            if (!std::isfinite(value)) return "Value " + text + " is not a finite number";
            if (value < 0 || (value == 0 && !zero_too))
                return "Value " + text + (zero_too ? " is negative" : " is not above 0");
            return {};
        },
        zero_too ? "NONNEGATIVE" : "POSITIVE");
}
inline const CLI::Validator positive = finite_sign_check(false);
inline const CLI::Validator non_negative = finite_sign_check(true);

/// printf's formatting into a string of any length. The compilers check `pattern` against the
/// values as they do printf's (hence C varargs, not a template); throws std::runtime_error if
/// printf cannot format them.
[[gnu::format(printf, 1, 2)]] inline std::string format(const char* pattern, ...) {
    std::va_list values, again;
    va_start(values, pattern);
    va_copy(again, values);
    const int size = std::vsnprintf(nullptr, 0, pattern, values);
    va_end(values);
    std::string text(size > 0 ? static_cast<std::size_t>(size) : 0, '\0');
    if (size > 0) std::vsnprintf(text.data(), text.size() + 1, pattern, again);
    va_end(again);
    if (size < 0) throw std::runtime_error(std::string("cannot format \"") + pattern + '"');
    return text;
}

/// Writes `report` to `path` as JSON indented by two spaces (NaN and infinity as null, bytes
/// that are not UTF-8 as U+FFFD); throws std::runtime_error when the file cannot be written.
inline void write_json(const std::string& path, const nlohmann::ordered_json& report) {
    std::ofstream out(path);
    out << report.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << '\n';
    if (!out) throw std::runtime_error("cannot write " + path);
}

} // namespace hivemesh::program
