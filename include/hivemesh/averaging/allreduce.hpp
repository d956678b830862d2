// Butterfly all-reduce over a formed group (DESIGN §5).
//
// All tensors are one virtual vector of V floats. Member k owns the contiguous span
// spans[k] (sizes from load balancing; clients own nothing). Every member that has values
// (node, client) streams its slice of each other member's span to that member in parts of
// about `part_size_bytes`, compressed; the owner ("reducer") adds them up as they arrive,
// and once every sender delivered part p (or was dropped) it sends the weighted mean
// sum(w_j x_j) / sum(w_j) of part p back to each sender that contributed to it. Every peer
// therefore moves 2(N-1)/N of the vector each way at equal shares.
//
// Failures (each reported in the result, never an error of the round):
// - a sender that stays silent for `sender_timeout` (or never connects) is dropped from
//   the parts it has not delivered; parts it delivered keep its values;
// - a reducer that stays silent for `reducer_timeout`, or fails, leaves the rest of its
//   span at each sender's local values;
// - at the round deadline whatever is not averaged stays local.
// So every element ends either averaged over the contributors its part_outcome names, or at
// the peer's own value.
//
// Threads: the round's bookkeeping runs on the RPC node's executor; compression,
// decompression and reduction run on the `compute` executor when one is given (a reducer's
// additions through a strand), so io threads stay free. Without one, everything runs on the
// node's executor (the right choice for the one-threaded simulated network).
#pragma once

#include "hivemesh/averaging/allreduce_wire.hpp"
#include "hivemesh/averaging/group.hpp"
#include "hivemesh/compression/compress.hpp"
#include "hivemesh/core/async.hpp"
#include "hivemesh/core/clock.hpp"
#include "hivemesh/core/log.hpp"
#include "hivemesh/net/node.hpp"
#include "hivemesh/tensor/tensor.hpp"

#include <asio/async_result.hpp>
#include <asio/co_spawn.hpp>
#include <asio/dispatch.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/post.hpp>
#include <asio/strand.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace hivemesh::averaging {

using namespace std::chrono_literals;

struct allreduce_options {
    /// RPC method the reducers serve (one per averager, e.g. "<prefix>.allreduce").
    std::string method = "hivemesh.allreduce";
    /// Bytes per part on the wire, compressed (DESIGN §5): a part holds part_size_bytes
    /// divided by the codec's payload bytes per element (4 for `none`, about 1 for the
    /// 8-bit codecs), at least one. Both ends of a round must agree on it.
    std::size_t part_size_bytes = 512u << 10;
    /// Codec for values and averages on the wire; `none` is exact.
    compression::kind codec = compression::kind::none;
    compression::options codec_options{};
    /// A reducer drops a sender that delivers nothing for this long.
    duration sender_timeout = 10s;
    /// A sender gives up on a reducer that makes no progress for this long; keep it above
    /// sender_timeout, since a reducer waits that long for a missing sender.
    duration reducer_timeout = 20s;
    /// How long an incoming sender may wait for this peer to start the same round.
    duration join_wait = 5s;
    /// Largest group accepted.
    std::size_t max_group_size = 1024;
};

/// Fault injection for tests: called at the named points of a round.
struct allreduce_hooks {
    /// Before a sender sends part `part` to `reducer`; returns a delay (0: none).
    std::function<duration(std::size_t reducer, std::size_t part)> before_send;
    /// Before a reducer averages part `part` of its span; returns a delay (0: none).
    std::function<duration(std::size_t part)> before_reduce;
};

/// What happened to one part of the vector at this peer.
struct part_outcome {
    std::size_t begin = 0;   ///< first element in the flat vector
    std::size_t size = 0;    ///< elements
    std::size_t reducer = 0; ///< member index that owns the span
    /// Members whose values are in the mean now held; empty when the part stayed local.
    std::vector<bool> contributors;

    bool averaged() const noexcept { return !contributors.empty(); }
};

/// The outcome of one round at this peer.
struct allreduce_result {
    /// The whole vector for a node or client; an aux peer's own span only.
    std::vector<part_outcome> parts;
    /// Members whose values are in at least one averaged part.
    std::vector<bool> participants;
    std::size_t elements_averaged = 0;
    std::size_t elements_total = 0;
    std::uint64_t bytes_sent = 0;      ///< message bytes, as sender and as reducer
    std::uint64_t bytes_received = 0;  ///< message bytes, as sender and as reducer
    std::uint64_t values_sent = 0;     ///< float values sent (before compression)
    std::uint64_t values_received = 0; ///< float values received (after decompression)

    double fraction_averaged() const noexcept {
        return elements_total == 0
                   ? 1.0
                   : static_cast<double>(elements_averaged) / static_cast<double>(elements_total);
    }
};

namespace detail {

/// Element ranges of the members' spans, in member order.
struct span_range {
    std::size_t begin = 0;
    std::size_t size = 0;
};

/// Elements in a part of about `part_bytes` once compressed with `codec` (header aside).
inline std::size_t part_elements_for(std::size_t part_bytes, compression::kind codec,
                                     const compression::options& opts) {
    constexpr std::size_t sample = std::size_t{1} << 20;
    const double bytes_per_element =
        static_cast<double>(compression::compressed_size(codec, sample, opts) -
                            compression::header_size) /
        static_cast<double>(sample);
    if (!(bytes_per_element >= 1.0)) // an unknown codec, refused later: size as float32
        return std::max<std::size_t>(1, part_bytes / sizeof(float));
    return std::max<std::size_t>(
        1, static_cast<std::size_t>(static_cast<double>(part_bytes) / bytes_per_element));
}

inline std::size_t part_count(std::size_t elements, std::size_t part_elements) noexcept {
    return (elements + part_elements - 1) / part_elements;
}

/// glibc maps every allocation above this (its largest dynamic mmap threshold) afresh, so a
/// span's sums that large would page-fault in every round (100 MB among 2 peers: 12k faults
/// a round, half the round's time). Smaller ones come back from the heap warm after the
/// first round, and keeping them would pin glibc's threshold low and cost more than it
/// saves (measured: 4 peers, 0.37 s a round freed, 0.55 s kept).
inline constexpr std::size_t always_mapped_bytes = std::size_t{32} << 20;

/// Floats that are not zeroed when allocated, for arrays whose every element is written
/// before it is read; they keep their storage when resized smaller.
class uninitialized_floats {
public:
    uninitialized_floats() = default;
    uninitialized_floats(uninitialized_floats&& other) noexcept
        : data_(std::move(other.data_))
        , size_(std::exchange(other.size_, 0))
        , capacity_(std::exchange(other.capacity_, 0)) {}
    uninitialized_floats& operator=(uninitialized_floats&& other) noexcept {
        data_ = std::move(other.data_);
        size_ = std::exchange(other.size_, 0);
        capacity_ = std::exchange(other.capacity_, 0);
        return *this;
    }

    void resize(std::size_t n) {
        if (n > capacity_) {
            data_ = std::make_unique_for_overwrite<float[]>(n);
            capacity_ = n;
        }
        size_ = n;
    }
    std::span<float> span() const noexcept { return {data_.get(), size_}; }
    std::size_t capacity() const noexcept { return capacity_; }

private:
    std::unique_ptr<float[]> data_;
    std::size_t size_ = 0;
    std::size_t capacity_ = 0;
};

/// An empty buffer: `buffer`, cleared but with its capacity, if nothing else holds it any
/// more (a write that completed has let go of it), else a new one. Large message buffers
/// are reused rather than allocated, and page-faulted in, for every part.
inline std::shared_ptr<byte_buffer> take_if_unshared(std::shared_ptr<byte_buffer>& buffer) {
    if (buffer && buffer.use_count() == 1) {
        // use_count() reads relaxed: order the last holder's release before our writes.
        std::atomic_thread_fence(std::memory_order_acquire);
        buffer->clear();
        return std::move(buffer);
    }
    buffer.reset();
    return std::make_shared<byte_buffer>();
}

} // namespace detail

template <net::transport Transport>
class allreduce_service {
public:
    using rpc_node_type = net::node<Transport>;
    using endpoint_type = typename Transport::endpoint_type;
    using timer_type = typename Transport::timer_type;
    using group_type = group_info<endpoint_type>;
    using completion_signature = void(std::error_code, allreduce_result);

    /// Serves `options.method` on `rpc`, which must outlive this service. `compute` runs
    /// compression and reduction (e.g. an asio::thread_pool's executor); without one they
    /// run on the node's executor.
    explicit allreduce_service(rpc_node_type& rpc, allreduce_options options = {},
                               std::optional<asio::any_io_executor> compute = std::nullopt)
        : state_(std::make_shared<service_state>(rpc, std::move(options), std::move(compute))) {
        if (state_->options.part_size_bytes < sizeof(float))
            throw std::invalid_argument("allreduce_options::part_size_bytes: at least 4");
        rpc.add_stream_handler(state_->options.method,
                               [weak = std::weak_ptr<service_state>(state_)](
                                   const net::call_context& context, net::call_stream& stream) {
                                   return serve(weak, context, stream);
                               });
    }
    allreduce_service(const allreduce_service&) = delete;
    allreduce_service& operator=(const allreduce_service&) = delete;
    /// Cancels rounds still running; their completions still run.
    ~allreduce_service() {
        auto st = state_;
        asio::dispatch(st->executor, [st] {
            for (auto& [id, weak] : st->rounds)
                if (auto r = weak.lock()) r->abort(errc::cancelled);
        });
    }

    /// Test hooks; set before starting rounds.
    void set_hooks(allreduce_hooks hooks) { state_->hooks = std::move(hooks); }
    const allreduce_options& options() const noexcept { return state_->options; }

    /// Averages `local` (the flat vector, V elements; ignored and may be empty for an aux
    /// member) with the group: `me` is this peer's index in `group.members`, `spans[k]` the
    /// number of elements member k reduces (sum V; 0 for clients), `weight` > 0 this peer's
    /// weight (ignored for aux). `local` is overwritten with the averages where they arrive
    /// and must stay valid until completion. The round ends by `timeout` at the latest.
    ///
    /// Completion: void(std::error_code, allreduce_result). Errors: invalid_argument (a
    /// malformed group, spans or weight, this node not at `me`, a round of the same group
    /// already running here; or a NaN or infinity in `local`, found where its part is first
    /// read: that part is never sent and the round ends at once, the result telling what was
    /// averaged before), cancelled (the token's cancellation slot was emitted, on the node's
    /// executor; the result still tells what was averaged before).
    /// Timeouts and failed peers are not errors: see allreduce_result::parts.
    template <ASIO_COMPLETION_TOKEN_FOR(completion_signature) Token = default_token_t>
    auto async_allreduce(group_type group, std::size_t me, std::vector<std::size_t> spans,
                         std::span<float> local, double weight, duration timeout,
                         Token&& token = default_token_t{}) {
        return start(std::forward<Token>(token), std::move(group), me, std::move(spans), local,
                     std::vector<tensor::tensor_ref>{}, weight, timeout);
    }

    /// The same over a list of tensors of any backend, concatenated in order; the tensors
    /// are read at the start and written at the end, and must stay alive until completion.
    template <ASIO_COMPLETION_TOKEN_FOR(completion_signature) Token = default_token_t>
    auto async_allreduce(group_type group, std::size_t me, std::vector<std::size_t> spans,
                         std::vector<tensor::tensor_ref> tensors, double weight, duration timeout,
                         Token&& token = default_token_t{}) {
        return start(std::forward<Token>(token), std::move(group), me, std::move(spans),
                     std::span<float>{}, std::move(tensors), weight, timeout);
    }

private:
    struct round;

    struct service_state {
        service_state(rpc_node_type& r, allreduce_options o, std::optional<asio::any_io_executor> c)
            : rpc(&r)
            , executor(r.get_executor())
            , options(std::move(o))
            , compute(std::move(c)) {
            if (compute) reduce = asio::any_io_executor(asio::make_strand(*compute));
        }
        rpc_node_type* rpc;
        asio::any_io_executor executor;
        allreduce_options options;
        std::optional<asio::any_io_executor> compute;
        std::optional<asio::any_io_executor> reduce; ///< serialises a reducer's additions
        allreduce_hooks hooks;
        std::map<group_id, std::weak_ptr<round>> rounds;
        std::set<timer_type*> joiners; ///< incoming senders waiting for their round
        /// The last round's sums when they were larger than detail::always_mapped_bytes,
        /// kept for the next round (see there).
        detail::uninitialized_floats spare_sums;

        time_point now() const { return net::transport_now<Transport>(executor); }
    };
    using state_ptr = std::shared_ptr<service_state>;

    // ---- one round -----------------------------------------------------------------------

    struct round : std::enable_shared_from_this<round> {
        /// A member sending to us, as seen by this peer reducing its span.
        struct sender_slot {
            bool expected = false;
            bool connected = false;
            bool failed = false;
            bool busy = false; ///< adding a part: not to be dropped meanwhile
            bool writer_done = false;
            std::size_t next_part = 0; ///< parts taken from it
            std::size_t written = 0;   ///< results written back to it
            double weight = 0;
            time_point last_progress{};
            net::call_stream* stream = nullptr;
            std::unique_ptr<wakeup> results_ready;
        };
        /// A member we send to.
        struct reducer_slot {
            bool active = false;
            bool busy = false;
            time_point last_progress{};
            net::call_stream* stream = nullptr;
        };

        round(state_ptr s, group_type g, std::size_t m, std::vector<std::size_t> sizes,
              std::span<float> l, std::vector<tensor::tensor_ref> t, double w, duration limit)
            : st(std::move(s))
            , io(st->executor)
            , group(std::move(g))
            , me(m)
            , span_sizes(std::move(sizes))
            , local(l)
            , tensors(std::move(t))
            , weight(w)
            , timeout(limit)
            , part_elements(detail::part_elements_for(st->options.part_size_bytes,
                                                      st->options.codec, st->options.codec_options))
            , progress(io)
            , all_done(io)
            , deadline_timer(io)
            , watch_timer(io) {}

        state_ptr st;
        asio::any_io_executor io;
        group_type group;
        std::size_t me;
        std::vector<std::size_t> span_sizes;
        std::span<float> local;
        std::vector<tensor::tensor_ref> tensors;
        std::vector<float> owned; ///< the flat copy of `tensors`
        double weight;
        duration timeout;
        std::size_t part_elements;
        std::vector<detail::span_range> spans;

        // Reducing our span.
        std::vector<sender_slot> senders;
        /// Our span's weighted sums; part p's start as our own weighted values (zero for
        /// aux) when its first addition or its average needs them (part_started).
        detail::uninitialized_floats sums;
        std::vector<bool> part_started;
        std::atomic<bool> local_non_finite{false}; ///< set by part_sums, on the reducing strand
        std::vector<double> part_weight;
        std::vector<std::vector<bool>> part_contributors;
        /// Encoded result messages, one buffer written to every sender, until all written.
        std::vector<std::shared_ptr<byte_buffer>> results;
        std::shared_ptr<byte_buffer> spare_result; ///< the last freed one, to encode into
        std::size_t ready = 0;                     ///< parts averaged (always a prefix)
        std::size_t trimmed = 0;                   ///< results freed (a prefix)
        wakeup progress;

        // Sending to the others.
        std::vector<reducer_slot> reducers;
        std::vector<std::vector<part_outcome>> outcomes; ///< [reducer][part]

        // Lifecycle.
        std::size_t activities = 0;
        wakeup all_done;
        timer_type deadline_timer;
        timer_type watch_timer;
        bool registered = false;
        bool finished = false;
        bool aborted = false;
        std::map<std::uint64_t, std::function<void()>> cancellers;
        std::uint64_t next_canceller = 0;
        allreduce_result result;

        member_role role() const { return group.members[me].role; }
        bool reducing() const { return spans[me].size > 0; }
        std::size_t parts_of(std::size_t k) const {
            return detail::part_count(spans[k].size, part_elements);
        }
        detail::span_range part_range(std::size_t k, std::size_t p) const {
            const std::size_t begin = spans[k].begin + p * part_elements;
            return {begin, std::min(part_elements, spans[k].begin + spans[k].size - begin)};
        }
        time_point now() const { return st->now(); }
        const allreduce_hooks& hooks() const { return st->hooks; }

        /// Calls `cancel` on abort() while the returned guard lives.
        class abort_guard {
        public:
            abort_guard(round& r, std::function<void()> cancel)
                : r_(&r) {
                if (r.aborted) {
                    cancel();
                    r_ = nullptr;
                    return;
                }
                id_ = r.next_canceller++;
                r.cancellers.emplace(id_, std::move(cancel));
            }
            abort_guard(const abort_guard&) = delete;
            abort_guard& operator=(const abort_guard&) = delete;
            ~abort_guard() {
                if (r_) r_->cancellers.erase(id_);
            }

        private:
            round* r_;
            std::uint64_t id_ = 0;
        };

        /// Stops everything still running: streams are reset, waits end.
        void abort(std::error_code why) {
            if (aborted || finished) return;
            aborted = true;
            abort_reason = why;
            auto actions = std::move(cancellers);
            cancellers.clear();
            for (auto& [id, action] : actions)
                action();
            progress.notify();
            for (auto& s : senders)
                if (s.results_ready) s.results_ready->notify();
        }
        std::error_code abort_reason;

        /// Runs `work` as one of the round's activities; the round ends when none is left.
        void spawn(asio::awaitable<void> work) {
            ++activities;
            asio::co_spawn(io, std::move(work),
                           [self = this->shared_from_this()](std::exception_ptr failure) {
                               if (failure)
                                   self->abort(escaped_exception_code(failure, "allreduce round"));
                               if (--self->activities == 0) self->all_done.notify();
                           });
        }

        asio::awaitable<void> sleep(duration d) {
            if (d <= duration::zero()) co_return;
            timer_type timer(io);
            timer.expires_after(d);
            abort_guard guard(*this, [&timer] { timer.cancel(); });
            co_await timer.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
        }

        // ---- checks ----------------------------------------------------------------------

        std::error_code check_arguments() const {
            const std::size_t n = group.members.size();
            if (n == 0 || n > st->options.max_group_size || n > 0xFFFF)
                return errc::invalid_argument;
            if (me >= n || span_sizes.size() != n) return errc::invalid_argument;
            if (group.members[me].peer.id != st->rpc->id()) return errc::invalid_argument;
            std::set<crypto::peer_id> ids;
            std::size_t total = 0;
            for (std::size_t k = 0; k < n; ++k) {
                if (!ids.insert(group.members[k].peer.id).second) return errc::invalid_argument;
                if (group.members[k].role == member_role::client && span_sizes[k] != 0)
                    return errc::invalid_argument;
                total += span_sizes[k];
            }
            if (sends_values(role())) {
                if (!std::isfinite(weight) || weight <= 0) return errc::invalid_argument;
                const std::size_t have =
                    tensors.empty() ? local.size() : tensor::total_size(tensors);
                if (have != total) return errc::invalid_argument;
            }
            if (timeout <= duration::zero()) return errc::invalid_argument;
            return {};
        }

        /// Does a sender's first message match our view of the round?
        std::error_code check_begin(const begin_message& b, const crypto::peer_id& remote) const {
            const std::size_t n = group.members.size();
            if (b.group_size != n || b.sender >= n || b.reducer != me || b.sender == me)
                return errc::protocol_violation;
            if (group.members[b.sender].peer.id != remote) return errc::refused;
            if (!sends_values(group.members[b.sender].role)) return errc::protocol_violation;
            if (b.span_begin != spans[me].begin || b.span_size != spans[me].size ||
                b.part_elements != part_elements || !std::isfinite(b.weight) || b.weight <= 0)
                return errc::protocol_violation;
            return {};
        }

        // ---- the round -------------------------------------------------------------------

        static asio::awaitable<std::pair<std::error_code, allreduce_result>>
        run(std::shared_ptr<round> self) {
            auto& r = *self;
            std::error_code ec = r.check_arguments();
            if (!ec && r.st->rounds.contains(r.group.id)) ec = errc::invalid_argument;
            if (ec) co_return std::pair{ec, allreduce_result{}};

            r.layout();
            // Our values are checked where they are first read, part by part (see
            // refuse_local_values), not in a pass over the whole tensor up front.
            if (sends_values(r.role()) && !r.tensors.empty()) {
                auto flatten = [&r] {
                    r.owned.resize(tensor::total_size(r.tensors));
                    tensor::flatten_to(r.tensors, r.owned);
                    r.local = r.owned;
                };
                co_await offload(r.st->compute, flatten);
            }
            // Visible to incoming senders only now that the sums and slots exist.
            if (!r.st->rounds.try_emplace(r.group.id, self).second)
                co_return std::pair{make_error_code(errc::invalid_argument), allreduce_result{}};
            r.registered = true;
            for (auto* joiner : r.st->joiners)
                joiner->cancel();
            r.deadline_timer.expires_after(r.timeout);
            r.deadline_timer.async_wait([weak = std::weak_ptr<round>(self)](std::error_code ec) {
                if (auto r = weak.lock(); r && !ec) r->abort(errc::timeout);
            });

            if (r.reducing()) r.spawn(reduce(self));
            if (sends_values(r.role()))
                for (std::size_t k = 0; k < r.group.members.size(); ++k)
                    if (k != r.me && r.spans[k].size > 0) r.spawn(send_to(self, k));
            // The watchdog is no activity: it must not keep a finished round waiting.
            asio::co_spawn(r.io, watch(self), asio::detached);
            while (r.activities > 0)
                co_await r.all_done.wait();

            r.finished = true;
            if (r.sums.capacity() * sizeof(float) > detail::always_mapped_bytes &&
                r.sums.capacity() > r.st->spare_sums.capacity())
                r.st->spare_sums = std::move(r.sums);
            r.deadline_timer.cancel();
            r.watch_timer.cancel();
            r.unregister();
            if (!r.tensors.empty()) {
                auto write_back = [&r] { tensor::unflatten_from(r.tensors, r.owned); };
                co_await offload(r.st->compute, write_back);
            }
            if (r.aborted &&
                (r.abort_reason == errc::cancelled || r.abort_reason == errc::invalid_argument))
                ec = r.abort_reason;
            co_return std::pair{ec, r.summarise()};
        }

        void unregister() {
            if (!registered) return;
            registered = false;
            const auto it = st->rounds.find(group.id);
            if (it != st->rounds.end()) st->rounds.erase(it);
        }

        /// Spans, slots and outcome tables.
        void layout() {
            const std::size_t n = group.members.size();
            spans.resize(n);
            std::size_t begin = 0;
            for (std::size_t k = 0; k < n; ++k) {
                spans[k] = {begin, span_sizes[k]};
                begin += span_sizes[k];
            }
            const time_point start = now();
            senders.resize(n);
            reducers.resize(n);
            outcomes.resize(n);
            for (std::size_t k = 0; k < n; ++k) {
                auto& s = senders[k];
                s.expected = reducing() && k != me && sends_values(group.members[k].role);
                s.last_progress = start;
                s.results_ready = std::make_unique<wakeup>(io);
                auto& slot = reducers[k];
                slot.active = sends_values(role()) && k != me && spans[k].size > 0;
                slot.last_progress = start;
                if (!sends_values(role()) && k != me) continue; // aux: only its own span
                for (std::size_t p = 0; p < parts_of(k); ++p) {
                    const auto range = part_range(k, p);
                    outcomes[k].push_back(part_outcome{range.begin, range.size, k, {}});
                }
            }
            if (reducing()) {
                const std::size_t parts = parts_of(me);
                const bool mine = sends_values(role());
                sums = std::exchange(st->spare_sums, {});
                sums.resize(spans[me].size);
                part_started.assign(parts, false);
                part_weight.assign(parts, mine ? weight : 0.0);
                part_contributors.assign(parts, std::vector<bool>(n, false));
                for (auto& who : part_contributors)
                    who[me] = mine;
                results.resize(parts);
            }
        }

        /// Part p's sums, started on first use (on the reducing executor): written once
        /// with our weighted values, just before the part is added to while still in cache.
        /// Our values are checked as they are read: a non-finite one sets local_non_finite
        /// (the sums are then unusable; refuse_local_values ends the round).
        std::span<float> part_sums(std::size_t p) {
            const auto range = part_range(me, p);
            const auto sum = sums.span().subspan(range.begin - spans[me].begin, range.size);
            if (!part_started[p]) {
                part_started[p] = true;
                if (sends_values(role())) {
                    const auto w = static_cast<float>(weight);
                    const auto mine = local.subspan(range.begin, range.size);
                    constexpr std::size_t chunk = 2048; // checked, then read again from L1
                    for (std::size_t i = 0; i < range.size; i += chunk) {
                        const std::size_t end = std::min(range.size, i + chunk);
                        if (!compression::all_finite(mine.subspan(i, end - i))) {
                            local_non_finite.store(true, std::memory_order_relaxed);
                            break;
                        }
                        for (std::size_t e = i; e < end; ++e)
                            sum[e] = w * mine[e];
                    }
                } else {
                    std::fill(sum.begin(), sum.end(), 0.0f);
                }
            }
            return sum;
        }

        /// Ends the round with invalid_argument if our own values held a NaN or infinity;
        /// true if so. Called on the node's executor after work that started sums.
        bool refuse_local_values() {
            if (!local_non_finite.load(std::memory_order_relaxed)) return false;
            abort(errc::invalid_argument);
            return true;
        }

        allreduce_result summarise() {
            allreduce_result out = std::move(result);
            out.participants.assign(group.members.size(), false);
            for (auto& parts : outcomes)
                for (auto& part : parts) {
                    out.elements_total += part.size;
                    if (part.averaged()) out.elements_averaged += part.size;
                    for (std::size_t j = 0; j < part.contributors.size(); ++j)
                        if (part.contributors[j]) out.participants[j] = true;
                    out.parts.push_back(std::move(part));
                }
            // Spans follow member order, so this is already vector order; aux peers have one.
            return out;
        }

        // ---- reducing our span ----------------------------------------------------------

        static asio::awaitable<void> reduce(std::shared_ptr<round> self) {
            auto& r = *self;
            const std::size_t parts = r.parts_of(r.me);
            while (r.ready < parts && !r.aborted) {
                if (!r.part_complete(r.ready)) {
                    co_await r.progress.wait();
                    continue;
                }
                const std::size_t p = r.ready;
                if (r.hooks().before_reduce) {
                    co_await r.sleep(r.hooks().before_reduce(p));
                    if (r.aborted) break;
                }
                co_await r.finish_part(p);
            }
        }

        bool part_complete(std::size_t p) const {
            // A part being added counts even if its sender failed meanwhile: its values are
            // in the sums, and its weight and contributor bit follow once the addition ends.
            for (const auto& s : senders)
                if (s.expected && s.next_part <= p && (!s.failed || s.busy)) return false;
            return true;
        }

        /// Averages part p, applies it to our own values and queues it for the senders.
        asio::awaitable<void> finish_part(std::size_t p) {
            const auto range = part_range(me, p);
            auto buffer = detail::take_if_unshared(spare_result);
            byte_buffer& message = *buffer;
            std::error_code ec;
            if (part_weight[p] > 0) {
                encode_result_head(message, static_cast<std::uint32_t>(p), part_contributors[p]);
                auto average = [&] {
                    const std::span<float> sum = part_sums(p);
                    if (local_non_finite.load(std::memory_order_relaxed)) return;
                    const auto scale = static_cast<float>(1.0 / part_weight[p]);
                    for (float& v : sum)
                        v *= scale;
                    const std::size_t head = message.size();
                    ec = compression::compress_into(st->options.codec, sum, message,
                                                    st->options.codec_options);
                    if (ec || !sends_values(role())) return;
                    const auto mine = local.subspan(range.begin, range.size);
                    if (st->options.codec == compression::kind::none)
                        std::copy(sum.begin(), sum.end(), mine.begin());
                    else // hold exactly what the others decode
                        ec = compression::decompress_into(byte_view(message).subspan(head), mine);
                };
                co_await offload(st->reduce, average);
                if (refuse_local_values()) co_return;
            }
            if (ec) log::warning("allreduce", "part ", p, " not averaged: ", ec.message());
            if (part_weight[p] > 0 && !ec) {
                outcomes[me][p].contributors = part_contributors[p];
                results[p] = std::move(buffer);
            }
            ++ready;
            trim_results();
            for (auto& s : senders)
                if (s.expected) s.results_ready->notify();
        }

        /// Frees the results every sender still being answered has already been written.
        void trim_results() {
            std::size_t low = ready;
            for (const auto& s : senders)
                if (s.connected && !s.writer_done) low = std::min(low, s.written);
            for (; trimmed < low; ++trimmed)
                if (results[trimmed]) spare_result = std::move(results[trimmed]);
        }

        void fail_sender(std::size_t j, errc why) {
            auto& s = senders[j];
            if (s.failed) return;
            s.failed = true;
            if (s.stream) s.stream->cancel(why);
            progress.notify();
            s.results_ready->notify();
        }

        /// Serves sender j's stream: takes its parts and returns the averages.
        static asio::awaitable<std::error_code> serve_sender(std::shared_ptr<round> self,
                                                             const begin_message& begin,
                                                             net::call_stream& stream) {
            using namespace asio::experimental::awaitable_operators;
            auto& r = *self;
            auto& s = r.senders[begin.sender];
            if (r.aborted || r.finished || !s.expected || s.connected || s.failed)
                co_return make_error_code(errc::refused);
            s.connected = true;
            s.stream = &stream;
            s.weight = begin.weight;
            s.last_progress = r.now();
            std::error_code status;
            {
                abort_guard guard(r, [&stream] { stream.cancel(errc::timeout); });
                co_await (take_parts(self, begin.sender, stream) &&
                          return_results(self, begin.sender, stream));
                if (s.failed || r.aborted) status = errc::timeout;
            }
            s.stream = nullptr;
            co_return status;
        }

        static asio::awaitable<void> take_parts(std::shared_ptr<round> self, std::size_t j,
                                                net::call_stream& stream) {
            auto& r = *self;
            auto& s = r.senders[j];
            const std::size_t parts = r.parts_of(r.me);
            std::vector<float> values;
            byte_buffer message; // its storage goes back to the stream for a later part
            while (s.next_part < parts && !s.failed && !r.aborted) {
                const auto ec = co_await stream.read(message);
                if (ec) {
                    r.fail_sender(j, errc::protocol_violation);
                    break;
                }
                if (s.failed || r.aborted) break;
                s.last_progress = r.now();
                r.result.bytes_received += message.size();
                part_message part;
                const auto bad =
                    decode_part(message, allreduce_message::part, r.group.size(), part);
                if (bad || part.part != s.next_part) {
                    r.fail_sender(j, errc::protocol_violation);
                    break;
                }
                const std::size_t p = s.next_part;
                const auto range = r.part_range(r.me, p);
                std::error_code refused;
                auto add = [&] {
                    const std::span<float> sum = r.part_sums(p);
                    if (r.local_non_finite.load(std::memory_order_relaxed)) return;
                    refused = compression::decompress_add(part.payload, sum,
                                                          static_cast<float>(s.weight), values);
                };
                s.busy = true;
                co_await offload(r.st->reduce, add);
                s.busy = false;
                if (r.refuse_local_values()) break;
                if (refused) {
                    r.fail_sender(j, errc::protocol_violation);
                    break;
                }
                r.part_weight[p] += s.weight;
                r.part_contributors[p][j] = true;
                r.result.values_received += range.size;
                ++s.next_part;
                s.last_progress = r.now();
                r.progress.notify();
            }
        }

        static asio::awaitable<void> return_results(std::shared_ptr<round> self, std::size_t j,
                                                    net::call_stream& stream) {
            auto& r = *self;
            auto& s = r.senders[j];
            const std::size_t parts = r.parts_of(r.me);
            while (s.written < parts) {
                while (r.ready <= s.written && !s.failed && !r.aborted)
                    co_await s.results_ready->wait();
                if (s.failed || r.aborted || !r.results[s.written]) break;
                auto message = r.results[s.written];
                r.result.bytes_sent += message->size();
                r.result.values_sent += r.part_range(r.me, s.written).size;
                const auto ec = co_await stream.write(std::move(message));
                if (ec) break;
                ++s.written;
                r.trim_results();
            }
            s.writer_done = true;
            r.trim_results();
            if (s.written < parts) r.fail_sender(j, errc::cancelled);
        }

        // ---- sending to the others -----------------------------------------------------

        static asio::awaitable<void> send_to(std::shared_ptr<round> self, std::size_t k) {
            using namespace asio::experimental::awaitable_operators;
            auto& r = *self;
            auto& slot = r.reducers[k];
            net::call_stream stream;
            {
                timer_type limit(r.io);
                limit.expires_after(r.timeout);
                abort_guard guard(r, [&limit] { limit.cancel(); });
                auto opened =
                    co_await (r.st->rpc->open_call(r.group.members[k].peer, r.st->options.method,
                                                   r.timeout, stream) ||
                              limit.async_wait(asio::experimental::as_tuple(asio::use_awaitable)));
                if (opened.index() != 0 || std::get<0>(opened) || r.aborted) {
                    slot.active = false;
                    co_return;
                }
            }
            slot.stream = &stream;
            slot.last_progress = r.now();
            {
                abort_guard guard(r, [&stream] { stream.cancel(errc::cancelled); });
                begin_message begin;
                begin.group = r.group.id;
                begin.group_size = static_cast<std::uint16_t>(r.group.size());
                begin.sender = static_cast<std::uint16_t>(r.me);
                begin.reducer = static_cast<std::uint16_t>(k);
                begin.weight = r.weight;
                begin.span_begin = r.spans[k].begin;
                begin.span_size = r.spans[k].size;
                begin.part_elements = static_cast<std::uint32_t>(r.part_elements);
                byte_buffer first = encode(begin);
                r.result.bytes_sent += first.size();
                const auto ec = co_await stream.write(std::move(first));
                if (!ec) co_await (send_parts(self, k, stream) && take_results(self, k, stream));
            }
            slot.stream = nullptr;
            slot.active = false;
        }

        static asio::awaitable<void> send_parts(std::shared_ptr<round> self, std::size_t k,
                                                net::call_stream& stream) {
            using namespace asio::experimental::awaitable_operators;
            auto& r = *self;
            auto& slot = r.reducers[k];
            const std::size_t parts = r.parts_of(k);
            // A pipeline: part p + 1 is compressed while part p is being written, into the
            // buffer of part p - 1 once the stream has let go of it (always an empty one).
            auto next = std::make_shared<byte_buffer>();
            std::shared_ptr<byte_buffer> spare;
            std::size_t next_part = 0;
            std::error_code packed;
            auto pack = [&] {
                const auto range = r.part_range(k, next_part);
                const auto values = r.local.subspan(range.begin, range.size);
                const auto codec = r.st->options.codec;
                // Our values are checked here, part by part (the statistical codecs refuse
                // non-finite input themselves); the check also brings the part into cache.
                if (!compression::refuses_non_finite(codec) && !compression::all_finite(values)) {
                    packed = errc::non_finite_input;
                    return;
                }
                encode_part_head(*next, static_cast<std::uint32_t>(next_part));
                packed =
                    compression::compress_into(codec, values, *next, r.st->options.codec_options);
            };
            if (parts > 0) co_await offload(r.st->compute, pack);
            for (std::size_t p = 0; p < parts; ++p) {
                if (r.hooks().before_send) co_await r.sleep(r.hooks().before_send(k, p));
                if (packed == errc::non_finite_input) r.abort(errc::invalid_argument);
                if (packed || r.aborted || !slot.active) {
                    stream.cancel(errc::cancelled);
                    co_return;
                }
                std::shared_ptr<byte_buffer> message = std::move(next);
                next = detail::take_if_unshared(spare);
                r.result.bytes_sent += message->size();
                r.result.values_sent += r.part_range(k, p).size;
                slot.last_progress = r.now();
                std::error_code written;
                if (p + 1 < parts) {
                    next_part = p + 1;
                    // Named: no temporaries inside co_await (see CONTRIBUTING.md).
                    auto writing = stream.write(message);
                    auto packing = offload(r.st->compute, pack);
                    written = co_await (std::move(writing) && std::move(packing));
                } else {
                    written = co_await stream.write(message);
                }
                spare = std::move(message);
                if (written) co_return;
                slot.last_progress = r.now();
            }
            co_await stream.close_write();
        }

        static asio::awaitable<void> take_results(std::shared_ptr<round> self, std::size_t k,
                                                  net::call_stream& stream) {
            auto& r = *self;
            auto& slot = r.reducers[k];
            const std::size_t parts = r.parts_of(k);
            std::vector<float> values;
            std::size_t p = 0;
            std::error_code why;
            byte_buffer storage; // goes back to the stream for a later result
            for (; p < parts; ++p) {
                byte_view message;
                if (auto ec = co_await stream.read(storage, message)) {
                    why = ec;
                    break;
                }
                slot.last_progress = r.now();
                r.result.bytes_received += message.size();
                part_message part;
                if (decode_part(message, allreduce_message::result, r.group.size(), part) ||
                    part.part != p || !r.valid_contributors(part.contributors)) {
                    why = errc::protocol_violation;
                    stream.cancel(errc::protocol_violation);
                    break;
                }
                const auto range = r.part_range(k, p);
                std::error_code refused;
                auto apply = [&] {
                    refused = compression::decompress_finite_into(
                        part.payload, r.local.subspan(range.begin, range.size), values);
                };
                slot.busy = true;
                co_await offload(r.st->compute, apply);
                slot.busy = false;
                if (refused) {
                    why = refused;
                    stream.cancel(errc::protocol_violation);
                    break;
                }
                r.outcomes[k][p].contributors = std::move(part.contributors);
                r.result.values_received += range.size;
                slot.last_progress = r.now();
            }
            if (p == parts) { // the reducer's final status, so the call ends cleanly
                byte_buffer rest;
                const auto ec = co_await stream.read(rest);
                if (ec != asio::error::eof) stream.cancel(errc::protocol_violation);
            } else if (!r.aborted) {
                log::warning("allreduce", "member ", k, " returned ", p, " of ", parts,
                             " parts: ", why.message());
            }
            slot.active = false;
        }

        /// A result's contributors: us among them, and only members with values.
        bool valid_contributors(const std::vector<bool>& who) const {
            if (!who[me]) return false;
            for (std::size_t j = 0; j < who.size(); ++j)
                if (who[j] && !sends_values(group.members[j].role)) return false;
            return true;
        }

        // ---- timeouts ------------------------------------------------------------------

        /// Drops senders and reducers that make no progress for their timeout; ends when no
        /// exchange is left to watch.
        static asio::awaitable<void> watch(std::shared_ptr<round> self) {
            auto& r = *self;
            const auto& o = r.st->options;
            abort_guard guard(r, [&r] { r.watch_timer.cancel(); });
            while (!r.aborted && !r.finished) {
                const time_point t = r.now();
                std::optional<time_point> next;
                auto consider = [&](time_point due) {
                    if (!next || due < *next) next = due;
                };
                for (std::size_t j = 0; j < r.senders.size(); ++j) {
                    auto& s = r.senders[j];
                    if (!s.expected || s.failed || s.next_part >= r.parts_of(r.me)) continue;
                    if (s.busy) {
                        consider(t + o.sender_timeout);
                    } else if (t >= s.last_progress + o.sender_timeout) {
                        r.fail_sender(j, errc::timeout);
                    } else {
                        consider(s.last_progress + o.sender_timeout);
                    }
                }
                for (auto& slot : r.reducers) {
                    if (!slot.active) continue;
                    if (slot.busy || !slot.stream) {
                        consider(t + o.reducer_timeout);
                    } else if (t >= slot.last_progress + o.reducer_timeout) {
                        slot.active = false;
                        slot.stream->cancel(errc::timeout);
                    } else {
                        consider(slot.last_progress + o.reducer_timeout);
                    }
                }
                if (!next) break;
                r.watch_timer.expires_after(*next - t);
                co_await r.watch_timer.async_wait(
                    asio::experimental::as_tuple(asio::use_awaitable));
            }
        }
    };

    // ---- plumbing ------------------------------------------------------------------------

    template <class Token>
    auto start(Token&& token, group_type group, std::size_t me, std::vector<std::size_t> spans,
               std::span<float> local, std::vector<tensor::tensor_ref> tensors, double weight,
               duration timeout) {
        return asio::async_initiate<Token, completion_signature>(
            [st = state_](auto handler, group_type group, std::size_t me,
                          std::vector<std::size_t> spans, std::span<float> local,
                          std::vector<tensor::tensor_ref> tensors, double weight,
                          duration timeout) {
                auto r = std::make_shared<round>(st, std::move(group), me, std::move(spans), local,
                                                 std::move(tensors), weight, timeout);
                co_launch(st->executor, round::run(r), std::move(handler),
                          "averaging::allreduce_service::async_allreduce",
                          [weak = std::weak_ptr<round>(r)] {
                              if (auto alive = weak.lock()) alive->abort(errc::cancelled);
                          });
            },
            token, std::move(group), me, std::move(spans), local, std::move(tensors), weight,
            timeout);
    }

    /// An incoming sender: find its round (waiting up to join_wait for it to start here),
    /// check its first message, then serve it.
    static asio::awaitable<std::error_code> serve(std::weak_ptr<service_state> weak,
                                                  const net::call_context& context,
                                                  net::call_stream& stream) {
        byte_buffer first;
        if (auto ec = co_await stream.read(first))
            co_return make_error_code(errc::protocol_violation);
        begin_message begin;
        if (decode(first, begin)) co_return make_error_code(errc::protocol_violation);
        auto st = weak.lock();
        if (!st) co_return make_error_code(errc::refused);
        const time_point give_up = st->now() + st->options.join_wait;
        std::shared_ptr<round> r;
        while (true) {
            if (const auto it = st->rounds.find(begin.group); it != st->rounds.end())
                r = it->second.lock();
            if (r && !r->finished && !r->spans.empty()) break;
            r.reset();
            const time_point t = st->now();
            if (t >= give_up) co_return make_error_code(errc::unknown_group);
            timer_type timer(st->executor);
            timer.expires_after(std::min<duration>(give_up - t, 100ms));
            st->joiners.insert(&timer);
            co_await timer.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
            st->joiners.erase(&timer);
        }
        if (auto ec = r->check_begin(begin, context.remote)) co_return ec;
        co_return co_await round::serve_sender(r, begin, stream);
    }

    state_ptr state_;
};

} // namespace hivemesh::averaging

// With HIVEMESH_SEPARATE_COMPILATION (the hivemesh::compiled target) the TCP and sim
// instantiations are compiled once, in src/averaging_tcp.cpp and src/averaging_sim.cpp, not in
// every translation unit.
#if defined(HIVEMESH_SEPARATE_COMPILATION)
#include "hivemesh/net/sim.hpp"
#include "hivemesh/net/tcp.hpp"

namespace hivemesh::averaging {
extern template class allreduce_service<net::tcp::transport>;
extern template class allreduce_service<net::sim::transport>;
} // namespace hivemesh::averaging
#endif
