// The non-template functions of progress/record.hpp: the record's codec and schema check.
#pragma once

#include "hivemesh/progress/record.hpp"

namespace hivemesh::progress {

HIVEMESH_DECL bool is_owner_marker(byte_view subkey) {
    return dht::parse_owner_marker(subkey).has_value();
}

HIVEMESH_DECL byte_buffer encode(const progress_record& r) {
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

HIVEMESH_DECL std::error_code decode(byte_view value, progress_record& out) {
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

HIVEMESH_DECL std::error_code check_progress_record(const dht::record& r, byte_view key) {
    if (r.key.size() != key.size() || !std::equal(key.begin(), key.end(), r.key.begin())) return {};
    if (!r.subkey || !is_owner_marker(*r.subkey)) return errc::invalid_argument;
    if (r.value.empty()) return {};
    progress_record decoded;
    return decode(r.value, decoded);
}

HIVEMESH_DECL std::shared_ptr<dht::schema_validator>
make_progress_validator(std::string_view run_id) {
    if (!is_valid_run_id(run_id))
        throw std::invalid_argument("hivemesh::progress::make_progress_validator: bad run_id");
    const std::string key = progress_key(run_id);
    byte_buffer key_bytes = to_buffer(as_bytes(key));
    return std::make_shared<dht::schema_validator>(
        [key_bytes](const dht::record& r) { return check_progress_record(r, key_bytes); },
        key_bytes);
}

} // namespace hivemesh::progress
