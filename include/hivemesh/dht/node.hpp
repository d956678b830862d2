// A Kademlia DHT node over any transport (net::tcp or net::sim), on top of an RPC node.
//
// RPC methods: "dht.ping", "dht.store" and "dht.find" (see dht/messages.hpp). Every request
// says where its sender listens (or that it is a client and serves nothing); every request
// and response feeds the routing table. Lookups are iterative and parallel: at most
// `alpha` requests in flight per key, several keys batched into one request to a peer
// that is a candidate for each of them; a key's search ends when the k nearest nodes seen
// have all answered (a store's, when its num_replicas nearest have; a plain get's, when a
// value is found). A store's small records ride along with its finds, so that its nearest
// nodes need no store request after the lookup (node_options::carried_record_bytes).
// Failing peers are blacklisted with exponential backoff and dropped from the routing table
// after repeated failures. A maintenance loop expires values, refreshes stale buckets,
// re-bootstraps from the initial peers (so a split swarm heals) and republishes the keys this node
// is a replica of (so values survive crashes); keys are also handed to newly seen nodes that become
// their nearest.
//
// Owner markers (dht/validator.hpp) are part of the protocol: every node checks them with an
// owner_validator for its RPC node's identity, installed at construction, which also signs
// the records this node owns. A node that skipped the check would keep and hand out forged
// records, and its reads would take them from a lying replica.
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
#include <cstring>
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
    /// A store's lookup hands a key's records to every node it asks when they total at most
    /// this many bytes, so that its nearest nodes, all asked, need no store request after
    /// it; the few nodes asked that turn out not to be among the nearest keep a copy until
    /// it expires. Larger records, and 0, are sent by store requests to the nearest alone.
    std::size_t carried_record_bytes = 8 * 1024;
    /// Deadline of one request to one peer.
    duration request_timeout = 5s;
    /// Keys carried by one find request (several lookups share requests).
    std::size_t max_keys_per_request = 32;
    /// Limits of the values this node stores for others, and of its cache.
    storage_limits storage;
    storage_limits cache = {.max_key_size = 1024,
                            .max_subkey_size = 1024,
                            .max_value_size = 64 * 1024,
                            .max_subkeys_per_key = 1024,
                            .max_total_bytes = 32u << 20,
                            .max_lifetime = std::chrono::minutes(5)};
    message_limits messages;
    /// Requests a peer may send (a store costs one more per item), and the burst allowed;
    /// past them its requests are refused with rate_limited.
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
    /// Contacts dropped from the table for failing are remembered (the latest
    /// max_lost_contacts, each for lost_contact_memory), and lost_contact_pings of them are
    /// pinged every maintenance period, in turn: when a partition heals, its sides find each
    /// other again within a few periods rather than at the next re-bootstrap.
    std::size_t max_lost_contacts = 64;
    std::size_t lost_contact_pings = 2;
    duration lost_contact_memory = 10min;
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
    std::uint64_t requests_served = 0;  ///< answered (a store's items may still be refused)
    std::uint64_t requests_refused = 0; ///< rate limited or malformed: the two below
    /// Refused with rate_limited: over the sender's allowance (requests_per_second,
    /// request_burst), or sent during its penalty.
    std::uint64_t requests_rate_limited = 0;
    std::uint64_t requests_malformed = 0; ///< refused, and their sender penalised
    /// Records of this node's stores handed over with the lookup's finds, and sent in store
    /// requests after it (carried_record_bytes), one per node.
    std::uint64_t store_records_carried = 0;
    std::uint64_t store_records_sent = 0;
    std::uint64_t handoffs = 0;    ///< keys handed to newly seen nodes
    std::uint64_t republished = 0; ///< keys stored again by the maintenance loop
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
    /// the maintenance loop. `announce` is where other nodes reach `rpc`. Installs an
    /// owner_validator for `rpc.identity()` (see the file comment).
    node(rpc_node_type& rpc, std::optional<endpoint_type> announce, node_options options = {})
        : state_(std::make_shared<state>(rpc, std::move(announce), std::move(options))) {
        if (state_->options.alpha == 0 || state_->options.num_replicas == 0 ||
            state_->options.max_keys_per_request == 0)
            throw std::invalid_argument(
                "hivemesh::dht::node: alpha, num_replicas and max_keys_per_request must be > 0");
        state_->validators.add(std::make_shared<owner_validator>(rpc.identity()));
        if (state_->announce) register_handlers(state_);
        if (state_->options.maintenance_period > duration::zero())
            asio::co_spawn(state_->executor, maintain(state_), asio::detached);
    }
    node(const node&) = delete;
    node& operator=(const node&) = delete;
    ~node();

    const dht::id& id() const noexcept { return state_->self; }
    const crypto::peer_id& peer_id() const noexcept { return state_->rpc->id(); }
    bool client_mode() const noexcept { return !state_->announce; }
    asio::any_io_executor get_executor() const { return state_->executor; }

    /// Adds a validator after the node's owner_validator; every stored and every received
    /// record must pass all of them, and records we store are signed by them. Call before
    /// serving.
    void add_validator(std::shared_ptr<const record_validator> validator);

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
    void bootstrap(std::vector<peer> initial);
    std::vector<store_outcome> store_many(std::vector<record> records);
    store_outcome store(byte_view key, byte_view value, time_point expiration);
    store_outcome store(byte_view key, byte_view subkey, byte_view value, time_point expiration);
    /// Returns nullopt when no node has the key (instead of throwing not_found).
    std::optional<key_entry> get(byte_view key, get_options options = {});
    std::vector<std::optional<key_entry>> get_many(std::vector<byte_buffer> keys,
                                                   get_options options = {});
    std::vector<contact_type> find_nearest(const dht::id& target, std::size_t count);

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
    void close();

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
            , maintenance_timer(executor)
            , last_republish(now()) {}

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
        /// Contacts dropped for failing, oldest pinged first, with when they were dropped.
        std::deque<std::pair<contact_type, time_point>> lost;
        time_point last_bootstrap{};
        /// From the start: the first republish comes an interval after it, not at the
        /// first maintenance, which would store again what the node was just given.
        time_point last_republish;
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

    // ---- contacts (impl/node_contacts.hpp) ---------------------------------------------

    static peer to_peer(const contact_type& c);
    static sender_info sender(const state_ptr& st);
    static bool blacklisted(const state_ptr& st, const dht::id& node);
    /// A peer answered us or sent us a valid request from where it listens.
    static void note_alive(const state_ptr& st, const contact_type& c);
    static void note_failure(const state_ptr& st, const contact_type& c);
    /// Pings the next options.lost_contact_pings lost contacts, forgetting expired ones.
    static void ping_lost(const state_ptr& st);
    /// Pings the least-recently-seen contact of a full bucket; its failure lets a newer
    /// contact in.
    static asio::awaitable<void> check_alive(state_ptr st, contact_type c);
    /// One request to one peer; feeds the routing table and the blacklist.
    static asio::awaitable<net::call_result> call(state_ptr st, contact_type c, std::string method,
                                                  byte_buffer body);

    // ---- serving (impl/node_serving.hpp) -----------------------------------------------

    using serve_function = std::error_code (*)(const state_ptr&, const net::call_context&,
                                               byte_view, byte_buffer&);

    static void register_handlers(const state_ptr& st);
    /// Admits a request: the node is open, the sender within its allowance and not
    /// penalised. A malformed request costs its sender its routing-table entry and every
    /// request for `penalty`.
    static std::error_code admit(const state_ptr& st, const net::call_context& context,
                                 double cost);
    static std::error_code penalise(const state_ptr& st, const net::call_context& context,
                                    std::error_code ec);
    /// Admits a request and decodes it into `out`; a malformed one is penalised.
    template <class Request>
    static std::error_code take_request(const state_ptr& st, const net::call_context& context,
                                        byte_view request, Request& out);
    /// Adds the sender of a request to the routing table if it serves.
    static void note_sender(const state_ptr& st, const net::call_context& context,
                            const sender_info& from);
    static std::error_code serve_ping(const state_ptr& st, const net::call_context& context,
                                      byte_view request, byte_buffer& response);
    static std::error_code serve_store(const state_ptr& st, const net::call_context& context,
                                       byte_view request, byte_buffer& response);
    static std::error_code serve_find(const state_ptr& st, const net::call_context& context,
                                      byte_view request, byte_buffer& response);
    /// Stores the items of a store or find request from an admitted sender.
    static std::vector<store_status> store_items(const state_ptr& st,
                                                 const std::vector<store_item>& items);
    /// What this node holds for `key`: its storage merged with its cache.
    static std::optional<key_entry> local_entry(const state_ptr& st, const dht::id& key,
                                                time_point now);

    // ---- lookups (impl/node_lookup.hpp) ------------------------------------------------

    enum class candidate_state : std::uint8_t { fresh, asked, answered, failed };
    struct candidate;
    /// One key's search.
    struct search;
    struct reply;
    /// Searches that share requests; kept alive by the requests it launched.
    struct lookup;

    static void add_candidate(const state_ptr& st, search& s, const contact_type& c,
                              std::size_t hop);
    /// True when the search is over: a value found (plain get), or the search's `width`
    /// nearest live candidates have all answered (requests to farther ones may still be out).
    static bool finished(const state_ptr& st, search& s);
    /// The nearest candidate of `s` nobody has asked yet, among its `width` nearest live ones.
    static candidate* next_candidate(const state_ptr& st, search& s);
    /// True if `node` is among the `width` nearest live candidates of `s`, this node counted.
    static bool among_nearest(const state_ptr& st, const search& s, const dht::id& node);
    /// Sends every request the searches allow, batching keys per peer.
    static void launch(const state_ptr& st, const std::shared_ptr<lookup>& l);
    /// Records a store's lookup hands to the nodes it asks: per target, indices into
    /// `records`, which outlives the lookup.
    struct carried_records {
        const std::vector<record>* records = nullptr;
        std::vector<std::vector<std::size_t>> of_target;
    };
    static asio::awaitable<void> ask(state_ptr st, std::shared_ptr<lookup> l, contact_type target,
                                     std::vector<std::size_t> batch, std::vector<bool> carried,
                                     std::size_t items, byte_buffer request);
    /// Applies one reply to its searches.
    static void absorb(const state_ptr& st, lookup& l, reply& r);
    /// Runs searches for `targets` to completion (or until the node closes); each ends
    /// when its `width` nearest live candidates have answered (k for a get or a refresh,
    /// num_replicas for a store), or at a value as finished() says. Only a lookup that
    /// `want_value` is sent values; each request carries its searches' `carry` records.
    static asio::awaitable<std::vector<search>>
    run_lookup(state_ptr st, std::vector<dht::id> targets, bool want_value, bool latest,
               std::size_t width, std::optional<std::vector<contact_type>> start = std::nullopt,
               carried_records carry = {});
    /// The answered candidates of `s`, nearest first.
    static std::vector<contact_type> answered(const search& s, std::size_t count);

    // ---- operations (impl/node_operations.hpp) -----------------------------------------

    static asio::awaitable<std::error_code> bootstrap(state_ptr st, std::vector<peer> initial);
    /// Pings the initial peers and looks up our own id starting from them (from our table
    /// if none answers): a swarm that grew apart from them during a partition finds its
    /// way back, since its own tables would only lead a lookup around itself.
    /// When joining (`all_buckets`), or when an initial peer answers that our table had
    /// lost, also refreshes every bucket so the table fills at all distances.
    static asio::awaitable<std::error_code> rebootstrap(state_ptr st, bool all_buckets);
    /// Looks up a random id in every bucket not refreshed within refresh_interval (every
    /// bucket when `all`).
    static asio::awaitable<void> refresh(state_ptr st, bool all);
    static asio::awaitable<std::pair<std::error_code, std::vector<contact_type>>>
    find_nearest(state_ptr st, dht::id target, std::size_t count);

    static asio::awaitable<std::pair<std::error_code, store_outcome>> store_one(state_ptr st,
                                                                                record r);
    static void count(store_outcome& outcome, store_status status);
    /// True if `r` fits the message limits every node enforces.
    static bool fits(const state_ptr& st, const record& r);
    /// The bytes of `r`'s key, value, subkey and signature: what a request's size cap counts.
    static std::size_t record_bytes(const record& r);
    static asio::awaitable<std::pair<std::error_code, std::vector<store_outcome>>>
    store_records(state_ptr st, std::vector<record> records);

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
                const std::vector<record>& records, bool in_cache);
    template <class Shared>
    static asio::awaitable<void> store_at(state_ptr st, contact_type target, byte_buffer body,
                                          std::vector<std::size_t> indices,
                                          std::shared_ptr<Shared> collected);

    static asio::awaitable<std::pair<std::error_code, key_entry>>
    get_one(state_ptr st, byte_buffer key, get_options options);
    static asio::awaitable<std::pair<std::error_code, std::vector<std::optional<key_entry>>>>
    get_keys(state_ptr st, std::vector<byte_buffer> keys, get_options options);
    /// Sends stores nobody waits for: values cached where a get found them missing
    /// (`in_cache`), or keys handed off to a new node.
    static asio::awaitable<void> send_and_forget(state_ptr st,
                                                 std::map<crypto::peer_id, outgoing_store> out,
                                                 std::vector<record> records, bool in_cache);

    // ---- keeping values where they belong (impl/node_maintenance.hpp) ------------------

    /// True if `candidate` is among the num_replicas nodes nearest to `key` that we know of,
    /// counting ourselves.
    static bool among_replicas(const state_ptr& st, const dht::id& key, const dht::id& candidate);
    /// A node was added to the routing table: give it the keys it is now a replica of, if
    /// we are the nearest of the others (so one node hands each key off).
    static void hand_off(const state_ptr& st, const contact_type& newcomer);
    /// Stores again every key this node is a replica of on the current nearest nodes.
    static asio::awaitable<std::error_code> republish(state_ptr st);
    static asio::awaitable<void> maintain(state_ptr st);

    state_ptr state_;
};

} // namespace hivemesh::dht

// The members defined out of class, one file per job (each includes this file first, so it
// also compiles alone; #pragma once breaks the cycle). Header-only use sees them here. With
// HIVEMESH_SEPARATE_COMPILATION (the hivemesh::compiled target) they are compiled once, in
// src/dht.cpp, for net::tcp and net::sim, and a program links them from there; the TCP
// instantiation is declared extern so that no translation unit instantiates it again.
#if !defined(HIVEMESH_SEPARATE_COMPILATION)
#include "hivemesh/dht/impl/node_contacts.hpp"
#include "hivemesh/dht/impl/node_lookup.hpp"
#include "hivemesh/dht/impl/node_maintenance.hpp"
#include "hivemesh/dht/impl/node_operations.hpp"
#include "hivemesh/dht/impl/node_serving.hpp"
#else
#include "hivemesh/net/tcp.hpp"

namespace hivemesh::dht {
extern template class node<net::tcp::transport>;
} // namespace hivemesh::dht
#endif
