// Sealed datagrams: one message from one identity to another with no handshake before it,
// for short requests and answers (the DHT's) where opening a secure session would cost more
// than the message.
//
// The key of a pair is the X25519 secret their identities share (identity::key_agreement),
// hashed with both public keys and, when set, the swarm key. It is the same both ways and
// computed once per peer, then cached; the keys computed for unknown senders are capped per
// second, so a flood of forged datagrams costs a bounded share of a core.
//
// Datagram (little-endian):
//   u8 version 1 | 32-byte sender public key | u64 sent at, ms since the Unix epoch |
//   24-byte nonce | ciphertext | 16-byte tag
// XChaCha20-Poly1305 with a random nonce (so no counter to keep per peer), the part before
// the ciphertext as associated data.
//
// What it gives: only the pair (and, with a swarm key, only members) can make or read a
// datagram between them, and the receiver learns who sent it. What it does not, unlike the
// secure channel: forward secrecy (a leaked identity key opens datagrams recorded before),
// and protection from replay beyond the clock window: a datagram can be replayed to its
// receiver for up to max_clock_skew after it was sent, so what travels this way must be
// safe to repeat.
#pragma once

#include "hivemesh/core/binary.hpp"
#include "hivemesh/core/bytes.hpp"
#include "hivemesh/core/clock.hpp"
#include "hivemesh/core/error.hpp"
#include "hivemesh/crypto/identity.hpp"
#include "hivemesh/crypto/secure_channel.hpp"

#include <sodium.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <list>
#include <optional>
#include <span>
#include <stdexcept>
#include <system_error>
#include <unordered_map>
#include <utility>

namespace hivemesh::crypto {

struct datagram_options {
    /// Mixed into every pair's key: a datagram sealed without it (or with another) does not
    /// open. The same secret as secure_options::swarm_key.
    std::optional<std::array<std::byte, 32>> swarm_key;
    /// A datagram whose sending time is further than this from the receiver's clock, either
    /// way, is refused: how long a recorded datagram can be replayed, and how far apart two
    /// peers' clocks may be.
    duration max_clock_skew = std::chrono::seconds(60);
    /// Pair keys kept (least recently used first out; about 100 bytes each). A sender's key
    /// is kept once one of its datagrams opened, so forged ones evict nothing.
    std::size_t max_cached_keys = 1024;
    /// Pair keys open() computes for senders not in the cache, per second, with a burst of as
    /// many (at least 1): what datagrams under made-up sender keys can cost, a key agreement
    /// each (73 µs on the development machine). Past it such a datagram is refused unread
    /// (rate_limited), so its sender retries and, as for a lost datagram, calls by stream
    /// after its last attempt. 0: no limit.
    double max_new_keys_per_second = 1000;
};

namespace detail {
inline constexpr std::uint8_t datagram_version = 1;
inline constexpr std::size_t datagram_nonce_size = crypto_aead_xchacha20poly1305_ietf_NPUBBYTES;
inline constexpr std::size_t datagram_tag_size = crypto_aead_xchacha20poly1305_ietf_ABYTES;
inline constexpr std::size_t datagram_header_size =
    1 + public_key::size + sizeof(std::uint64_t) + datagram_nonce_size;
} // namespace detail

/// Bytes a sealed datagram adds to its payload (81).
inline constexpr std::size_t datagram_overhead =
    detail::datagram_header_size + detail::datagram_tag_size;

/// Seals datagrams from one identity and opens those sent to it. Not thread-safe (the key
/// cache changes on every call): one per executor.
class datagram_sealer {
public:
    /// Keeps a copy of `self`. Throws std::invalid_argument for max_cached_keys 0, a
    /// max_clock_skew that is not positive, or a max_new_keys_per_second that is negative or
    /// not finite.
    datagram_sealer(const identity& self, datagram_options options)
        : self_(self.clone())
        , options_(std::move(options))
        , new_keys_(std::max(1.0, options_.max_new_keys_per_second)) {
        if (options_.max_cached_keys == 0)
            throw std::invalid_argument("datagram_options::max_cached_keys: at least 1");
        if (options_.max_clock_skew <= duration::zero())
            throw std::invalid_argument("datagram_options::max_clock_skew: positive");
        if (!(options_.max_new_keys_per_second >= 0) ||
            !std::isfinite(options_.max_new_keys_per_second))
            throw std::invalid_argument(
                "datagram_options::max_new_keys_per_second: 0 or a finite positive number");
    }
    ~datagram_sealer() {
        if (options_.swarm_key)
            sodium_memzero(options_.swarm_key->data(), options_.swarm_key->size());
    }
    datagram_sealer(const datagram_sealer&) = delete;
    datagram_sealer& operator=(const datagram_sealer&) = delete;

    const identity& self() const noexcept { return self_; }

    /// Appends to `out` `payload` sealed for `to`, stamped with `now`. Errors (nothing
    /// appended): invalid_argument when `to` is our own key or not a valid one.
    std::error_code seal(const public_key& to, byte_view payload, time_point now,
                         byte_buffer& out) {
        const symmetric_key* key = find_key(to);
        if (!key) {
            auto made = make_key(to);
            if (!made) return errc::invalid_argument;
            key = &remember(to, *made);
        }
        const std::size_t start = out.size();
        binary_writer w(out);
        w.write(detail::datagram_version);
        w.write_bytes(self_.public_key().view());
        w.write(milliseconds_since_epoch(now));
        randombytes_buf(w.grow(detail::datagram_nonce_size), detail::datagram_nonce_size);
        w.write_bytes(payload);
        std::byte* tag = w.grow(detail::datagram_tag_size);
        std::byte* header = out.data() + start;
        std::byte* text = header + detail::datagram_header_size;
        crypto_aead_xchacha20poly1305_ietf_encrypt_detached(
            detail::uchars(text), detail::uchars(tag), nullptr, detail::uchars(text),
            payload.size(), detail::uchars(header), detail::datagram_header_size, nullptr,
            detail::uchars(header + detail::datagram_header_size - detail::datagram_nonce_size),
            key->data());
        return {};
    }

    /// What open() found: who sent the datagram, and its payload (decrypted in place, a
    /// view into the datagram).
    struct opened {
        public_key sender;
        std::span<std::byte> payload;
    };

    /// Opens `datagram`, decrypting it in place, at `now`. Errors: truncated_input (shorter
    /// than datagram_overhead), unsupported_version, invalid_argument (the sender is us or
    /// not a valid key), authentication_failed (a forged or altered datagram, another swarm
    /// key, or a sending time outside max_clock_skew of `now`: a replay or a clock too far
    /// off), rate_limited (a sender not in the cache past max_new_keys_per_second). On error
    /// the datagram may be left partly decrypted.
    std::error_code open(std::span<std::byte> datagram, time_point now, opened& out) {
        if (datagram.size() < datagram_overhead) return errc::truncated_input;
        binary_reader r(datagram);
        if (r.read<std::uint8_t>() != detail::datagram_version) return errc::unsupported_version;
        const auto sender = *public_key::from_bytes(r.read_bytes(public_key::size));
        const std::uint64_t sent = r.read<std::uint64_t>();
        const std::uint64_t skew = static_cast<std::uint64_t>(
            std::chrono::duration_cast<std::chrono::milliseconds>(options_.max_clock_skew).count());
        const std::uint64_t here = milliseconds_since_epoch(now);
        if (sent > here ? sent - here > skew : here - sent > skew)
            return errc::authentication_failed;
        std::byte* header = datagram.data();
        std::byte* text = header + detail::datagram_header_size;
        const std::size_t text_size = datagram.size() - datagram_overhead;
        auto decrypt = [&](const symmetric_key& key) {
            return crypto_aead_xchacha20poly1305_ietf_decrypt_detached(
                       detail::uchars(text), nullptr, detail::uchars(text), text_size,
                       detail::uchars(text + text_size), detail::uchars(header),
                       detail::datagram_header_size,
                       detail::uchars(text - detail::datagram_nonce_size), key.data()) == 0;
        };
        if (const symmetric_key* key = find_key(sender)) {
            if (!decrypt(*key)) return errc::authentication_failed;
        } else {
            if (sender == self_.public_key()) return errc::invalid_argument;
            if (!take_new_key(now)) return errc::rate_limited;
            const auto made = make_key(sender);
            if (!made) return errc::invalid_argument;
            if (!decrypt(*made)) return errc::authentication_failed;
            remember(sender, *made);
        }
        out = {sender, {text, text_size}};
        return {};
    }

    /// Pair keys in the cache now.
    std::size_t cached_keys() const noexcept { return keys_.size(); }

private:
    struct key_hash {
        std::size_t operator()(const public_key& key) const noexcept {
            std::size_t h;
            std::memcpy(&h, key.bytes().data(), sizeof h);
            return h;
        }
    };
    struct cached_key {
        public_key peer;
        symmetric_key key;
    };

    static std::uint64_t milliseconds_since_epoch(time_point t) noexcept {
        const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch());
        return ms.count() < 0 ? 0 : static_cast<std::uint64_t>(ms.count());
    }

    /// The cached key shared with `peer`, now the most recently used; null if none.
    const symmetric_key* find_key(const public_key& peer) {
        const auto it = index_.find(peer);
        if (it == index_.end()) return nullptr;
        keys_.splice(keys_.begin(), keys_, it->second);
        return &it->second->key;
    }

    /// The key shared with `peer`, computed; none for our own key or an invalid one.
    std::optional<symmetric_key> make_key(const public_key& peer) const {
        if (peer == self_.public_key()) return std::nullopt;
        std::array<unsigned char, 32> shared;
        if (!self_.key_agreement(peer, shared)) return std::nullopt;
        // Both public keys in a fixed order, so the two ends hash the same bytes.
        const bool ours_first = std::memcmp(self_.public_key().bytes().data(), peer.bytes().data(),
                                            public_key::size) < 0;
        const public_key& first = ours_first ? self_.public_key() : peer;
        const public_key& second = ours_first ? peer : self_.public_key();
        symmetric_key key;
        crypto_generichash_state state;
        const auto& swarm = options_.swarm_key;
        crypto_generichash_init(&state, swarm ? detail::uchars(swarm->data()) : nullptr,
                                swarm ? swarm->size() : 0, symmetric_key::size);
        static constexpr char context[] = "hivemesh datagram v1";
        crypto_generichash_update(&state, reinterpret_cast<const unsigned char*>(context),
                                  sizeof context - 1);
        crypto_generichash_update(&state, shared.data(), shared.size());
        crypto_generichash_update(&state, detail::uchars(first.bytes().data()), public_key::size);
        crypto_generichash_update(&state, detail::uchars(second.bytes().data()), public_key::size);
        crypto_generichash_final(&state, key.data(), symmetric_key::size);
        sodium_memzero(shared.data(), shared.size());
        sodium_memzero(&state, sizeof state);
        return key;
    }

    /// Caches `key` for `peer` (not cached yet), evicting the least recently used.
    const symmetric_key& remember(const public_key& peer, const symmetric_key& key) {
        if (keys_.size() >= options_.max_cached_keys) {
            index_.erase(keys_.back().peer);
            keys_.pop_back();
        }
        keys_.push_front({peer, key});
        index_.emplace(peer, keys_.begin());
        return keys_.front().key;
    }

    /// Takes one of max_new_keys_per_second's tokens as of `now`, if there is one. A clock
    /// that steps back adds none.
    bool take_new_key(time_point now) noexcept {
        const double rate = options_.max_new_keys_per_second;
        if (rate == 0) return true;
        if (now > refilled_at_) {
            const double seconds = std::chrono::duration<double>(now - refilled_at_).count();
            new_keys_ = std::min(std::max(1.0, rate), new_keys_ + seconds * rate);
            refilled_at_ = now;
        }
        if (new_keys_ < 1) return false;
        new_keys_ -= 1;
        return true;
    }

    identity self_;
    datagram_options options_;
    std::list<cached_key> keys_; ///< most recently used first
    std::unordered_map<public_key, std::list<cached_key>::iterator, key_hash> index_;
    double new_keys_;          ///< tokens for take_new_key(), full at first
    time_point refilled_at_{}; ///< when new_keys_ was last topped up
};

} // namespace hivemesh::crypto
