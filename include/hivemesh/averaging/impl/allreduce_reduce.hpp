// A round's reducing side: taking each sender's parts of our span, adding them up, and
// returning the averages (included by averaging/impl/allreduce_round.hpp).
#pragma once

#include "hivemesh/averaging/impl/allreduce_round.hpp"

namespace hivemesh::averaging {

template <net::transport Transport>
std::span<float> allreduce_service<Transport>::round::part_sums(std::size_t p, bool with_own) {
    const auto sum = part_sums_view(p);
    if (!part_started[p]) {
        part_started[p] = true;
        if (with_own && sends_values(role())) {
            const auto range = part_range(me, p);
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

template <net::transport Transport>
bool allreduce_service<Transport>::round::judge_norms(std::size_t p,
                                                      std::vector<std::size_t>& staged) {
    const bool mine = sends_values(role());
    std::vector<double> norms;
    if (mine) {
        const auto range = part_range(me, p);
        const double own = detail::l2_norm(local.subspan(range.begin, range.size));
        if (!std::isfinite(own)) {
            local_non_finite.store(true, std::memory_order_relaxed);
            return false;
        }
        norms.push_back(own);
    }
    for (const std::size_t j : staged)
        norms.push_back(senders[j].staged_norm);
    const auto beyond = detail::beyond_norm_bound(norms, st->options.max_norm_ratio);
    if (mine && beyond[0]) {
        exclude(p, me, value_fault::norm_bound);
        part_weight[p] = 0;
        part_contributors[p][me] = false;
    }
    std::vector<std::size_t> kept;
    for (std::size_t i = 0; i < staged.size(); ++i) {
        if (beyond[i + (mine ? 1 : 0)])
            exclude(p, staged[i], value_fault::norm_bound);
        else
            kept.push_back(staged[i]);
    }
    staged = std::move(kept);
    return true;
}

template <net::transport Transport>
bool allreduce_service<Transport>::round::mean_in_one_pass(std::size_t p,
                                                           const std::vector<std::size_t>& staged) {
    if (!compression::none_payload_is_native) return false;
    const auto range = part_range(me, p);
    double total = part_weight[p];
    std::vector<detail::weighted_values> others;
    for (const std::size_t j : staged) {
        const auto values = compression::none_values(senders[j].staged_payload, range.size);
        if (!values) return false;
        others.push_back({values->data(), static_cast<float>(senders[j].weight)});
        total += senders[j].weight;
    }
    if (!(total > 0)) return false;
    const std::span<float> own =
        part_contributors[p][me] ? local.subspan(range.begin, range.size) : std::span<float>{};
    if (!detail::weighted_mean_into(part_sums_view(p), own, static_cast<float>(weight), others,
                                    static_cast<float>(1.0 / total)))
        return false;
    part_weight[p] = total;
    for (const std::size_t j : staged)
        part_contributors[p][j] = true;
    return true;
}

template <net::transport Transport>
std::span<float> allreduce_service<Transport>::round::part_mean(std::size_t p,
                                                                std::vector<std::size_t> staged,
                                                                bool& overflow) {
    std::span<float> sum;
    if (staging) {
        if (bounded() && !judge_norms(p, staged)) return {};
        if (mean_in_one_pass(p, staged)) return part_sums_view(p);
        // A part that is not `none`, or a mean that is not finite: added one by one, which
        // finds what made it so.
        sum = part_sums(p, part_contributors[p][me]);
        for (const std::size_t j : staged) {
            auto& s = senders[j];
            const auto ec = compression::decompress_add(
                s.staged_payload, sum, static_cast<float>(s.weight), reduce_scratch);
            if (ec) { // validated when it arrived, so only a `none` part's values can fail
                if (ec == errc::non_finite_input) exclude(p, j, value_fault::non_finite);
                continue;
            }
            part_weight[p] += s.weight;
            part_contributors[p][j] = true;
        }
    } else {
        sum = part_sums(p);
    }
    if (local_non_finite.load(std::memory_order_relaxed) || !(part_weight[p] > 0)) return {};
    const auto scale = static_cast<float>(1.0 / part_weight[p]);
    for (float& v : sum)
        v *= scale;
    // Finite values may still overflow the sums: that part is neither applied nor sent.
    overflow = !compression::all_finite(sum);
    return overflow ? std::span<float>{} : sum;
}

template <net::transport Transport>
void allreduce_service<Transport>::round::exclude(std::size_t p, std::size_t j, value_fault why) {
    auto& list = part_excluded[p];
    const auto at =
        std::find_if(list.begin(), list.end(), [j](const exclusion& e) { return e.member > j; });
    list.insert(at, exclusion{j, why});
}

template <net::transport Transport>
bool allreduce_service<Transport>::round::refuse_local_values() {
    if (!local_non_finite.load(std::memory_order_relaxed)) return false;
    abort(errc::invalid_argument);
    return true;
}

template <net::transport Transport>
asio::awaitable<void> allreduce_service<Transport>::round::reduce(std::shared_ptr<round> self) {
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

template <net::transport Transport>
bool allreduce_service<Transport>::round::part_complete(std::size_t p) const {
    // A part being added counts even if its sender failed meanwhile: its values are
    // in the sums, and its weight and contributor bit follow once the addition ends.
    for (const auto& s : senders)
        if (s.expected && s.next_part <= p && (!s.failed || s.busy)) return false;
    return true;
}

template <net::transport Transport>
asio::awaitable<void> allreduce_service<Transport>::round::finish_part(std::size_t p) {
    const auto range = part_range(me, p);
    auto buffer = detail::take_if_unshared(spare_result);
    byte_buffer& message = *buffer;
    std::error_code ec;
    std::optional<value_fault> refused;
    // In a staging round, every sender's part p is staged or missing now.
    std::vector<std::size_t> staged;
    for (std::size_t j = 0; j < senders.size(); ++j)
        if (senders[j].has_staged && senders[j].staged_part == p) staged.push_back(j);
    const bool any = staging ? sends_values(role()) || !staged.empty() : part_weight[p] > 0;
    if (any) {
        auto average = [&] {
            bool overflow = false;
            const std::span<float> sum = part_mean(p, staged, overflow);
            if (overflow) refused = value_fault::non_finite;
            if (sum.empty()) return;
            const auto& o = st->options;
            const auto codec = result_codec();
            encode_result_head(message, static_cast<std::uint32_t>(p), part_contributors[p],
                               part_excluded[p]);
            const std::size_t head = message.size();
            ec = compression::compress_into(codec, sum, message, o.codec_options);
            if (ec) return;
            if (sends_values(role())) {
                const auto mine = local.subspan(range.begin, range.size);
                if (codec == compression::kind::none)
                    std::copy(sum.begin(), sum.end(), mine.begin());
                else // hold exactly what the others decode
                    ec = compression::decompress_into(byte_view(message).subspan(head), mine);
            }
            if (!ec && hooks().rewrite_sent) {
                std::vector<float> hostile(sum.begin(), sum.end());
                hooks().rewrite_sent(me, p, hostile);
                message.resize(head);
                ec = compression::compress_into(codec, hostile, message, o.codec_options);
            }
        };
        co_await offload(part_reduce, average);
        if (refuse_local_values()) co_return;
    }
    for (const std::size_t j : staged) {
        auto& s = senders[j];
        s.has_staged = false;
        s.last_progress = now();
        s.staged_taken->notify();
    }
    if (ec) log::warning("allreduce", "part ", p, " not averaged: ", ec.message());
    if (refused) log::warning("allreduce", "part ", p, " not averaged: its mean overflowed");
    auto& outcome = outcomes[me][p];
    outcome.excluded = part_excluded[p];
    outcome.refused = refused;
    if (part_weight[p] > 0 && !ec && !refused) {
        outcome.contributors = part_contributors[p];
        results[p] = std::move(buffer);
    }
    ++ready;
    trim_results();
    for (auto& s : senders)
        if (s.expected) s.results_ready->notify();
}

template <net::transport Transport>
void allreduce_service<Transport>::round::trim_results() {
    std::size_t low = ready;
    for (const auto& s : senders)
        if (s.connected && !s.writer_done) low = std::min(low, s.written);
    for (; trimmed < low; ++trimmed)
        if (results[trimmed]) spare_result = std::move(results[trimmed]);
}

template <net::transport Transport>
void allreduce_service<Transport>::round::fail_sender(std::size_t j, errc why) {
    auto& s = senders[j];
    if (s.failed) return;
    s.failed = true;
    if (s.stream) s.stream->cancel(why);
    progress.notify();
    results_progressed(); // its own wait ends, and it holds no stream any more
    s.staged_taken->notify();
}

template <net::transport Transport>
void allreduce_service<Transport>::round::member_departed(std::size_t k) {
    if (aborted || finished || !senders[k].expected) return;
    if (senders[k].next_part < parts_of(me)) fail_sender(k, errc::connection_closed);
}

template <net::transport Transport>
asio::awaitable<std::error_code> allreduce_service<Transport>::round::serve_sender(
    std::shared_ptr<round> self, const begin_message& begin, net::call_stream& stream) {
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

template <net::transport Transport>
asio::awaitable<void> allreduce_service<Transport>::round::take_parts(std::shared_ptr<round> self,
                                                                      std::size_t j,
                                                                      net::call_stream& stream) {
    auto& r = *self;
    auto& s = r.senders[j];
    const std::size_t parts = r.parts_of(r.me);
    const bool bounded = r.bounded();
    const bool staging = r.staging;
    std::vector<float> values;
    byte_buffer message; // its storage goes back to the stream for a later part
    while (s.next_part < parts && !s.failed && !r.aborted) {
        // In a staging round, a part waits (staged) until the part's mean is taken.
        while (s.has_staged && !s.failed && !r.aborted)
            co_await s.staged_taken->wait();
        if (s.failed || r.aborted) break;
        const auto ec = co_await stream.read(message);
        if (ec) {
            r.fail_sender(j, errc::protocol_violation);
            break;
        }
        if (s.failed || r.aborted) break;
        s.last_progress = r.now();
        r.result.bytes_received += message.size();
        part_message part;
        const auto bad = decode_part(message, allreduce_message::part, r.group.size(), part);
        if (bad || part.part != s.next_part) {
            r.fail_sender(j, errc::protocol_violation);
            break;
        }
        const std::size_t p = s.next_part;
        const auto range = r.part_range(r.me, p);
        std::error_code refused;
        double norm = 0;
        if (staging) { // screened now, averaged once every contribution is here
            auto screen = [&] {
                // Without the bound, a `none` part's values are checked by the mean's pass.
                if (bounded || !compression::none_values(part.payload, range.size))
                    refused = compression::decompress_norm(part.payload, range.size, norm, values);
            };
            s.busy = true;
            co_await offload(r.part_compute, screen);
            s.busy = false;
        } else {
            auto add = [&] {
                const std::span<float> sum = r.part_sums(p);
                if (r.local_non_finite.load(std::memory_order_relaxed)) return;
                refused = compression::decompress_add(part.payload, sum,
                                                      static_cast<float>(s.weight), values);
            };
            s.busy = true;
            co_await offload(r.part_reduce, add);
            s.busy = false;
            if (r.refuse_local_values()) break;
        }
        if (refused && refused != errc::non_finite_input) {
            r.fail_sender(j, errc::protocol_violation);
            break;
        }
        if (refused) { // the sums are unchanged: left out of this part only
            r.exclude(p, j, value_fault::non_finite);
        } else if (staging) {
            std::swap(s.staged, message); // the payload still views it
            s.staged_payload = part.payload;
            s.staged_part = p;
            s.staged_norm = norm;
            s.has_staged = true;
        } else {
            r.part_weight[p] += s.weight;
            r.part_contributors[p][j] = true;
        }
        r.result.values_received += range.size;
        ++s.next_part;
        s.last_progress = r.now();
        r.progress.notify();
    }
}

template <net::transport Transport>
asio::awaitable<void>
allreduce_service<Transport>::round::return_results(std::shared_ptr<round> self, std::size_t j,
                                                    net::call_stream& stream) {
    auto& r = *self;
    auto& s = r.senders[j];
    const std::size_t parts = r.parts_of(r.me);
    s.last_result = r.now();
    while (s.written < parts) {
        while (!s.failed && !r.aborted) {
            if (r.ready <= s.written) { // waiting for the average is not stalling
                co_await s.results_ready->wait();
                s.last_result = r.now();
            } else if (r.results_paced(j, s.written)) {
                (void)co_await net::within<timer_type>(s.results_ready->wait(), r.pace_patience());
            } else {
                break;
            }
        }
        if (r.hooks().before_result) co_await r.sleep(r.hooks().before_result(j, s.written));
        if (s.failed || r.aborted || !r.results[s.written]) break;
        auto message = r.results[s.written];
        r.result.bytes_sent += message->size();
        r.result.values_sent += r.part_range(r.me, s.written).size;
        const auto ec = co_await stream.write(std::move(message));
        if (ec) break;
        ++s.written;
        s.last_result = r.now();
        r.trim_results();
        r.results_progressed();
    }
    s.writer_done = true;
    r.trim_results();
    r.results_progressed(); // it holds no stream any more
    if (s.written < parts) r.fail_sender(j, errc::cancelled);
}

} // namespace hivemesh::averaging
