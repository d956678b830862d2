// Matchmaking: peers that want to average find each other through the DHT and form groups
// (DESIGN §5).
//
// A peer looking for a group declares itself under the DHT key "<prefix>.0b<bits>" (subkey:
// its owner marker "[owner:<base58 Ed25519 public key>]", so the DHT signs the declaration
// and refuses anyone else's store or withdrawal there; value: its schema hash (u64) and
// listen address without a PeerId; expiration: the end of its search window). Readers take
// the PeerId from the marker's key, skip subkeys that are not one marker and peers of another
// schema hash; a dial checks that PeerId, so an address that belongs to someone else leads
// nowhere. Peers are ordered by (expiration, PeerId). A peer asks the earliest declared
// peers before it to lead it, one at a time; a leader accepts later peers (and clients,
// which never lead) until the group reaches target_group_size or holds the members the
// search expects (match_request::expected), or until its own expiration if it then
// has at least min_group_size members, and then sends every follower the group: a fresh id
// and the ordered members (leader first, then followers in the order they joined) with what
// each told about itself (role, bandwidth, user bytes). Refusals carry a reason (join_status);
// a peer that follows someone refuses with `not_a_leader` and names its leader. A peer
// reads the key every poll_interval (at most a quarter of its window, so that a declaration
// that lands just after a read is seen in time), and one with followers keeps looking for
// earlier leaders: peers that start together see each other's declarations only partly and
// first gather in small groups, and these merge into full ones this way. When an earlier leader
// accepts it, it dismisses its followers with a disband notice naming that leader, which they ask
// next. A peer's incoming join requests wait while its own request to another leader is under way,
// so it never leads and follows at once.
#pragma once

#include "hivemesh/averaging/group.hpp"
#include "hivemesh/averaging/group_key.hpp"
#include "hivemesh/averaging/matchmaking_wire.hpp"
#include "hivemesh/core/async.hpp"
#include "hivemesh/core/log.hpp"
#include "hivemesh/dht/node.hpp"
#include "hivemesh/dht/validator.hpp"
#include "hivemesh/net/node.hpp"

#include <asio/async_result.hpp>
#include <asio/bind_executor.hpp>
#include <asio/co_spawn.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <sodium.h>

#include <algorithm>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace hivemesh::averaging {

using namespace std::chrono_literals;

struct matchmaking_options {
    /// DHT key prefix and RPC method prefix: 1..100 of [A-Za-z0-9_.:/-].
    std::string prefix = "hivemesh";
    std::size_t target_group_size = 16;
    std::size_t min_group_size = 2;
    /// How long a leader may take to answer a join request.
    duration join_timeout = 5s;
    /// How long a follower waits for its group past its leader's expiration.
    duration group_slack = 5s;
    /// Between DHT reads while looking; at most a quarter of the search's window, so that
    /// a peer that declares just after one of our reads is still seen in time.
    duration poll_interval = 1s;
    /// Join requests served at once, from their arrival until answered. Accepted followers
    /// waiting for their group no longer count: there are at most target_group_size - 1 of
    /// them, so a large group is not capped here. One past it is refused at once with
    /// errc::refused, before its request is read, and the requester asks its next
    /// candidate; so a flood of requests holds at most this many handlers besides the
    /// followers. At least 1.
    std::size_t max_pending_joins = 64;
    matchmaking_limits limits;
};

/// Counters of a matchmaker's serving side (join requests from others) and of the join
/// requests it sent, for monitoring and tests.
struct matchmaking_statistics {
    std::uint64_t joins_served = 0;   ///< join requests taken within max_pending_joins
    std::uint64_t joins_accepted = 0; ///< ... of which answered `accepted` (followers)
    std::uint64_t joins_refused = 0;  ///< refused at once: max_pending_joins were pending
    std::size_t pending_joins = 0;    ///< being served now, accepted followers aside
    std::size_t peak_pending_joins = 0;
    std::uint64_t requests_sent = 0;    ///< our join requests to leaders
    std::uint64_t requests_refused = 0; ///< ... that a leader refused with errc::refused
};

/// What one search is for and what this peer tells the others.
struct match_request {
    group_bits bits;               ///< the Moshpit group bits of the key to look under
    std::uint64_t schema_hash = 0; ///< peers with different hashes never group
    member_role role = member_role::node;
    double bandwidth = 0; ///< for load balancing; 0 for a client
    byte_buffer metadata; ///< the application's bytes, handed to every member
    /// Look this long; the declaration expires then, so keep it within the replicas'
    /// dht::storage_limits::max_lifetime (5 min by default), which refuse a later one.
    duration window = 15s;
    /// Leading, form the group even below target_group_size once it holds `expected()`
    /// members that are not aux peers (and at least min_group_size): e.g. 0 until the caller's
    /// values are ready to average, then every peer known to take part. Until then a larger
    /// group costs nothing, and room is kept for peers (aux peers too) that come later. No
    /// `expected`, or 0: the group forms at target_group_size or at the end of the window.
    /// Called on the node's executor; call matchmaker::recheck() when its answer changes.
    std::function<std::size_t()> expected;
};

template <net::transport Transport>
class matchmaker {
public:
    using rpc_node_type = net::node<Transport>;
    using dht_node_type = dht::node<Transport>;
    using endpoint_type = typename Transport::endpoint_type;
    using timer_type = typename Transport::timer_type;
    using group_type = group_info<endpoint_type>;
    using completion_signature = void(std::error_code, group_type);

    /// Serves "<prefix>.join" on `rpc`; `announce` is where others dial this peer (none for
    /// a client, which can only follow). `rpc` and `dht` must outlive the matchmaker.
    /// Throws std::invalid_argument for a bad prefix or group sizes.
    matchmaker(rpc_node_type& rpc, dht_node_type& dht, std::optional<endpoint_type> announce,
               matchmaking_options options = {})
        : state_(std::make_shared<state>(rpc, dht, std::move(announce), std::move(options))) {
        const auto& o = state_->options;
        if (o.prefix.empty() || o.prefix.size() > 100)
            throw std::invalid_argument("matchmaking_options::prefix: 1..100 characters");
        if (o.min_group_size < 1 || o.target_group_size < o.min_group_size ||
            o.target_group_size > o.limits.max_group_size)
            throw std::invalid_argument("matchmaking_options: need 1 <= min <= target <= max");
        if (o.max_pending_joins == 0)
            throw std::invalid_argument("matchmaking_options::max_pending_joins: at least 1");
        rpc.add_stream_handler(method(o), [weak = std::weak_ptr<state>(state_)](
                                              const net::call_context& c, net::call_stream& s) {
            return serve(weak, c, s);
        });
    }
    matchmaker(const matchmaker&) = delete;
    matchmaker& operator=(const matchmaker&) = delete;
    ~matchmaker() {
        auto st = state_;
        asio::dispatch(st->executor, [st] {
            if (st->current) st->current->stop(errc::cancelled);
        });
    }

    const matchmaking_options& options() const noexcept { return state_->options; }

    /// The counters so far. Read on the node's executor (join requests are served there),
    /// or while it runs nothing, as a simulated network between events.
    const matchmaking_statistics& statistics() const noexcept { return state_->stats; }

    /// The current search looks at its group again, e.g. because match_request::ready now
    /// says yes, and forms it if it holds the members expected. On the node's executor.
    void recheck() {
        if (auto a = state_->current) a->form_if_complete();
    }

    /// The DHT key of `bits` for this matchmaker's prefix.
    std::string key_of(const group_bits& bits) const {
        return group_key(state_->options.prefix, bits);
    }

    /// Looks for a group for `request.window`. One search at a time per matchmaker.
    /// Completion: void(std::error_code, group_type) with this peer among the members.
    /// Errors: too_few_peers (no group of min_group_size formed in the window),
    /// invalid_argument (a search is already running, a non-client role without an
    /// announce endpoint, metadata over the limit), cancelled (the token's cancellation slot
    /// was emitted on the node's executor).
    template <ASIO_COMPLETION_TOKEN_FOR(completion_signature) Token = default_token_t>
    auto async_find_group(match_request request, Token&& token = default_token_t{}) {
        return asio::async_initiate<Token, completion_signature>(
            [st = state_](auto handler, match_request request) {
                auto a = std::make_shared<attempt>(st, std::move(request));
                co_launch(st->executor, look(st, a), std::move(handler),
                          "averaging::matchmaker::async_find_group",
                          [weak = std::weak_ptr<attempt>(a)] {
                              if (auto alive = weak.lock()) alive->stop(errc::cancelled);
                          });
            },
            token, std::move(request));
    }

    /// Waits until none of this matchmaker's withdrawals (the empty values that withdraw a
    /// declaration when a search ends before its expiration, stopped or cancelled ones too)
    /// is in flight: completes at once if none is. Bounded by the DHT's request timeouts,
    /// which bound each withdrawal. Completion: void(std::error_code): the first error of the
    /// withdrawals that completed while it waited (store_refused when no replica took one:
    /// the declaration then expires by itself), or cancelled (the token's cancellation slot,
    /// emitted on the node's executor; the withdrawals go on).
    template <ASIO_COMPLETION_TOKEN_FOR(void(std::error_code)) Token = default_token_t>
    auto async_wait_withdrawals(Token&& token = default_token_t{}) {
        return asio::async_initiate<Token, void(std::error_code)>(
            [st = state_](auto handler) {
                co_launch(st->executor, wait_withdrawals(st), std::move(handler),
                          "averaging::matchmaker::async_wait_withdrawals");
            },
            token);
    }

private:
    struct attempt;

    /// One async_wait_withdrawals waiting.
    struct withdrawal_waiter {
        explicit withdrawal_waiter(const asio::any_io_executor& ex)
            : none_left(ex) {}
        std::error_code first_error;
        wakeup none_left;
    };

    struct state {
        state(rpc_node_type& r, dht_node_type& d, std::optional<endpoint_type> a,
              matchmaking_options o)
            : rpc(&r)
            , dht(&d)
            , executor(r.get_executor())
            , announce(std::move(a))
            , options(std::move(o))
            , own_subkey(to_buffer(as_bytes(dht::owner_marker(r.identity().public_key())))) {}
        rpc_node_type* rpc;
        dht_node_type* dht;
        asio::any_io_executor executor;
        std::optional<endpoint_type> announce;
        matchmaking_options options;
        byte_buffer own_subkey; ///< our owner marker: the subkey of our declarations
        std::shared_ptr<attempt> current;
        std::uint64_t searches = 0;
        std::size_t withdrawals = 0; ///< in flight
        std::vector<std::shared_ptr<withdrawal_waiter>> withdrawal_waiters;
        matchmaking_statistics stats;

        time_point now() const { return net::transport_now<Transport>(executor); }
        member_wire self(const match_request& r) const {
            member_wire m{r.role, r.bandwidth, std::nullopt, r.metadata};
            if (announce && r.role != member_role::client)
                m.address = Transport::to_address(*announce);
            return m;
        }
    };
    using state_ptr = std::shared_ptr<state>;

    static std::string method(const matchmaking_options& o) { return o.prefix + ".join"; }

    /// A declared peer that might lead us.
    struct candidate {
        time_point expiration{};
        crypto::peer_id id;
        net::peer_address address;
    };

    /// Whom to ask next after a join: a refusing peer's leader, or the leader our own leader
    /// joined when it dismissed us (which may be asked again: it was not full then).
    struct suggestion {
        candidate leader;
        bool dismissed = false;
    };

    struct follower {
        crypto::peer_id id;
        member_wire member;
    };

    /// One search.
    struct attempt {
        attempt(state_ptr s, match_request r)
            : st(std::move(s))
            , request(std::move(r))
            , key(group_key(st->options.prefix, request.bits))
            , progress(st->executor)
            , idle(st->executor) {}

        state_ptr st;
        match_request request;
        std::string key;
        time_point expiration{};
        time_point next_fetch{}; ///< when a peer with followers reads the key again
        bool requesting = false; ///< our own join request is under way
        std::optional<candidate> leader;
        std::vector<follower> followers;
        std::optional<group_message> formed;
        bool finished = false;
        std::error_code stopped;
        net::call_stream* outgoing = nullptr;
        wakeup progress;                      ///< the search loop: a follower came, or stop
        std::vector<wakeup*> handler_wakeups; ///< join handlers waiting on us
        timer_type idle;

        bool before(time_point other_expiration, const crypto::peer_id& other) const {
            return std::pair(expiration, st->rpc->id()) < std::pair(other_expiration, other);
        }
        /// Forms the group if we lead the members the request expects now
        /// (match_request::expected).
        void form_if_complete() {
            const std::size_t expected = request.expected ? request.expected() : 0;
            if (expected == 0 || formed || finished || stopped || leader || requesting ||
                followers.empty() || followers.size() + 1 < st->options.min_group_size)
                return;
            std::size_t members = request.role == member_role::aux ? 0 : 1;
            for (const auto& f : followers)
                if (f.member.role != member_role::aux) ++members;
            if (members >= expected) assemble();
        }
        bool leads(const crypto::peer_id& id) const {
            return std::any_of(followers.begin(), followers.end(),
                               [&](const follower& f) { return f.id == id; });
        }
        void wake_handlers() {
            for (auto* w : handler_wakeups)
                w->notify();
        }
        /// Forms the group with the followers we have (leader first).
        void assemble() {
            if (formed || finished) return;
            group_message m;
            const std::uint64_t n = st->searches;
            const auto stamp = expiration.time_since_epoch().count();
            crypto_generichash_state h;
            crypto_generichash_init(&h, nullptr, 0, m.id.size());
            const auto& me = st->rpc->id().bytes();
            crypto_generichash_update(&h, reinterpret_cast<const unsigned char*>(me.data()),
                                      me.size());
            crypto_generichash_update(&h, reinterpret_cast<const unsigned char*>(&stamp),
                                      sizeof stamp);
            crypto_generichash_update(&h, reinterpret_cast<const unsigned char*>(&n), sizeof n);
            crypto_generichash_final(&h, reinterpret_cast<unsigned char*>(m.id.data()),
                                     m.id.size());
            m.members.emplace_back(st->rpc->id(), st->self(request));
            for (const auto& f : followers)
                m.members.emplace_back(f.id, f.member);
            formed = std::move(m);
            wake_handlers();
            progress.notify();
        }
        void stop(std::error_code why) {
            if (finished || stopped) return;
            stopped = why;
            if (outgoing) outgoing->cancel(errc::cancelled);
            idle.cancel();
            progress.notify();
            wake_handlers();
        }
    };

    // ---- the searching side --------------------------------------------------------------

    static asio::awaitable<std::pair<std::error_code, group_type>>
    look(state_ptr st, std::shared_ptr<attempt> a) {
        const auto& r = a->request;
        const bool client = r.role == member_role::client;
        if (st->current || (!client && !st->announce) ||
            r.metadata.size() > st->options.limits.max_metadata || r.window <= duration::zero())
            co_return std::pair{make_error_code(errc::invalid_argument), group_type{}};
        st->current = a;
        ++st->searches;
        a->expiration = st->now() + r.window;
        // See poll_interval: at least four reads a window.
        const duration read_interval = std::min<duration>(st->options.poll_interval, r.window / 4);
        if (!client) co_await declare(st, *a);

        std::optional<group_type> found;
        while (!a->formed && !a->stopped && st->now() < a->expiration) {
            // A peer alone reads the key whenever it wakes; one with followers wakes for
            // each new follower too, and reads only every read_interval.
            if (a->followers.empty() || st->now() >= a->next_fetch) {
                a->next_fetch = st->now() + read_interval;
                auto candidates = co_await fetch(st, *a);
                std::deque<candidate> queue(candidates.begin(), candidates.end());
                std::set<crypto::peer_id> asked;
                while (!queue.empty() && !a->stopped && !a->formed && st->now() < a->expiration) {
                    const candidate c = queue.front();
                    queue.pop_front();
                    if (!asked.insert(c.id).second) continue;
                    std::optional<suggestion> next;
                    found = co_await try_join(st, a, c, next);
                    a->form_if_complete(); // joiners may have come while we asked
                    if (found) break;
                    if (!next) continue;
                    if (next->dismissed) asked.erase(next->leader.id);
                    queue.push_front(next->leader);
                }
                if (found) break;
            }
            if (a->formed || a->stopped) break;
            // Wait for followers or the next poll, never past our expiration.
            const auto left = a->expiration - st->now();
            if (left <= duration::zero()) break;
            a->idle.expires_after(std::min(left, read_interval));
            using namespace asio::experimental::awaitable_operators;
            co_await (a->progress.wait() ||
                      a->idle.async_wait(asio::experimental::as_tuple(asio::use_awaitable)));
        }

        std::error_code ec = a->stopped;
        if (!found && !ec) {
            if (!a->formed && a->followers.size() + 1 >= st->options.min_group_size && !client &&
                !a->followers.empty())
                a->assemble();
            if (a->formed)
                found = to_group(st, *a->formed, st->rpc->id(), ec);
            else
                ec = errc::too_few_peers;
        }
        a->finished = true;
        a->wake_handlers(); // followers of a group that did not form learn it now
        if (st->current == a) st->current.reset();
        // Past its expiration the declaration is gone: a withdrawal would only be refused.
        // Before it, the withdrawal goes out without holding up the group: its lookup may
        // wait on dead peers, and even on a healthy swarm takes a few round trips.
        if (!client && st->now() < a->expiration) withdraw(st, *a);
        if (ec || !found)
            co_return std::pair{ec ? ec : make_error_code(errc::too_few_peers), group_type{}};
        co_return std::pair{std::error_code{}, std::move(*found)};
    }

    /// Stores our declaration: our schema hash and address, until the end of our window
    /// (signed by the DHT node's owner_validator).
    static asio::awaitable<void> declare(state_ptr st, attempt& a) {
        byte_buffer value;
        binary_writer w(value);
        w.write(a.request.schema_hash);
        Transport::to_address(*st->announce).write_without_peer(w);
        auto [ec, outcome] =
            co_await st->dht->async_store(as_bytes(a.key), st->own_subkey, value, a.expiration);
        if (ec) log::debug("matchmaking", "declaration under ", a.key, ": ", ec.message());
    }

    /// Starts withdrawing our declaration (an empty value, strictly later) without waiting;
    /// counted until it completes, for async_wait_withdrawals. A next search whose
    /// declaration expires later still wins whichever store lands first.
    static void withdraw(const state_ptr& st, const attempt& a) {
        ++st->withdrawals;
        st->dht->async_store(
            as_bytes(a.key), st->own_subkey, byte_view{}, a.expiration + duration(1),
            asio::bind_executor(st->executor, [weak = std::weak_ptr<state>(st), key = a.key](
                                                  std::error_code ec, dht::store_outcome) {
                if (ec) log::debug("matchmaking", "withdrawal under ", key, ": ", ec.message());
                if (auto alive = weak.lock()) withdrawn(*alive, ec);
            }));
    }

    /// A withdrawal completed: tells the waiters its error, and wakes them when it was the
    /// last one in flight.
    static void withdrawn(state& st, std::error_code ec) {
        for (const auto& w : st.withdrawal_waiters)
            if (ec && !w->first_error) w->first_error = ec;
        if (--st.withdrawals != 0) return;
        for (const auto& w : std::exchange(st.withdrawal_waiters, {}))
            w->none_left.notify();
    }

    static asio::awaitable<std::error_code> wait_withdrawals(state_ptr st) {
        if (st->withdrawals == 0) co_return std::error_code{};
        auto waiter = std::make_shared<withdrawal_waiter>(st->executor);
        st->withdrawal_waiters.push_back(waiter);
        if (auto cancelled = co_await waiter->none_left.wait()) {
            std::erase(st->withdrawal_waiters, waiter);
            co_return make_error_code(errc::cancelled);
        }
        co_return waiter->first_error;
    }

    /// The declared peers that could lead us, earliest first. Skips subkeys that are not one
    /// owner marker (the DHT checked the signatures of those that are), withdrawals, other
    /// schema hashes (peers that would refuse us), and addresses we cannot dial.
    static asio::awaitable<std::vector<candidate>> fetch(state_ptr st, attempt& a) {
        dht::get_options options;
        options.latest = true;
        auto [ec, entry] = co_await st->dht->async_get(as_bytes(a.key), options);
        std::vector<candidate> out;
        if (ec) co_return out;
        const time_point now = st->now();
        const bool client = a.request.role == member_role::client;
        for (const auto& [subkey, value] : entry.dictionary) {
            if (value.value.empty() || value.expiration <= now || subkey == st->own_subkey)
                continue;
            const auto owner = dht::parse_owner_marker(subkey);
            if (!owner) continue;
            const crypto::peer_id id = owner->id();
            if (!client &&
                !(std::pair(value.expiration, id) < std::pair(a.expiration, st->rpc->id())))
                continue;
            binary_reader reader(value.value);
            const auto schema_hash = reader.read<std::uint64_t>();
            auto address = net::peer_address::read_without_peer(reader);
            if (reader.finish() || schema_hash != a.request.schema_hash ||
                !Transport::to_endpoint(address))
                continue;
            out.push_back({value.expiration, id, std::move(address)});
        }
        std::sort(out.begin(), out.end(), [](const candidate& x, const candidate& y) {
            return std::pair(x.expiration, x.id) < std::pair(y.expiration, y.id);
        });
        co_return out;
    }

    /// Asks `c` to lead us; on acceptance dismisses our followers and waits for the group.
    /// Sets `next` when `c` names another leader to ask.
    static asio::awaitable<std::optional<group_type>> try_join(state_ptr st,
                                                               std::shared_ptr<attempt> a,
                                                               candidate c,
                                                               std::optional<suggestion>& next) {
        const auto& o = st->options;
        const auto endpoint = Transport::to_endpoint(c.address);
        const typename rpc_node_type::peer target{c.id, *endpoint};
        const duration limit =
            std::max<duration>(c.expiration - st->now(), duration::zero()) + o.group_slack;
        a->requesting = true;
        net::call_stream stream;
        a->outgoing = &stream;
        std::optional<group_type> out;
        join_response response;
        // The dial is part of asking: a dead candidate costs join_timeout, not the node's
        // dial_timeout, which may be longer.
        std::error_code ec = co_await st->rpc->open_call_within(
            target, method(o), limit + o.join_timeout, o.join_timeout, stream);
        const bool opened = !ec;
        if (opened) {
            join_request request{a->request.schema_hash, a->key, a->expiration,
                                 st->self(a->request)};
            ++st->stats.requests_sent;
            ec = co_await stream.write(encode(request));
        }
        byte_buffer message;
        if (opened) {
            // Also after a failed write: a leader at max_pending_joins refuses before it
            // reads our request, and its status is what the read returns.
            auto reading = stream.read(message);
            if (const auto read_error =
                    co_await net::within<timer_type>(std::move(reading), o.join_timeout))
                ec = read_error;
        }
        if (ec == errc::refused) ++st->stats.requests_refused;
        if (!ec) ec = decode(message, response);
        a->requesting = false;
        a->wake_handlers();
        const auto suggest = [&](const std::optional<suggested_leader>& leader, bool dismissed) {
            if (!leader) return;
            const auto& [id, address] = *leader;
            // c's own leader is earlier than c, so c's expiration bounds the wait for it.
            if (Transport::to_endpoint(address) && id != st->rpc->id() && id != c.id)
                next = suggestion{candidate{c.expiration, id, address}, dismissed};
        };
        if (!ec && response.status == join_status::accepted && !a->stopped) {
            a->leader = c;
            // Waiting joiners now get "not a leader, ask c"; our followers, a disband notice
            // naming c.
            a->followers.clear();
            a->wake_handlers();
            ec = co_await stream.read(message); // bounded by the call's limit
            matchmaking_message type{};
            if (!ec) ec = peek_type(message, type);
            if (!ec && type == matchmaking_message::group) {
                group_message m;
                ec = decode(message, m, o.limits);
                if (!ec) {
                    auto group = to_group(st, m, c.id, ec);
                    if (!ec) out = std::move(group);
                }
            } else if (!ec && type == matchmaking_message::disband) {
                disband_message m;
                ec = decode(message, m);
                if (!ec) suggest(m.leader, true);
            }
            a->leader.reset();
        } else if (!ec && response.status == join_status::not_a_leader) {
            suggest(response.leader, false);
        }
        if (ec && ec != asio::error::eof)
            log::debug("matchmaking", "joining ", c.id.to_string(), ": ", ec.message());
        a->outgoing = nullptr;
        co_return out;
    }

    /// The group as the averaging layer uses it, after checking it: `leader` first, us in
    /// it once, distinct members, dialable addresses for every member that reduces.
    static group_type to_group(const state_ptr& st, const group_message& m,
                               const crypto::peer_id& leader, std::error_code& ec) {
        group_type g;
        g.id = m.id;
        std::set<crypto::peer_id> seen;
        bool me = false;
        ec = {};
        if (m.members.empty() || m.members.front().first != leader) ec = errc::protocol_violation;
        for (const auto& [id, w] : m.members) {
            if (ec) break;
            if (!seen.insert(id).second) ec = errc::protocol_violation;
            me = me || id == st->rpc->id();
            group_member<endpoint_type> member;
            member.peer.id = id;
            member.role = w.role;
            member.bandwidth = w.bandwidth;
            member.metadata = w.metadata;
            if (w.address) {
                if (auto e = Transport::to_endpoint(*w.address))
                    member.peer.endpoint = *e;
                else
                    ec = errc::protocol_violation;
            } else if (w.role != member_role::client) {
                ec = errc::protocol_violation;
            }
            g.members.push_back(std::move(member));
        }
        if (!ec && !me) ec = errc::protocol_violation;
        if (ec) return {};
        return g;
    }

    // ---- the leading side ----------------------------------------------------------------

    static asio::awaitable<std::error_code> respond(net::call_stream& stream, join_status status,
                                                    std::optional<candidate> leader = {}) {
        join_response response;
        response.status = status;
        if (leader) response.leader.emplace(leader->id, leader->address);
        co_return co_await stream.write(encode(response));
    }

    /// Counts a join request as pending while it lives, or until release().
    struct pending_join {
        explicit pending_join(matchmaking_statistics& s) noexcept
            : stats(s) {
            stats.peak_pending_joins = std::max(stats.peak_pending_joins, ++stats.pending_joins);
        }
        pending_join(const pending_join&) = delete;
        pending_join& operator=(const pending_join&) = delete;
        ~pending_join() { release(); }
        void release() noexcept {
            if (held) --stats.pending_joins;
            held = false;
        }
        matchmaking_statistics& stats;
        bool held = true;
    };

    /// A join request from `context.remote`.
    static asio::awaitable<std::error_code>
    serve(std::weak_ptr<state> weak, const net::call_context& context, net::call_stream& stream) {
        auto st = weak.lock();
        if (!st) co_return make_error_code(errc::refused);
        // Refused before reading anything, so a flood costs no more than this many handlers.
        if (st->stats.pending_joins >= st->options.max_pending_joins) {
            ++st->stats.joins_refused;
            co_return make_error_code(errc::refused);
        }
        ++st->stats.joins_served;
        pending_join slot(st->stats);
        byte_buffer message;
        {
            // A follower writes its request as soon as the call opens: one that does not
            // would hold its slot for the caller's whole deadline. The reset comes before
            // the read is cancelled, which would tell the caller `cancelled` instead.
            using namespace asio::experimental::awaitable_operators;
            timer_type limit(st->executor);
            limit.expires_after(st->options.join_timeout);
            bool expired = false;
            auto expire = [&]() -> asio::awaitable<void> {
                auto [ec] =
                    co_await limit.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
                if (ec) co_return;
                expired = true;
                stream.cancel(errc::timeout);
            };
            auto got = co_await (stream.read(message) || expire());
            if (expired) co_return make_error_code(errc::timeout);
            if (auto ec = std::get<0>(got)) co_return ec;
        }
        join_request request;
        const auto bad = decode(message, request, st->options.limits);
        const bool client_request = request.member.role == member_role::client;
        if (bad || client_request != !request.member.address.has_value() ||
            (request.member.address && !Transport::to_endpoint(*request.member.address)))
            co_return co_await respond(stream, join_status::bad_request);
        auto a = st->current;
        if (!a || a->finished || a->stopped)
            co_return co_await respond(stream, join_status::not_looking);
        if (request.schema_hash != a->request.schema_hash)
            co_return co_await respond(stream, join_status::bad_schema_hash);
        if (request.group_key != a->key)
            co_return co_await respond(stream, join_status::bad_group_key);
        if (request.expiration <= st->now())
            co_return co_await respond(stream, join_status::not_declared);

        // Wait while our own request to a leader is under way.
        wakeup changed(st->executor);
        a->handler_wakeups.push_back(&changed);
        struct unlist {
            attempt* a;
            wakeup* w;
            ~unlist() { std::erase(a->handler_wakeups, w); }
        } guard{a.get(), &changed};
        {
            timer_type limit(st->executor);
            limit.expires_after(st->options.join_timeout);
            while (a->requesting && !a->finished && !a->stopped) {
                using namespace asio::experimental::awaitable_operators;
                auto woke =
                    co_await (changed.wait() ||
                              limit.async_wait(asio::experimental::as_tuple(asio::use_awaitable)));
                if (woke.index() == 1) break;
            }
        }
        if (a->finished || a->stopped || a->formed || a->requesting)
            co_return co_await respond(stream, a->requesting ? join_status::not_a_leader
                                                             : join_status::not_looking);
        if (a->leader) co_return co_await respond(stream, join_status::not_a_leader, a->leader);
        if (a->request.role == member_role::client ||
            (request.member.role != member_role::client &&
             !a->before(request.expiration, context.remote)))
            co_return co_await respond(stream, join_status::not_a_leader);
        for (const auto& f : a->followers)
            if (f.id == context.remote)
                co_return co_await respond(stream, join_status::duplicate_peer);
        if (a->followers.size() + 1 >= st->options.target_group_size)
            co_return co_await respond(stream, join_status::group_full);

        a->followers.push_back({context.remote, request.member});
        ++st->stats.joins_accepted;
        slot.release(); // a follower: bounded by group_full above, not by max_pending_joins
        if (a->followers.size() + 1 == st->options.target_group_size)
            a->assemble();
        else
            a->form_if_complete();
        a->progress.notify();
        if (auto ec = co_await respond(stream, join_status::accepted)) {
            co_return ec;
        }
        // Until the group forms, the search ends, or we dismiss our followers.
        while (!a->formed && !a->finished && !a->stopped && a->leads(context.remote))
            co_await changed.wait();
        if (a->formed && std::any_of(a->formed->members.begin(), a->formed->members.end(),
                                     [&](const auto& m) { return m.first == context.remote; }))
            co_return co_await stream.write(encode(*a->formed));
        disband_message disband;
        if (a->leader) disband.leader.emplace(a->leader->id, a->leader->address);
        co_return co_await stream.write(encode(disband));
    }

    state_ptr state_;
};

} // namespace hivemesh::averaging

// With HIVEMESH_SEPARATE_COMPILATION (the hivemesh::compiled target) the net::tcp and
// net::sim instantiations are compiled once, in src/averaging_tcp.cpp and src/averaging_sim.cpp,
// and a program links them from there; the TCP one is declared extern so that no translation unit
// instantiates it again.
#if defined(HIVEMESH_SEPARATE_COMPILATION)
#include "hivemesh/net/tcp.hpp"

namespace hivemesh::averaging {
extern template class matchmaker<net::tcp::transport>;
} // namespace hivemesh::averaging
#endif
