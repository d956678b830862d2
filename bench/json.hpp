// JSON text for the benchmark programs' --json reports (which write their objects by hand).
#pragma once

#include <cmath>
#include <cstdio>
#include <string>
#include <string_view>

namespace hivemesh::bench {

/// `text` as a JSON string: quotes and backslashes escaped, control characters as \uXXXX.
inline std::string json_string(std::string_view text) {
    std::string out = "\"";
    for (const char ch : text) {
        if (ch == '"' || ch == '\\') {
            out += '\\';
            out += ch;
        } else if (static_cast<unsigned char>(ch) < 0x20) {
            char escaped[8];
            std::snprintf(escaped, sizeof escaped, "\\u%04x", static_cast<unsigned>(ch));
            out += escaped;
        } else {
            out += ch;
        }
    }
    return out + "\"";
}

/// `v` to 6 significant digits; null when it is not finite (JSON has no NaN or infinity).
inline std::string json_number(double v) {
    if (!std::isfinite(v)) return "null";
    char text[40];
    std::snprintf(text, sizeof text, "%.6g", v);
    return text;
}

} // namespace hivemesh::bench
