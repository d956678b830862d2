// A collaborative optimizer's whole state as a value (hivemind's state_dict), and its file
// format: what a peer needs to stop, restart and rejoin its swarm where it was.
//
// File format, version 1, every integer little-endian:
//
//     magic "HMCKPT\r\n" (8 bytes) | u32 version
//     u32 length | run_id            u32 length | local optimizer's name
//     u64 epoch | u64 step_count | u64 outer_step_count
//     six tensor lists, in this order: parameters, buffers, optimizer_state, outer_start,
//       outer_state (float32 elements), integer_buffers (int64 elements); each list is
//       u32 tensor count | per tensor: u64 element count, then its elements
//     u64 XXH3-64 of every byte before it
//
// The magic's CR LF catches a file mangled by a text-mode transfer. Every length and count is
// checked against the bytes left before anything is allocated, and the checksum before any
// field is read, so a truncated, corrupt or foreign file is refused whole.
#pragma once

#include "hivemesh/core/binary.hpp"
#include "hivemesh/core/bytes.hpp"
#include "hivemesh/core/error.hpp"
#include "hivemesh/core/file.hpp"
#include "hivemesh/optim/state_metadata.hpp"

#include <xxhash.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <span>
#include <string>
#include <system_error>
#include <vector>

namespace hivemesh::optim {

/// A collaborative optimizer's state (see collaborative_optimizer::state_dict).
struct checkpoint {
    std::string run_id;
    /// The local epoch: the epochs the peer had completed.
    std::uint64_t epoch = 0;
    /// The local optimizer: its name ("adam", "sgd", "torch:Adam", ...) and step count.
    std::string optimizer;
    std::uint64_t step_count = 0;
    /// The parameters' values, in the optimizer's order.
    std::vector<std::vector<float>> parameters;
    /// model_buffers::averaged and model_buffers::carried, in order.
    std::vector<std::vector<float>> buffers;
    std::vector<std::vector<std::int64_t>> integer_buffers;
    /// The local optimizer's state_tensors (moments, momentum buffers).
    std::vector<std::vector<float>> optimizer_state;
    /// DiLoCo: θ_start, and the outer optimizer's state and step count; empty otherwise.
    std::vector<std::vector<float>> outer_start;
    std::vector<std::vector<float>> outer_state;
    std::uint64_t outer_step_count = 0;

    friend bool operator==(const checkpoint&, const checkpoint&) = default;
};

inline constexpr std::array<char, 8> checkpoint_magic{'H', 'M', 'C', 'K', 'P', 'T', '\r', '\n'};
inline constexpr std::uint32_t checkpoint_version = 1;
/// The longest run_id and local optimizer name a checkpoint file may hold.
inline constexpr std::size_t max_checkpoint_name_length = 256;

namespace detail {

inline constexpr std::size_t checkpoint_header_size = checkpoint_magic.size() + 4;
inline constexpr std::size_t checkpoint_checksum_size = 8;

} // namespace detail

/// The checkpoint file's bytes (see the file comment). Throws std::system_error
/// (length_limit_exceeded) for a run_id or name over 2^32 - 1 bytes or a list of as many
/// tensors.
inline byte_buffer encode(const checkpoint& c) {
    std::size_t size = detail::checkpoint_header_size + 8 + c.run_id.size() + c.optimizer.size() +
                       3 * 8 + detail::tensor_list_size(c.integer_buffers) +
                       detail::checkpoint_checksum_size;
    for (const auto* list :
         {&c.parameters, &c.buffers, &c.optimizer_state, &c.outer_start, &c.outer_state})
        size += detail::tensor_list_size(*list);
    byte_buffer out;
    out.reserve(size);
    binary_writer w(out);
    w.write_bytes(as_bytes(std::span(checkpoint_magic)));
    w.write(checkpoint_version);
    w.write_string(c.run_id);
    w.write_string(c.optimizer);
    w.write(c.epoch);
    w.write(c.step_count);
    w.write(c.outer_step_count);
    detail::write_tensor_list(w, c.parameters);
    detail::write_tensor_list(w, c.buffers);
    detail::write_tensor_list(w, c.optimizer_state);
    detail::write_tensor_list(w, c.outer_start);
    detail::write_tensor_list(w, c.outer_state);
    detail::write_tensor_list(w, c.integer_buffers);
    w.write(static_cast<std::uint64_t>(XXH3_64bits(out.data(), out.size())));
    return out;
}

/// Decodes a checkpoint file's bytes into `out` (unspecified on error). Errors: bad_magic (not
/// a checkpoint), unsupported_version, truncated_input, corrupt_data (the checksum does not
/// match), length_limit_exceeded (a run_id or name over max_checkpoint_name_length),
/// trailing_data. Whatever decodes encodes back to the same bytes.
inline std::error_code decode(byte_view bytes, checkpoint& out) {
    binary_reader header(bytes);
    const byte_view magic = header.read_bytes(checkpoint_magic.size());
    if (header.ok() && std::memcmp(magic.data(), checkpoint_magic.data(), magic.size()) != 0)
        return errc::bad_magic;
    const auto version = header.read<std::uint32_t>();
    if (!header.ok()) return header.error();
    if (version != checkpoint_version) return errc::unsupported_version;
    if (bytes.size() < detail::checkpoint_header_size + detail::checkpoint_checksum_size)
        return errc::truncated_input;
    const std::size_t body_end = bytes.size() - detail::checkpoint_checksum_size;
    binary_reader checksum(bytes.subspan(body_end));
    if (checksum.read<std::uint64_t>() != XXH3_64bits(bytes.data(), body_end))
        return errc::corrupt_data;

    binary_reader r(
        bytes.subspan(detail::checkpoint_header_size, body_end - detail::checkpoint_header_size));
    out.run_id = r.read_string(max_checkpoint_name_length);
    out.optimizer = r.read_string(max_checkpoint_name_length);
    out.epoch = r.read<std::uint64_t>();
    out.step_count = r.read<std::uint64_t>();
    out.outer_step_count = r.read<std::uint64_t>();
    out.parameters = detail::read_tensor_list<float>(r);
    out.buffers = detail::read_tensor_list<float>(r);
    out.optimizer_state = detail::read_tensor_list<float>(r);
    out.outer_start = detail::read_tensor_list<float>(r);
    out.outer_state = detail::read_tensor_list<float>(r);
    out.integer_buffers = detail::read_tensor_list<std::int64_t>(r);
    return r.finish();
}

/// Writes `c` to `path` atomically (see replace_file): a crash leaves the previous file or
/// the new one. Throws std::system_error with the system's error and the path.
inline void save_checkpoint(const std::filesystem::path& path, const checkpoint& c) {
    if (auto ec = replace_file(path, encode(c)))
        throw std::system_error(ec, "hivemesh: cannot write checkpoint " + path.string());
}

/// Reads the checkpoint file at `path`. Throws std::system_error with the path and the
/// system's error or decode()'s (a file that is not a whole checkpoint changes nothing).
inline checkpoint load_checkpoint(const std::filesystem::path& path) {
    std::error_code ec;
    const byte_buffer bytes = read_file(path, std::numeric_limits<std::size_t>::max(), ec);
    if (ec) throw std::system_error(ec, "hivemesh: cannot read checkpoint " + path.string());
    checkpoint c;
    if (auto error = decode(bytes, c))
        throw std::system_error(error, "hivemesh: " + path.string() + " is not a valid checkpoint");
    return c;
}

} // namespace hivemesh::optim
