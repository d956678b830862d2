// Moshpit group keys: the bits a peer declares under while looking for a group, and how
// they rotate after each round so that former groupmates meet new peers.
//
// Pure, no I/O. A key is `<prefix>.0b<bits>`; after a group of g members forms, each member
// shifts a coordinate drawn from a permutation seeded by the group id into its bits.
#pragma once

#include "hivemesh/core/bytes.hpp"
#include "hivemesh/core/error.hpp"
#include "hivemesh/core/random.hpp"

#include <xxhash.h>

#include <bit>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace hivemesh::averaging {

/// A string of 0/1 of fixed length (0..64), held as an unsigned number whose most
/// significant bit is the first character: "0110" has size 4 and value 6.
class group_bits {
public:
    static constexpr std::size_t max_size = 64;

    /// The empty bit string (size 0).
    constexpr group_bits() noexcept = default;

    /// The `size` low bits of `value`, most significant first. Throws std::system_error
    /// (invalid_argument) if size > 64 or value does not fit in `size` bits.
    constexpr group_bits(std::uint64_t value, std::size_t size)
        : value_(value)
        , size_(size) {
        if (size > max_size || (value & ~mask(size)) != 0)
            throw std::system_error(errc::invalid_argument, "hivemesh::averaging::group_bits");
    }

    constexpr std::size_t size() const noexcept { return size_; }
    constexpr bool empty() const noexcept { return size_ == 0; }
    constexpr std::uint64_t value() const noexcept { return value_; }

    /// Bit `index` counted from the first character (the most significant); index < size().
    constexpr bool operator[](std::size_t index) const noexcept {
        return ((value_ >> (size_ - 1 - index)) & 1) != 0;
    }

    /// All ones in the low `size` bits (size <= 64).
    static constexpr std::uint64_t mask(std::size_t size) noexcept {
        return size >= 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << size) - 1;
    }

    friend constexpr bool operator==(const group_bits&, const group_bits&) noexcept = default;
    /// Orders by size, then by value.
    friend constexpr std::strong_ordering operator<=>(const group_bits& a,
                                                      const group_bits& b) noexcept {
        if (auto c = a.size_ <=> b.size_; c != 0) return c;
        return a.value_ <=> b.value_;
    }

private:
    std::uint64_t value_ = 0;
    std::size_t size_ = 0;
};

/// The bits as '0'/'1' characters, most significant first ("" for size 0).
inline std::string to_string(const group_bits& bits) {
    std::string text(bits.size(), '0');
    for (std::size_t i = 0; i < bits.size(); ++i)
        if (bits[i]) text[i] = '1';
    return text;
}

/// Parses '0'/'1' characters, most significant first. Errors: invalid_argument for any
/// other character or more than 64 characters (then returns the empty bits).
inline group_bits from_string(std::string_view text, std::error_code& ec) noexcept {
    ec.clear();
    if (text.size() > group_bits::max_size) {
        ec = errc::invalid_argument;
        return {};
    }
    std::uint64_t value = 0;
    for (const char c : text) {
        if (c != '0' && c != '1') {
            ec = errc::invalid_argument;
            return {};
        }
        value = (value << 1) | static_cast<std::uint64_t>(c == '1');
    }
    return group_bits(value, text.size());
}

/// Throwing from_string(): std::system_error with errc::invalid_argument.
inline group_bits from_string(std::string_view text) {
    std::error_code ec;
    const group_bits bits = from_string(text, ec);
    throw_if_error(ec, "hivemesh::averaging::from_string");
    return bits;
}

/// The DHT key a peer declares under: `<prefix>.0b<bits>` (`<prefix>.0b` for size 0).
inline std::string group_key(std::string_view prefix, const group_bits& bits) {
    std::string key;
    key.reserve(prefix.size() + 3 + bits.size());
    key.append(prefix);
    key.append(".0b");
    key.append(to_string(bits));
    return key;
}

/// Reads the bits back from a key made by group_key(prefix, bits). Errors:
/// invalid_argument if `key` does not start with `<prefix>.0b` or the rest is not valid
/// bits (see from_string).
inline group_bits parse_group_key(std::string_view key, std::string_view prefix,
                                  std::error_code& ec) noexcept {
    ec.clear();
    if (key.size() < prefix.size() + 3 || key.substr(0, prefix.size()) != prefix ||
        key.substr(prefix.size(), 3) != ".0b") {
        ec = errc::invalid_argument;
        return {};
    }
    return from_string(key.substr(prefix.size() + 3), ec);
}

/// Largest group rotate() accepts (its permutation has fewer than 2 * group_size entries).
inline constexpr std::size_t max_rotation_group_size = std::size_t{1} << 20;

/// Number of bits a group of `group_size` shifts in: ceil(log2(group_size)) (0 for sizes 0
/// and 1), capped at `bits_size`.
constexpr std::size_t rotation_width(std::size_t group_size, std::size_t bits_size) noexcept {
    const std::size_t width = group_size <= 1 ? 0 : std::bit_width(group_size - 1);
    return width < bits_size ? width : bits_size;
}

/// The seed of a group's coordinate permutation: XXH3_64bits (xxHash >= 0.8, default
/// secret, seed 0) of the group id bytes, which is the same on every platform.
inline std::uint64_t rotation_seed(byte_view group_id) noexcept {
    return XXH3_64bits(group_id.data(), group_id.size());
}

/// The coordinate permutation of a group: the numbers 0..2^width-1 in order, shuffled by
/// random_generator(rotation_seed(group_id)).shuffle(), i.e. Fisher-Yates from the top:
/// for i = 2^width down to 2, swap entries i-1 and uniform(i). Throws std::system_error
/// (invalid_argument) if width > 20.
inline std::vector<std::uint64_t> rotation_permutation(byte_view group_id, std::size_t width) {
    if (width > 20)
        throw std::system_error(errc::invalid_argument,
                                "hivemesh::averaging::rotation_permutation");
    std::vector<std::uint64_t> permutation(std::size_t{1} << width);
    std::iota(permutation.begin(), permutation.end(), std::uint64_t{0});
    random_generator rng(rotation_seed(group_id));
    rng.shuffle(std::span<std::uint64_t>(permutation));
    return permutation;
}

/// Moshpit rotation: the bits the member at `member_index` (its position in the group's
/// ordered member list) declares under next round, after a group of `group_size` with id
/// `group_id` formed. With n = rotation_width(group_size, bits.size()) and
/// p = rotation_permutation(group_id, n), the member's coordinate is
/// p[member_index mod 2^n] and the new bits are the old ones shifted left by n (the n
/// first bits drop out) with the n-bit coordinate appended, most significant bit first;
/// the size stays the same. Groupmates get distinct coordinates, hence distinct new bits,
/// unless group_size > 2^bits.size(), where coordinates repeat (modulo 2^n) and groupmates
/// can meet again.
///
/// Errors (invalid_argument, returns `bits` unchanged): group_size 0 or above
/// max_rotation_group_size, member_index >= group_size.
inline group_bits rotate(const group_bits& bits, byte_view group_id, std::size_t member_index,
                         std::size_t group_size, std::error_code& ec) {
    ec.clear();
    if (group_size == 0 || group_size > max_rotation_group_size || member_index >= group_size) {
        ec = errc::invalid_argument;
        return bits;
    }
    const std::size_t width = rotation_width(group_size, bits.size());
    if (width == 0) return bits;
    const auto permutation = rotation_permutation(group_id, width);
    const std::uint64_t coordinate = permutation[member_index % permutation.size()];
    const std::uint64_t kept = width >= 64 ? 0 : bits.value() << width;
    return group_bits((kept | coordinate) & group_bits::mask(bits.size()), bits.size());
}

/// Throwing rotate(): std::system_error with errc::invalid_argument.
inline group_bits rotate(const group_bits& bits, byte_view group_id, std::size_t member_index,
                         std::size_t group_size) {
    std::error_code ec;
    const group_bits result = rotate(bits, group_id, member_index, group_size, ec);
    throw_if_error(ec, "hivemesh::averaging::rotate");
    return result;
}

} // namespace hivemesh::averaging
