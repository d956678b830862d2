// Writes valid seed inputs for every fuzz target into <directory>/<target>/: every codec at a
// few sizes, zstd payloads, sealed record streams, handshake messages, mux frames, RPC
// messages, peer addresses, DHT messages, state-sharing messages and progress records.
// Usage: make_corpus <directory>
#include "crypto_seeds.hpp"

#include <hivemesh/averaging/allreduce_wire.hpp>
#include <hivemesh/averaging/matchmaking_wire.hpp>
#include <hivemesh/averaging/state_sharing.hpp>
#include <hivemesh/compression.hpp>
#include <hivemesh/core/random.hpp>
#include <hivemesh/crypto/datagram.hpp>
#include <hivemesh/crypto/secure_channel.hpp>
#include <hivemesh/dht/messages.hpp>
#include <hivemesh/net/address.hpp>
#include <hivemesh/net/frame.hpp>
#include <hivemesh/net/rpc_wire.hpp>
#include <hivemesh/optim/checkpoint.hpp>
#include <hivemesh/optim/state_metadata.hpp>
#include <hivemesh/progress/record.hpp>

#include <array>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace {

void write_file(const std::filesystem::path& path, const hivemesh::byte_buffer& bytes) {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
}

// The keys and seeds of the crypto fuzz targets.
using namespace hivemesh::fuzz;

hivemesh::byte_buffer with_selector(std::uint8_t selector, const hivemesh::byte_buffer& body) {
    hivemesh::byte_buffer out{std::byte{selector}};
    out.insert(out.end(), body.begin(), body.end());
    return out;
}

// Streams of records in each mode: with and without the close record, with key updates.
void write_record_corpus(const std::filesystem::path& dir) {
    using namespace hivemesh::crypto;
    const symmetric_key key = record_key();
    for (std::uint8_t mode = 0; mode < 3; ++mode) {
        const auto suite = static_cast<cipher>(mode);
        if (suite == cipher::aes256_gcm && !aes256_gcm_available()) continue;
        for (const bool closed : {false, true}) {
            secure_options options;
            options.max_record_size = max_record_size;
            options.rekey_interval_records = 2;
            record_sealer sealer(suite, key, options);
            hivemesh::byte_buffer stream{std::byte{mode}};
            for (std::size_t n : {0, 1, 100, 5, 300})
                hivemesh::throw_if_error(
                    sealer.append(
                        hivemesh::byte_buffer(n, std::byte{static_cast<unsigned char>(n)}), stream),
                    "make_corpus: seal");
            if (closed) hivemesh::throw_if_error(sealer.append_close(stream), "make_corpus: close");
            write_file(dir /
                           ("records_" + std::string(to_string(suite)) + (closed ? "_closed" : "")),
                       stream);
        }
    }
}

// Datagrams from the dialer to the listener, empty and not, at fuzz_datagram's time.
void write_datagram_corpus(const std::filesystem::path& dir) {
    using namespace hivemesh::crypto;
    datagram_sealer dialer(identity::from_seed(filled(dialer_seed)), {});
    const auto listener = identity::from_seed(filled(listener_seed));
    for (std::size_t n : {0, 1, 100, 1200}) {
        hivemesh::byte_buffer datagram;
        hivemesh::throw_if_error(
            dialer.seal(listener.public_key(),
                        hivemesh::byte_buffer(n, std::byte{static_cast<unsigned char>(n)}),
                        hivemesh::time_point{datagram_sent_at}, datagram),
            "make_corpus: seal a datagram");
        write_file(dir / ("datagram_" + std::to_string(n)), datagram);
    }
}

// Valid messages 1, 2 and 3 between the fixed peers, for every selector's options (with
// bit 4, the resumed handshake's).
void write_handshake_corpus(const std::filesystem::path& dir) {
    using namespace hivemesh::crypto;
    const auto dialer_identity = identity::from_seed(filled(dialer_seed));
    const auto listener_identity = identity::from_seed(filled(listener_seed));
    for (std::uint8_t flags : {0, 4, 8, 12, 16, 20, 24, 28}) {
        handshake dialer(dialer_identity, role::dialer, options_for(flags, dialer_ephemeral_seed),
                         std::nullopt, resumption_for(flags, role::dialer, listener_identity));
        handshake listener(listener_identity, role::listener,
                           options_for(flags, listener_ephemeral_seed), std::nullopt,
                           resumption_for(flags, role::listener, dialer_identity));
        hivemesh::byte_buffer hello, reply, finish, none;
        if (dialer.start(hello) || listener.on_message(hello, reply) ||
            dialer.on_message(reply, finish) || listener.on_message(finish, none))
            throw std::runtime_error("make_corpus: the fixed handshake failed");
        if (listener.resumed() != ((flags & 16) != 0))
            throw std::runtime_error("make_corpus: the fixed ticket did not resume");
        const auto suffix = "_" + std::to_string(flags);
        write_file(dir / ("hello" + suffix), with_selector(flags, hello));
        write_file(dir / ("reply" + suffix),
                   with_selector(static_cast<std::uint8_t>(flags | 1), reply));
        write_file(dir / ("finish" + suffix),
                   with_selector(static_cast<std::uint8_t>(flags | 2), finish));
    }
}

// Valid frames of every type, for fuzz_mux_frame.
void write_frame_corpus(const std::filesystem::path& dir) {
    using namespace hivemesh::net;
    const auto frame = [](auto&& write) {
        hivemesh::byte_buffer out;
        hivemesh::binary_writer w(out);
        write(w);
        return out;
    };
    write_file(dir / "settings", frame([](auto& w) {
                   write_settings_frame(w, {1 << 20, 128, 1 << 24, hivemesh::byte_buffer(7)});
               }));
    write_file(dir / "data", frame([](auto& w) {
                   write_data_header(w, 1, frame_flags::open | frame_flags::end_message);
                   w.write_bytes(hivemesh::byte_buffer(100, std::byte{9}));
               }));
    write_file(dir / "window", frame([](auto& w) { write_window_frame(w, 3, 65536); }));
    write_file(dir / "reset", frame([](auto& w) { write_reset_frame(w, 5, 20); }));
    write_file(dir / "ping", frame([](auto& w) { write_ping_frame(w, frame_type::ping, 42); }));
    write_file(dir / "goaway",
               frame([](auto& w) { write_frame_header(w, frame_type::goaway, 0); }));
}

// Call headers, replies and datagram messages, for fuzz_rpc_message.
void write_rpc_corpus(const std::filesystem::path& dir) {
    using namespace hivemesh::net;
    const hivemesh::byte_buffer body(40, std::byte{3});
    write_file(dir / "unary", encode_call_header(call_kind::unary, "dht.find", 5000, body));
    write_file(dir / "streaming",
               encode_call_header(call_kind::streaming, "averaging/join", 60000));
    write_file(dir / "reply", encode_reply(reply_tag::reply, body));
    write_file(dir / "data", encode_reply(reply_tag::data, body));
    write_file(dir / "status",
               encode_status(make_error_code(hivemesh::errc::refused), "no such method"));
    for (const auto kind :
         {datagram_kind::request, datagram_kind::reply, datagram_kind::by_stream}) {
        hivemesh::byte_buffer datagram;
        append_datagram_header(kind, 0x0102030405060708, datagram);
        const auto message = kind == datagram_kind::request
                                 ? encode_call_header(call_kind::unary, "dht.find", 5000, body)
                             : kind == datagram_kind::reply ? encode_reply(reply_tag::reply, body)
                                                            : hivemesh::byte_buffer{};
        datagram.insert(datagram.end(), message.begin(), message.end());
        write_file(dir / ("datagram_" + std::to_string(static_cast<int>(kind))), datagram);
    }
}

// Addresses of every protocol, printable and binary, for fuzz_address.
void write_address_corpus(const std::filesystem::path& dir) {
    using namespace hivemesh::net;
    const auto id = hivemesh::crypto::identity::from_seed(filled(dialer_seed)).id();
    const std::string texts[] = {"/ip4/127.0.0.1/tcp/4242/p2p/" + id.to_string(),
                                 "/ip6/::1/tcp/1/p2p/" + id.to_string(), "/dns/localhost/tcp/80",
                                 "/sim/17/port/9/p2p/" + id.to_string()};
    int n = 0;
    for (const auto& text : texts) {
        write_file(dir / ("text_" + std::to_string(n)),
                   hivemesh::to_buffer(hivemesh::as_bytes(text)));
        hivemesh::byte_buffer binary;
        hivemesh::binary_writer w(binary);
        peer_address::from_string(text).write(w);
        write_file(dir / ("binary_" + std::to_string(n++)), binary);
    }
}

// Listen addresses of every protocol, for the DHT seeds.
std::vector<hivemesh::net::peer_address> dht_addresses() {
    using hivemesh::net::peer_address;
    return {peer_address::from_string("/ip4/127.0.0.1/tcp/4242"),
            peer_address::from_string("/ip6/2001:db8::1/tcp/443"),
            peer_address::from_string("/dns/peer.example.org/tcp/31337"), peer_address::sim(17, 9)};
}

hivemesh::byte_buffer text_bytes(std::string_view text) {
    return hivemesh::to_buffer(hivemesh::as_bytes(text));
}

// Ping, store and find requests from client-mode and addressed senders, for
// fuzz_dht_requests.
void write_dht_request_corpus(const std::filesystem::path& dir) {
    using namespace hivemesh::dht;
    const auto addresses = dht_addresses();
    write_file(dir / "ping_client", encode(ping_request{}));
    for (std::size_t i = 0; i < addresses.size(); ++i)
        write_file(dir / ("ping_" + std::to_string(i)), encode(ping_request{{addresses[i]}}));

    store_request store{{addresses[0]}, {}};
    store.items.push_back({{text_bytes("key"),
                            std::nullopt,
                            text_bytes("value"),
                            hivemesh::time_point{std::chrono::seconds(1700000000)},
                            {}},
                           false});
    store.items.push_back({{text_bytes("dict"), text_bytes("subkey"), text_bytes(""),
                            hivemesh::time_point{}, hivemesh::byte_buffer(64, std::byte{7})},
                           true});
    write_file(dir / "store", encode(store));
    write_file(dir / "store_empty", encode(store_request{}));

    find_request find{{addresses[3]}, {}, 20};
    for (const char* key : {"a", "b", "c"})
        find.keys.push_back(id::of_key(key));
    write_file(dir / "find", encode(find));
    write_file(dir / "find_empty", encode(find_request{{}, {}, 0}));
    find.want_values = false;
    find.items = store.items;
    write_file(dir / "find_carrying", encode(find));
}

// Ping, store and find responses with plain and dictionary entries and peers of every
// protocol, for fuzz_dht_responses.
void write_dht_response_corpus(const std::filesystem::path& dir) {
    using namespace hivemesh::dht;
    write_file(dir / "ping", encode(ping_response{}));
    store_response statuses;
    for (std::uint8_t s = 0; s <= max_store_status; ++s)
        statuses.statuses.push_back(static_cast<store_status>(s));
    write_file(dir / "store", encode(statuses));

    std::vector<peer_info> peers; // every other one with its key
    for (const auto& address : dht_addresses()) {
        const auto key = hivemesh::crypto::identity::from_seed(
                             filled(static_cast<std::uint8_t>(peers.size() + 1)))
                             .public_key();
        peers.push_back({key.id(), address});
        if (peers.size() % 2 == 1) peers.back().key = key;
    }
    key_entry plain;
    plain.key = text_bytes("key");
    plain.plain =
        stored_value{text_bytes("value"), hivemesh::time_point{std::chrono::hours(1)}, {}};
    key_entry dictionary;
    dictionary.key = text_bytes("dict");
    for (const char* subkey : {"", "a", "b\xff"})
        dictionary.dictionary[text_bytes(subkey)] =
            stored_value{text_bytes(subkey), hivemesh::time_point{std::chrono::seconds(5)},
                         hivemesh::byte_buffer(64, std::byte{1})};
    find_response find{{{plain, {peers[0]}}, {dictionary, peers}, {std::nullopt, peers}}};
    write_file(dir / "find", encode(find));
    write_file(dir / "find_empty", encode(find_response{}));
    find.statuses = statuses.statuses;
    write_file(dir / "find_with_statuses", encode(find));
}

// State sharing: the request, headers of a few states (empty, with and without metadata,
// several codecs), their chunks and donor records.
void write_state_corpus(const std::filesystem::path& dir) {
    using namespace hivemesh::averaging;
    write_file(dir / "request", encode(state_request{}));
    write_file(dir / "optimizer_metadata",
               hivemesh::optim::encode(hivemesh::optim::state_metadata{
                   .epoch = 12, .step_count = 12, .integer_buffers = {{7, 8}}}));
    hivemesh::random_generator rng(5);
    const std::vector<std::vector<std::size_t>> layouts = {{}, {0}, {3}, {5, 0, 2, 9}, {70, 1}};
    std::size_t n = 0;
    for (const auto& sizes : layouts) {
        state_snapshot s;
        s.metadata = text_bytes(n % 2 ? "epoch=7" : "");
        for (const auto size : sizes) {
            std::vector<float> t(size);
            for (auto& v : t)
                v = static_cast<float>(rng.normal());
            s.tensors.push_back(std::move(t));
        }
        const auto codec = hivemesh::compression::all_kinds[n % 3];
        state_header header;
        hivemesh::throw_if_error(make_header(s, codec, 4, header), "make_corpus: state header");
        write_file(dir / ("header_" + std::to_string(n)), encode(header));
        std::vector<float> flat;
        for (const auto& t : s.tensors)
            flat.insert(flat.end(), t.begin(), t.end());
        for (std::uint64_t c = 0; c < header.chunk_hashes.size() && c < 2; ++c) {
            hivemesh::byte_buffer chunk;
            const auto values = std::span<const float>(flat).subspan(
                static_cast<std::size_t>(c * 4),
                static_cast<std::size_t>(chunk_length(flat.size(), 4, c)));
            hivemesh::throw_if_error(append_chunk_message(c, codec, values, chunk),
                                     "make_corpus: state chunk");
            write_file(dir / ("chunk_" + std::to_string(n) + "_" + std::to_string(c)), chunk);
        }
        ++n;
    }
    std::size_t a = 0;
    for (const auto& address : dht_addresses()) {
        const double priority = static_cast<double>(a) - 1.5;
        write_file(dir / ("donor_" + std::to_string(a++)), encode(donor_record{priority, address}));
    }
}

} // namespace

void write_averaging_corpus(const std::filesystem::path& dir) {
    using namespace hivemesh::averaging;
    join_request request;
    request.schema_hash = 42;
    request.group_key = "run.0b0110";
    request.expiration = hivemesh::time_point(hivemesh::duration(1'700'000'000'000'000'000));
    request.member = {member_role::node, 125e6,
                      hivemesh::net::peer_address::parse("/ip4/10.0.0.1/tcp/4242").value(),
                      hivemesh::byte_buffer(3, std::byte{7})};
    write_file(dir / "request", encode(request));
    request.member = {member_role::client, 0, std::nullopt, {}};
    write_file(dir / "request_client", encode(request));
    const std::array<std::byte, 32> seed{};
    const auto someone = hivemesh::crypto::identity::from_seed(seed).id();
    join_response response{
        join_status::not_a_leader,
        std::pair{someone, hivemesh::net::peer_address::parse("/sim/3/port/1").value()}};
    write_file(dir / "response_leader", encode(response));
    write_file(dir / "response", encode(join_response{}));
    group_message group;
    group.id.fill(std::byte{1});
    group.members.emplace_back(someone, request.member);
    write_file(dir / "group", encode(group));
    write_file(dir / "disband", encode(disband_message{}));
    write_file(dir / "disband_leader", encode(disband_message{response.leader}));
    begin_message begin{{}, 4, 1, 2, 0.5, 100, 50, 25};
    write_file(dir / "begin", encode(begin));
    hivemesh::byte_buffer part;
    encode_part_head(part, 3);
    const std::vector<float> values{1, 2, 3};
    hivemesh::compression::compress_into(hivemesh::compression::kind::none, values, part);
    write_file(dir / "part", part);
    hivemesh::byte_buffer result;
    encode_result_head(result, 1, {true, false, true, true, false});
    write_file(dir / "result", result);
    hivemesh::byte_buffer excluding;
    encode_result_head(excluding, 2, {true, false, true, false, false},
                       {{1, value_fault::non_finite}, {3, value_fault::norm_bound}});
    hivemesh::compression::compress_into(hivemesh::compression::kind::none, values, excluding);
    write_file(dir / "result_excluding", excluding);
}

// Progress records at their limits, and a tombstone (empty).
void write_progress_corpus(const std::filesystem::path& dir) {
    using hivemesh::progress::progress_record;
    const auto max = std::numeric_limits<std::uint64_t>::max();
    const progress_record records[] = {
        {},
        {7, 300, 12.5, hivemesh::time_point{std::chrono::seconds(1700000000)}, true},
        {max, max, std::numeric_limits<double>::max(),
         hivemesh::time_point{hivemesh::duration{std::numeric_limits<std::int64_t>::max()}}, false},
    };
    int n = 0;
    for (const auto& r : records)
        write_file(dir / ("record_" + std::to_string(n++)), hivemesh::progress::encode(r));
    write_file(dir / "tombstone", {});
}

// Checkpoint files: empty, of a gradient-mode model with buffers, and of DiLoCo.
void write_checkpoint_corpus(const std::filesystem::path& dir) {
    using hivemesh::optim::checkpoint;
    write_file(dir / "empty", hivemesh::optim::encode(checkpoint{}));
    checkpoint c;
    c.run_id = "fashion-mnist";
    c.epoch = 30;
    c.optimizer = "adam";
    c.step_count = 30;
    c.parameters = {{0.5f, -1.0f, 2.0f}, {}, {3.0f, 4.0f}};
    c.buffers = {{0.1f, 0.9f}};
    c.integer_buffers = {{120}, {}};
    c.optimizer_state = {{0.0f, 1.0f, 2.0f}, {0.5f, 0.5f, 0.5f}, {}, {},
                         {1.0f, 1.0f},       {2.0f, 2.0f}};
    write_file(dir / "gradients", hivemesh::optim::encode(c));
    c.outer_start = c.parameters;
    c.outer_state = c.parameters;
    c.outer_step_count = 4;
    write_file(dir / "diloco", hivemesh::optim::encode(c));
}

int main(int argc, char** argv) {
    using namespace hivemesh::compression;
    if (argc != 2) {
        std::cerr << "usage: make_corpus <directory>   (writes <directory>/<fuzz target>/...)\n";
        return 2;
    }
    const std::filesystem::path root = argv[1];
    const auto dir = [&](const char* target) {
        std::filesystem::create_directories(root / target);
        return root / target;
    };
    const auto tensors = dir("decompress"), bytes = dir("decompress_bytes");
    hivemesh::random_generator rng(1);
    for (kind k : all_kinds)
        for (std::size_t n : {0, 1, 65, 300}) {
            std::vector<float> values(n);
            for (auto& v : values)
                v = static_cast<float>(rng.normal());
            const options opts{.block_size = 64, .row_length = n % 5 == 0 && n ? 5u : 0u};
            write_file(tensors / (std::string(to_string(k)) + "_" + std::to_string(n)),
                       compress(k, values, opts));
        }
    for (std::size_t n : {0, 100, 2000}) {
        hivemesh::byte_buffer payload(n);
        for (std::size_t i = 0; i < n; ++i)
            payload[i] = static_cast<std::byte>(i % 13);
        write_file(bytes / ("payload_" + std::to_string(n)), compress_bytes(payload));
    }
    write_record_corpus(dir("secure_record"));
    write_averaging_corpus(dir("averaging_messages"));
    write_handshake_corpus(dir("handshake"));
    write_datagram_corpus(dir("datagram"));
    write_frame_corpus(dir("mux_frame"));
    write_rpc_corpus(dir("rpc_message"));
    write_address_corpus(dir("address"));
    write_dht_request_corpus(dir("dht_requests"));
    write_dht_response_corpus(dir("dht_responses"));
    write_state_corpus(dir("state_messages"));
    write_progress_corpus(dir("progress_record"));
    write_checkpoint_corpus(dir("checkpoint"));
    return 0;
}
