// The newcomer side of state sharing: finds the donors in the DHT and downloads the state
// from the best of them, checking every chunk, falling back to the next donor. See
// state_sharing.hpp for the protocol.
#pragma once

#include "hivemesh/averaging/state_wire.hpp"
#include "hivemesh/core/async.hpp"
#include "hivemesh/core/log.hpp"
#include "hivemesh/dht/node.hpp"
#include "hivemesh/net/node.hpp"
#include "hivemesh/net/rpc_wire.hpp"
#include "hivemesh/net/transport.hpp"

#include <asio/async_result.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/use_future.hpp>

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

// ---- newcomers -----------------------------------------------------------------------------

/// How a newcomer downloads.
struct load_options {
    /// The whole operation: DHT lookup and every donor tried.
    duration timeout = 600s;
    /// One donor, from dialing to the last chunk.
    duration donor_timeout = 300s;
    state_limits limits;
    /// Where chunks are hashed and decoded (e.g. a thread pool); none: the node's executor.
    std::optional<asio::any_io_executor> compute;
};

/// A donor that failed, and why.
struct donor_failure {
    crypto::peer_id donor;
    double priority = 0;
    std::error_code error;
};

/// What async_load_state delivers.
struct downloaded_state {
    state_snapshot contents;
    /// The donor it came from, and its advertised priority.
    crypto::peer_id donor;
    double priority = 0;
    std::uint64_t chunks = 0;
    /// Donors tried before (or, on error, instead), best first.
    std::vector<donor_failure> failures;
};

namespace detail {

/// One download from one donor over one streaming call.
template <net::transport Transport>
asio::awaitable<std::error_code> download_from(net::node<Transport>& rpc,
                                               typename net::node<Transport>::peer target,
                                               std::string method, duration timeout,
                                               const load_options& options, downloaded_state& out) {
    const state_limits& limits = options.limits;
    net::call_stream call;
    if (auto ec = co_await rpc.open_call(std::move(target), std::move(method), timeout, call))
        co_return ec;
    byte_buffer request = encode(state_request{});
    if (auto ec = co_await call.write(std::move(request))) co_return ec;
    if (auto ec = co_await call.close_write()) co_return ec;

    const auto fail = [&call](errc code) -> std::error_code {
        call.cancel(code);
        return code;
    };
    byte_buffer message;
    if (auto ec = co_await call.read(message))
        co_return ec == asio::error::eof ? make_error_code(errc::protocol_violation) : ec;
    state_header header;
    if (auto ec = decode(message, header, limits)) {
        log::debug("averaging", "bad state header from ", call.remote().short_string(), ": ",
                   ec.message());
        co_return fail(errc::protocol_violation);
    }
    state_assembler assembler(std::move(header));
    while (!assembler.complete()) {
        if (auto ec = co_await call.read(message))
            co_return ec == asio::error::eof ? make_error_code(errc::protocol_violation) : ec;
        state_chunk chunk;
        if (decode(message, chunk, limits)) co_return fail(errc::protocol_violation);
        std::error_code added;
        auto add = [&] { added = assembler.add(chunk); };
        co_await offload(options.compute, add);
        if (auto ec = added) {
            log::debug("averaging", "chunk ", chunk.index, " from ", call.remote().short_string(),
                       ": ", ec.message());
            co_return fail(static_cast<errc>(ec.value()));
        }
    }
    // The donor's final status: anything but a clean end is a failure.
    const std::error_code end = co_await call.read(message);
    if (!end) co_return fail(errc::protocol_violation);
    if (end != asio::error::eof) co_return end;
    out.chunks = assembler.chunk_count();
    out.contents = assembler.take();
    co_return std::error_code{};
}

template <net::transport Transport>
asio::awaitable<std::pair<std::error_code, std::vector<donor_info>>>
list_donors(dht::node<Transport>& dht, std::string prefix) {
    const std::string key_text = donors_key(prefix);
    const byte_buffer key = to_buffer(as_bytes(key_text));
    const dht::get_options how{.latest = true};
    auto [ec, entry] = co_await dht.async_get(key, how);
    std::pair<std::error_code, std::vector<donor_info>> result;
    if (ec) {
        result.first = ec;
        co_return result;
    }
    const std::optional<crypto::peer_id> self = dht.peer_id();
    for (auto& donor : parse_donors(entry, self))
        if (Transport::to_endpoint(donor.address)) result.second.push_back(std::move(donor));
    if (result.second.empty()) result.first = errc::not_found;
    co_return result;
}

template <net::transport Transport>
asio::awaitable<std::pair<std::error_code, downloaded_state>>
load_state(net::node<Transport>& rpc, dht::node<Transport>& dht, std::string prefix,
           load_options options) {
    std::pair<std::error_code, downloaded_state> result;
    const std::string method = state_method(prefix);
    if (!net::is_valid_method(method)) {
        result.first = errc::invalid_argument;
        co_return result;
    }
    const auto executor = rpc.get_executor();
    const time_point deadline = net::transport_now<Transport>(executor) + options.timeout;
    using timer_type = typename Transport::timer_type;
    auto [list_error, donors] =
        co_await net::within<timer_type>(list_donors(dht, std::move(prefix)), options.timeout);
    if (list_error) {
        result.first = list_error;
        co_return result;
    }
    for (const auto& donor : donors) {
        const duration remaining = deadline - net::transport_now<Transport>(executor);
        if (remaining <= duration::zero()) {
            result.first = errc::timeout;
            break;
        }
        typename net::node<Transport>::peer target{donor.id,
                                                   *Transport::to_endpoint(donor.address)};
        const duration limit = std::min(options.donor_timeout, remaining);
        downloaded_state attempt;
        const std::error_code ec = co_await net::within<timer_type>(
            download_from(rpc, std::move(target), method, limit, options, attempt), limit);
        const asio::cancellation_state cancellation = co_await asio::this_coro::cancellation_state;
        if (cancellation.cancelled() != asio::cancellation_type::none) {
            result.first = errc::cancelled;
            break;
        }
        if (!ec) {
            result.first = {};
            result.second.contents = std::move(attempt.contents);
            result.second.chunks = attempt.chunks;
            result.second.donor = donor.id;
            result.second.priority = donor.priority;
            break;
        }
        log::info("averaging", "state download from ", donor.id.short_string(),
                  " failed: ", ec.message());
        result.second.failures.push_back({donor.id, donor.priority, ec});
        result.first = ec;
    }
    co_return result;
}

} // namespace detail

/// The donors advertised under `prefix`, best first (see parse_donors), without this peer and
/// without addresses `Transport` cannot dial. Completion: void(std::error_code,
/// std::vector<donor_info>); not_found when there is none, or the DHT's error (no_peers,
/// cancelled). The DHT node must outlive the operation; the token's cancellation slot
/// cancels it.
template <net::transport Transport,
          ASIO_COMPLETION_TOKEN_FOR(void(std::error_code, std::vector<donor_info>))
              Token = default_token_t>
auto async_list_donors(dht::node<Transport>& dht, std::string prefix,
                       Token&& token = default_token_t{}) {
    return asio::async_initiate<Token, void(std::error_code, std::vector<donor_info>)>(
        [&dht](auto handler, std::string prefix) {
            co_launch(dht.get_executor(), detail::list_donors(dht, std::move(prefix)),
                      std::move(handler), "averaging::async_list_donors");
        },
        token, std::move(prefix));
}

/// Downloads the state advertised under `prefix`: reads the donors from the DHT, then tries
/// them best first (excluding this peer), each within options.donor_timeout and all within
/// options.timeout, until one delivers a complete, verified state.
///
/// Completion: void(std::error_code, downloaded_state). Errors: not_found when no donor is
/// advertised; otherwise, when every donor failed, the error of the last one tried
/// (result.failures lists each donor's error): timeout, unreachable, refused, not_a_donor,
/// connection_closed, corrupt_data (a chunk whose hash or decoding does not match the
/// header), protocol_violation (a malformed or out-of-order message), or the donor's own
/// status; timeout also when options.timeout ran out before a donor could be tried;
/// invalid_argument for a bad prefix. On error the contents are empty: a partial or
/// unverified state is never delivered.
///
/// Cancellation: the token's cancellation slot (any type) ends the operation with cancelled.
/// The RPC and DHT nodes must outlive the operation.
template <net::transport Transport, ASIO_COMPLETION_TOKEN_FOR(void(
                                        std::error_code, downloaded_state)) Token = default_token_t>
auto async_load_state(net::node<Transport>& rpc, dht::node<Transport>& dht, std::string prefix,
                      load_options options, Token&& token = default_token_t{}) {
    return asio::async_initiate<Token, void(std::error_code, downloaded_state)>(
        [&rpc, &dht](auto handler, std::string prefix, load_options options) {
            co_launch(rpc.get_executor(),
                      detail::load_state(rpc, dht, std::move(prefix), std::move(options)),
                      std::move(handler), "averaging::async_load_state");
        },
        token, std::move(prefix), std::move(options));
}

/// Blocking async_load_state(), for training loops. Throws std::system_error with the
/// operation's error, or errc::wrong_thread when called on the nodes' io thread.
template <net::transport Transport>
downloaded_state load_state(net::node<Transport>& rpc, dht::node<Transport>& dht,
                            std::string prefix, load_options options = {}) {
    if (running_in_this_thread(rpc.get_executor()))
        throw std::system_error(errc::wrong_thread, "hivemesh::averaging::load_state: blocking "
                                                    "call on an io thread; use async_load_state");
    return async_load_state(rpc, dht, std::move(prefix), std::move(options), asio::use_future)
        .get();
}

} // namespace hivemesh::averaging

// With HIVEMESH_SEPARATE_COMPILATION (the hivemesh::compiled target) the net::tcp and
// net::sim instantiations are compiled once, in src/averaging_tcp.cpp and src/averaging_sim.cpp,
// and a program links them from there; the TCP one is declared extern so that no translation unit
// instantiates it again.
#if defined(HIVEMESH_SEPARATE_COMPILATION)
#include "hivemesh/net/tcp.hpp"

namespace hivemesh::averaging::detail {
extern template asio::awaitable<std::pair<std::error_code, std::vector<donor_info>>>
list_donors(dht::node<net::tcp::transport>&, std::string);
extern template asio::awaitable<std::pair<std::error_code, downloaded_state>>
load_state(net::node<net::tcp::transport>&, dht::node<net::tcp::transport>&, std::string,
           load_options);
} // namespace hivemesh::averaging::detail
#endif
