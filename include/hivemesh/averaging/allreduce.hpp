// Butterfly all-reduce over a formed group (DESIGN §5).
//
// All tensors are one virtual vector of V floats. Member k owns the contiguous span
// spans[k] (sizes from load balancing; clients own nothing). Every member that has values
// (node, client) streams its slice of each other member's span to that member in parts of
// about `part_size_bytes`, compressed; once every sender delivered part p (or was dropped)
// the owner ("reducer") sends the weighted mean sum(w_j x_j) / sum(w_j) of part p back to
// each sender that contributed to it. Every peer therefore moves 2(N-1)/N of the vector
// each way at equal shares. A reducer adds the parts up as they arrive, or, in a round
// that works inline (see Threads) or has the norm bound, keeps one part per sender and
// forms each mean in one pass over them (round::staging).
//
// Failures (each reported in the result, never an error of the round):
// - a sender that stays silent for `sender_timeout` (or never connects) is dropped from
//   the parts it has not delivered; parts it delivered keep its values. A member we cannot
//   dial (refused, unanswered, another peer at its address), or whose connection ends while
//   we send to it, is dropped so at once, without that wait;
// - a reducer that stays silent for `reducer_timeout`, or fails, leaves the rest of its
//   span at each sender's local values;
// - at the round deadline whatever is not averaged stays local.
// So every element ends either averaged over the contributors its part_outcome names, or at
// the peer's own value.
//
// Pacing: a sender's streams to the reducers share its uplink, which TCP does not split
// evenly, and a reducer whose parts fall behind holds back the averages it owes everyone.
// So none of a sender's open streams gets more than allreduce_pace_parts parts (in shares
// of the spans) ahead of the one furthest behind, unless that one made no progress for a
// quarter of sender_timeout (a stalled reducer must not make the others drop us). A
// reducer paces the averages it returns to its senders the same way, so that none of them
// gets its span's averages late.
//
// Hostile values (each reported in the part outcomes, never an error of the round):
// - a sender's part holding a NaN or infinity, or (with allreduce_options::max_norm_ratio)
//   whose norm is far above the others', is left out of that part's mean, its weight too;
//   every result of the part names it (part_outcome::excluded);
// - a reducer's average holding a NaN or infinity, or (with the bound) whose norm is far
//   above the sender's own part's, is not applied: the sender keeps its own values for that
//   part (part_outcome::refused) and, after a non-finite one, for the rest of that span;
// - a reducer whose sums overflow applies and returns nothing for that part.
// So nothing non-finite ever reaches a tensor.
//
// Threads: the round's bookkeeping runs on the RPC node's executor; compression,
// decompression and reduction run on the `compute` executor when one is given (a reducer's
// additions through a strand), so io threads stay free. A round in which every link is fast
// enough for `none` (codec_for_link) does its part work on the node's executor instead, if
// its parts are at most detail::max_inline_part_bytes: each part is then one pass over
// memory, about what a hand-off to the pool and back costs. Without a `compute` executor
// everything runs on the node's executor (the right choice for the one-threaded simulated
// network).
#pragma once

#include "hivemesh/averaging/allreduce_wire.hpp"
#include "hivemesh/averaging/group.hpp"
#include "hivemesh/compression/compress.hpp"
#include "hivemesh/compression/throughput.hpp"
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
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace hivemesh::averaging {

using namespace std::chrono_literals;

/// How many parts, in shares of the spans, one of a sender's streams may run ahead of its
/// slowest, and one of a reducer's result streams ahead of its slowest (see "Pacing" above).
inline constexpr std::size_t allreduce_pace_parts = 2;

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
    /// The adaptive choice (see codec_for_link): where the link is slower than this peer
    /// compresses and decompresses, a member sends with slow_link_codec instead of `codec`,
    /// since the bytes it saves on the wire then take longer than the compression. The
    /// link's rate comes from the group's announced bandwidths: for the values sent to a
    /// reducer, the lesser of this member's and the reducer's; for the averages a reducer
    /// returns (one message to every sender), the least of its own and the senders'. Unknown
    /// figures (0) are left out; with none known, `codec` is used. std::nullopt turns the
    /// choice off. Parts are sized by `codec` whatever a member picks, so the group agrees on
    /// them, and a receiver reads each payload's codec from the payload.
    std::optional<compression::kind> slow_link_codec = compression::kind::blockwise_8bit;
    /// This peer's rate through slow_link_codec, compressing then decompressing, in float32
    /// bytes per second (finite, at least 0); 0: compression::measured_throughput, measured
    /// once per process when the service is made.
    double codec_rate = 0;
    /// A reducer drops a sender that delivers nothing for this long.
    duration sender_timeout = 10s;
    /// A sender gives up on a reducer that makes no progress for this long; keep it above
    /// sender_timeout, since a reducer waits that long for a missing sender.
    duration reducer_timeout = 20s;
    /// How long an incoming sender may wait for this peer to start the same round; for a
    /// group this peer expects (allreduce_service::expect), reducer_timeout instead.
    duration join_wait = 5s;
    /// Largest group accepted.
    std::size_t max_group_size = 1024;
    /// The norm bound, 0 (the default) for none, else at least 1. A reducer leaves out of part
    /// p's mean every contribution whose L2 norm exceeds max_norm_ratio times the median m of
    /// the norms of part p's contributions (its own values count as one; the lower median of
    /// an even count; no bound while m is 0, as in a part most members leave at zero). The
    /// median, unlike the mean or the largest norm, stays an honest member's norm while
    /// honest members are the majority, whatever one member sends. Only large norms are left
    /// out: a small one moves the mean no more than an honest member's weight may.
    /// A sender refuses an average whose norm exceeds max_norm_ratio^2 times its own part's
    /// (unless that is 0): an honest average is a weighted mean of contributions of norm at
    /// most max_norm_ratio·m, and m is at most max_norm_ratio times the sender's own norm
    /// unless that is itself far below the group's, when keeping its own values costs little.
    /// Every member of a group should use the same bound.
    double max_norm_ratio = 0;
};

/// Fault injection for tests: called at the named points of a round.
struct allreduce_hooks {
    /// Before a sender sends part `part` to `reducer`; returns a delay (0: none).
    std::function<duration(std::size_t reducer, std::size_t part)> before_send;
    /// Before a reducer averages part `part` of its span; returns a delay (0: none).
    std::function<duration(std::size_t part)> before_reduce;
    /// Before a reducer returns the average of part `part` of its span to `sender`; returns
    /// a delay (0: none).
    std::function<duration(std::size_t sender, std::size_t part)> before_result;
    /// Makes this peer hostile: rewrites what it sends just before it is compressed, past its
    /// own checks. `values` is a copy of its values for part `part` of member `reducer`'s
    /// span or, when `reducer` is this peer, of the averages of part `part` of its own span
    /// returned to every sender (its own values keep the true ones). A codec that cannot
    /// encode a NaN or infinity refuses it as it would our own. Called where the part is
    /// compressed: on the compute executor when the round uses it (see Threads above).
    std::function<void(std::size_t reducer, std::size_t part, std::span<float> values)>
        rewrite_sent;
};

/// What happened to one part of the vector at this peer.
struct part_outcome {
    std::size_t begin = 0;   ///< first element in the flat vector
    std::size_t size = 0;    ///< elements
    std::size_t reducer = 0; ///< member index that owns the span
    /// Members whose values are in the mean now held; empty when the part stayed local.
    std::vector<bool> contributors;
    /// Members whose values for this part reached the reducer but were left out of the mean,
    /// and why, in member order (as the reducer reported them with the average; also filled
    /// when the part was not averaged at the reducer itself).
    std::vector<exclusion> excluded;
    /// Set when this peer refused the part's average (a NaN or infinity, or a norm beyond
    /// allreduce_options::max_norm_ratio) or, at the reducer, found its own average
    /// non-finite (an overflow): the part kept this peer's own values.
    std::optional<value_fault> refused;

    bool averaged() const noexcept { return !contributors.empty(); }
};

/// The outcome of one round at this peer.
struct allreduce_result {
    /// The whole vector for a node or client; an aux peer's own span only.
    std::vector<part_outcome> parts;
    /// Members whose values are in at least one averaged part.
    std::vector<bool> participants;
    /// Members left out of at least one part's mean for the values they sent (the parts'
    /// `excluded`).
    std::vector<bool> excluded;
    /// Parts whose average was refused here (part_outcome::refused): they kept our values.
    std::size_t parts_refused = 0;
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

/// The codec of the adaptive choice for a link of `link_rate` bytes per second (0: unknown):
/// options.slow_link_codec when it is set and options.codec_rate exceeds a known link rate,
/// else options.codec. Compressing at rate C to a fraction f of the bytes, a transfer over a
/// link of rate L takes max(1/C, f/L) per byte instead of 1/L: less exactly when C > L.
inline compression::kind codec_for_link(const allreduce_options& options, double link_rate) {
    if (options.slow_link_codec && link_rate > 0 && options.codec_rate > link_rate)
        return *options.slow_link_codec;
    return options.codec;
}

namespace detail {

/// Whether a call's read or write failed because the connection itself ended (the peer's
/// process exited or its host went away), rather than by a status, a deadline or a cancel.
inline bool connection_lost(std::error_code ec) noexcept {
    return ec == errc::connection_closed || ec == errc::connection_truncated;
}

/// The lesser of two announced bandwidths, leaving out unknown ones (0, or what a peer
/// should not have announced: negative, NaN or infinite); 0 when neither is known.
inline double slower_link(double a, double b) noexcept {
    const auto known = [](double x) { return x > 0 && std::isfinite(x) ? x : 0.0; };
    a = known(a);
    b = known(b);
    return a > 0 && b > 0 ? std::min(a, b) : std::max(a, b);
}

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

/// The L2 norm of `values`, summed in double precision: NaN or infinity exactly when a value
/// is one.
inline double l2_norm(std::span<const float> values) noexcept {
    double squares = 0;
    for (const float v : values)
        squares += static_cast<double>(v) * static_cast<double>(v);
    return std::sqrt(squares);
}

/// A contribution to a part's mean where it arrived: the value bytes of a `none` buffer
/// (compression::none_values) and its weight.
struct weighted_values {
    const std::byte* bytes;
    float weight;
};

/// Writes out[i] = (own_weight·own[i] + Σ w_j·x_j[i]) · scale, each operation rounded to float
/// in that order (so bit for bit what adding the contributions one after the other into a
/// sum and then scaling it gives); with `own` empty the sum starts at zero. Works in chunks
/// that stay in L1, so each input is read once. Returns false as soon as a chunk holds a
/// NaN or infinity (an input's, or an overflow); `out` is then partly written.
inline bool weighted_mean_into(std::span<float> out, std::span<const float> own, float own_weight,
                               std::span<const weighted_values> others, float scale) noexcept {
    constexpr std::size_t chunk = 2048;
    for (std::size_t begin = 0; begin < out.size(); begin += chunk) {
        const std::size_t count = std::min(chunk, out.size() - begin);
        float* sum = out.data() + begin;
        if (own.empty())
            std::fill_n(sum, count, 0.0f);
        else
            for (std::size_t i = 0; i < count; ++i)
                sum[i] = own_weight * own[begin + i];
        for (const auto& x : others) {
            const std::byte* bytes = x.bytes + 4 * begin;
            for (std::size_t i = 0; i < count; ++i) {
                float v;
                std::memcpy(&v, bytes + 4 * i, sizeof v);
                sum[i] += x.weight * v;
            }
        }
        for (std::size_t i = 0; i < count; ++i)
            sum[i] *= scale;
        if (!compression::all_finite(std::span<const float>(sum, count))) return false;
    }
    return true;
}

/// Which of `norms` exceed `ratio` times their median (the lower one of an even count):
/// allreduce_options::max_norm_ratio. None while the median is 0.
inline std::vector<bool> beyond_norm_bound(const std::vector<double>& norms, double ratio) {
    std::vector<bool> out(norms.size(), false);
    if (norms.empty()) return out;
    std::vector<double> sorted = norms;
    const auto middle = sorted.begin() + static_cast<std::ptrdiff_t>((sorted.size() - 1) / 2);
    std::nth_element(sorted.begin(), middle, sorted.end());
    const double median = *middle;
    if (!(median > 0)) return out;
    for (std::size_t i = 0; i < norms.size(); ++i)
        out[i] = norms[i] > ratio * median;
    return out;
}

/// The largest part a round that compresses nothing works on in the node's executor (see
/// "Threads" above): a pass over it takes about 0.1 ms, so the executor's other work
/// waits no longer than a round trip on a local network. Larger parts go to the compute
/// executor.
inline constexpr std::size_t max_inline_part_bytes = std::size_t{1} << 20;

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
    /// compression and reduction (e.g. an asio::thread_pool's executor) except in rounds
    /// that compress nothing; without one they run on the node's executor. Throws
    /// std::invalid_argument for a part_size_bytes below 4 or a max_norm_ratio other than 0
    /// or a finite number of at least 1.
    explicit allreduce_service(rpc_node_type& rpc, allreduce_options options = {},
                               std::optional<asio::any_io_executor> compute = std::nullopt)
        : state_(std::make_shared<service_state>(rpc, std::move(options), std::move(compute))) {
        if (state_->options.part_size_bytes < sizeof(float))
            throw std::invalid_argument("allreduce_options::part_size_bytes: at least 4");
        const double ratio = state_->options.max_norm_ratio;
        if (!(ratio == 0 || (ratio >= 1 && std::isfinite(ratio))))
            throw std::invalid_argument("allreduce_options::max_norm_ratio: 0 (off) or at least 1");
        double& codec_rate = state_->options.codec_rate;
        if (!(codec_rate >= 0 && std::isfinite(codec_rate)))
            throw std::invalid_argument("allreduce_options::codec_rate: finite, at least 0");
        if (state_->options.slow_link_codec && codec_rate == 0)
            codec_rate = compression::measured_throughput(*state_->options.slow_link_codec);
        rpc.add_stream_handler(state_->options.method,
                               [weak = std::weak_ptr<service_state>(state_)](
                                   const net::call_context& context, net::call_stream& stream) {
                                   return serve(weak, context, stream);
                               });
    }
    allreduce_service(const allreduce_service&) = delete;
    allreduce_service& operator=(const allreduce_service&) = delete;
    /// Cancels rounds still running; their completions still run.
    ~allreduce_service();

    class expectation;
    /// See expectation; call on the node's executor.
    expectation expect(const group_id& group);

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
    /// Timeouts, failed peers and hostile values are not errors: see allreduce_result::parts.
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
        /// Incoming senders waiting for their round, in arrival order: they wake in it, so
        /// a reducer adds parts in an order that does not depend on addresses (a simulated
        /// swarm then gives the same sums for the same seed).
        std::vector<timer_type*> joiners;
        std::map<group_id, std::size_t> expected; ///< groups with live expectations: their count
        /// The last round's sums when they were larger than detail::always_mapped_bytes,
        /// kept for the next round (see there).
        detail::uninitialized_floats spare_sums;

        time_point now() const { return net::transport_now<Transport>(executor); }
        void wake_joiners() {
            for (auto* joiner : joiners)
                joiner->cancel();
        }
    };
    using state_ptr = std::shared_ptr<service_state>;

public:
    /// While alive, incoming senders of a group this peer belongs to but has not started
    /// yet wait for its round up to reducer_timeout (the longest a sender waits for a
    /// reducer) rather than join_wait: e.g. from the group's forming to the trigger of a
    /// scheduled step, which may come later here than at other members. Destroy it on the
    /// node's executor.
    class expectation {
    public:
        expectation(expectation&& other) noexcept
            : st_(std::move(other.st_))
            , id_(other.id_) {}
        expectation& operator=(expectation&&) = delete;
        ~expectation() {
            if (!st_) return;
            auto& count = st_->expected[id_];
            if (--count == 0) st_->expected.erase(id_);
            st_->wake_joiners(); // those waiting on it give up now, unless the round runs
        }

    private:
        friend class allreduce_service;
        expectation(state_ptr st, const group_id& id)
            : st_(std::move(st))
            , id_(id) {
            ++st_->expected[id_];
        }
        state_ptr st_;
        group_id id_;
    };

private:
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
                auto r = make_round(st, std::move(group), me, std::move(spans), local,
                                    std::move(tensors), weight, timeout);
                co_launch(st->executor, run_round(r), std::move(handler),
                          "averaging::allreduce_service::async_allreduce",
                          [weak = std::weak_ptr<round>(r)] { cancel_round(weak); });
            },
            token, std::move(group), me, std::move(spans), local, std::move(tensors), weight,
            timeout);
    }

    // The round stays incomplete here (it is defined in impl/allreduce_round.hpp), so that
    // start(), which users instantiate, needs no more of it than these.
    static std::shared_ptr<round> make_round(state_ptr st, group_type group, std::size_t me,
                                             std::vector<std::size_t> spans, std::span<float> local,
                                             std::vector<tensor::tensor_ref> tensors, double weight,
                                             duration timeout);
    static asio::awaitable<std::pair<std::error_code, allreduce_result>>
    run_round(std::shared_ptr<round> r);
    static void cancel_round(const std::weak_ptr<round>& weak);

    /// An incoming sender: find its round (waiting up to join_wait for it to start here),
    /// check its first message, then serve it.
    static asio::awaitable<std::error_code> serve(std::weak_ptr<service_state> weak,
                                                  const net::call_context& context,
                                                  net::call_stream& stream);

    state_ptr state_;
};

template <net::transport Transport>
auto allreduce_service<Transport>::expect(const group_id& group) -> expectation {
    return expectation(state_, group);
}

} // namespace hivemesh::averaging

// Header-only use sees the member definitions here. With HIVEMESH_SEPARATE_COMPILATION (the
// hivemesh::compiled target) they are compiled once, in src/averaging_tcp.cpp and
// src/averaging_sim.cpp, for net::tcp and net::sim, and a program links them from there; the TCP
// instantiation is declared extern so that no translation unit instantiates it again.
#if !defined(HIVEMESH_SEPARATE_COMPILATION)
#include "hivemesh/averaging/impl/allreduce_round.hpp"
#else
#include "hivemesh/net/tcp.hpp"

namespace hivemesh::averaging {
extern template class allreduce_service<net::tcp::transport>;
} // namespace hivemesh::averaging
#endif
