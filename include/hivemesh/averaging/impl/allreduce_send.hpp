// A round's sending side: streaming our slice of each other member's span to it and
// applying the averages it returns (included by averaging/impl/allreduce_round.hpp).
#pragma once

#include "hivemesh/averaging/impl/allreduce_round.hpp"

namespace hivemesh::averaging {

template <net::transport Transport>
asio::awaitable<void> allreduce_service<Transport>::round::send_to(std::shared_ptr<round> self,
                                                                   std::size_t k) {
    using namespace asio::experimental::awaitable_operators;
    auto& r = *self;
    auto& slot = r.reducers[k];
    net::call_stream stream;
    {
        timer_type limit(r.io);
        limit.expires_after(r.timeout);
        abort_guard guard(r, [&limit] { limit.cancel(); });
        auto opening =
            r.st->rpc->open_call(r.group.members[k].peer, r.st->options.method, r.timeout, stream);
        const auto opened = co_await net::within(std::move(opening), limit);
        if (opened || r.aborted) {
            slot.active = false;
            // k's address did not answer, or someone else did (member_departed leaves an
            // aborted round alone).
            if (opened) r.member_departed(k);
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
        if (!ec)
            co_await (send_parts(self, k, stream) && take_results(self, k, stream));
        else if (detail::connection_lost(ec))
            r.member_departed(k);
    }
    slot.stream = nullptr;
    slot.active = false;
}

template <net::transport Transport>
asio::awaitable<void> allreduce_service<Transport>::round::send_parts(std::shared_ptr<round> self,
                                                                      std::size_t k,
                                                                      net::call_stream& stream) {
    using namespace asio::experimental::awaitable_operators;
    auto& r = *self;
    auto& slot = r.reducers[k];
    const std::size_t parts = r.parts_of(k);
    // take_results may apply averages into our values once no write reads them.
    struct on_exit {
        round& r;
        reducer_slot& slot;
        ~on_exit() {
            slot.sending_ended = true;
            slot.part_written->notify();
            r.sends_progressed();
        }
    } ended{r, slot};
    // A pipeline: part p + 1 is compressed while part p is being written, into the
    // buffer of part p - 1 once the stream has let go of it (always an empty one).
    // Uncompressed, only its head is, just before its write, and the values go out from
    // where they are: their check then runs here, so the write finds them in this core's
    // cache (checked a part ahead, they would have left it).
    const bool borrowing = r.codec_to(k) == compression::kind::none &&
                           compression::none_payload_is_native && !r.hooks().rewrite_sent;
    auto next = std::make_shared<byte_buffer>();
    std::span<const float> next_borrowed;
    std::shared_ptr<byte_buffer> spare;
    std::size_t next_part = 0;
    std::error_code packed;
    std::vector<float> hostile; // what the rewrite_sent hook makes of our values
    auto pack = [&] {
        const auto range = r.part_range(k, next_part);
        std::span<const float> values = r.local.subspan(range.begin, range.size);
        const auto codec = r.codec_to(k);
        // Our values are checked here, part by part (the statistical codecs refuse
        // non-finite input themselves); the check also brings the part into cache.
        if (!compression::refuses_non_finite(codec) && !compression::all_finite(values)) {
            packed = errc::non_finite_input;
            return;
        }
        if (r.hooks().rewrite_sent) {
            hostile.assign(values.begin(), values.end());
            r.hooks().rewrite_sent(k, next_part, hostile);
            values = hostile;
        }
        encode_part_head(*next, static_cast<std::uint32_t>(next_part));
        const auto& codec_options = r.st->options.codec_options;
        if (borrowing) {
            compression::append_none_header(values.size(), *next, codec_options.original);
            next_borrowed = values;
            packed = {};
            return;
        }
        packed = compression::compress_into(codec, values, *next, codec_options);
    };
    if (parts > 0 && !borrowing) co_await offload(r.part_compute, pack);
    for (std::size_t p = 0; p < parts; ++p) {
        while (!r.aborted && slot.active && r.paced_out(k, p)) {
            slot.pacing = true;
            const auto waited =
                co_await net::within<timer_type>(slot.others_progressed->wait(), r.pace_patience());
            slot.pacing = false;
            slot.last_progress = r.now();
            if (waited && waited != errc::timeout) break;
        }
        if (r.hooks().before_send) co_await r.sleep(r.hooks().before_send(k, p));
        if (borrowing) {
            next_part = p;
            pack();
        }
        if (packed == errc::non_finite_input) r.abort(errc::invalid_argument);
        if (packed || r.aborted || !slot.active) {
            stream.cancel(errc::cancelled);
            co_return;
        }
        std::shared_ptr<byte_buffer> message = std::move(next);
        const byte_view borrowed = std::as_bytes(std::exchange(next_borrowed, {}));
        next = detail::take_if_unshared(spare);
        r.result.bytes_sent += message->size() + borrowed.size();
        r.result.values_sent += r.part_range(k, p).size;
        slot.last_progress = r.now();
        // Named: no temporaries inside co_await (see CONTRIBUTING.md).
        auto writing =
            borrowed.empty() ? stream.write(message) : stream.write_borrowed(*message, borrowed);
        std::error_code written;
        if (p + 1 < parts && !borrowing) {
            next_part = p + 1;
            auto packing = offload(r.part_compute, pack);
            written = co_await (std::move(writing) && std::move(packing));
        } else {
            written = co_await std::move(writing);
        }
        spare = std::move(message);
        if (written) co_return;
        slot.parts_written = p + 1;
        slot.part_written->notify();
        r.sends_progressed();
        slot.last_progress = r.now();
    }
    co_await stream.close_write();
}

template <net::transport Transport>
asio::awaitable<void> allreduce_service<Transport>::round::take_results(std::shared_ptr<round> self,
                                                                        std::size_t k,
                                                                        net::call_stream& stream) {
    auto& r = *self;
    auto& slot = r.reducers[k];
    const std::size_t parts = r.parts_of(k);
    const double ratio = r.st->options.max_norm_ratio;
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
            part.part != p || !r.valid_result(part)) {
            why = errc::protocol_violation;
            stream.cancel(errc::protocol_violation);
            break;
        }
        std::error_code waited;
        while (!waited && slot.parts_written <= p && !slot.sending_ended)
            waited = co_await slot.part_written->wait();
        if (waited) {
            why = waited;
            break;
        }
        const auto range = r.part_range(k, p);
        const auto mine = r.local.subspan(range.begin, range.size);
        std::error_code refused;
        bool beyond = false;
        auto apply = [&] {
            if (ratio > 0) { // our own part is still our values here
                double norm = 0;
                refused = compression::decompress_norm(part.payload, range.size, norm, values);
                const double own = detail::l2_norm(mine);
                beyond = !refused && own > 0 && norm > ratio * ratio * own;
                if (refused || beyond) return;
            }
            refused = compression::decompress_finite_into(part.payload, mine, values);
        };
        slot.busy = true;
        co_await offload(r.part_compute, apply);
        slot.busy = false;
        auto& outcome = r.outcomes[k][p];
        if (refused) { // a reducer that sends such values is not heard any more
            if (refused == errc::non_finite_input) outcome.refused = value_fault::non_finite;
            why = refused;
            stream.cancel(errc::protocol_violation);
            break;
        }
        outcome.excluded = std::move(part.excluded);
        r.result.values_received += range.size;
        slot.last_progress = r.now();
        if (beyond) { // kept our own values for this part; later ones may be fine
            outcome.refused = value_fault::norm_bound;
            log::warning("allreduce", "member ", k, "'s average of part ", p,
                         " is beyond the norm bound: kept our values");
            continue;
        }
        outcome.contributors = std::move(part.contributors);
    }
    if (p == parts) { // the reducer's final status, so the call ends cleanly
        byte_buffer rest;
        const auto ec = co_await stream.read(rest);
        if (ec != asio::error::eof) stream.cancel(errc::protocol_violation);
    } else if (!r.aborted) {
        log::warning("allreduce", "member ", k, " returned ", p, " of ", parts,
                     " parts: ", why.message());
        if (detail::connection_lost(why)) r.member_departed(k);
    }
    slot.active = false;
    r.sends_progressed(); // it holds no stream any more
}

template <net::transport Transport>
bool allreduce_service<Transport>::round::valid_result(const part_message& m) const {
    // decode_part checked the members' range and that no one is both.
    bool excluded_me = false;
    for (const auto& e : m.excluded) {
        if (!sends_values(group.members[e.member].role)) return false;
        excluded_me = excluded_me || e.member == me;
    }
    if (m.contributors[me] == excluded_me) return false;
    for (std::size_t j = 0; j < m.contributors.size(); ++j)
        if (m.contributors[j] && !sends_values(group.members[j].role)) return false;
    return true;
}

} // namespace hivemesh::averaging
