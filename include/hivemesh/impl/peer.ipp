// The non-template parts of peer.hpp: the swarm key, the interface addresses, the threads
// of a TCP peer and hivemesh::peer itself.
#pragma once

#include "hivemesh/peer.hpp"

namespace hivemesh {

namespace detail {

HIVEMESH_DECL std::array<std::byte, 32> swarm_key_of(std::string_view secret) {
    static constexpr std::string_view label = "hivemesh swarm key v1:";
    std::array<std::byte, 32> key{};
    crypto_generichash_state state;
    crypto_generichash_init(&state, nullptr, 0, key.size());
    crypto_generichash_update(&state, reinterpret_cast<const unsigned char*>(label.data()),
                              label.size());
    crypto_generichash_update(&state, reinterpret_cast<const unsigned char*>(secret.data()),
                              secret.size());
    crypto_generichash_final(&state, reinterpret_cast<unsigned char*>(key.data()), key.size());
    return key;
}

HIVEMESH_DECL std::vector<asio::ip::address> interface_addresses(int family) {
    std::vector<asio::ip::address> out, loopback;
    ifaddrs* list = nullptr;
    if (getifaddrs(&list) != 0) return out;
    for (const ifaddrs* i = list; i; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != family || !(i->ifa_flags & IFF_UP)) continue;
        asio::ip::address ip;
        if (family == AF_INET) {
            asio::ip::address_v4::bytes_type bytes;
            std::memcpy(bytes.data(), &reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr,
                        bytes.size());
            ip = asio::ip::address_v4(bytes);
        } else {
            const auto* v6 = reinterpret_cast<const sockaddr_in6*>(i->ifa_addr);
            asio::ip::address_v6::bytes_type bytes;
            std::memcpy(bytes.data(), &v6->sin6_addr, bytes.size());
            const asio::ip::address_v6 a(bytes);
            if (a.is_link_local()) continue; // needs a zone, which multiaddrs do not carry
            ip = a;
        }
        (ip.is_loopback() ? loopback : out).push_back(ip);
    }
    freeifaddrs(list);
    out.insert(out.end(), loopback.begin(), loopback.end());
    return out;
}

HIVEMESH_DECL peer_threads::peer_threads(const peer_options& options)
    : strand_(asio::make_strand(io_.get_executor()))
    , work_(io_.get_executor()) {
    if (options.io_threads == 0) throw_bad_option("io_threads must be at least 1");
    if (options.compute_threads > 0) compute_pool_.emplace(options.compute_threads);
}

HIVEMESH_DECL peer_threads::~peer_threads() {
    stop();
}

HIVEMESH_DECL void peer_threads::start(std::size_t io_threads) {
    running_ = io_threads;
    for (std::size_t i = 0; i < io_threads; ++i)
        threads_.emplace_back([this] {
            io_.run();
            std::lock_guard lock(mutex_);
            --running_;
            idle_.notify_all();
        });
}

HIVEMESH_DECL void peer_threads::stop(duration drain) {
    work_.reset();
    {
        std::unique_lock lock(mutex_);
        idle_.wait_for(lock, drain, [this] { return running_ == 0; });
    }
    io_.stop();
    for (auto& t : threads_)
        if (t.joinable()) t.join();
    threads_.clear();
    if (compute_pool_) compute_pool_->join();
}

} // namespace detail

HIVEMESH_DECL peer::peer(peer_options options)
    : peer_threads(options)
    , basic_peer(net::tcp::transport(strand_), options, compute_executor_of(compute_pool_)) {
    start(options.io_threads);
    std::promise<std::pair<std::error_code, std::string>> bootstrapped;
    auto result = bootstrapped.get_future();
    async_bootstrap([&bootstrapped](std::error_code ec, std::string why) {
        bootstrapped.set_value({ec, std::move(why)});
    });
    auto [ec, why] = result.get();
    if (ec) {
        shutdown();
        throw std::system_error(ec, "hivemesh::peer: bootstrap failed" +
                                        (why.empty() ? std::string{} : ": " + why));
    }
}

HIVEMESH_DECL peer::~peer() {
    shutdown();
}

HIVEMESH_DECL std::optional<asio::any_io_executor>
peer::compute_executor_of(std::optional<asio::thread_pool>& pool) {
    if (!pool) return std::nullopt;
    return asio::any_io_executor(pool->get_executor());
}

HIVEMESH_DECL void peer::shutdown() {
    if (threads_.empty()) return;
    auto closed = std::make_shared<std::promise<void>>(); // may complete after we stop waiting
    auto done = closed->get_future();
    asio::dispatch(strand_, [this, closed] {
        async_close([closed](std::error_code) { closed->set_value(); });
    });
    done.wait_for(options().rpc.drain_timeout + 500ms);
    stop(500ms);
}

} // namespace hivemesh
