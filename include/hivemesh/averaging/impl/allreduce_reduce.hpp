// A round's reducing side: taking each sender's parts of our span, adding them up, and
// returning the averages (included by averaging/impl/allreduce_round.hpp).
#pragma once

#include "hivemesh/averaging/impl/allreduce_round.hpp"

namespace hivemesh::averaging {

template <net::transport Transport>
std::span<float> allreduce_service<Transport>::round::part_sums(std::size_t p) {
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
    s.results_ready->notify();
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
        const auto bad = decode_part(message, allreduce_message::part, r.group.size(), part);
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
            refused = compression::decompress_add(part.payload, sum, static_cast<float>(s.weight),
                                                  values);
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

template <net::transport Transport>
asio::awaitable<void>
allreduce_service<Transport>::round::return_results(std::shared_ptr<round> self, std::size_t j,
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

} // namespace hivemesh::averaging
