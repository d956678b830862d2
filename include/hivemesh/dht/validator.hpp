// Record validators: what a node checks before it stores a record, and what a writer adds
// (a signature) before it publishes one.
//
// Protected records. A key or subkey that contains the marker `[owner:<base58 public key>]`
// (see owner_marker) belongs to that Ed25519 key: the record must carry the key's signature
// of signing_payload(record), which covers key, subkey, value and expiration. Anyone else's
// store is refused, and a replayed signature cannot extend the expiration. Markers are found
// by searching the raw bytes of key and subkey; every marker must name the same key, and a
// malformed marker (no closing ']', or not a canonical base58 32-byte key between the
// brackets) makes the record invalid rather than silently unprotected.
#pragma once

#include "hivemesh/core/binary.hpp"
#include "hivemesh/core/bytes.hpp"
#include "hivemesh/core/config.hpp"
#include "hivemesh/core/error.hpp"
#include "hivemesh/crypto/identity.hpp"
#include "hivemesh/crypto/peer_id.hpp"
#include "hivemesh/dht/record.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <unordered_set>
#include <utility>
#include <vector>

namespace hivemesh::dht {

/// Domain separation string at the start of every signing payload.
inline constexpr std::string_view record_signing_domain = "hivemesh.dht.record.v1";

/// The bytes an owner signs for `r` (little-endian, u32 length prefixes):
///   u32 len | domain "hivemesh.dht.record.v1" | u32 len | key |
///   u8 has_subkey (0 or 1) | [u32 len | subkey, if has_subkey] |
///   u32 len | value | i64 expiration (ns since the Unix epoch).
/// Every field is delimited, so no two distinct records share a payload.
inline byte_buffer signing_payload(const record& r) {
    byte_buffer out;
    out.reserve(4 + record_signing_domain.size() + 4 + r.key.size() + 1 +
                (r.subkey ? 4 + r.subkey->size() : 0) + 4 + r.value.size() + 8);
    binary_writer w(out);
    w.write_string(record_signing_domain);
    w.write_sized_bytes(r.key);
    w.write(static_cast<std::uint8_t>(r.subkey ? 1 : 0));
    if (r.subkey) w.write_sized_bytes(*r.subkey);
    w.write_sized_bytes(r.value);
    w.write(static_cast<std::int64_t>(r.expiration.time_since_epoch().count()));
    return out;
}

/// The marker that protects a key or subkey for `key`: "[owner:" + base58(key) + "]".
inline std::string owner_marker(const crypto::public_key& key) {
    return "[owner:" + crypto::base58_encode(key.view()) + "]";
}

/// The key named by `text` if it is exactly one owner marker as owner_marker() writes it
/// ("[owner:" + canonical base58 of 32 bytes + "]"), else nullopt. Readers of records whose
/// subkey names their writer use it: the writer's PeerId is then the key's id().
HIVEMESH_DECL std::optional<crypto::public_key> parse_owner_marker(byte_view text);

/// The key that owns `r`: nullopt with `ec` clear if `r` is unprotected. Errors
/// (invalid_argument): markers naming different keys, or a malformed marker.
inline std::optional<crypto::public_key> record_owner(const record& r, std::error_code& ec) {
    static constexpr std::string_view prefix = "[owner:";
    ec.clear();
    std::optional<crypto::public_key> owner;
    const auto scan = [&](byte_view field) {
        const std::string_view text = as_string_view(field);
        for (std::size_t pos = text.find(prefix); pos != std::string_view::npos;
             pos = text.find(prefix, pos)) {
            const std::size_t begin = pos + prefix.size();
            const std::size_t end = text.find(']', begin);
            crypto::public_key::bytes_type bytes{};
            if (end == std::string_view::npos ||
                !crypto::base58_decode(text.substr(begin, end - begin), bytes)) {
                ec = errc::invalid_argument;
                return false;
            }
            if (owner && owner->bytes() != bytes) {
                ec = errc::invalid_argument;
                return false;
            }
            owner = crypto::public_key(bytes);
            pos = end + 1;
        }
        return true;
    };
    if (!scan(r.key) || (r.subkey && !scan(*r.subkey))) return std::nullopt;
    return owner;
}

namespace detail {

/// Remembers signatures that verified, by a BLAKE2b-256 digest of key, signature and message,
/// so that a record seen again (every poll of a matchmaking key returns the same
/// declarations, from each replica) costs a hash instead of an Ed25519 verification (about
/// 100 times as much). Sound because a digest collision is out of reach. Holds `capacity`
/// digests, the oldest forgotten first. Thread-safe.
class verified_signatures {
public:
    explicit verified_signatures(std::size_t capacity = 8192)
        : capacity_(capacity) {}

    /// crypto::verify(key, message, sig), from the cache when it verified before.
    HIVEMESH_DECL bool verify(const crypto::public_key& key, byte_view message,
                              const crypto::signature& sig);

    struct counters {
        std::uint64_t hits = 0;
        std::uint64_t verified = 0; ///< verifications run (those that failed included)
    };
    HIVEMESH_DECL counters statistics() const;

private:
    using digest = std::array<std::byte, 32>;
    struct digest_hash {
        std::size_t operator()(const digest& d) const noexcept {
            std::size_t h = 0;
            std::memcpy(&h, d.data(), sizeof h); // already uniform
            return h;
        }
    };

    std::size_t capacity_;
    mutable std::mutex mutex_;
    std::unordered_set<digest, digest_hash> known_;
    std::deque<digest> order_; ///< insertion order, for forgetting the oldest
    counters counters_;
};

} // namespace detail

/// Decides whether a record may be stored, and adds what it needs before publishing.
class record_validator {
public:
    virtual ~record_validator() = default;
    /// An empty error code if `r` may be stored; the reason otherwise.
    virtual std::error_code validate(const record& r) const = 0;
    /// Prepares `r` for publishing (e.g. signs it); the default does nothing.
    virtual void sign(record&) const {}
};

/// Enforces owner markers (see the file comment) and signs records this identity owns.
class owner_validator final : public record_validator {
public:
    /// Keeps its own clone of `me`. Throws std::logic_error if `me` was moved from.
    explicit owner_validator(const crypto::identity& me)
        : me_(me.clone()) {}

    /// Unprotected records: valid only without a signature (else bad_signature).
    /// Protected records: valid only with the marked key's Ed25519 signature of
    /// signing_payload(r) (else bad_signature). Conflicting or malformed markers:
    /// invalid_argument.
    std::error_code validate(const record& r) const override {
        std::error_code ec;
        const auto owner = record_owner(r, ec);
        if (ec) return ec;
        if (!owner)
            return r.signature.empty() ? std::error_code{} : make_error_code(errc::bad_signature);
        const auto sig = crypto::signature::from_bytes(r.signature);
        if (!sig || !verified_->verify(*owner, signing_payload(r), *sig))
            return errc::bad_signature;
        return {};
    }

    /// Fills `r.signature` if `r` is protected by this identity's key; leaves any other
    /// record as it is (a record owned by someone else will fail validate()).
    void sign(record& r) const override {
        std::error_code ec;
        const auto owner = record_owner(r, ec);
        if (ec || !owner || *owner != me_.public_key()) return;
        const auto sig = me_.sign(signing_payload(r));
        r.signature.assign(sig.view().begin(), sig.view().end());
    }

    const crypto::public_key& public_key() const noexcept { return me_.public_key(); }
    /// The marker that protects keys or subkeys for this identity.
    std::string marker() const { return owner_marker(me_.public_key()); }
    /// Signature checks answered from the cache of verified ones, and run.
    detail::verified_signatures::counters verifications() const { return verified_->statistics(); }

private:
    crypto::identity me_;
    // Shared, not a member: validate() is const, and a validator may serve several nodes.
    std::shared_ptr<detail::verified_signatures> verified_ =
        std::make_shared<detail::verified_signatures>();
};

/// An application's check of value types: runs `hook` on records whose key starts with
/// the prefix (every record when the prefix is empty); other records pass.
class schema_validator final : public record_validator {
public:
    using hook_type = std::function<std::error_code(const record&)>;

    /// Throws std::system_error(invalid_argument) if `hook` is empty.
    explicit schema_validator(hook_type hook, byte_buffer key_prefix = {})
        : hook_(std::move(hook))
        , prefix_(std::move(key_prefix)) {
        if (!hook_)
            throw std::system_error(errc::invalid_argument,
                                    "hivemesh::dht::schema_validator: empty hook");
    }

    /// The hook's verdict for a record under the prefix; success otherwise.
    std::error_code validate(const record& r) const override {
        if (r.key.size() < prefix_.size() ||
            !std::equal(prefix_.begin(), prefix_.end(), r.key.begin()))
            return {};
        return hook_(r);
    }

    const byte_buffer& key_prefix() const noexcept { return prefix_; }

private:
    hook_type hook_;
    byte_buffer prefix_;
};

/// Validators applied together. An empty chain accepts everything.
class validator_chain {
public:
    /// Appends `v`, which runs after those added before it. Throws
    /// std::system_error(invalid_argument) if `v` is null.
    void add(std::shared_ptr<const record_validator> v) {
        if (!v)
            throw std::system_error(errc::invalid_argument,
                                    "hivemesh::dht::validator_chain: null validator");
        validators_.push_back(std::move(v));
    }

    /// The first error any validator reports, in order; success if none does.
    std::error_code validate(const record& r) const {
        for (const auto& v : validators_)
            if (auto ec = v->validate(r)) return ec;
        return {};
    }

    /// Lets every validator prepare `r`, in order.
    void sign(record& r) const {
        for (const auto& v : validators_)
            v->sign(r);
    }

    bool empty() const noexcept { return validators_.empty(); }
    std::size_t size() const noexcept { return validators_.size(); }

private:
    std::vector<std::shared_ptr<const record_validator>> validators_;
};

} // namespace hivemesh::dht

#if !defined(HIVEMESH_SEPARATE_COMPILATION)
#include "hivemesh/dht/impl/validator.ipp"
#endif
