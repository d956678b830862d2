// The progress record: what each peer of a training run publishes in the DHT about its own
// progress, its wire format, and the schema check that keeps malformed values out.
//
// Every peer stores one record under the key "<run_id>_progress", subkey = its owner marker
// "[owner:<base58 Ed25519 public key>]" (dht/validator.hpp), so the DHT's owner_validator
// signs it and refuses anyone else's store under that subkey. Wire (little-endian, 34 bytes):
//
//   u8  version (1)
//   u64 epoch
//   u64 samples accumulated in that epoch
//   f64 samples per second (EMA; finite, >= 0)
//   i64 report time (ns since the Unix epoch, >= 0): when the sample count was taken
//   u8  client (0 or 1)
//
// An empty value is a tombstone: the peer withdrew, and readers skip it.
#pragma once

#include "hivemesh/core/binary.hpp"
#include "hivemesh/core/bytes.hpp"
#include "hivemesh/core/clock.hpp"
#include "hivemesh/core/error.hpp"
#include "hivemesh/crypto/identity.hpp"
#include "hivemesh/crypto/peer_id.hpp"
#include "hivemesh/dht/record.hpp"
#include "hivemesh/dht/validator.hpp"
#include "hivemesh/net/rpc_wire.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>

namespace hivemesh::progress {

/// The version byte every progress record starts with.
inline constexpr std::uint8_t record_wire_version = 1;
/// The encoded size of a progress record.
inline constexpr std::size_t record_size = 34;
/// The longest run_id: "<run_id>_progress" stays a valid RPC method name, so layers above may
/// use the run_id as a prefix of their own methods.
inline constexpr std::size_t max_run_id_length = 100;

/// One peer's progress as published in the DHT.
struct progress_record {
    std::uint64_t epoch = 0;
    std::uint64_t samples_accumulated = 0; ///< in `epoch`, as reported
    double samples_per_second = 0;         ///< the peer's EMA; finite, >= 0
    time_point report_time{};              ///< when samples_accumulated was counted
    bool client = false;                   ///< its epoch does not set the global epoch

    friend bool operator==(const progress_record&, const progress_record&) = default;
};

/// True if `run_id` is 1..max_run_id_length characters of [A-Za-z0-9_.:/-].
inline bool is_valid_run_id(std::string_view run_id) noexcept {
    return run_id.size() <= max_run_id_length && net::is_valid_method(run_id);
}

/// The DHT key of a run's progress records: "<run_id>_progress".
inline std::string progress_key(std::string_view run_id) {
    return std::string(run_id) + "_progress";
}

/// True if `subkey` is exactly one owner marker, "[owner:" + canonical base58 of a 32-byte
/// key + "]", as owner_marker() writes it.
inline bool is_owner_marker(byte_view subkey) {
    static constexpr std::string_view prefix = "[owner:";
    const std::string_view text = as_string_view(subkey);
    if (text.size() <= prefix.size() + 1 || !text.starts_with(prefix) || !text.ends_with(']'))
        return false;
    crypto::public_key::bytes_type bytes{};
    return crypto::base58_decode(text.substr(prefix.size(), text.size() - prefix.size() - 1),
                                 bytes);
}

/// Encodes `r`. Throws std::system_error(invalid_argument) for a samples_per_second that is
/// negative or not finite, or a report time before the Unix epoch.
inline byte_buffer encode(const progress_record& r) {
    if (!std::isfinite(r.samples_per_second) || r.samples_per_second < 0)
        throw std::system_error(errc::invalid_argument,
                                "hivemesh::progress::encode: samples_per_second must be finite "
                                "and >= 0");
    if (r.report_time.time_since_epoch().count() < 0)
        throw std::system_error(errc::invalid_argument,
                                "hivemesh::progress::encode: report time before the Unix epoch");
    byte_buffer out;
    out.reserve(record_size);
    binary_writer w(out);
    w.write(record_wire_version);
    w.write(r.epoch);
    w.write(r.samples_accumulated);
    w.write_f64(r.samples_per_second);
    w.write(static_cast<std::int64_t>(r.report_time.time_since_epoch().count()));
    w.write_flag(r.client);
    return out;
}

/// Decodes a record; on error `out` is unspecified. Errors: truncated_input, trailing_data,
/// unsupported_version, corrupt_data (samples per second negative, NaN or infinite, a report
/// time before the Unix epoch, a client flag other than 0 or 1). Whatever decodes encodes
/// back to the same bytes.
inline std::error_code decode(byte_view value, progress_record& out) {
    binary_reader r(value);
    const auto version = r.read<std::uint8_t>();
    if (r.ok() && version != record_wire_version) r.fail(errc::unsupported_version);
    out.epoch = r.read<std::uint64_t>();
    out.samples_accumulated = r.read<std::uint64_t>();
    out.samples_per_second = r.read_f64();
    if (r.ok() && !(std::isfinite(out.samples_per_second) && out.samples_per_second >= 0))
        r.fail(errc::corrupt_data);
    const auto report_ns = r.read<std::int64_t>();
    if (r.ok() && report_ns < 0) r.fail(errc::corrupt_data);
    out.report_time = time_point{duration{report_ns}};
    out.client = r.read_flag();
    return r.finish();
}

/// The schema check of a run's progress key, for a dht::schema_validator: records under
/// exactly `key` must be dictionary items whose subkey is one owner marker and whose value is
/// a tombstone (empty) or a record that decodes. Other keys pass. Errors: invalid_argument
/// (a plain value, or a subkey that is not an owner marker), the decoder's errors.
inline std::error_code check_progress_record(const dht::record& r, byte_view key) {
    if (r.key.size() != key.size() || !std::equal(key.begin(), key.end(), r.key.begin())) return {};
    if (!r.subkey || !is_owner_marker(*r.subkey)) return errc::invalid_argument;
    if (r.value.empty()) return {};
    progress_record decoded;
    return decode(r.value, decoded);
}

/// A validator that applies check_progress_record to the run's key; add it to every peer of
/// the run (tracker does), so replicas refuse malformed values and readers drop them.
/// Throws std::invalid_argument for an invalid run_id.
inline std::shared_ptr<dht::schema_validator> make_progress_validator(std::string_view run_id) {
    if (!is_valid_run_id(run_id))
        throw std::invalid_argument("hivemesh::progress::make_progress_validator: bad run_id");
    const std::string key = progress_key(run_id);
    byte_buffer key_bytes = to_buffer(as_bytes(key));
    return std::make_shared<dht::schema_validator>(
        [key_bytes](const dht::record& r) { return check_progress_record(r, key_bytes); },
        key_bytes);
}

} // namespace hivemesh::progress
