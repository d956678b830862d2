// The donor side of state sharing: state_server advertises this peer in the DHT and streams
// its state to newcomers. See state_sharing.hpp for the protocol.
#pragma once

#include "hivemesh/averaging/state_wire.hpp"
#include "hivemesh/core/async.hpp"
#include "hivemesh/core/log.hpp"
#include "hivemesh/dht/node.hpp"
#include "hivemesh/dht/validator.hpp"
#include "hivemesh/net/node.hpp"
#include "hivemesh/net/rpc_wire.hpp"
#include "hivemesh/net/transport.hpp"

#include <asio/async_result.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/post.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

namespace hivemesh::averaging {

using namespace std::chrono_literals;

/// How a donor serves.
struct server_options {
    /// Codec of the chunk payloads; `none` keeps every bit. A lossy codec gives the newcomer
    /// the codec's approximation (and costs the donor two compressions per chunk: one to hash
    /// it for the header, one to send it). Statistical codecs refuse non-finite values.
    compression::kind codec = compression::kind::none;
    /// Uncompressed float32 bytes per chunk (rounded down to whole elements, at least one).
    /// A chunk and the header (32 bytes per chunk) each travel as one RPC message, so keep
    /// both under the multiplexer's max_message_size (16 MiB) and the newcomers' limits.
    std::size_t chunk_size_bytes = 1 << 20;
    /// Lifetime of the DHT advertisement; it is refreshed every refresh_period. Keep it within
    /// the replicas' dht::storage_limits::max_lifetime (5 min by default), which refuse more.
    duration advertisement_ttl = 60s;
    duration refresh_period = 20s;
    /// Uploads served at once; more are refused (errc::refused), so the newcomer tries the
    /// next donor. Each upload holds one state from the provider.
    std::size_t max_concurrent_uploads = 4;
};

/// Counters of one server.
struct server_statistics {
    std::uint64_t advertisements = 0;         ///< successful stores of our record
    std::uint64_t advertisement_failures = 0; ///< stores no replica accepted
    std::uint64_t uploads_started = 0;
    std::uint64_t uploads_completed = 0;
    std::uint64_t uploads_failed = 0;  ///< the newcomer left, the connection failed, stopped
    std::uint64_t uploads_refused = 0; ///< not serving, busy, or a malformed request
    std::uint64_t chunks_sent = 0;
    std::uint64_t bytes_sent = 0; ///< header and chunk messages
};

/// Serves this peer's state to newcomers: registers "<prefix>.state" on the RPC node and
/// advertises (priority, `announce`) in the DHT under "<prefix>_state_donors", subkey = its
/// owner marker (signed by the DHT node's owner_validator), refreshing the record while
/// serving. Uses (does not own) the RPC and DHT nodes, which must outlive it.
///
/// Each upload calls `provider` once and streams the state it returns chunk by chunk (the
/// multiplexer's send completes when a chunk is written, so at most about one chunk is
/// buffered besides the provider's state). The provider, and compressing and hashing the
/// chunks, run on `compute` when given (e.g. a thread pool, so a provider that copies a large
/// state or waits for a lock does not hold up the io thread), else on the node's executor.
/// The provider may throw; the newcomer then sees remote_error (or the std::system_error's
/// code).
template <net::transport Transport>
class state_server {
public:
    using rpc_node_type = net::node<Transport>;
    using dht_node_type = dht::node<Transport>;
    using endpoint_type = typename Transport::endpoint_type;
    using timer_type = typename Transport::timer_type;
    using state_provider = std::function<state_snapshot()>;

    /// Starts serving and advertising at once. Throws std::invalid_argument when
    /// "<prefix>.state" is not a valid method name, `priority` is not finite, or the options
    /// are out of range; std::system_error if `announce` has no valid address.
    state_server(rpc_node_type& rpc, dht_node_type& dht, std::string prefix, endpoint_type announce,
                 state_provider provider, double priority, server_options options = {},
                 std::optional<asio::any_io_executor> compute = std::nullopt)
        : state_(std::make_shared<shared>(rpc, dht)) {
        if (!net::is_valid_method(state_method(prefix)))
            throw std::invalid_argument("hivemesh::averaging::state_server: bad prefix \"" +
                                        prefix + "\"");
        if (!std::isfinite(priority))
            throw std::invalid_argument("hivemesh::averaging::state_server: priority not finite");
        if (!provider)
            throw std::invalid_argument("hivemesh::averaging::state_server: no state provider");
        if (options.max_concurrent_uploads == 0 || options.refresh_period <= duration::zero() ||
            options.advertisement_ttl <= duration::zero() || !compression::is_known(options.codec))
            throw std::invalid_argument("hivemesh::averaging::state_server: bad options");
        auto& st = *state_;
        st.prefix = std::move(prefix);
        const std::string key = donors_key(st.prefix);
        st.key = to_buffer(as_bytes(key));
        st.subkey = to_buffer(as_bytes(dht::owner_marker(rpc.identity().public_key())));
        st.address = Transport::to_address(announce).without_peer();
        st.provider = std::move(provider);
        st.priority = priority;
        st.options = options;
        st.compute = std::move(compute);
        st.record = encode(donor_record{st.priority, st.address}); // validates the address
        rpc.add_stream_handler(state_method(st.prefix),
                               [weak = std::weak_ptr<shared>(state_)](
                                   const net::call_context&,
                                   net::call_stream& stream) -> asio::awaitable<std::error_code> {
                                   auto st = weak.lock();
                                   if (!st) co_return errc::not_a_donor;
                                   co_return co_await serve(std::move(st), stream);
                               });
        asio::co_spawn(st.executor, refresh_loop(state_), asio::detached);
    }
    state_server(const state_server&) = delete;
    state_server& operator=(const state_server&) = delete;
    /// Stops serving and withdraws the advertisement without waiting (see stop()).
    ~state_server() { stop(); }

    const std::string& prefix() const noexcept { return state_->prefix; }
    double priority() const noexcept { return state_->priority; }
    bool serving() const noexcept { return state_->serving; }
    const server_statistics& statistics() const noexcept { return state_->stats; }

    /// Changes the advertised priority from the next advertisement on (async_advertise()
    /// publishes it now). Throws std::invalid_argument if it is not finite.
    void set_priority(double priority) {
        if (!std::isfinite(priority))
            throw std::invalid_argument("hivemesh::averaging::state_server: priority not finite");
        state_->priority = priority;
        state_->record = encode(donor_record{priority, state_->address});
    }

    /// Stores the advertisement now (the server also does it every refresh_period).
    /// Completion: void(std::error_code): store_refused when no replica accepted it,
    /// not_a_donor after stop(), no_peers, cancelled (the token's cancellation slot).
    template <ASIO_COMPLETION_TOKEN_FOR(void(std::error_code)) Token = default_token_t>
    auto async_advertise(Token&& token = default_token_t{}) {
        return asio::async_initiate<Token, void(std::error_code)>(
            [st = state_](auto handler) {
                co_launch(st->executor, advertise(st), std::move(handler),
                          "averaging::state_server::async_advertise");
            },
            token);
    }

    /// Stops serving: newcomers (also those mid-download, at their next chunk) get
    /// not_a_donor, the refresh stops, and the advertisement is withdrawn by storing an empty
    /// value (a tombstone readers skip) that expires 1 s after the last advertisement would
    /// have. Completion: void(std::error_code), the tombstone store's error (store_refused
    /// if no replica took it: the record then simply expires). Idempotent: a later call
    /// completes at once with no error. Not cancellable: it completes when the tombstone
    /// store does, within the DHT's request timeouts.
    template <ASIO_COMPLETION_TOKEN_FOR(void(std::error_code)) Token = default_token_t>
    auto async_stop(Token&& token = default_token_t{}) {
        return asio::async_initiate<Token, void(std::error_code)>(
            [st = state_](auto handler) {
                const bool was_serving = std::exchange(st->serving, false);
                asio::post(st->executor, [st] { st->timer.cancel(); });
                if (!was_serving || st->last_expiration == time_point{}) {
                    asio::post(st->executor, [handler = std::move(handler)]() mutable {
                        std::move(handler)(std::error_code{});
                    });
                    return;
                }
                // Started here, not on the executor: the DHT node must still exist.
                dht::record tombstone{st->key, st->subkey, {}, st->last_expiration + 1s, {}};
                st->dht->async_store(
                    std::move(tombstone),
                    [handler = std::move(handler)](std::error_code ec, dht::store_outcome) mutable {
                        std::move(handler)(ec);
                    });
            },
            token);
    }

    /// async_stop() without waiting for the tombstone.
    void stop() { async_stop(asio::detached); }

private:
    struct shared {
        shared(rpc_node_type& r, dht_node_type& d)
            : rpc(&r)
            , dht(&d)
            , executor(r.get_executor())
            , timer(executor) {}

        rpc_node_type* rpc;
        dht_node_type* dht;
        asio::any_io_executor executor;
        std::string prefix;
        byte_buffer key;
        byte_buffer subkey;
        net::peer_address address;
        state_provider provider;
        double priority = 0;
        byte_buffer record;
        server_options options;
        std::optional<asio::any_io_executor> compute;
        timer_type timer;
        time_point last_expiration{};
        bool serving = true;
        std::size_t active_uploads = 0;
        server_statistics stats;
    };
    using shared_ptr_type = std::shared_ptr<shared>;

    static asio::awaitable<std::error_code> advertise(shared_ptr_type st) {
        if (!st->serving) co_return errc::not_a_donor;
        // Strictly later than any earlier advertisement, or the replicas refuse it.
        const time_point expiration =
            std::max(net::transport_now<Transport>(st->executor) + st->options.advertisement_ttl,
                     st->last_expiration + duration(1));
        st->last_expiration = expiration;
        dht::record r{st->key, st->subkey, st->record, expiration, {}};
        auto [ec, outcome] = co_await st->dht->async_store(std::move(r));
        // Outdated: a later advertisement of ours (started meanwhile) got there first.
        if (ec == errc::store_refused && outcome.refusal == dht::store_status::outdated) ec = {};
        if (ec) {
            ++st->stats.advertisement_failures;
            log::debug("averaging", "state donor advertisement failed: ", ec.message());
        } else {
            ++st->stats.advertisements;
        }
        co_return ec;
    }

    static asio::awaitable<void> refresh_loop(shared_ptr_type st) {
        while (st->serving) {
            co_await advertise(st);
            if (!st->serving) break;
            st->timer.expires_after(st->options.refresh_period);
            co_await st->timer.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
        }
    }

    struct upload_slot {
        explicit upload_slot(shared* s) noexcept
            : st(s) {
            ++st->active_uploads;
        }
        upload_slot(const upload_slot&) = delete;
        upload_slot& operator=(const upload_slot&) = delete;
        ~upload_slot() { --st->active_uploads; }
        shared* st;
    };

    static asio::awaitable<std::error_code> serve(shared_ptr_type st, net::call_stream& stream) {
        if (!st->serving || st->active_uploads >= st->options.max_concurrent_uploads) {
            ++st->stats.uploads_refused;
            co_return st->serving ? errc::refused : errc::not_a_donor;
        }
        const upload_slot slot(st.get());
        byte_buffer raw;
        if (auto ec = co_await stream.read(raw)) {
            ++st->stats.uploads_refused;
            if (ec == asio::error::eof) co_return errc::protocol_violation;
            co_return ec;
        }
        state_request request;
        if (auto ec = decode(raw, request)) {
            ++st->stats.uploads_refused;
            co_return ec == errc::unsupported_version ? ec
                                                      : make_error_code(errc::protocol_violation);
        }
        ++st->stats.uploads_started;
        const std::error_code ec = co_await upload(st, stream);
        if (ec)
            ++st->stats.uploads_failed;
        else
            ++st->stats.uploads_completed;
        co_return ec;
    }

    static asio::awaitable<std::error_code> upload(shared_ptr_type st, net::call_stream& stream) {
        const compression::kind codec = st->options.codec;
        const std::uint32_t chunk_elements =
            detail::chunk_elements_for(st->options.chunk_size_bytes);
        state_snapshot snapshot;
        state_header header;
        std::error_code made;
        auto hash_chunks = [&] {
            snapshot = st->provider();
            made = make_header(snapshot, codec, chunk_elements, header);
        };
        co_await offload(st->compute, hash_chunks);
        if (made) co_return made;
        const std::uint64_t total = header.total_elements();
        const std::uint64_t count = header.chunk_hashes.size();
        byte_buffer first = encode(header);
        header = {};
        st->stats.bytes_sent += first.size();
        if (auto ec = co_await stream.write(std::move(first))) co_return ec;
        detail::chunk_source source(snapshot.tensors);
        for (std::uint64_t i = 0; i < count; ++i) {
            if (!st->serving) co_return errc::not_a_donor;
            byte_buffer message;
            std::error_code packed;
            auto pack = [&] {
                const auto values =
                    source.next(static_cast<std::size_t>(chunk_length(total, chunk_elements, i)));
                packed = append_chunk_message(i, codec, values, message);
            };
            co_await offload(st->compute, pack);
            if (packed) co_return packed;
            st->stats.bytes_sent += message.size();
            if (auto ec = co_await stream.write(std::move(message))) co_return ec;
            ++st->stats.chunks_sent;
        }
        co_return std::error_code{};
    }

    shared_ptr_type state_;
};

} // namespace hivemesh::averaging

// With HIVEMESH_SEPARATE_COMPILATION (the hivemesh::compiled target) the net::tcp and
// net::sim instantiations are compiled once, in src/averaging_tcp.cpp and src/averaging_sim.cpp,
// and a program links them from there; the TCP one is declared extern so that no translation unit
// instantiates it again.
#if defined(HIVEMESH_SEPARATE_COMPILATION)
#include "hivemesh/net/tcp.hpp"

namespace hivemesh::averaging {
extern template class state_server<net::tcp::transport>;
} // namespace hivemesh::averaging
#endif
