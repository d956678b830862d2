// A seeded random generator whose output is the same on every platform and compiler.
//
// The standard distributions are implementation-defined, so anything that must agree
// across peers (Moshpit group rotation, simulated networks) uses these instead:
// xoshiro256** seeded through splitmix64, Lemire's unbiased bounded integers, and a
// Fisher-Yates shuffle driven by them.
#pragma once

#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numbers>
#include <span>
#include <utility>

namespace hivemesh {

namespace detail {
__extension__ typedef unsigned __int128 uint128; // GCC and Clang both have it
} // namespace detail

/// splitmix64 step: used to expand a 64-bit seed into generator state.
constexpr std::uint64_t splitmix64(std::uint64_t& state) noexcept {
    std::uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/// xoshiro256** (Blackman & Vigna). Satisfies std::uniform_random_bit_generator.
class random_generator {
public:
    using result_type = std::uint64_t;

    constexpr explicit random_generator(std::uint64_t seed = 0) noexcept { reseed(seed); }

    constexpr void reseed(std::uint64_t seed) noexcept {
        for (auto& word : s_)
            word = splitmix64(seed);
        spare_ = 0; // a pending normal() sample belongs to the old sequence
        has_spare_ = false;
    }

    static constexpr result_type min() noexcept { return 0; }
    static constexpr result_type max() noexcept { return std::numeric_limits<result_type>::max(); }

    constexpr result_type operator()() noexcept {
        const std::uint64_t result = std::rotl(s_[1] * 5, 7) * 9;
        const std::uint64_t t = s_[1] << 17;
        s_[2] ^= s_[0];
        s_[3] ^= s_[1];
        s_[1] ^= s_[2];
        s_[0] ^= s_[3];
        s_[2] ^= t;
        s_[3] = std::rotl(s_[3], 45);
        return result;
    }

    /// Uniform integer in [0, bound); bound 0 returns 0. Unbiased (Lemire 2019).
    constexpr std::uint64_t uniform(std::uint64_t bound) noexcept {
        if (bound == 0) return 0;
        detail::uint128 m = static_cast<detail::uint128>((*this)()) * bound;
        auto low = static_cast<std::uint64_t>(m);
        if (low < bound) {
            const std::uint64_t threshold = (0 - bound) % bound;
            while (low < threshold) {
                m = static_cast<detail::uint128>((*this)()) * bound;
                low = static_cast<std::uint64_t>(m);
            }
        }
        return static_cast<std::uint64_t>(m >> 64);
    }

    /// Uniform double in [0, 1) with 53 random bits.
    constexpr double uniform_real() noexcept {
        return static_cast<double>((*this)() >> 11) * 0x1.0p-53;
    }

    /// Standard normal sample (Box-Muller). Bit-identical wherever libm's log/cos/sin are.
    double normal() noexcept {
        if (has_spare_) {
            has_spare_ = false;
            return spare_;
        }
        const double u1 = 1.0 - uniform_real(); // (0, 1]: log stays finite
        const double u2 = uniform_real();
        const double radius = std::sqrt(-2.0 * std::log(u1));
        const double angle = 2.0 * std::numbers::pi * u2;
        spare_ = radius * std::sin(angle);
        has_spare_ = true;
        return radius * std::cos(angle);
    }

    /// Fisher-Yates shuffle using uniform(); the same seed gives the same order everywhere.
    template <class T>
    constexpr void shuffle(std::span<T> items) noexcept {
        for (std::size_t i = items.size(); i > 1; --i) {
            const auto j = static_cast<std::size_t>(uniform(i));
            std::swap(items[i - 1], items[j]);
        }
    }

private:
    std::array<std::uint64_t, 4> s_{};
    double spare_ = 0;
    bool has_spare_ = false;
};

} // namespace hivemesh
