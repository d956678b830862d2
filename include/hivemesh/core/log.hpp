// A process-wide logging sink that the user can redirect or silence.
#pragma once

#include <atomic>
#include <functional>
#include <iostream>
#include <memory>
#include <mutex>
#include <sstream>
#include <string_view>

namespace hivemesh::log {

enum class level : int { trace = 0, debug, info, warning, error, off };

inline const char* to_string(level l) noexcept {
    constexpr const char* names[] = {"trace", "debug", "info", "warning", "error", "off"};
    return names[static_cast<int>(l)];
}

/// Receives every message at or above the threshold. May be called from any thread.
using sink = std::function<void(level, std::string_view component, std::string_view message)>;

namespace detail {

struct state {
    std::atomic<int> threshold{static_cast<int>(level::warning)};
    std::mutex mutex; // guards `current` and serialises calls into it
    std::shared_ptr<const sink> current;
};

inline state& global() {
    static state s;
    return s;
}

inline void write_to_stderr(level l, std::string_view component, std::string_view message) {
    std::cerr << "[hivemesh " << to_string(l) << "] " << component << ": " << message << '\n';
}

} // namespace detail

/// Replaces the sink; an empty function restores the default (standard error).
inline void set_sink(sink s) {
    auto& g = detail::global();
    std::lock_guard lock(g.mutex);
    g.current = s ? std::make_shared<const sink>(std::move(s)) : nullptr;
}

/// Messages below `l` are dropped before they are formatted.
inline void set_level(level l) noexcept {
    detail::global().threshold.store(static_cast<int>(l), std::memory_order_relaxed);
}

inline bool enabled(level l) noexcept {
    return static_cast<int>(l) >= detail::global().threshold.load(std::memory_order_relaxed) &&
           l != level::off;
}

/// Formats the arguments with operator<< and hands the message to the sink.
template <class... Args>
void write(level l, std::string_view component, const Args&... args) {
    if (!enabled(l)) return;
    std::ostringstream text;
    ((text << args), ...); // a comma fold: also valid (and warning-free) with no arguments
    auto& g = detail::global();
    std::lock_guard lock(g.mutex);
    if (g.current)
        (*g.current)(l, component, text.str());
    else
        detail::write_to_stderr(l, component, text.str());
}

template <class... Args>
void debug(std::string_view component, const Args&... args) {
    write(level::debug, component, args...);
}
template <class... Args>
void info(std::string_view component, const Args&... args) {
    write(level::info, component, args...);
}
template <class... Args>
void warning(std::string_view component, const Args&... args) {
    write(level::warning, component, args...);
}
template <class... Args>
void error(std::string_view component, const Args&... args) {
    write(level::error, component, args...);
}

} // namespace hivemesh::log
