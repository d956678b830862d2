// The averager: one call averages a peer's tensors with a Moshpit group (DESIGN §5).
//
// A step finds a group through matchmaking under the peer's current group key, splits the
// vector by the members' announced bandwidths (load balancing), runs the butterfly
// all-reduce over the tensors and rotates the group bits with the group's id, so that the
// next step meets different peers. A step can be scheduled ahead: matchmaking then runs
// while the caller still computes, and the all-reduce starts when the caller triggers it.
// The averager also serves its state to newcomers and loads state from donors.
#pragma once

#include "hivemesh/averaging/allreduce.hpp"
#include "hivemesh/averaging/group_key.hpp"
#include "hivemesh/averaging/load_balancing.hpp"
#include "hivemesh/averaging/matchmaking.hpp"
#include "hivemesh/averaging/state_sharing.hpp"
#include "hivemesh/tensor/tensor.hpp"

#include <asio/post.hpp>
#include <asio/use_future.hpp>
#include <xxhash.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace hivemesh::averaging {

struct averager_options {
    /// Names the run: DHT keys ("<prefix>.0b<bits>", "<prefix>_state_donors") and RPC
    /// methods ("<prefix>.join", "<prefix>.allreduce", "<prefix>.state").
    std::string prefix = "hivemesh";
    member_role role = member_role::node;
    /// Announced for load balancing (bytes/s or any consistent unit); 0 = unknown, unless
    /// the RPC node has an upload cap (net::node_options::max_upload_rate): then 0 means
    /// the cap, which the peer cannot send faster than. Clients always announce 0.
    double bandwidth = 0;
    std::size_t target_group_size = 16;
    std::size_t min_group_size = 2;
    /// Length of the group key in bits (Moshpit: log2 of the number of groups).
    std::size_t group_key_length = 0;
    /// The starting key; by default derived from the PeerId, so keys spread uniformly.
    std::optional<averaging::group_bits> initial_bits;
    /// How long one step looks for a group.
    duration matchmaking_time = 15s;
    /// How long one all-reduce may take.
    duration averaging_timeout = 60s;
    allreduce_options allreduce;     ///< method is set from prefix
    matchmaking_options matchmaking; ///< prefix and group sizes are set from above
    /// Application bytes handed to every groupmate (e.g. an epoch).
    byte_buffer metadata;
};

/// What one step achieved.
struct step_result {
    group_id group{};
    std::size_t group_size = 0;
    std::size_t index = 0; ///< our position in the group
    /// When the all-reduce began (the group formed and the control was triggered), on the
    /// transport's clock; time_point{} if it never began.
    time_point allreduce_started{};
    allreduce_result allreduce;
};

/// A scheduled step: matchmaking runs now, the all-reduce waits for trigger().
class step_control : public std::enable_shared_from_this<step_control> {
public:
    /// `round` tags the step: peers whose steps carry different tags never group (e.g. the
    /// training epoch, so that peers of different epochs do not average together).
    /// `expected_members`: the group may form once it holds this many members other than aux
    /// peers and the step is triggered (0: none expected; see match_request::expected).
    explicit step_control(const asio::any_io_executor& executor, std::uint64_t round = 0,
                          std::size_t expected_members = 0)
        : executor_(executor)
        , ready_(executor)
        , round_(round)
        , expected_members_(expected_members) {}

    /// Lets the all-reduce start, with the local values as they are then. Any thread.
    void trigger(double weight = 1.0) {
        asio::post(executor_, [self = shared_from_this(), weight] {
            if (self->triggered_) return;
            self->weight_ = weight;
            self->triggered_ = true;
            self->ready_.notify();
            if (self->on_change_) self->on_change_();
        });
    }
    /// Replaces the count of members expected: who takes part may be known better later,
    /// e.g. peers that will not come. While matchmaking runs and once triggered, a lower
    /// count may form the group at once. Any thread; in order with trigger().
    void expect(std::size_t expected_members) {
        asio::post(executor_, [self = shared_from_this(), expected_members] {
            if (self->expected_members_ == expected_members) return;
            self->expected_members_ = expected_members;
            if (self->on_change_) self->on_change_();
        });
    }
    bool triggered() const noexcept { return triggered_; }
    double weight() const noexcept { return weight_; }
    std::uint64_t round() const noexcept { return round_; }
    /// The members expected (changed by expect(), on the executor).
    std::size_t expected_members() const noexcept { return expected_members_; }

private:
    template <net::transport Transport>
    friend class averager;
    asio::any_io_executor executor_;
    wakeup ready_;
    std::uint64_t round_;
    std::size_t expected_members_;
    std::function<void()> on_change_; ///< while matchmaking: the matchmaker's recheck
    double weight_ = 1.0;
    bool triggered_ = false;
};

/// The schema hash of a list of tensors: their element counts, in order (XXH3-64).
inline std::uint64_t schema_hash_of(std::span<const tensor::tensor_ref> tensors) {
    std::vector<std::uint64_t> sizes;
    for (const auto& t : tensors)
        sizes.push_back(static_cast<std::uint64_t>(t.size()));
    return XXH3_64bits(sizes.data(), sizes.size() * sizeof(std::uint64_t));
}

template <net::transport Transport>
class averager {
public:
    using rpc_node_type = net::node<Transport>;
    using dht_node_type = dht::node<Transport>;
    using endpoint_type = typename Transport::endpoint_type;
    using completion_signature = void(std::error_code, step_result);

    /// Averages `tensors` (kept by reference: they must outlive the averager and keep their
    /// sizes). `announce` is where others dial us (none: client). `compute` runs compression
    /// and reduction (see allreduce_service), and the hashing and (de)compression of state
    /// chunks. Throws std::invalid_argument for bad options.
    averager(rpc_node_type& rpc, dht_node_type& dht, std::optional<endpoint_type> announce,
             std::vector<tensor::tensor_ref> tensors, averager_options options = {},
             std::optional<asio::any_io_executor> compute = std::nullopt)
        : rpc_(&rpc)
        , dht_(&dht)
        , announce_(announce)
        , tensors_(std::move(tensors))
        , options_(configured(std::move(options), !announce, rpc.options().max_upload_rate))
        , schema_hash_(schema_hash_of(tensors_))
        , matchmaker_(rpc, dht, announce, options_.matchmaking)
        , compute_(compute)
        , allreduce_(rpc, options_.allreduce, std::move(compute))
        , bits_(options_.initial_bits ? *options_.initial_bits : bits_from(rpc.id())) {
        if (bits_.size() != options_.group_key_length)
            throw std::invalid_argument("averager_options::initial_bits: wrong length");
    }

    const averager_options& options() const noexcept { return options_; }
    /// The current group bits (rotated after every successful step). Node executor only.
    const averaging::group_bits& bits() const noexcept { return bits_; }
    std::uint64_t schema_hash() const noexcept { return schema_hash_; }
    /// The matchmaker's counters (join requests served, refused over
    /// matchmaking_options::max_pending_joins, ...). Node executor only.
    const matchmaking_statistics& matchmaker_statistics() const noexcept {
        return matchmaker_.statistics();
    }

    /// A control for async_scheduled_step, tagged with `round` (see step_control); trigger it
    /// when the local values are ready. Once it is triggered, a group that holds
    /// `expected_members` members other than aux peers forms at once, even below
    /// target_group_size (e.g. every peer known to take part; 0: none expected, the group
    /// forms at target_group_size or when matchmaking ends).
    std::shared_ptr<step_control> make_control(std::uint64_t round = 0,
                                               std::size_t expected_members = 0) const {
        return std::make_shared<step_control>(rpc_->get_executor(), round, expected_members);
    }

    /// Matchmaking now; the all-reduce once `control` is triggered. Completion:
    /// void(std::error_code, step_result). Errors: too_few_peers (no group in
    /// matchmaking_time), invalid_argument (a step is already running), cancelled (the
    /// token's cancellation slot, emitted on the node's executor, reaches matchmaking, the
    /// wait for the trigger or the all-reduce, whichever runs), or a
    /// failed all-reduce's error; the tensors are then as they were (or partly averaged:
    /// see step_result::allreduce).
    template <ASIO_COMPLETION_TOKEN_FOR(completion_signature) Token = default_token_t>
    auto async_scheduled_step(std::shared_ptr<step_control> control,
                              Token&& token = default_token_t{}) {
        return asio::async_initiate<Token, completion_signature>(
            [this](auto handler, std::shared_ptr<step_control> control) {
                co_launch(rpc_->get_executor(), run_step(std::move(control)), std::move(handler),
                          "averaging::averager::async_step");
            },
            token, std::move(control));
    }

    /// One step with `weight` (e.g. the samples behind the local values). See
    /// async_scheduled_step.
    template <ASIO_COMPLETION_TOKEN_FOR(completion_signature) Token = default_token_t>
    auto async_step(double weight, Token&& token = default_token_t{}) {
        auto control = make_control();
        control->triggered_ = true;
        control->weight_ = weight;
        return async_scheduled_step(std::move(control), std::forward<Token>(token));
    }

    /// Blocking step for training loops; throws std::system_error (wrong_thread on the
    /// node's io thread, else the step's error).
    step_result step(double weight = 1.0);

    /// Waits until none of the withdrawals of this averager's matchmaking declarations (sent
    /// when a step's matchmaking ends before its window, a cancelled step's too) is in
    /// flight, e.g. before a peer that leaves goes: cancel the steps and let them complete
    /// first, so that their withdrawals have started. Completes at once if none is in flight;
    /// bounded by the DHT's request timeouts. Completion: void(std::error_code): the first
    /// error of the withdrawals it waited for (store_refused when no replica took one: the
    /// declaration then expires by itself), or cancelled (the token's cancellation slot,
    /// emitted on the node's executor; the withdrawals go on).
    template <ASIO_COMPLETION_TOKEN_FOR(void(std::error_code)) Token = default_token_t>
    auto async_wait_withdrawals(Token&& token = default_token_t{}) {
        return matchmaker_.async_wait_withdrawals(std::forward<Token>(token));
    }

    /// Serves our state to newcomers, advertised with `priority` (higher is preferred, e.g.
    /// the epoch). `provider` is called for each download, on the compute executor if the
    /// averager has one, else on the node's executor.
    void serve_state(std::function<state_snapshot()> provider, double priority,
                     server_options options = {}) {
        if (!announce_)
            throw std::invalid_argument("averager::serve_state: a client serves nothing");
        server_ = std::make_unique<state_server<Transport>>(*rpc_, *dht_, options_.prefix,
                                                            *announce_, std::move(provider),
                                                            priority, options, compute_);
    }
    state_server<Transport>* state_server_ptr() noexcept { return server_.get(); }

    /// Downloads state from the best donor, falling back to the next, checking and decoding
    /// chunks on our `compute` executor unless `options` name one. Completion:
    /// void(std::error_code, downloaded_state); see async_load_state.
    template <ASIO_COMPLETION_TOKEN_FOR(void(std::error_code, downloaded_state))
                  Token = default_token_t>
    auto async_load_state_from_peers(load_options options, Token&& token = default_token_t{}) {
        if (!options.compute) options.compute = compute_;
        return async_load_state(*rpc_, *dht_, options_.prefix, std::move(options),
                                std::forward<Token>(token));
    }

private:
    static averager_options configured(averager_options o, bool client, double upload_cap) {
        if (o.bandwidth == 0) o.bandwidth = upload_cap;
        if (client) {
            o.role = member_role::client;
            o.bandwidth = 0;
        }
        if (o.group_key_length > group_bits::max_size)
            throw std::invalid_argument("averager_options::group_key_length: at most 64");
        o.allreduce.method = o.prefix + ".allreduce";
        o.matchmaking.prefix = o.prefix;
        o.matchmaking.min_group_size = o.min_group_size;
        o.matchmaking.target_group_size = o.target_group_size;
        return o;
    }

    /// Starting bits from the PeerId, so keys spread evenly without coordination.
    averaging::group_bits bits_from(const crypto::peer_id& id) const {
        const auto& b = id.bytes();
        std::uint64_t value = 0;
        std::memcpy(&value, b.data(), sizeof value);
        const std::size_t n = options_.group_key_length;
        return averaging::group_bits(n == 0 ? 0 : value & averaging::group_bits::mask(n), n);
    }

    asio::awaitable<std::pair<std::error_code, step_result>>
    run_step(std::shared_ptr<step_control> control) {
        using out_type = std::pair<std::error_code, step_result>;
        if (stepping_) co_return out_type{errc::invalid_argument, {}};
        stepping_ = true;
        struct done_guard {
            bool* flag;
            ~done_guard() { *flag = false; }
        } guard{&stepping_};

        match_request request;
        request.bits = bits_;
        request.schema_hash =
            control->round_ == 0
                ? schema_hash_
                : XXH3_64bits_withSeed(&control->round_, sizeof control->round_, schema_hash_);
        request.role = options_.role;
        request.bandwidth = options_.bandwidth;
        request.metadata = options_.metadata;
        request.window = options_.matchmaking_time;
        // Once triggered, the group need wait for no one but the members expected.
        request.expected = [control] {
            return control->triggered_ ? control->expected_members_ : 0;
        };
        control->on_change_ = [this] { matchmaker_.recheck(); };
        struct unhook {
            step_control* control;
            ~unhook() { control->on_change_ = nullptr; }
        } const hooked{control.get()}; // on every way out, cancellation too
        auto [ec, group] = co_await matchmaker_.async_find_group(std::move(request));
        control->on_change_ = nullptr;
        if (ec) co_return out_type{ec, {}};

        // Members triggered before us may send to us meanwhile.
        const auto expecting = allreduce_.expect(group.id);
        while (!control->triggered_)
            if (auto cancelled = co_await control->ready_.wait())
                co_return out_type{errc::cancelled, {}};

        step_result out;
        out.group = group.id;
        out.group_size = group.size();
        for (std::size_t k = 0; k < group.size(); ++k)
            if (group.members[k].peer.id == rpc_->id()) out.index = k;
        const auto spans =
            load_balance(tensor::total_size(tensors_), announced_bandwidths(group), ec);
        if (ec) co_return out_type{ec, std::move(out)};
        const auto members = group.size();
        const auto id = group.id;
        out.allreduce_started = net::transport_now<Transport>(rpc_->get_executor());
        auto [reduce_ec, result] =
            co_await allreduce_.async_allreduce(std::move(group), out.index, spans, tensors_,
                                                control->weight_, options_.averaging_timeout);
        out.allreduce = std::move(result);
        if (reduce_ec) co_return out_type{reduce_ec, std::move(out)};
        bits_ = rotate(bits_, id, out.index, members);
        co_return out_type{std::error_code{}, std::move(out)};
    }

    rpc_node_type* rpc_;
    dht_node_type* dht_;
    std::optional<endpoint_type> announce_;
    std::vector<tensor::tensor_ref> tensors_;
    averager_options options_;
    std::uint64_t schema_hash_;
    matchmaker<Transport> matchmaker_;
    std::optional<asio::any_io_executor> compute_;
    allreduce_service<Transport> allreduce_;
    averaging::group_bits bits_;
    bool stepping_ = false;
    std::unique_ptr<state_server<Transport>> server_;
};

// Out of the class, so that the compiled mode instantiates it once (see CONTRIBUTING.md).
template <net::transport Transport>
step_result averager<Transport>::step(double weight) {
    if (running_in_this_thread(rpc_->get_executor()))
        throw std::system_error(errc::wrong_thread,
                                "hivemesh::averaging::averager::step on an io thread");
    return async_step(weight, asio::use_future).get();
}

} // namespace hivemesh::averaging

// With HIVEMESH_SEPARATE_COMPILATION (the hivemesh::compiled target) the net::tcp and
// net::sim instantiations are compiled once, in src/averaging_tcp.cpp and src/averaging_sim.cpp,
// and a program links them from there; the TCP one is declared extern so that no translation unit
// instantiates it again.
#if defined(HIVEMESH_SEPARATE_COMPILATION)
#include "hivemesh/net/tcp.hpp"

namespace hivemesh::averaging {
extern template class averager<net::tcp::transport>;
} // namespace hivemesh::averaging
#endif
