// A running swarm member: identity, transport, RPC node, DHT node, threads and bootstrap in
// one object (DESIGN §1, §9).
//
//     hivemesh::peer_options po;
//     po.listen = {"/ip4/127.0.0.1/tcp/0"};
//     po.initial_peers = {"/ip4/10.0.0.7/tcp/31337/p2p/<PeerId>"};
//     hivemesh::peer peer(po);   // started and bootstrapped, or throws std::system_error
//
// hivemesh::peer runs over TCP and owns its io threads and compute pool. The layers above
// (progress, optim) are templates over basic_peer<Transport>, so the same code runs on the
// simulated network, where basic_peer<net::sim::transport> lives on the network's
// one-threaded io_context and bootstraps through async_bootstrap().
#pragma once

#include "hivemesh/core/async.hpp"
#include "hivemesh/core/clock.hpp"
#include "hivemesh/core/config.hpp"
#include "hivemesh/core/error.hpp"
#include "hivemesh/crypto/identity.hpp"
#include "hivemesh/dht/node.hpp"
#include "hivemesh/dht/validator.hpp"
#include "hivemesh/net/address.hpp"
#include "hivemesh/net/node.hpp"
#include "hivemesh/net/tcp.hpp"

#include <asio/bind_executor.hpp>
#include <asio/dispatch.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>
#include <asio/strand.hpp>
#include <asio/thread_pool.hpp>

#include <sodium.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstring>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>

namespace hivemesh {

using namespace std::chrono_literals;

/// How a peer joins the swarm. Addresses are multiaddrs (net::peer_address).
struct peer_options {
    /// Where to listen: /ip4/HOST/tcp/PORT or /ip6/HOST/tcp/PORT (port 0 picks a free one;
    /// 0.0.0.0 or :: listens on every interface); /sim/NODE/port/PORT on the simulated
    /// network. Ignored in client mode.
    std::vector<std::string> listen{"/ip4/127.0.0.1/tcp/0"};
    /// Where others reach this peer, if not where it listens (a public address behind a
    /// NAT or a port forward); the first one is what the DHT announces.
    std::vector<std::string> announce;
    /// Peers to bootstrap from, each ending in /p2p/<PeerId>. Empty: the first peer of a
    /// new swarm.
    std::vector<std::string> initial_peers;
    /// The identity's key file, loaded or created (mode 0600); empty: a fresh identity.
    std::string identity_path;
    /// A shared secret: only peers with the same one can connect. Empty: none.
    std::string swarm_key;
    /// Authenticated but unencrypted connections; every peer must agree.
    bool plaintext = false;
    /// Ask the swarm but serve nothing: no listening, never in anyone's routing table.
    bool client_mode = false;
    /// Threads running the network (hivemesh::peer only); the nodes run on one strand.
    std::size_t io_threads = 1;
    /// Threads for compression and reduction; 0: they run on the io threads.
    std::size_t compute_threads = 1;
    /// How long bootstrapping may take, retries included.
    duration bootstrap_timeout = 30s;
    /// The layers' own settings (security is set from swarm_key and plaintext above).
    /// rpc.max_upload_rate and rpc.max_download_rate cap the peer's traffic (bytes per
    /// second, 0: no cap); the upload cap is also the bandwidth its averagers announce
    /// unless they set one.
    net::node_options rpc;
    dht::node_options dht;
};

namespace detail {

/// The 32-byte swarm key of a shared secret: BLAKE2b-256 of a domain label and the text.
HIVEMESH_DECL std::array<std::byte, 32> swarm_key_of(std::string_view secret);

[[noreturn]] inline void throw_bad_option(const std::string& what) {
    throw std::system_error(make_error_code(errc::invalid_argument), "hivemesh::peer: " + what);
}

/// Parses `text` as a multiaddr for Transport; `role` names the option in errors.
template <net::transport Transport>
std::pair<net::peer_address, typename Transport::endpoint_type>
parse_peer_address(const std::string& text, const char* role) {
    std::string_view reason;
    auto address = net::peer_address::parse(text, &reason);
    if (!address) throw_bad_option(std::string(role) + " \"" + text + "\": " + std::string(reason));
    auto endpoint = Transport::to_endpoint(*address);
    if (!endpoint)
        throw_bad_option(std::string(role) + " \"" + text +
                         "\": not an address of this transport (ip4 or ip6 over TCP, sim on "
                         "the simulated network; DNS names are not resolved here)");
    return {std::move(*address), *endpoint};
}

/// The addresses of the interfaces that are up, of `family` (AF_INET or AF_INET6),
/// loopback last: what a listener on 0.0.0.0 or :: can be dialed at.
HIVEMESH_DECL std::vector<asio::ip::address> interface_addresses(int family);

/// Where a listener at `local` can be dialed: itself, or every interface address for an
/// unspecified host (TCP); the same endpoint elsewhere.
template <class Endpoint>
std::vector<Endpoint> dialable(const Endpoint& local) {
    if constexpr (std::is_same_v<Endpoint, asio::ip::tcp::endpoint>) {
        if (local.address().is_unspecified()) {
            std::vector<Endpoint> out;
            for (const auto& ip : interface_addresses(local.address().is_v4() ? AF_INET : AF_INET6))
                out.emplace_back(ip, local.port());
            if (!out.empty()) return out;
        }
    }
    return {local};
}

} // namespace detail

/// A swarm member over `Transport`: its identity, RPC node and DHT node, listening where
/// peer_options says. The constructor does not contact anyone: see async_bootstrap().
/// Everything runs on the transport's executor (one thread or a strand); the accessors may
/// be called from any thread, the nodes' own rules apply to the nodes.
template <net::transport Transport>
class basic_peer {
public:
    using transport_type = Transport;
    using endpoint_type = typename Transport::endpoint_type;
    using rpc_node_type = net::node<Transport>;
    using dht_node_type = dht::node<Transport>;

    /// Loads or makes the identity (peer_options::identity_path), listens and starts the
    /// nodes. `compute` runs compression and reduction for the layers above (none: the
    /// transport's executor). Throws std::system_error: invalid_argument for a malformed
    /// option (the message names it), the identity file's errors, or listening's
    /// (e.g. address_in_use).
    basic_peer(Transport transport, peer_options options,
               std::optional<asio::any_io_executor> compute = std::nullopt)
        : basic_peer(std::move(transport), std::move(options), std::nullopt, std::move(compute)) {}

    /// As above with a given identity (tests and simulations use seeded ones).
    basic_peer(Transport transport, peer_options options, crypto::identity identity,
               std::optional<asio::any_io_executor> compute = std::nullopt)
        : basic_peer(std::move(transport), std::move(options),
                     std::optional<crypto::identity>(std::move(identity)), std::move(compute)) {}

    basic_peer(const basic_peer&) = delete;
    basic_peer& operator=(const basic_peer&) = delete;
    ~basic_peer() = default;

    const crypto::peer_id& id() const noexcept { return rpc_->id(); }
    const peer_options& options() const noexcept { return options_; }
    bool client_mode() const noexcept { return options_.client_mode; }
    asio::any_io_executor get_executor() const { return transport_.executor(); }
    /// Where compression and reduction run.
    std::optional<asio::any_io_executor> compute_executor() const { return compute_; }
    Transport& transport() noexcept { return transport_; }
    rpc_node_type& rpc() noexcept { return *rpc_; }
    dht_node_type& dht() noexcept { return *dht_; }
    /// Where others dial this peer (none in client mode).
    const std::optional<endpoint_type>& announce_endpoint() const noexcept { return announce_; }

    /// Dialable multiaddrs, each ending in /p2p/<PeerId>: peer_options::announce if given,
    /// else where the peer listens, with port 0 resolved and an unspecified host expanded
    /// to the interfaces' addresses. Empty in client mode.
    std::vector<std::string> addresses() const;

    /// Contacts the initial peers and fills the routing table, retrying with backoff until
    /// peer_options::bootstrap_timeout. Completion: void(std::error_code, std::string);
    /// the text says, for each initial peer, why it could not be reached. Errors: no_peers
    /// (none answered; a wrong swarm key shows as handshake_failed in the text),
    /// cancelled. Without initial peers it completes at once with success. The peer must
    /// outlive the operation; after close() it ends at its next attempt, with cancelled.
    template <ASIO_COMPLETION_TOKEN_FOR(void(std::error_code, std::string)) Token = default_token_t>
    auto async_bootstrap(Token&& token = default_token_t{}) {
        return asio::async_initiate<Token, void(std::error_code, std::string)>(
            [this](auto handler) {
                co_launch(get_executor(), bootstrap(), std::move(handler),
                          "hivemesh::basic_peer::async_bootstrap");
            },
            token);
    }

    /// Adds a DHT record validator (e.g. a layer's schema check); safe while the peer runs.
    void add_validator(std::shared_ptr<const dht::record_validator> validator);

    /// Stops listening and closes the DHT node; the calls in flight get up to
    /// peer_options::rpc.drain_timeout to finish (see net::node::close). Call on the peer's
    /// executor, or while nothing runs it. The layers above withdraw their records first
    /// (e.g. collaborative_optimizer::async_close).
    void close() {
        dht_->close();
        rpc_->close();
    }

    /// close(), then waits for the calls in flight. Completion: void(std::error_code):
    /// success, or timeout when some were cut at the drain deadline. Call on the peer's
    /// executor; the peer must outlive the operation. Cancellation ends only the wait.
    template <ASIO_COMPLETION_TOKEN_FOR(void(std::error_code)) Token = default_token_t>
    auto async_close(Token&& token = default_token_t{}) {
        dht_->close();
        return rpc_->async_close(std::forward<Token>(token));
    }

private:
    basic_peer(Transport transport, peer_options options, std::optional<crypto::identity> identity,
               std::optional<asio::any_io_executor> compute);

    static bool is_loopback(const endpoint_type& e) {
        if constexpr (std::is_same_v<endpoint_type, asio::ip::tcp::endpoint>)
            return e.address().is_loopback();
        else
            return false;
    }

    asio::awaitable<std::pair<std::error_code, std::string>> bootstrap();

    time_point now() const { return net::transport_now<Transport>(get_executor()); }

    Transport transport_;
    peer_options options_;
    std::optional<asio::any_io_executor> compute_;
    std::vector<typename rpc_node_type::peer> initial_;
    std::vector<net::peer_address> announce_addresses_;
    std::optional<endpoint_type> announce_;
    std::unique_ptr<rpc_node_type> rpc_;
    std::unique_ptr<dht_node_type> dht_;
};

// basic_peer's larger members, defined out of the class: with the extern template of the
// compiled mode (end of this file), no translation unit instantiates them again to inline them.

template <net::transport Transport>
std::vector<std::string> basic_peer<Transport>::addresses() const {
    std::vector<std::string> out;
    for (const auto& address : announce_addresses_)
        out.push_back(address.with_peer(id()).to_string());
    return out;
}

template <net::transport Transport>
void basic_peer<Transport>::add_validator(std::shared_ptr<const dht::record_validator> validator) {
    asio::dispatch(get_executor(), [dht = dht_.get(), validator = std::move(validator)] {
        dht->add_validator(validator);
    });
}

template <net::transport Transport>
basic_peer<Transport>::basic_peer(Transport transport, peer_options options,
                                  std::optional<crypto::identity> identity,
                                  std::optional<asio::any_io_executor> compute)
    : transport_(std::move(transport))
    , options_(std::move(options))
    , compute_(std::move(compute)) {
    if (const auto error = net::rate_limit_error(options_.rpc); !error.empty())
        detail::throw_bad_option("rpc." + error);
    for (const auto& text : options_.initial_peers) {
        auto [address, endpoint] = detail::parse_peer_address<Transport>(text, "initial peer");
        if (!address.peer)
            detail::throw_bad_option("initial peer \"" + text + "\" lacks /p2p/<PeerId>");
        initial_.push_back({*address.peer, endpoint});
    }
    std::vector<endpoint_type> listen;
    if (!options_.client_mode) {
        if (options_.listen.empty())
            detail::throw_bad_option("no listen address (set client_mode to listen nowhere)");
        for (const auto& text : options_.listen)
            listen.push_back(detail::parse_peer_address<Transport>(text, "listen address").second);
    }
    for (const auto& text : options_.announce)
        announce_addresses_.push_back(
            detail::parse_peer_address<Transport>(text, "announce address").first.without_peer());

    if (!identity)
        identity = options_.identity_path.empty()
                       ? crypto::identity::generate()
                       : crypto::identity::load_or_create(options_.identity_path);
    net::node_options rpc_options = options_.rpc;
    rpc_options.security.plaintext = options_.plaintext;
    if (!options_.swarm_key.empty())
        rpc_options.security.swarm_key = detail::swarm_key_of(options_.swarm_key);
    rpc_ = std::make_unique<rpc_node_type>(transport_, std::move(*identity), rpc_options);

    std::vector<typename Transport::listener_type> listeners;
    for (const auto& at : listen) {
        auto listener = transport_.listen(at);
        if (options_.announce.empty())
            for (const auto& e : detail::dialable(listener.local_endpoint()))
                announce_addresses_.push_back(Transport::to_address(e));
        listeners.push_back(std::move(listener));
    }
    if (!options_.client_mode && !announce_addresses_.empty()) {
        announce_ = Transport::to_endpoint(announce_addresses_.front());
        // Of the listeners' own addresses, announce one that others can reach.
        if (options_.announce.empty())
            for (const auto& address : announce_addresses_)
                if (auto e = Transport::to_endpoint(address); e && !is_loopback(*e)) {
                    announce_ = e;
                    break;
                }
    }
    dht_ = std::make_unique<dht_node_type>(*rpc_, announce_, options_.dht);
    for (auto& listener : listeners)
        rpc_->serve(std::move(listener));
}

template <net::transport Transport>
asio::awaitable<std::pair<std::error_code, std::string>> basic_peer<Transport>::bootstrap() {
    if (initial_.empty()) co_return std::pair{std::error_code{}, std::string{}};
    const time_point give_up = now() + options_.bootstrap_timeout;
    duration pause = 250ms;
    while (true) {
        auto [ec] = co_await dht_->async_bootstrap(initial_, default_token_t{});
        if (!ec) co_return std::pair{ec, std::string{}};
        if (ec != errc::no_peers) co_return std::pair{ec, std::string(ec.message())};
        const time_point t = now();
        if (t + pause >= give_up) break;
        typename Transport::timer_type timer(get_executor());
        timer.expires_after(pause);
        auto [waited] = co_await timer.async_wait(default_token_t{});
        if (waited) co_return std::pair{make_error_code(errc::cancelled), std::string{}};
        pause = std::min<duration>(2 * pause, 4s);
    }
    // Say why, peer by peer: a wrong swarm key, a refused port, a wrong PeerId...
    std::string why;
    for (const auto& p : initial_) {
        const std::error_code ec = co_await rpc_->connect(p);
        if (!why.empty()) why += "; ";
        why += Transport::to_address(p.endpoint, p.id).to_string() + ": " +
               (ec ? ec.message() : std::string("connects, but answers no DHT ping"));
    }
    co_return std::pair{make_error_code(errc::no_peers), std::move(why)};
}

namespace detail {

/// The threads of a TCP peer, made before its nodes (a base, so it is built first) and
/// started once they exist.
class peer_threads {
protected:
    HIVEMESH_DECL explicit peer_threads(const peer_options& options);
    HIVEMESH_DECL ~peer_threads();

    HIVEMESH_DECL void start(std::size_t io_threads);

    /// Lets the io threads finish what is queued (completions of the calls a close ended)
    /// for up to `drain`, then stops them, and joins them and the compute pool.
    HIVEMESH_DECL void stop(duration drain = 0s);

    // Declared before io_, so it outlives it: coroutine frames that io_ destroys at shutdown
    // may hold strands on the pool, whose destructors use the pool's strand service.
    std::optional<asio::thread_pool> compute_pool_;
    asio::io_context io_;
    asio::strand<asio::io_context::executor_type> strand_;
    asio::executor_work_guard<asio::io_context::executor_type> work_;
    std::vector<std::thread> threads_;
    std::mutex mutex_;
    std::condition_variable idle_;
    std::size_t running_ = 0; ///< io threads still in run()
};

} // namespace detail

/// A swarm member over TCP with its own threads: started and bootstrapped by its
/// constructor. The blocking forms of the nodes may be called from any thread but its io
/// threads; the destructor closes everything and joins its threads, after letting the
/// calls in flight finish for up to rpc.drain_timeout (the rest fail with
/// connection_closed).
class peer : private detail::peer_threads, public basic_peer<net::tcp::transport> {
public:
    /// Starts the peer and bootstraps it. Throws std::system_error: the constructor errors
    /// of basic_peer, or no_peers after bootstrap_timeout with, in the message, why each
    /// initial peer could not be reached (e.g. handshake_failed for another swarm key).
    HIVEMESH_DECL explicit peer(peer_options options);
    peer(const peer&) = delete;
    peer& operator=(const peer&) = delete;
    HIVEMESH_DECL ~peer();

private:
    HIVEMESH_DECL static std::optional<asio::any_io_executor>
    compute_executor_of(std::optional<asio::thread_pool>& pool);

    /// Closes the nodes on their strand, lets the calls in flight finish (up to the drain
    /// timeout) and the completions of those it cut run, then stops and joins the
    /// threads; each step bounded, so a wedged io thread cannot hold us.
    /// Idempotent.
    HIVEMESH_DECL void shutdown();
};

} // namespace hivemesh

#if !defined(HIVEMESH_SEPARATE_COMPILATION)
#include "hivemesh/impl/peer.ipp"
#else
// The TCP instantiation is compiled once, in src/peer.cpp, not in every translation unit.
namespace hivemesh {
extern template class basic_peer<net::tcp::transport>;
} // namespace hivemesh
#endif
