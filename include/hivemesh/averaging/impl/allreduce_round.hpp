// One all-reduce round: its state, its lifecycle (checks, layout, the run, the summary)
// and the watchdog that drops silent members (included by averaging/allreduce.hpp).
#pragma once

#include "hivemesh/averaging/allreduce.hpp"

namespace hivemesh::averaging {

template <net::transport Transport>
struct allreduce_service<Transport>::round : std::enable_shared_from_this<round> {
    /// A member sending to us, as seen by this peer reducing its span.
    struct sender_slot {
        bool expected = false;
        bool connected = false;
        bool failed = false;
        bool busy = false; ///< adding a part: not to be dropped meanwhile
        bool writer_done = false;
        std::size_t next_part = 0; ///< parts taken from it
        std::size_t written = 0;   ///< results written back to it
        /// When it last wrote a result, began, or waited for one to be ready (results_paced).
        time_point last_result{};
        double weight = 0;
        time_point last_progress{};
        net::call_stream* stream = nullptr;
        std::unique_ptr<wakeup> results_ready;
        /// In a staging round: the part taken but not averaged yet (one at a time), its
        /// message, payload and norm (with the norm bound); staged_taken wakes the reader
        /// once it was averaged.
        bool has_staged = false;
        std::size_t staged_part = 0;
        double staged_norm = 0;
        byte_buffer staged;
        byte_view staged_payload;
        std::unique_ptr<wakeup> staged_taken;
    };
    /// A member we send to.
    struct reducer_slot {
        bool active = false;
        bool busy = false;
        time_point last_progress{};
        net::call_stream* stream = nullptr;
        /// Our parts whose write completed, and whether send_parts ended: a part is sent
        /// from our values where they are, so its average waits until it is out.
        std::size_t parts_written = 0;
        bool sending_ended = false;
        std::unique_ptr<wakeup> part_written;
        /// Waiting for our other streams to catch up (paced_out); woken by their progress.
        bool pacing = false;
        std::unique_ptr<wakeup> others_progressed;
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
        , part_elements(detail::part_elements_for(st->options.part_size_bytes, st->options.codec,
                                                  st->options.codec_options))
        , progress(io)
        , all_done(io)
        , deadline_timer(io)
        , watch_timer(io) {}

    state_ptr st;
    asio::any_io_executor io;
    /// Where this round's parts are encoded and decoded, and where its sums are added to
    /// and averaged (one at a time: a strand of the pool, or the node's executor); nullopt:
    /// the node's executor (see part_work_inline).
    std::optional<asio::any_io_executor> part_compute;
    std::optional<asio::any_io_executor> part_reduce;
    /// Every sender's part p waits (staged) until part p is averaged, which then reads each
    /// contribution once (part_mean): in rounds with the norm bound, which judges the parts
    /// side by side, and in rounds that work inline (part_work_inline), whose cost is passes
    /// over memory. Otherwise each part is added into the sums as it arrives.
    bool staging = false;
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
    /// Our span's weighted sums (one part's in a staging round); part p's start as our own
    /// weighted values (zero for aux) when its first addition or its average needs them
    /// (part_started).
    detail::uninitialized_floats sums;
    std::vector<bool> part_started;
    std::atomic<bool> local_non_finite{false}; ///< set by part_sums, on part_reduce
    std::vector<double> part_weight;
    std::vector<std::vector<bool>> part_contributors;
    std::vector<std::vector<exclusion>> part_excluded; ///< in member order
    std::vector<float> reduce_scratch;                 ///< on part_reduce
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
    /// The codec of our values for member k, by the adaptive choice (codec_for_link).
    compression::kind codec_to(std::size_t k) const {
        return codec_for_link(st->options, detail::slower_link(group.members[me].bandwidth,
                                                               group.members[k].bandwidth));
    }
    /// The codec of our span's averages: each is one message to every sender, so the slowest
    /// of their links and ours counts.
    compression::kind result_codec() const {
        double rate = 0;
        for (std::size_t j = 0; j < group.size(); ++j)
            if (j == me || sends_values(group.members[j].role))
                rate = detail::slower_link(rate, group.members[j].bandwidth);
        return codec_for_link(st->options, rate);
    }
    /// True when every link of the group is fast enough for `none` (codec_for_link picks
    /// the compressing codec only below a rate, so the slowest known link decides) and the
    /// parts are small. A part is then one pass over memory, which costs about what handing
    /// it to the compute pool and back costs, so the round does its part work on the node's
    /// executor.
    bool part_work_inline() const {
        if (st->options.part_size_bytes > detail::max_inline_part_bytes) return false;
        double rate = 0;
        for (const auto& m : group.members)
            rate = detail::slower_link(rate, m.bandwidth);
        return codec_for_link(st->options, rate) == compression::kind::none;
    }
    time_point now() const { return st->now(); }
    const allreduce_hooks& hooks() const { return st->hooks; }
    bool bounded() const { return st->options.max_norm_ratio > 0; }

    /// True if part p to reducer k must wait for our other open streams (the pacing in
    /// allreduce.hpp). The one furthest behind is never held, so nothing waits in a cycle;
    /// one that made no progress for pace_patience() holds nobody.
    bool paced_out(std::size_t k, std::size_t p) const {
        const std::size_t parts = parts_of(k);
        const time_point stalled = now() - pace_patience();
        for (std::size_t i = 0; i < reducers.size(); ++i) {
            const auto& other = reducers[i];
            if (i == k || !other.active || !other.stream || other.sending_ended ||
                other.last_progress <= stalled)
                continue;
            if (p * parts_of(i) > (other.parts_written + allreduce_pace_parts) * parts) return true;
        }
        return false;
    }
    /// True if result p to sender j must wait for our other open result streams: the same
    /// pacing for the averages we return (they share our uplink too).
    bool results_paced(std::size_t j, std::size_t p) const {
        const time_point stalled = now() - pace_patience();
        for (std::size_t i = 0; i < senders.size(); ++i) {
            const auto& other = senders[i];
            if (i == j || !other.expected || !other.connected || other.writer_done ||
                other.failed || other.last_result <= stalled)
                continue;
            if (p > other.written + allreduce_pace_parts) return true;
        }
        return false;
    }
    /// Wakes the result streams that results_paced holds.
    void results_progressed() {
        for (auto& s : senders)
            if (s.results_ready) s.results_ready->notify();
    }
    /// Well within sender_timeout, so that the reducers of held streams never drop us.
    duration pace_patience() const { return st->options.sender_timeout / 4; }
    /// Wakes the streams that paced_out holds.
    void sends_progressed() {
        for (auto& slot : reducers)
            if (slot.pacing) slot.others_progressed->notify();
    }

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
        for (auto& s : senders) {
            if (s.results_ready) s.results_ready->notify();
            if (s.staged_taken) s.staged_taken->notify();
        }
        sends_progressed();
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

    // ---- the round (impl/allreduce_round.hpp) -------------------------------------------
    std::error_code check_arguments() const;
    /// Does a sender's first message match our view of the round?
    std::error_code check_begin(const begin_message& b, const crypto::peer_id& remote) const;
    static asio::awaitable<std::pair<std::error_code, allreduce_result>>
    run(std::shared_ptr<round> self);
    void unregister();
    /// Spans, slots and outcome tables.
    void layout();
    allreduce_result summarise();
    /// Drops senders and reducers that make no progress for their timeout; ends when no
    /// exchange is left to watch.
    static asio::awaitable<void> watch(std::shared_ptr<round> self);

    // ---- reducing our span (impl/allreduce_reduce.hpp) ----------------------------------
    /// Part p's sums, started on first use (on the reducing executor): written once
    /// with our weighted values (zeros without `with_own`), just before the part is added
    /// to while still in cache. Our values are checked as they are read: a non-finite one
    /// sets local_non_finite (the sums are then unusable; refuse_local_values ends the round).
    std::span<float> part_sums(std::size_t p, bool with_own = true);
    /// Part p's sums, as they are. A staging round averages one part at a time, so its sums
    /// hold one part, which stays in cache.
    std::span<float> part_sums_view(std::size_t p) {
        const auto range = part_range(me, p);
        return staging ? sums.span().first(range.size)
                       : sums.span().subspan(range.begin - spans[me].begin, range.size);
    }
    /// On part_reduce: part p's mean, in its sums. In a staging round, of our values and the
    /// parts `staged` (sender indices, ascending) holds, those the norm bound keeps (with it),
    /// in member order, our own first: in one pass (mean_in_one_pass), else added into the
    /// sums, which leaves out a part with a NaN or infinity; otherwise the streamed sums.
    /// Empty if our own values were non-finite (local_non_finite) or nothing contributed;
    /// `overflow` set (and empty) if the mean is not finite.
    std::span<float> part_mean(std::size_t p, std::vector<std::size_t> staged, bool& overflow);
    /// With the norm bound: leaves out of part p (and removes from `staged`) the
    /// contributions beyond it, ours too; false if our own values were non-finite.
    bool judge_norms(std::size_t p, std::vector<std::size_t>& staged);
    /// Part p's mean of our values (if still in) and the `staged` parts, in one pass
    /// (detail::weighted_mean_into) when they are all `none`; false, leaving the weights and
    /// contributors alone, if one is not or the mean is not finite.
    bool mean_in_one_pass(std::size_t p, const std::vector<std::size_t>& staged);
    /// Records that member j's values for part p were left out, keeping member order.
    void exclude(std::size_t p, std::size_t j, value_fault why);
    /// Ends the round with invalid_argument if our own values held a NaN or infinity;
    /// true if so. Called on the node's executor after work that started sums.
    bool refuse_local_values();
    static asio::awaitable<void> reduce(std::shared_ptr<round> self);
    bool part_complete(std::size_t p) const;
    /// Averages part p, applies it to our own values and queues it for the senders.
    asio::awaitable<void> finish_part(std::size_t p);
    /// Frees the results every sender still being answered has already been written.
    void trim_results();
    void fail_sender(std::size_t j, errc why);
    /// Our connection to member k failed (see send_to): k is most likely gone, so its parts
    /// of our span are not waited for (a silent sender would hold them for sender_timeout).
    void member_departed(std::size_t k);
    /// Serves sender j's stream: takes its parts and returns the averages.
    static asio::awaitable<std::error_code>
    serve_sender(std::shared_ptr<round> self, const begin_message& begin, net::call_stream& stream);
    static asio::awaitable<void> take_parts(std::shared_ptr<round> self, std::size_t j,
                                            net::call_stream& stream);
    static asio::awaitable<void> return_results(std::shared_ptr<round> self, std::size_t j,
                                                net::call_stream& stream);

    // ---- sending to the others (impl/allreduce_send.hpp) --------------------------------
    static asio::awaitable<void> send_to(std::shared_ptr<round> self, std::size_t k);
    static asio::awaitable<void> send_parts(std::shared_ptr<round> self, std::size_t k,
                                            net::call_stream& stream);
    static asio::awaitable<void> take_results(std::shared_ptr<round> self, std::size_t k,
                                              net::call_stream& stream);
    /// A result's contributors and exclusions: only members with values, and us in exactly
    /// one of them.
    bool valid_result(const part_message& m) const;
};

template <net::transport Transport>
std::error_code allreduce_service<Transport>::round::check_arguments() const {
    const std::size_t n = group.members.size();
    if (n == 0 || n > st->options.max_group_size || n > 0xFFFF) return errc::invalid_argument;
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
        // As a float too: the sums are weighted in single precision.
        if (!std::isfinite(weight) || weight <= 0 || weight > std::numeric_limits<float>::max())
            return errc::invalid_argument;
        const std::size_t have = tensors.empty() ? local.size() : tensor::total_size(tensors);
        if (have != total) return errc::invalid_argument;
    }
    if (timeout <= duration::zero()) return errc::invalid_argument;
    return {};
}

template <net::transport Transport>
std::error_code
allreduce_service<Transport>::round::check_begin(const begin_message& b,
                                                 const crypto::peer_id& remote) const {
    const std::size_t n = group.members.size();
    if (b.group_size != n || b.sender >= n || b.reducer != me || b.sender == me)
        return errc::protocol_violation;
    if (group.members[b.sender].peer.id != remote) return errc::refused;
    if (!sends_values(group.members[b.sender].role)) return errc::protocol_violation;
    if (b.span_begin != spans[me].begin || b.span_size != spans[me].size ||
        b.part_elements != part_elements || !std::isfinite(b.weight) || b.weight <= 0 ||
        b.weight > std::numeric_limits<float>::max())
        return errc::protocol_violation;
    return {};
}

template <net::transport Transport>
asio::awaitable<std::pair<std::error_code, allreduce_result>>
allreduce_service<Transport>::round::run(std::shared_ptr<round> self) {
    auto& r = *self;
    std::error_code ec = r.check_arguments();
    if (!ec && r.st->rounds.contains(r.group.id)) ec = errc::invalid_argument;
    if (ec) co_return std::pair{ec, allreduce_result{}};

    const bool inline_work = r.part_work_inline();
    r.staging = inline_work || r.bounded();
    r.layout();
    if (!inline_work) {
        r.part_compute = r.st->compute;
        r.part_reduce = r.st->reduce;
    }
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
    r.st->wake_joiners();
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
    if (sends_values(r.role()) && !r.tensors.empty()) { // an aux member's are not ours to write
        auto write_back = [&r] { tensor::unflatten_from(r.tensors, r.owned); };
        co_await offload(r.st->compute, write_back);
    }
    if (r.aborted &&
        (r.abort_reason == errc::cancelled || r.abort_reason == errc::invalid_argument))
        ec = r.abort_reason;
    allreduce_result out = r.summarise();
    for (std::size_t j = 0; j < out.excluded.size(); ++j)
        if (out.excluded[j])
            log::warning("allreduce", "member ", j, " was left out of parts for its values");
    co_return std::pair{ec, std::move(out)};
}

template <net::transport Transport>
void allreduce_service<Transport>::round::unregister() {
    if (!registered) return;
    registered = false;
    const auto it = st->rounds.find(group.id);
    if (it != st->rounds.end()) st->rounds.erase(it);
}

template <net::transport Transport>
void allreduce_service<Transport>::round::layout() {
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
        s.staged_taken = std::make_unique<wakeup>(io);
        auto& slot = reducers[k];
        slot.active = sends_values(role()) && k != me && spans[k].size > 0;
        slot.last_progress = start;
        slot.part_written = std::make_unique<wakeup>(io);
        slot.others_progressed = std::make_unique<wakeup>(io);
        if (!sends_values(role()) && k != me) continue; // aux: only its own span
        for (std::size_t p = 0; p < parts_of(k); ++p) {
            const auto range = part_range(k, p);
            outcomes[k].push_back(part_outcome{range.begin, range.size, k, {}, {}, std::nullopt});
        }
    }
    if (reducing()) {
        const std::size_t parts = parts_of(me);
        const bool mine = sends_values(role());
        sums = std::exchange(st->spare_sums, {});
        sums.resize(staging ? std::min(part_elements, spans[me].size) : spans[me].size);
        part_started.assign(parts, false);
        part_weight.assign(parts, mine ? weight : 0.0);
        part_contributors.assign(parts, std::vector<bool>(n, false));
        for (auto& who : part_contributors)
            who[me] = mine;
        part_excluded.assign(parts, {});
        results.resize(parts);
    }
}

template <net::transport Transport>
allreduce_result allreduce_service<Transport>::round::summarise() {
    allreduce_result out = std::move(result);
    out.participants.assign(group.members.size(), false);
    out.excluded.assign(group.members.size(), false);
    for (auto& parts : outcomes)
        for (auto& part : parts) {
            out.elements_total += part.size;
            if (part.averaged()) out.elements_averaged += part.size;
            for (std::size_t j = 0; j < part.contributors.size(); ++j)
                if (part.contributors[j]) out.participants[j] = true;
            for (const auto& e : part.excluded)
                out.excluded[e.member] = true;
            if (part.refused) ++out.parts_refused;
            out.parts.push_back(std::move(part));
        }
    // Spans follow member order, so this is already vector order; aux peers have one.
    return out;
}

template <net::transport Transport>
asio::awaitable<void> allreduce_service<Transport>::round::watch(std::shared_ptr<round> self) {
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
            if (s.busy || s.has_staged) { // working, or waiting for the others' parts
                consider(t + o.sender_timeout);
            } else if (t >= s.last_progress + o.sender_timeout) {
                r.fail_sender(j, errc::timeout);
            } else {
                consider(s.last_progress + o.sender_timeout);
            }
        }
        for (auto& slot : r.reducers) {
            if (!slot.active) continue;
            if (slot.busy || slot.pacing || !slot.stream) {
                consider(t + o.reducer_timeout);
            } else if (t >= slot.last_progress + o.reducer_timeout) {
                slot.active = false;
                slot.stream->cancel(errc::timeout);
                r.sends_progressed();
            } else {
                consider(slot.last_progress + o.reducer_timeout);
            }
        }
        if (!next) break;
        r.watch_timer.expires_after(*next - t);
        co_await r.watch_timer.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
    }
}

// ---- the service's members that need the round ------------------------------------------

template <net::transport Transport>
allreduce_service<Transport>::~allreduce_service() {
    auto st = state_;
    asio::dispatch(st->executor, [st] {
        for (auto& [id, weak] : st->rounds)
            if (auto r = weak.lock()) r->abort(errc::cancelled);
    });
}

template <net::transport Transport>
std::shared_ptr<typename allreduce_service<Transport>::round>
allreduce_service<Transport>::make_round(state_ptr st, group_type group, std::size_t me,
                                         std::vector<std::size_t> spans, std::span<float> local,
                                         std::vector<tensor::tensor_ref> tensors, double weight,
                                         duration timeout) {
    return std::make_shared<round>(std::move(st), std::move(group), me, std::move(spans), local,
                                   std::move(tensors), weight, timeout);
}

template <net::transport Transport>
asio::awaitable<std::pair<std::error_code, allreduce_result>>
allreduce_service<Transport>::run_round(std::shared_ptr<round> r) {
    return round::run(std::move(r));
}

template <net::transport Transport>
void allreduce_service<Transport>::cancel_round(const std::weak_ptr<round>& weak) {
    if (auto alive = weak.lock()) alive->abort(errc::cancelled);
}

template <net::transport Transport>
asio::awaitable<std::error_code>
allreduce_service<Transport>::serve(std::weak_ptr<service_state> weak,
                                    const net::call_context& context, net::call_stream& stream) {
    byte_buffer first;
    if (auto ec = co_await stream.read(first)) co_return make_error_code(errc::protocol_violation);
    begin_message begin;
    if (decode(first, begin)) co_return make_error_code(errc::protocol_violation);
    auto st = weak.lock();
    if (!st) co_return make_error_code(errc::refused);
    const time_point arrived = st->now();
    std::shared_ptr<round> r;
    while (true) {
        if (const auto it = st->rounds.find(begin.group); it != st->rounds.end())
            r = it->second.lock();
        if (r && !r->finished && !r->spans.empty()) break;
        r.reset();
        const time_point t = st->now();
        const time_point give_up =
            arrived + (st->expected.contains(begin.group) ? st->options.reducer_timeout
                                                          : st->options.join_wait);
        if (t >= give_up) co_return make_error_code(errc::unknown_group);
        timer_type timer(st->executor);
        timer.expires_after(std::min<duration>(give_up - t, 100ms));
        st->joiners.push_back(&timer);
        struct unlist { // also when the frame is destroyed while it waits
            service_state* st;
            timer_type* timer;
            ~unlist() { std::erase(st->joiners, timer); }
        } const listed{st.get(), &timer};
        co_await timer.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
    }
    if (auto ec = r->check_begin(begin, context.remote)) co_return ec;
    co_return co_await round::serve_sender(r, begin, stream);
}

} // namespace hivemesh::averaging

// Its two sides, after the struct whose members they define.
#include "hivemesh/averaging/impl/allreduce_reduce.hpp"
#include "hivemesh/averaging/impl/allreduce_send.hpp"
