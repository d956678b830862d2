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
#include "hivemesh/core/config.hpp"
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
/// key + "]", as owner_marker() writes it (dht::parse_owner_marker).
HIVEMESH_DECL bool is_owner_marker(byte_view subkey);

/// Encodes `r`. Throws std::system_error(invalid_argument) for a samples_per_second that is
/// negative or not finite, or a report time before the Unix epoch.
HIVEMESH_DECL byte_buffer encode(const progress_record& r);

/// Decodes a record; on error `out` is unspecified. Errors: truncated_input, trailing_data,
/// unsupported_version, corrupt_data (samples per second negative, NaN or infinite, a report
/// time before the Unix epoch, a client flag other than 0 or 1). Whatever decodes encodes
/// back to the same bytes.
HIVEMESH_DECL std::error_code decode(byte_view value, progress_record& out);

/// The schema check of a run's progress key, for a dht::schema_validator: records under
/// exactly `key` must be dictionary items whose subkey is one owner marker and whose value is
/// a tombstone (empty) or a record that decodes. Other keys pass. Errors: invalid_argument
/// (a plain value, or a subkey that is not an owner marker), the decoder's errors.
HIVEMESH_DECL std::error_code check_progress_record(const dht::record& r, byte_view key);

/// A validator that applies check_progress_record to the run's key; add it to every peer of
/// the run (tracker does), so replicas refuse malformed values and readers drop them.
/// Throws std::invalid_argument for an invalid run_id.
HIVEMESH_DECL std::shared_ptr<dht::schema_validator>
make_progress_validator(std::string_view run_id);

} // namespace hivemesh::progress

#if !defined(HIVEMESH_SEPARATE_COMPILATION)
#include "hivemesh/progress/impl/record.ipp"
#endif
