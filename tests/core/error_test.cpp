#include <hivemesh/core/error.hpp>

#include <catch2/catch.hpp>

#include <string>
#include <system_error>
#include <utility>

using hivemesh::errc;

static_assert(std::is_error_code_enum_v<errc>);

TEST_CASE("the error category is named hivemesh and is a singleton", "[core][error]") {
    CHECK(std::string(hivemesh::hivemesh_category().name()) == "hivemesh");
    CHECK(&hivemesh::hivemesh_category() == &hivemesh::hivemesh_category());
    const std::error_code ec = errc::bad_magic;
    CHECK(&ec.category() == &hivemesh::hivemesh_category());
    CHECK(ec.category() != std::generic_category());
}

TEST_CASE("every errc has its own value and message", "[core][error]") {
    // The numeric values are part of the wire protocol (errors travel in RPC replies).
    const std::pair<errc, std::pair<int, const char*>> expected[] = {
        {errc::truncated_input, {1, "input truncated"}},
        {errc::length_limit_exceeded, {2, "length exceeds limit"}},
        {errc::bad_magic, {3, "bad magic bytes"}},
        {errc::unsupported_version, {4, "unsupported format version"}},
        {errc::unknown_codec, {5, "unknown codec"}},
        {errc::invalid_argument, {6, "invalid argument"}},
        {errc::corrupt_data, {7, "corrupt data"}},
        {errc::trailing_data, {8, "unexpected trailing data"}},
        {errc::size_mismatch, {9, "size mismatch"}},
        {errc::non_finite_input, {10, "non-finite input (NaN or infinity)"}},
        {errc::compression_failed, {11, "compression library failure"}},
        {errc::insecure_permissions, {12, "secret file is readable by others"}},
        {errc::bad_signature, {13, "signature does not verify"}},
        {errc::handshake_failed, {14, "secure handshake failed"}},
        {errc::peer_id_mismatch, {15, "remote peer is not the expected one"}},
        {errc::authentication_failed, {16, "record authentication failed"}},
        {errc::connection_truncated, {17, "connection truncated"}},
        {errc::timeout, {18, "deadline exceeded"}},
        {errc::unreachable, {19, "peer unreachable"}},
        {errc::refused, {20, "refused by peer"}},
        {errc::protocol_violation, {21, "protocol violation"}},
        {errc::message_too_large, {22, "message too large"}},
        {errc::cancelled, {23, "operation cancelled"}},
        {errc::connection_closed, {24, "connection closed"}},
        {errc::remote_error, {25, "remote handler failed"}},
        {errc::not_found, {26, "not found"}},
        {errc::no_peers, {27, "no known peers"}},
        {errc::store_refused, {28, "store refused by every replica"}},
        {errc::rate_limited, {29, "rate limit exceeded"}},
        {errc::storage_full, {30, "storage limit reached"}},
        {errc::wrong_thread, {31, "blocking call on an io thread"}},
        {errc::too_few_peers, {32, "too few peers to form a group"}},
        {errc::unknown_group, {33, "unknown averaging group"}},
        {errc::not_a_donor, {34, "peer does not serve state"}},
        {errc::internal_error, {35, "internal error (see the log)"}},
    };
    for (const auto& [e, value_and_message] : expected) {
        const auto& [value, message] = value_and_message;
        const std::error_code ec = hivemesh::make_error_code(e);
        INFO("errc value " << value);
        CHECK(static_cast<int>(e) == value);
        CHECK(ec.value() == value);
        CHECK(ec.message() == message);
        CHECK(static_cast<bool>(ec)); // no errc means success
    }
    CHECK(hivemesh::hivemesh_category().message(0) == "unknown hivemesh error");
    CHECK(hivemesh::hivemesh_category().message(static_cast<int>(hivemesh::last_errc) + 1) ==
          "unknown hivemesh error");
    CHECK(hivemesh::hivemesh_category().message(-1) == "unknown hivemesh error");
}

TEST_CASE("std::error_code compares with hivemesh::errc", "[core][error]") {
    const std::error_code ec = errc::truncated_input; // implicit, via is_error_code_enum
    CHECK(ec == errc::truncated_input);
    CHECK(errc::truncated_input == ec);
    CHECK(ec != errc::length_limit_exceeded);
    CHECK(ec == hivemesh::make_error_code(errc::truncated_input));

    // Same number, different category: not equal.
    const std::error_code generic = std::make_error_code(std::errc::invalid_argument);
    CHECK(generic != errc::invalid_argument);
    CHECK(hivemesh::make_error_code(errc::invalid_argument) != std::errc::invalid_argument);
    const std::error_code same_number(static_cast<int>(errc::truncated_input),
                                      std::generic_category());
    CHECK(same_number != errc::truncated_input);

    // A default (success) code equals no hivemesh error.
    const std::error_code ok;
    CHECK_FALSE(ok);
    for (int v = 1; v <= 25; ++v)
        CHECK(ok != static_cast<errc>(v));

    std::error_code assigned;
    assigned = errc::corrupt_data;
    CHECK(assigned == errc::corrupt_data);
    CHECK(assigned.message() == "corrupt data");
}

TEST_CASE("throw_if_error throws std::system_error only for a set code", "[core][error]") {
    CHECK_NOTHROW(hivemesh::throw_if_error({}, "nothing"));

    try {
        hivemesh::throw_if_error(errc::size_mismatch, "decompress");
        FAIL("throw_if_error did not throw");
    } catch (const std::system_error& e) {
        CHECK(e.code() == errc::size_mismatch);
        const std::string what = e.what();
        CHECK(what.find("decompress") != std::string::npos);
        CHECK(what.find("size mismatch") != std::string::npos);
    }

    // Codes from other categories pass through unchanged.
    try {
        hivemesh::throw_if_error(std::make_error_code(std::errc::io_error), "read");
        FAIL("throw_if_error did not throw");
    } catch (const std::system_error& e) {
        CHECK(e.code() == std::errc::io_error);
    }

    // A system_error can be built from the enum directly.
    const std::system_error direct(errc::unknown_codec, "codec 99");
    CHECK(direct.code() == errc::unknown_codec);
}
