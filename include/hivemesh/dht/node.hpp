// A Kademlia DHT node over any transport (net::tcp or net::sim), on top of an RPC node.
//
// RPC methods: "dht.ping", "dht.store" and "dht.find" (see dht/messages.hpp). Every request
// says where its sender listens (or that it is a client and serves nothing); every request
// and response feeds the routing table. Lookups are iterative and parallel: at most
// `alpha` requests in flight per key, several keys batched into one request to a peer
// that is a candidate for each of them; a key's search ends when the k nearest nodes seen
// have all answered (or, for a plain get, when a value is found). Failing peers are
// blacklisted with exponential backoff and dropped from the routing table after repeated
// failures. A maintenance loop expires values, refreshes stale buckets, re-bootstraps from
// the initial peers (so a split swarm heals) and republishes the keys this node is a
// replica of (so values survive crashes); keys are also handed to newly seen nodes that
// become their nearest.
//
// Threading: everything runs on the RPC node's executor (one thread, or a strand). The
// asynchronous API may be called from any thread; the blocking forms must not be called
// on an io thread (they fail with errc::wrong_thread instead of deadlocking).
#pragma once

#include "hivemesh/core/async.hpp"
#include "hivemesh/core/bytes.hpp"
#include "hivemesh/core/clock.hpp"
#include "hivemesh/core/error.hpp"
#include "hivemesh/core/log.hpp"
#include "hivemesh/core/random.hpp"
#include "hivemesh/dht/id.hpp"
#include "hivemesh/dht/messages.hpp"
#include "hivemesh/dht/rate_limiter.hpp"
#include "hivemesh/dht/record.hpp"
#include "hivemesh/dht/routing_table.hpp"
#include "hivemesh/dht/storage.hpp"
#include "hivemesh/dht/typed.hpp"
#include "hivemesh/dht/validator.hpp"
#include "hivemesh/net/mux.hpp"
#include "hivemesh/net/node.hpp"

#include <asio/async_result.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/strand.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/use_future.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <system_error>
#include <unordered_map>
#include <utility>
#include <vector>

namespace hivemesh::dht {

using namespace std::chrono_literals;

struct node_options {
    routing_options routing;
    /// Requests in flight per key during a lookup.
    std::size_t alpha = 3;
    /// Nodes each value is stored on.
    std::size_t num_replicas = 5;
    /// Deadline of one request to one peer.
    duration request_timeout = 5s;
    /// Keys carried by one find request (several lookups share requests).
    std::size_t max_keys_per_request = 32;
    /// Limits of the values this node stores for others, and of its cache.
    storage_limits storage;
    storage_limits cache = {1024, 1024, 64 * 1024, 1024, 32u << 20};
    message_limits messages;
    /// Requests a peer may send (a store costs one per item), and the burst allowed.
    double requests_per_second = 500;
    double request_burst = 1000;
    /// How often the maintenance loop runs; zero disables it.
    duration maintenance_period = 5s;
    /// A bucket with no lookup for this long is refreshed.
    duration refresh_interval = 300s;
    /// The initial peers are contacted again this often (and whenever the table is empty).
    duration rebootstrap_interval = 60s;
    /// Keys this node is a replica of are stored again on their nearest nodes this often.
    duration republish_interval = 300s;
    /// How long a peer that sent a malformed request is refused.
    duration penalty = 60s;
    /// Backoff of a failing peer: base doubled per consecutive failure, up to max.
    duration blacklist_base = 1s;
    duration blacklist_max = 60s;
    /// After a get, cache the value locally and on the nearest visited node that lacked it.
    bool cache_on_get = true;
};

/// How a get searches.
struct get_options {
    /// Search fully (until the k nearest nodes answered) and return the newest value,
    /// merging dictionaries subkey by subkey, instead of the first value found.
    bool latest = false;
};

/// What storing one record achieved.
struct store_outcome {
    /// Nodes that accepted the record (this one included, when it is among the nearest).
    std::size_t replicas = 0;
    /// When no node accepted it: a refusal one of them gave (the lowest status value, so
    /// `outdated` wins over rarer reasons); nullopt if no node answered at all.
    std::optional<store_status> refusal;
};

/// Counters of one node.
struct node_statistics {
    std::uint64_t lookups = 0;       ///< key searches finished
    std::uint64_t lookup_rounds = 0; ///< sum of their rounds (hops from our own table)
    std::uint64_t requests_sent = 0;
    std::uint64_t requests_failed = 0;
    std::uint64_t requests_served = 0;
    std::uint64_t requests_refused = 0; ///< malformed or over a limit; the sender is penalised
    std::uint64_t handoffs = 0;         ///< keys handed to newly seen nodes
    std::uint64_t republished = 0;      ///< keys stored again by the maintenance loop
};

namespace detail {

/// Merges `incoming` into `merged` with the storage rules: a strictly later expiration
/// wins, dictionaries merge subkey by subkey, and the kind changes only for a value
/// later than everything held.
inline void merge_entry(std::optional<key_entry>& merged, const key_entry& incoming) {
    if (incoming.empty()) return;
    if (!merged || merged->empty()) {
        merged = incoming;
        return;
    }
    if (incoming.plain) {
        if (incoming.plain->expiration > merged->expiration()) {
            merged->dictionary.clear();
            merged->plain = incoming.plain;
        }
        return;
    }
    if (merged->plain) {
        if (incoming.expiration() <= merged->plain->expiration) return;
        merged->plain.reset();
    }
    for (const auto& [subkey, value] : incoming.dictionary) {
        auto [it, added] = merged->dictionary.try_emplace(subkey, value);
        if (!added && value.expiration > it->second.expiration) it->second = value;
    }
}

/// Every record held in `entry`.
inline std::vector<record> records_of(const key_entry& entry) {
    std::vector<record> out;
    if (entry.plain) out.push_back(entry.to_record(std::nullopt, *entry.plain));
    for (const auto& [subkey, value] : entry.dictionary)
        out.push_back(entry.to_record(subkey, value));
    return out;
}

} // namespace detail

/// A DHT node. Owns its routing table and storage; uses (does not own) an RPC node, which
/// must outlive it and serve on the endpoint announced here.
///
/// Every async_ operation runs as one coroutine on the node's executor (hivemesh::co_launch)
/// and completes with the signature its comment names. Cancellation: emitting the token's
/// cancellation slot (any type) cancels the requests the operation is waiting for, and it
/// completes with cancelled and an empty result; so does close().
template <net::transport Transport>
class node {
public:
    using rpc_node_type = net::node<Transport>;
    using endpoint_type = typename Transport::endpoint_type;
    using timer_type = typename Transport::timer_type;
    using contact_type = contact<endpoint_type>;
    using peer = typename rpc_node_type::peer;

    /// Registers the DHT methods on `rpc` (unless `announce` is empty: client mode, where
    /// the node asks but serves nothing and nobody adds it to a routing table) and starts
    /// the maintenance loop. `announce` is where other nodes reach `rpc`.
    node(rpc_node_type& rpc, std::optional<endpoint_type> announce, node_options options = {})
        : state_(std::make_shared<state>(rpc, std::move(announce), std::move(options))) {
        if (state_->options.alpha == 0 || state_->options.num_replicas == 0 ||
            state_->options.max_keys_per_request == 0)
            throw std::invalid_argument(
                "hivemesh::dht::node: alpha, num_replicas and max_keys_per_request must be > 0");
        if (state_->announce) register_handlers(state_);
        if (state_->options.maintenance_period > duration::zero())
            asio::co_spawn(state_->executor, maintain(state_), asio::detached);
    }
    node(const node&) = delete;
    node& operator=(const node&) = delete;
    ~node() { close(); }

    const dht::id& id() const noexcept { return state_->self; }
    const crypto::peer_id& peer_id() const noexcept { return state_->rpc->id(); }
    bool client_mode() const noexcept { return !state_->announce; }
    asio::any_io_executor get_executor() const { return state_->executor; }

    /// Adds a validator; every stored and every received record must pass all of them,
    /// and records we store are signed by them (owner markers). Call before serving.
    void add_validator(std::shared_ptr<const record_validator> validator) {
        state_->validators.add(std::move(validator));
    }

    /// Contacts `initial` peers, then looks up our own id and refreshes the buckets, so the
    /// routing table fills. The peers are remembered and contacted again periodically.
    /// Completion: void(std::error_code); no_peers if none of them answered.
    template <ASIO_COMPLETION_TOKEN_FOR(void(std::error_code)) Token = default_token_t>
    auto async_bootstrap(std::vector<peer> initial, Token&& token = default_token_t{}) {
        return run<void(std::error_code)>(std::forward<Token>(token),
                                          [initial = std::move(initial)](state_ptr st) mutable {
                                              return bootstrap(std::move(st), std::move(initial));
                                          });
    }

    /// Stores `records` on the num_replicas nodes nearest to each key (signing protected
    /// ones). Completion: void(std::error_code, std::vector<store_outcome>) with one
    /// outcome per record; the error is no_peers (client with an empty table) or
    /// cancelled/connection_closed when the node closes.
    template <ASIO_COMPLETION_TOKEN_FOR(void(std::error_code, std::vector<store_outcome>))
                  Token = default_token_t>
    auto async_store_many(std::vector<record> records, Token&& token = default_token_t{}) {
        return run<void(std::error_code, std::vector<store_outcome>)>(
            std::forward<Token>(token), [records = std::move(records)](state_ptr st) mutable {
                return store_records(std::move(st), std::move(records));
            });
    }

    /// Stores one record. Completion: void(std::error_code, store_outcome); the error is
    /// store_refused when no node accepted it (the outcome says why).
    template <ASIO_COMPLETION_TOKEN_FOR(void(std::error_code, store_outcome))
                  Token = default_token_t>
    auto async_store(record r, Token&& token = default_token_t{}) {
        return run<void(std::error_code, store_outcome)>(
            std::forward<Token>(token), [r = std::move(r)](state_ptr st) mutable {
                return store_one(std::move(st), std::move(r));
            });
    }
    /// Stores `value` under `key` until `expiration`.
    template <ASIO_COMPLETION_TOKEN_FOR(void(std::error_code, store_outcome))
                  Token = default_token_t>
    auto async_store(byte_view key, byte_view value, time_point expiration,
                     Token&& token = default_token_t{}) {
        return async_store(record{to_buffer(key), std::nullopt, to_buffer(value), expiration, {}},
                           std::forward<Token>(token));
    }
    /// Stores `value` under `subkey` of the dictionary at `key` until `expiration`.
    template <ASIO_COMPLETION_TOKEN_FOR(void(std::error_code, store_outcome))
                  Token = default_token_t>
    auto async_store(byte_view key, byte_view subkey, byte_view value, time_point expiration,
                     Token&& token = default_token_t{}) {
        return async_store(
            record{to_buffer(key), to_buffer(subkey), to_buffer(value), expiration, {}},
            std::forward<Token>(token));
    }

    /// Finds the values of `keys`. Completion: void(std::error_code,
    /// std::vector<std::optional<key_entry>>), one per key (nullopt: no node has it).
    template <ASIO_COMPLETION_TOKEN_FOR(void(
                  std::error_code, std::vector<std::optional<key_entry>>)) Token = default_token_t>
    auto async_get_many(std::vector<byte_buffer> keys, get_options options,
                        Token&& token = default_token_t{}) {
        return run<void(std::error_code, std::vector<std::optional<key_entry>>)>(
            std::forward<Token>(token), [keys = std::move(keys), options](state_ptr st) mutable {
                return get_keys(std::move(st), std::move(keys), options);
            });
    }

    /// Finds the value of `key`. Completion: void(std::error_code, key_entry); not_found if
    /// no node has a live value.
    template <ASIO_COMPLETION_TOKEN_FOR(void(std::error_code, key_entry)) Token = default_token_t>
    auto async_get(byte_view key, get_options options, Token&& token = default_token_t{}) {
        return run<void(std::error_code, key_entry)>(
            std::forward<Token>(token), [key = to_buffer(key), options](state_ptr st) mutable {
                return get_one(std::move(st), std::move(key), options);
            });
    }

    /// The `count` nodes nearest to `target` that answered a lookup, nearest first (this
    /// node included unless it is a client). Completion: void(std::error_code,
    /// std::vector<contact_type>).
    template <ASIO_COMPLETION_TOKEN_FOR(void(std::error_code, std::vector<contact_type>))
                  Token = default_token_t>
    auto async_find_nearest(dht::id target, std::size_t count, Token&& token = default_token_t{}) {
        return run<void(std::error_code, std::vector<contact_type>)>(
            std::forward<Token>(token),
            [target, count](state_ptr st) { return find_nearest(std::move(st), target, count); });
    }

    // ---- blocking forms, for training loops (never on an io thread) ----------------

    /// Throw std::system_error: errc::wrong_thread on an io thread, else the error of the
    /// asynchronous form.
    void bootstrap(std::vector<peer> initial) {
        block(async_bootstrap(std::move(initial), asio::use_future));
    }
    std::vector<store_outcome> store_many(std::vector<record> records) {
        return block(async_store_many(std::move(records), asio::use_future));
    }
    store_outcome store(byte_view key, byte_view value, time_point expiration) {
        return block(async_store(key, value, expiration, asio::use_future));
    }
    store_outcome store(byte_view key, byte_view subkey, byte_view value, time_point expiration) {
        return block(async_store(key, subkey, value, expiration, asio::use_future));
    }
    /// Returns nullopt when no node has the key (instead of throwing not_found).
    std::optional<key_entry> get(byte_view key, get_options options = {}) {
        auto entries = block(async_get_many({to_buffer(key)}, options, asio::use_future));
        return std::move(entries.front());
    }
    std::vector<std::optional<key_entry>> get_many(std::vector<byte_buffer> keys,
                                                   get_options options = {}) {
        return block(async_get_many(std::move(keys), options, asio::use_future));
    }
    std::vector<contact_type> find_nearest(const dht::id& target, std::size_t count) {
        return block(async_find_nearest(target, count, asio::use_future));
    }

    // ---- typed helpers ----------------------------------------------------------------

    /// Stores `value` encoded by value_codec<T>.
    template <class T>
    store_outcome store_value(byte_view key, const T& value, time_point expiration) {
        const auto bytes = encode_value(value);
        return store(key, bytes, expiration);
    }
    /// The plain value at `key` decoded as T; nullopt if absent, a dictionary, or not a T.
    template <class T>
    std::optional<T> get_value(byte_view key, get_options options = {}) {
        const auto entry = get(key, options);
        if (!entry || !entry->plain) return std::nullopt;
        T out{};
        if (decode_value(entry->plain->value, out)) return std::nullopt;
        return out;
    }

    // ---- inspection (call on the node's executor, or while it is idle) -----------------

    const routing_table<endpoint_type>& table() const noexcept { return state_->table; }
    const dht::storage& local_storage() const noexcept { return state_->storage; }
    const dht::storage& local_cache() const noexcept { return state_->cache; }
    const node_statistics& statistics() const noexcept { return state_->stats; }
    /// Runs the republish step now (the maintenance loop does it every republish_interval).
    /// Completion: void(std::error_code).
    template <ASIO_COMPLETION_TOKEN_FOR(void(std::error_code)) Token = default_token_t>
    auto async_republish(Token&& token = default_token_t{}) {
        return run<void(std::error_code)>(std::forward<Token>(token),
                                          [](state_ptr st) { return republish(std::move(st)); });
    }

    /// Stops the maintenance loop and answers no more requests; operations under way end
    /// early. The RPC node stays open. Idempotent.
    void close() {
        auto st = state_;
        if (!st || st->closed) return;
        st->closed = true;
        asio::post(st->executor, [st] { st->maintenance_timer.cancel(); });
    }

private:
    struct blacklist_entry {
        time_point until{};
        unsigned failures = 0;
    };

    struct state {
        state(rpc_node_type& r, std::optional<endpoint_type> a, node_options o)
            : rpc(&r)
            , executor(r.get_executor())
            , self(dht::id::of_peer(r.id()))
            , announce(std::move(a))
            , options(std::move(o))
            , table(self, options.routing)
            , storage(options.storage)
            , cache(options.cache)
            , limiter(options.requests_per_second, options.request_burst)
            , rng(seed_of(self))
            , maintenance_timer(executor) {}

        static std::uint64_t seed_of(const dht::id& self) {
            std::uint64_t seed = 0;
            std::memcpy(&seed, self.bytes().data(), sizeof seed);
            return seed;
        }

        time_point now() const { return net::transport_now<Transport>(executor); }

        rpc_node_type* rpc;
        asio::any_io_executor executor;
        dht::id self;
        std::optional<endpoint_type> announce;
        node_options options;
        routing_table<endpoint_type> table;
        dht::storage storage;
        dht::storage cache;
        validator_chain validators;
        rate_limiter limiter;
        random_generator rng;
        timer_type maintenance_timer;
        std::vector<peer> initial_peers;
        std::unordered_map<dht::id, blacklist_entry> blacklist;
        std::unordered_map<crypto::peer_id, time_point> penalised;
        std::set<dht::id> pinging; // eviction pings under way
        time_point last_bootstrap{};
        time_point last_republish{};
        node_statistics stats;
        bool closed = false;
    };
    using state_ptr = std::shared_ptr<state>;

    // ---- plumbing ----------------------------------------------------------------------

    /// Runs `make(state)` (a coroutine) on the node's executor and completes `token` with
    /// its result, under the policy of hivemesh::co_launch.
    template <class Signature, class Token, class Make>
    auto run(Token&& token, Make make) {
        return asio::async_initiate<Token, Signature>(
            [st = state_](auto handler, Make make) mutable {
                co_launch(st->executor, make(st), std::move(handler), "dht::node");
            },
            token, std::move(make));
    }

    template <class Future>
    auto block(Future future) {
        if (running_in_this_thread(state_->executor))
            throw std::system_error(errc::wrong_thread,
                                    "hivemesh::dht::node: blocking call on an io thread; use the "
                                    "async_ form there");
        return future.get();
    }

    static peer to_peer(const contact_type& c) { return peer{c.peer, c.endpoint}; }

    static sender_info sender(const state_ptr& st) {
        if (!st->announce) return {};
        return {Transport::to_address(*st->announce)};
    }

    static bool blacklisted(const state_ptr& st, const dht::id& node) {
        const auto it = st->blacklist.find(node);
        return it != st->blacklist.end() && it->second.until > st->now();
    }

    /// A peer answered us or sent us a valid request from where it listens.
    static void note_alive(const state_ptr& st, const contact_type& c) {
        st->blacklist.erase(c.id);
        const auto outcome = st->table.on_seen(c, st->now());
        if (outcome.ping_candidate && !st->pinging.contains(outcome.ping_candidate->id)) {
            st->pinging.insert(outcome.ping_candidate->id);
            asio::co_spawn(st->executor, check_alive(st, *outcome.ping_candidate), asio::detached);
        }
        if (outcome.result == routing_table<endpoint_type>::seen_result::added) hand_off(st, c);
    }

    static void note_failure(const state_ptr& st, const dht::id& node) {
        st->table.on_failure(node);
        auto& entry = st->blacklist[node];
        entry.failures = std::min(entry.failures + 1, 30u);
        auto backoff = st->options.blacklist_base * (std::int64_t{1} << (entry.failures - 1));
        entry.until = st->now() + std::min(backoff, st->options.blacklist_max);
    }

    /// Pings the least-recently-seen contact of a full bucket; its failure lets a newer
    /// contact in.
    static asio::awaitable<void> check_alive(state_ptr st, contact_type c) {
        // A named body: g++ 12 destroys temporaries inside a co_await expression twice.
        auto body = encode(ping_request{sender(st)});
        co_await call(st, c, "dht.ping", std::move(body));
        st->pinging.erase(c.id);
    }

    /// One request to one peer; feeds the routing table and the blacklist.
    static asio::awaitable<net::call_result> call(state_ptr st, contact_type c, std::string method,
                                                  byte_buffer body) {
        if (st->closed) co_return net::call_result{errc::cancelled, {}};
        ++st->stats.requests_sent;
        auto [ec, response] = co_await st->rpc->async_call(
            to_peer(c), std::move(method), std::move(body), st->options.request_timeout);
        if (st->closed) co_return net::call_result{errc::cancelled, {}};
        if (ec) {
            ++st->stats.requests_failed;
            note_failure(st, c.id);
        } else {
            note_alive(st, c);
        }
        co_return net::call_result{ec, std::move(response)};
    }

    // ---- serving -----------------------------------------------------------------------

    using serve_function = std::error_code (*)(const state_ptr&, const net::call_context&,
                                               byte_view, byte_buffer&);

    static void register_handlers(const state_ptr& st) {
        // Handlers hold the state weakly: the RPC node may outlive this node.
        const auto add = [&](const char* method, serve_function serve) {
            st->rpc->add_handler(method,
                                 [weak = std::weak_ptr<state>(st), serve](
                                     const net::call_context& context, byte_view request,
                                     byte_buffer& response) -> asio::awaitable<std::error_code> {
                                     co_return serve(weak.lock(), context, request, response);
                                 });
        };
        add("dht.ping", &serve_ping);
        add("dht.store", &serve_store);
        add("dht.find", &serve_find);
    }

    /// Admits a request: the node is open, the sender within its allowance and not
    /// penalised. A malformed request costs its sender its routing-table entry and every
    /// request for `penalty`.
    static std::error_code admit(const state_ptr& st, const net::call_context& context,
                                 double cost) {
        if (!st || st->closed) return errc::refused;
        const auto now = st->now();
        if (const auto it = st->penalised.find(context.remote);
            it != st->penalised.end() && it->second > now) {
            ++st->stats.requests_refused;
            return errc::rate_limited;
        }
        if (!st->limiter.allow(context.remote, now, cost)) {
            ++st->stats.requests_refused;
            return errc::rate_limited;
        }
        ++st->stats.requests_served;
        return {};
    }

    static std::error_code penalise(const state_ptr& st, const net::call_context& context,
                                    std::error_code ec) {
        ++st->stats.requests_refused;
        st->penalised[context.remote] = st->now() + st->options.penalty;
        st->table.remove(dht::id::of_peer(context.remote));
        log::warning("dht", "refused a request from ", context.remote.short_string(), ": ",
                     ec.message());
        return ec;
    }

    /// Adds the sender of a request to the routing table if it serves.
    static void note_sender(const state_ptr& st, const net::call_context& context,
                            const sender_info& from) {
        if (!from.listen) return;
        const auto endpoint = Transport::to_endpoint(*from.listen);
        if (!endpoint) return;
        note_alive(st, contact_type{dht::id::of_peer(context.remote), context.remote, *endpoint});
    }

    static std::error_code serve_ping(const state_ptr& st, const net::call_context& context,
                                      byte_view request, byte_buffer& response) {
        if (auto ec = admit(st, context, 1)) return ec;
        ping_request ping;
        if (auto ec = decode(request, ping, st->options.messages)) return penalise(st, context, ec);
        note_sender(st, context, ping.from);
        response = encode(ping_response{});
        return {};
    }

    static std::error_code serve_store(const state_ptr& st, const net::call_context& context,
                                       byte_view request, byte_buffer& response) {
        if (auto ec = admit(st, context, 1)) return ec;
        store_request store;
        if (auto ec = decode(request, store, st->options.messages))
            return penalise(st, context, ec);
        if (!store.items.empty() && !st->limiter.allow(context.remote, st->now(),
                                                       static_cast<double>(store.items.size()))) {
            ++st->stats.requests_refused;
            return errc::rate_limited;
        }
        note_sender(st, context, store.from);
        store_response reply;
        reply.statuses.reserve(store.items.size());
        const auto now = st->now();
        for (const auto& item : store.items) {
            if (st->validators.validate(item.item)) {
                reply.statuses.push_back(store_status::invalid);
                continue;
            }
            auto& target = item.in_cache ? st->cache : st->storage;
            reply.statuses.push_back(target.store(item.item, now));
        }
        response = encode(reply);
        return {};
    }

    static std::error_code serve_find(const state_ptr& st, const net::call_context& context,
                                      byte_view request, byte_buffer& response) {
        if (auto ec = admit(st, context, 1)) return ec;
        find_request find;
        if (auto ec = decode(request, find, st->options.messages)) return penalise(st, context, ec);
        note_sender(st, context, find.from);
        const auto requester = dht::id::of_peer(context.remote);
        const auto count = std::min<std::size_t>(
            {find.max_peers, st->options.routing.k, st->options.messages.max_peers});
        find_response reply;
        reply.results.reserve(find.keys.size());
        const auto now = st->now();
        for (const auto& key : find.keys) {
            find_result result;
            result.entry = local_entry(st, key, now);
            for (const auto& c : st->table.nearest(key, count, &requester))
                result.nearest.push_back({c.peer, Transport::to_address(c.endpoint)});
            reply.results.push_back(std::move(result));
        }
        response = encode(reply);
        return {};
    }

    /// What this node holds for `key`: its storage merged with its cache.
    static std::optional<key_entry> local_entry(const state_ptr& st, const dht::id& key,
                                                time_point now) {
        auto entry = st->storage.get(key, now);
        if (auto cached = st->cache.get(key, now)) detail::merge_entry(entry, *cached);
        return entry;
    }

    // ---- lookups -----------------------------------------------------------------------

    enum class candidate_state : std::uint8_t { fresh, asked, answered, failed };

    struct candidate {
        contact_type contact;
        candidate_state status = candidate_state::fresh;
        std::size_t hop = 1;
    };

    /// One key's search.
    struct search {
        dht::id target;
        bool want_value = false;
        bool latest = false;
        std::map<dht::id, candidate> candidates; // by distance to target
        std::size_t in_flight = 0;
        std::size_t rounds = 0;
        bool done = false;
        std::optional<key_entry> found;
        /// Nearest node that answered without the value (where a get caches it).
        std::optional<contact_type> nearest_without_value;
    };

    struct reply {
        contact_type from;
        std::vector<std::size_t> searches;
        std::error_code ec;
        find_response response;
    };

    /// Searches that share requests; kept alive by the requests it launched.
    struct lookup {
        explicit lookup(const asio::any_io_executor& ex)
            : wake(ex) {}
        std::vector<search> searches;
        std::deque<reply> replies;
        std::size_t in_flight = 0;
        wakeup wake;
    };

    static void add_candidate(const state_ptr& st, search& s, const contact_type& c,
                              std::size_t hop) {
        if (c.id == st->self) return;
        s.candidates.try_emplace(c.id ^ s.target, candidate{c, candidate_state::fresh, hop});
    }

    /// True when the search is over: a value found (plain get), or the k nearest live
    /// candidates have all answered (requests to farther ones may still be out).
    static bool finished(const state_ptr& st, search& s) {
        if (s.done) return true;
        if (s.want_value && !s.latest && s.found) return s.done = true;
        std::size_t answered_count = 0;
        for (auto& [distance, c] : s.candidates) {
            if (answered_count == st->options.routing.k) break;
            if (c.status == candidate_state::answered) {
                ++answered_count;
                continue;
            }
            if (c.status == candidate_state::failed ||
                (c.status == candidate_state::fresh && blacklisted(st, c.contact.id)))
                continue;
            return false; // a near candidate is not asked yet, or its answer is pending
        }
        return s.done = true;
    }

    /// The nearest candidate of `s` nobody has asked yet, among its k nearest live ones.
    static candidate* next_candidate(const state_ptr& st, search& s) {
        std::size_t live = 0;
        for (auto& [distance, c] : s.candidates) {
            if (c.status == candidate_state::failed) continue;
            if (live++ == st->options.routing.k) break;
            if (c.status != candidate_state::fresh) continue;
            if (blacklisted(st, c.contact.id)) {
                c.status = candidate_state::failed;
                --live;
                continue;
            }
            return &c;
        }
        return nullptr;
    }

    /// Sends every request the searches allow, batching keys per peer.
    static void launch(const state_ptr& st, const std::shared_ptr<lookup>& l) {
        for (std::size_t i = 0; i < l->searches.size(); ++i) {
            auto& s = l->searches[i];
            while (!finished(st, s) && s.in_flight < st->options.alpha) {
                candidate* chosen = next_candidate(st, s);
                if (!chosen) break;
                const contact_type target = chosen->contact;
                // Every other live search with this peer among its next candidates rides
                // along in the same request.
                std::vector<std::size_t> batch{i};
                chosen->status = candidate_state::asked;
                s.rounds = std::max(s.rounds, chosen->hop);
                ++s.in_flight;
                for (std::size_t j = 0;
                     j < l->searches.size() && batch.size() < st->options.max_keys_per_request;
                     ++j) {
                    auto& other = l->searches[j];
                    if (j == i || other.done) continue;
                    const auto it = other.candidates.find(target.id ^ other.target);
                    if (it == other.candidates.end() || it->second.status != candidate_state::fresh)
                        continue;
                    it->second.status = candidate_state::asked;
                    other.rounds = std::max(other.rounds, it->second.hop);
                    ++other.in_flight;
                    batch.push_back(j);
                }
                find_request request{
                    sender(st), {}, static_cast<std::uint32_t>(st->options.routing.k)};
                for (const auto j : batch)
                    request.keys.push_back(l->searches[j].target);
                ++l->in_flight;
                asio::co_spawn(st->executor, ask(st, l, target, std::move(batch), encode(request)),
                               asio::detached);
            }
        }
    }

    static asio::awaitable<void> ask(state_ptr st, std::shared_ptr<lookup> l, contact_type target,
                                     std::vector<std::size_t> batch, byte_buffer request) {
        auto [ec, raw] = co_await call(st, target, "dht.find", std::move(request));
        reply r{std::move(target), std::move(batch), ec, {}};
        if (!r.ec) {
            r.ec = decode(raw, r.response, st->options.messages);
            if (!r.ec && r.response.results.size() != r.searches.size())
                r.ec = errc::protocol_violation;
            if (r.ec) note_failure(st, r.from.id);
        }
        l->replies.push_back(std::move(r));
        --l->in_flight;
        l->wake.notify();
    }

    /// Applies one reply to its searches.
    static void absorb(const state_ptr& st, lookup& l, reply& r) {
        for (std::size_t n = 0; n < r.searches.size(); ++n) {
            auto& s = l.searches[r.searches[n]];
            --s.in_flight;
            auto it = s.candidates.find(r.from.id ^ s.target);
            if (it == s.candidates.end()) continue;
            auto& c = it->second;
            if (r.ec) {
                c.status = candidate_state::failed;
                continue;
            }
            c.status = candidate_state::answered;
            auto& result = r.response.results[n];
            bool had_value = false;
            if (result.entry && dht::id::of_key(result.entry->key) == s.target) {
                // Keep only what our validators accept: a bad record from one node must not
                // hide good ones from others.
                key_entry valid{result.entry->key, {}, {}};
                if (result.entry->plain && !st->validators.validate(result.entry->to_record(
                                               std::nullopt, *result.entry->plain)))
                    valid.plain = result.entry->plain;
                for (auto& [subkey, value] : result.entry->dictionary)
                    if (!st->validators.validate(result.entry->to_record(subkey, value)))
                        valid.dictionary.emplace(subkey, value);
                had_value = !valid.empty();
                detail::merge_entry(s.found, valid);
            }
            if (!had_value && (!s.nearest_without_value ||
                               closer(s.target, r.from.id, s.nearest_without_value->id)))
                s.nearest_without_value = r.from;
            for (const auto& info : result.nearest) {
                const auto endpoint = Transport::to_endpoint(info.address);
                if (!endpoint) continue;
                add_candidate(st, s,
                              contact_type{dht::id::of_peer(info.peer), info.peer, *endpoint},
                              c.hop + 1);
            }
        }
    }

    /// Runs searches for `targets` to completion (or until the node closes).
    static asio::awaitable<std::vector<search>>
    run_lookup(state_ptr st, std::vector<dht::id> targets, bool want_value, bool latest,
               std::optional<std::vector<contact_type>> start = std::nullopt) {
        auto l = std::make_shared<lookup>(st->executor);
        l->searches.resize(targets.size());
        const auto now = st->now();
        for (std::size_t i = 0; i < targets.size(); ++i) {
            auto& s = l->searches[i];
            s.target = targets[i];
            s.want_value = want_value;
            s.latest = latest;
            for (const auto& c :
                 start ? *start : st->table.nearest(s.target, st->options.routing.k))
                add_candidate(st, s, c, 1);
            st->table.mark_refreshed(s.target, now);
        }
        while (!st->closed) {
            launch(st, l);
            const bool all_done = std::all_of(l->searches.begin(), l->searches.end(),
                                              [](const search& s) { return s.done; });
            if (all_done || l->in_flight == 0) break;
            const auto cancelled = co_await l->wake.wait();
            if (cancelled) break;
            while (!l->replies.empty()) {
                absorb(st, *l, l->replies.front());
                l->replies.pop_front();
            }
        }
        for (auto& s : l->searches) {
            ++st->stats.lookups;
            st->stats.lookup_rounds += s.rounds;
        }
        co_return std::move(l->searches);
    }

    /// The answered candidates of `s`, nearest first.
    static std::vector<contact_type> answered(const search& s, std::size_t count) {
        std::vector<contact_type> out;
        for (const auto& [distance, c] : s.candidates) {
            if (out.size() == count) break;
            if (c.status == candidate_state::answered) out.push_back(c.contact);
        }
        return out;
    }

    // ---- operations --------------------------------------------------------------------

    static asio::awaitable<std::error_code> bootstrap(state_ptr st, std::vector<peer> initial) {
        for (auto& p : initial)
            if (std::find_if(st->initial_peers.begin(), st->initial_peers.end(),
                             [&](const peer& known) { return known.id == p.id; }) ==
                st->initial_peers.end())
                st->initial_peers.push_back(p);
        co_return co_await rebootstrap(st, true);
    }

    /// Pings the initial peers and looks up our own id starting from them (from our table
    /// if none answers): a swarm that grew apart from them during a partition finds its
    /// way back, since its own tables would only lead a lookup around itself.
    /// When joining (`all_buckets`), or when an initial peer answers that our table had
    /// lost, also refreshes every bucket so the table fills at all distances.
    static asio::awaitable<std::error_code> rebootstrap(state_ptr st, bool all_buckets) {
        st->last_bootstrap = st->now();
        std::vector<contact_type> answered_peers;
        const auto ping = encode(ping_request{sender(st)});
        for (const auto& p : st->initial_peers) {
            if (p.id == st->rpc->id()) continue;
            const contact_type c{dht::id::of_peer(p.id), p.id, p.endpoint};
            const bool known = st->table.find(c.id) != nullptr;
            auto [ec, unused] = co_await call(st, c, "dht.ping", ping);
            if (ec) continue;
            answered_peers.push_back(c);
            if (!known) all_buckets = true;
        }
        if (st->closed) co_return errc::cancelled;
        if (answered_peers.empty() && st->table.size() == 0) co_return errc::no_peers;
        std::vector<dht::id> own{st->self};
        std::optional<std::vector<contact_type>> start;
        if (!answered_peers.empty()) start = std::move(answered_peers);
        co_await run_lookup(st, std::move(own), false, false, std::move(start));
        if (all_buckets) co_await refresh(st, true);
        co_return std::error_code{};
    }

    /// Looks up a random id in every bucket not refreshed within refresh_interval (every
    /// bucket when `all`).
    static asio::awaitable<void> refresh(state_ptr st, bool all) {
        const auto targets = st->table.refresh_targets(
            st->now(), all ? duration::zero() : st->options.refresh_interval, st->rng);
        if (!targets.empty()) co_await run_lookup(st, targets, false, false);
    }

    static asio::awaitable<std::pair<std::error_code, std::vector<contact_type>>>
    find_nearest(state_ptr st, dht::id target, std::size_t count) {
        using result = std::pair<std::error_code, std::vector<contact_type>>;
        std::vector<dht::id> targets{target};
        auto searches = co_await run_lookup(st, std::move(targets), false, false);
        if (st->closed) co_return result{errc::cancelled, {}};
        auto nearest = answered(searches.front(), count);
        if (st->announce) {
            nearest.push_back(contact_type{st->self, st->rpc->id(), *st->announce});
            std::sort(nearest.begin(), nearest.end(),
                      [&](const contact_type& a, const contact_type& b) {
                          return closer(target, a.id, b.id);
                      });
            if (nearest.size() > count) nearest.resize(count);
        }
        if (nearest.empty()) co_return result{errc::no_peers, {}};
        co_return result{std::error_code{}, std::move(nearest)};
    }

    static asio::awaitable<std::pair<std::error_code, store_outcome>> store_one(state_ptr st,
                                                                                record r) {
        using result = std::pair<std::error_code, store_outcome>;
        std::vector<record> records;
        records.push_back(std::move(r));
        auto [ec, outcomes] = co_await store_records(st, std::move(records));
        if (ec) co_return result{ec, {}};
        const auto outcome = outcomes.front();
        std::error_code status;
        if (outcome.replicas == 0)
            status = outcome.refusal ? errc::store_refused : errc::unreachable;
        co_return result{status, outcome};
    }

    static void count(store_outcome& outcome, store_status status) {
        if (status == store_status::stored)
            ++outcome.replicas;
        else if (!outcome.refusal || status < *outcome.refusal)
            outcome.refusal = status;
    }

    /// True if `r` fits the message limits every node enforces.
    static bool fits(const state_ptr& st, const record& r) {
        const auto& limits = st->options.messages;
        return r.key.size() <= limits.max_key_size && r.value.size() <= limits.max_value_size &&
               r.signature.size() <= limits.max_signature_size &&
               (!r.subkey || r.subkey->size() <= limits.max_subkey_size);
    }

    static asio::awaitable<std::pair<std::error_code, std::vector<store_outcome>>>
    store_records(state_ptr st, std::vector<record> records) {
        using result = std::pair<std::error_code, std::vector<store_outcome>>;
        std::vector<store_outcome> outcomes(records.size());
        if (!st->announce && st->table.size() == 0 && st->initial_peers.empty())
            co_return result{errc::no_peers, std::move(outcomes)};
        // Sign, then check, as every receiver will.
        std::vector<bool> valid(records.size());
        std::vector<dht::id> targets;
        std::vector<std::size_t> search_of(records.size());
        std::map<dht::id, std::size_t> index;
        for (std::size_t i = 0; i < records.size(); ++i) {
            st->validators.sign(records[i]);
            if (!fits(st, records[i])) {
                outcomes[i].refusal = store_status::too_large;
                continue;
            }
            if (st->validators.validate(records[i])) {
                outcomes[i].refusal = store_status::invalid;
                continue;
            }
            valid[i] = true;
            const auto key = records[i].key_id();
            auto [it, added] = index.try_emplace(key, targets.size());
            if (added) targets.push_back(key);
            search_of[i] = it->second;
        }
        auto searches = co_await run_lookup(st, targets, false, false);
        if (st->closed) co_return result{errc::cancelled, std::move(outcomes)};
        // Per record: the num_replicas nearest of the nodes that answered, and this node.
        std::map<crypto::peer_id, outgoing_store> outgoing;
        const auto now = st->now();
        for (std::size_t i = 0; i < records.size(); ++i) {
            if (!valid[i]) continue;
            const auto& s = searches[search_of[i]];
            auto nearest = answered(s, st->options.num_replicas);
            bool self_included = false;
            if (st->announce) {
                self_included = nearest.size() < st->options.num_replicas ||
                                closer(s.target, st->self, nearest.back().id);
                if (self_included && nearest.size() == st->options.num_replicas) nearest.pop_back();
            }
            if (self_included) count(outcomes[i], st->storage.store(records[i], now));
            for (const auto& c : nearest) {
                auto& out = outgoing[c.peer];
                out.target = c;
                out.records.push_back(i);
            }
        }
        auto answers = co_await send_stores(st, std::move(outgoing), records, false);
        for (auto& [indices, statuses] : answers)
            for (std::size_t n = 0; n < indices.size(); ++n)
                count(outcomes[indices[n]], statuses[n]);
        co_return result{std::error_code{}, std::move(outcomes)};
    }

    struct outgoing_store {
        contact_type target;
        std::vector<std::size_t> records; // indices into the records being stored
    };

    /// Record indices sent in one request, and the statuses the peer answered.
    using store_answer = std::pair<std::vector<std::size_t>, std::vector<store_status>>;

    /// Sends the stores in parallel, split into requests within the message limits, and
    /// collects the answers of the peers that answered in full.
    static asio::awaitable<std::vector<store_answer>>
    send_stores(state_ptr st, std::map<crypto::peer_id, outgoing_store> outgoing,
                const std::vector<record>& records, bool in_cache) {
        struct shared {
            explicit shared(const asio::any_io_executor& ex)
                : wake(ex) {}
            std::size_t pending = 0;
            std::vector<store_answer> answers;
            wakeup wake;
        };
        auto collected = std::make_shared<shared>(st->executor);
        constexpr std::size_t max_request_bytes = 4u << 20;
        for (auto& [peer_id, out] : outgoing) {
            for (std::size_t first = 0; first < out.records.size();) {
                store_request request{sender(st), {}};
                std::vector<std::size_t> indices;
                std::size_t bytes = 0;
                for (; first < out.records.size() &&
                       request.items.size() < st->options.messages.max_items;
                     ++first) {
                    const auto& r = records[out.records[first]];
                    const auto size = r.key.size() + r.value.size() +
                                      (r.subkey ? r.subkey->size() : 0) + r.signature.size();
                    if (!indices.empty() && bytes + size > max_request_bytes) break;
                    bytes += size;
                    request.items.push_back({r, in_cache});
                    indices.push_back(out.records[first]);
                }
                ++collected->pending;
                asio::co_spawn(
                    st->executor,
                    store_at(st, out.target, encode(request), std::move(indices), collected),
                    asio::detached);
            }
        }
        if (collected->pending > 0) co_await collected->wake.wait();
        co_return std::move(collected->answers);
    }

    template <class Shared>
    static asio::awaitable<void> store_at(state_ptr st, contact_type target, byte_buffer body,
                                          std::vector<std::size_t> indices,
                                          std::shared_ptr<Shared> collected) {
        auto [ec, raw] = co_await call(st, target, "dht.store", std::move(body));
        store_response response;
        if (!ec && !decode(raw, response, st->options.messages) &&
            response.statuses.size() == indices.size())
            collected->answers.emplace_back(std::move(indices), std::move(response.statuses));
        if (--collected->pending == 0) collected->wake.notify();
    }

    static asio::awaitable<std::pair<std::error_code, key_entry>>
    get_one(state_ptr st, byte_buffer key, get_options options) {
        using result = std::pair<std::error_code, key_entry>;
        std::vector<byte_buffer> keys;
        keys.push_back(std::move(key));
        auto [ec, entries] = co_await get_keys(st, std::move(keys), options);
        if (ec) co_return result{ec, {}};
        if (!entries.front()) co_return result{errc::not_found, {}};
        co_return result{std::error_code{}, std::move(*entries.front())};
    }

    static asio::awaitable<std::pair<std::error_code, std::vector<std::optional<key_entry>>>>
    get_keys(state_ptr st, std::vector<byte_buffer> keys, get_options options) {
        using result = std::pair<std::error_code, std::vector<std::optional<key_entry>>>;
        std::vector<std::optional<key_entry>> entries(keys.size());
        std::vector<dht::id> targets;
        std::vector<std::size_t> wanted; // indices of keys searched on the network
        const auto now = st->now();
        for (std::size_t i = 0; i < keys.size(); ++i) {
            const auto key = dht::id::of_key(keys[i]);
            entries[i] = local_entry(st, key, now);
            if (entries[i] && !options.latest) continue;
            targets.push_back(key);
            wanted.push_back(i);
        }
        if (targets.empty()) co_return result{std::error_code{}, std::move(entries)};
        if (st->table.size() == 0 && st->initial_peers.empty() && !st->announce)
            co_return result{errc::no_peers, std::move(entries)};
        auto searches = co_await run_lookup(st, targets, true, options.latest);
        if (st->closed) co_return result{errc::cancelled, std::move(entries)};
        std::map<crypto::peer_id, outgoing_store> caching;
        std::vector<record> cached;
        for (std::size_t n = 0; n < wanted.size(); ++n) {
            auto& s = searches[n];
            if (!s.found) continue;
            detail::merge_entry(entries[wanted[n]], *s.found);
            if (!st->options.cache_on_get) continue;
            for (auto& r : detail::records_of(*s.found)) {
                st->cache.store(r, now);
                if (!s.nearest_without_value) continue;
                auto& out = caching[s.nearest_without_value->peer];
                out.target = *s.nearest_without_value;
                out.records.push_back(cached.size());
                cached.push_back(std::move(r));
            }
        }
        if (!caching.empty())
            asio::co_spawn(st->executor,
                           send_and_forget(st, std::move(caching), std::move(cached), true),
                           asio::detached);
        co_return result{std::error_code{}, std::move(entries)};
    }

    /// Sends stores nobody waits for: values cached where a get found them missing
    /// (`in_cache`), or keys handed off to a new node.
    static asio::awaitable<void> send_and_forget(state_ptr st,
                                                 std::map<crypto::peer_id, outgoing_store> out,
                                                 std::vector<record> records, bool in_cache) {
        co_await send_stores(st, std::move(out), records, in_cache);
    }

    // ---- keeping values where they belong ----------------------------------------------

    /// True if `candidate` is among the num_replicas nodes nearest to `key` that we know of,
    /// counting ourselves.
    static bool among_replicas(const state_ptr& st, const dht::id& key, const dht::id& candidate) {
        const auto nearest = st->table.nearest(key, st->options.num_replicas);
        std::size_t closer_count = 0;
        for (const auto& c : nearest)
            if (c.id != candidate && closer(key, c.id, candidate)) ++closer_count;
        if (candidate != st->self && closer(key, st->self, candidate)) ++closer_count;
        return closer_count < st->options.num_replicas;
    }

    /// A node was added to the routing table: give it the keys it is now a replica of, if
    /// we are the nearest of the others (so one node hands each key off).
    static void hand_off(const state_ptr& st, const contact_type& newcomer) {
        if (!st->announce || st->storage.key_count() == 0) return;
        std::vector<record> records;
        st->storage.for_each(st->now(), [&](const dht::id& key, const key_entry& entry) {
            if (!among_replicas(st, key, newcomer.id)) return;
            for (const auto& c : st->table.nearest(key, 1, &newcomer.id))
                if (closer(key, c.id, st->self)) return; // someone else is nearer: theirs to do
            for (auto& r : detail::records_of(entry))
                records.push_back(std::move(r));
            ++st->stats.handoffs;
        });
        if (records.empty()) return;
        std::map<crypto::peer_id, outgoing_store> out;
        out[newcomer.peer].target = newcomer;
        for (std::size_t i = 0; i < records.size(); ++i)
            out[newcomer.peer].records.push_back(i);
        asio::co_spawn(st->executor, send_and_forget(st, std::move(out), std::move(records), false),
                       asio::detached);
    }

    /// Stores again every key this node is a replica of on the current nearest nodes.
    static asio::awaitable<std::error_code> republish(state_ptr st) {
        st->last_republish = st->now();
        std::vector<record> records;
        st->storage.for_each(st->now(), [&](const dht::id& key, const key_entry& entry) {
            if (!among_replicas(st, key, st->self)) return;
            ++st->stats.republished;
            for (auto& r : detail::records_of(entry))
                records.push_back(std::move(r));
        });
        if (!records.empty()) co_await store_records(st, std::move(records));
        co_return std::error_code{};
    }

    static asio::awaitable<void> maintain(state_ptr st) {
        while (!st->closed) {
            st->maintenance_timer.expires_after(st->options.maintenance_period);
            // A cancelled wait means close(): the flag says so.
            co_await st->maintenance_timer.async_wait(
                asio::experimental::as_tuple(asio::use_awaitable));
            if (st->closed) co_return;
            const auto now = st->now();
            st->storage.remove_expired(now);
            st->cache.remove_expired(now);
            std::erase_if(st->blacklist, [&](const auto& entry) {
                return entry.second.until + st->options.blacklist_max < now;
            });
            std::erase_if(st->penalised, [&](const auto& entry) { return entry.second <= now; });
            if (!st->initial_peers.empty() &&
                (st->table.size() == 0 ||
                 now - st->last_bootstrap >= st->options.rebootstrap_interval)) {
                co_await rebootstrap(st, st->table.size() == 0);
                continue;
            }
            co_await refresh(st, false);
            if (st->announce && now - st->last_republish >= st->options.republish_interval)
                co_await republish(st);
        }
    }

    state_ptr state_;
};

} // namespace hivemesh::dht

// With HIVEMESH_SEPARATE_COMPILATION (the hivemesh::compiled target) the TCP and sim
// instantiations are compiled once, in src/dht.cpp, not in every translation unit.
#if defined(HIVEMESH_SEPARATE_COMPILATION)
#include "hivemesh/net/sim.hpp"
#include "hivemesh/net/tcp.hpp"

namespace hivemesh::dht {
extern template class node<net::tcp::transport>;
extern template class node<net::sim::transport>;
} // namespace hivemesh::dht
#endif
