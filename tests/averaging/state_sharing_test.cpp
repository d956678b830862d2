// State sharing: wire messages (exact bytes, hostile input) and downloads from donors over the
// DHT, every networked case on the simulated network and on loopback TCP.
#include "support/bytes.hpp"
#include "support/dht_attacks.hpp"
#include "support/identities.hpp"
#include "support/swarm_checks.hpp"

#include <hivemesh/averaging/state_sharing.hpp>
#include <hivemesh/compression/compress.hpp>

#include <asio/thread_pool.hpp>

#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstring>
#include <future>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

using namespace hivemesh;
using namespace std::chrono_literals;

namespace {

using test::bytes_of;
using test::hex;
using test::sim_world;
using test::swarm;
using test::tcp_world;

constexpr const char* prefix = "run";
constexpr std::size_t swarm_size = 6;

/// A state of tensors with these sizes: pseudo-random values plus special bit patterns
/// (signed zero, infinities, a NaN with a payload, a denormal), so that only a bit-exact copy
/// passes bitwise_equal.
averaging::state_snapshot make_state(std::uint64_t seed, const std::vector<std::size_t>& sizes) {
    random_generator rng(seed);
    averaging::state_snapshot s;
    s.metadata = bytes_of("epoch=" + std::to_string(seed));
    for (const auto n : sizes) {
        std::vector<float> t(n);
        for (auto& v : t)
            v = static_cast<float>(rng.normal());
        const float special[] = {-0.0f, std::numeric_limits<float>::infinity(),
                                 std::bit_cast<float>(0x7FC01234u),
                                 std::numeric_limits<float>::denorm_min()};
        for (std::size_t i = 0; i < std::min<std::size_t>(n, 4); ++i)
            t[(i * 7919) % n] = special[i];
        s.tensors.push_back(std::move(t));
    }
    return s;
}

/// Odd sizes, empty ones included: about 4.6 MiB of float32.
const std::vector<std::size_t> big_sizes = {0, 1, 777'777, 3, 0, 100'003, 333'335, 17};

template <class World>
void start(swarm<World>& s) {
    for (std::size_t i = 0; i < swarm_size; ++i)
        s.add(4000 + i);
    test::bootstrap(s, 1, 5);
}

template <class World>
using server_type = averaging::state_server<typename World::transport_type>;

/// A server on member `i` serving `shared` (the test keeps the state alive) at `priority`,
/// once its first advertisement is stored.
template <class World>
std::unique_ptr<server_type<World>>
serve(swarm<World>& s, std::size_t i, const averaging::state_snapshot& shared, double priority,
      averaging::server_options options = {}, std::optional<asio::any_io_executor> compute = {}) {
    auto& m = s.members[i];
    auto server = std::make_unique<server_type<World>>(
        *m.rpc, *m.dht, prefix, m.endpoint, [&shared] { return shared; }, priority, options,
        compute);
    REQUIRE(s.world.run_until([&] { return server->statistics().advertisements >= 1; }, 3600s));
    return server;
}

template <class World>
std::tuple<std::error_code, averaging::downloaded_state>
load(swarm<World>& s, std::size_t i, averaging::load_options options = {}) {
    return test::wait_for<std::error_code, averaging::downloaded_state>(s.world, [&](auto handler) {
        averaging::async_load_state(*s.members[i].rpc, *s.members[i].dht, prefix, options, handler);
    });
}

/// Stops the member's whole peer: a crash on the simulated network, a closed node on TCP.
template <class World>
void kill(swarm<World>& s, std::size_t i) {
    auto& m = s.members[i];
    if constexpr (std::is_same_v<World, sim_world>) {
        s.world.network.crash(m.transport->node());
    } else {
        m.dht->close();
        m.rpc->close_now();
    }
}

/// Advertises member `i` as a donor at `priority` by hand (for hand-written donors).
template <class World>
void advertise_by_hand(swarm<World>& s, std::size_t i, double priority) {
    auto& m = s.members[i];
    using transport = typename World::transport_type;
    const averaging::donor_record record{priority, transport::to_address(m.endpoint)};
    const auto key = bytes_of(averaging::donors_key(prefix));
    auto [ec, outcome] =
        test::wait_for<std::error_code, dht::store_outcome>(s.world, [&](auto handler) {
            m.dht->async_store(dht::record{.key = key,
                                           .subkey = test::marker_of(m.rpc->identity()),
                                           .value = averaging::encode(record),
                                           .expiration = s.world.now() + 4min,
                                           .signature = {}},
                               handler);
        });
    REQUIRE_FALSE(ec);
}

/// A donor that follows the protocol but flips one bit of chunk `bad_chunk`'s payload after
/// hashing it, then waits for the newcomer to hang up (it never sends the rest), so only a
/// check on arrival can end the download quickly with corrupt_data.
template <class World>
void install_corrupt_donor(swarm<World>& s, std::size_t i, const averaging::state_snapshot& shared,
                           std::uint32_t chunk_elements, std::uint64_t bad_chunk,
                           std::size_t& served) {
    s.members[i].rpc->add_stream_handler(
        averaging::state_method(prefix),
        [&shared, chunk_elements, bad_chunk,
         &served](const net::call_context&,
                  net::call_stream& stream) -> asio::awaitable<std::error_code> {
            ++served;
            byte_buffer raw;
            if (auto ec = co_await stream.read(raw)) co_return ec;
            averaging::state_header header;
            if (auto ec =
                    averaging::make_header(shared, compression::kind::none, chunk_elements, header))
                co_return ec;
            const auto total = header.total_elements();
            byte_buffer first = averaging::encode(header);
            if (auto ec = co_await stream.write(std::move(first))) co_return ec;
            std::vector<float> flat;
            for (const auto& t : shared.tensors)
                flat.insert(flat.end(), t.begin(), t.end());
            for (std::uint64_t c = 0; c <= bad_chunk; ++c) {
                const auto begin = static_cast<std::size_t>(c * chunk_elements);
                const auto length =
                    static_cast<std::size_t>(averaging::chunk_length(total, chunk_elements, c));
                byte_buffer message;
                if (auto ec = averaging::append_chunk_message(
                        c, compression::kind::none,
                        std::span<const float>(flat.data() + begin, length), message))
                    co_return ec;
                if (c == bad_chunk) message.back() ^= std::byte{0x01};
                if (auto ec = co_await stream.write(std::move(message))) co_return ec;
            }
            // Silence until the newcomer resets the call (it closed its side already, so
            // reading would only return eof).
            auto watch = stream.stream().watch();
            co_await watch.until_finished();
            co_return errc::cancelled;
        });
}

bool same_bits(const averaging::state_snapshot& a, const averaging::state_snapshot& b) {
    return averaging::bitwise_equal(a, b);
}

} // namespace

// ---- wire ------------------------------------------------------------------------------------

TEST_CASE("state header: exact bytes, canonical round trip", "[averaging][state][wire]") {
    averaging::state_header h;
    h.codec = compression::kind::none;
    h.chunk_elements = 2;
    h.metadata = bytes_of({0xAB, 0xCD});
    h.tensor_sizes = {2, 0, 1};
    h.chunk_hashes.resize(2);
    h.chunk_hashes[0].fill(std::byte{0x11});
    h.chunk_hashes[1].fill(std::byte{0x22});
    const auto bytes = averaging::encode(h);
    const std::string expected = "01 00 02 00 00 00 "         // version, codec, chunk
                                 "02 00 00 00 ab cd "         // metadata
                                 "03 00 00 00 "               // tensor count
                                 "02 00 00 00 00 00 00 00 "   // sizes
                                 "00 00 00 00 00 00 00 00 "   //
                                 "01 00 00 00 00 00 00 00 "   //
                                 "02 00 00 00 00 00 00 00 " + // chunk count
                                 hex(byte_buffer(32, std::byte{0x11})) +
                                 " " + //
                                 hex(byte_buffer(32, std::byte{0x22}));
    CHECK(hex(bytes) == expected);
    averaging::state_header back;
    REQUIRE_FALSE(averaging::decode(bytes, back));
    CHECK(back == h);
    CHECK(averaging::encode(back) == bytes);
}

TEST_CASE("state messages: exact bytes of request, chunk and donor record",
          "[averaging][state][wire]") {
    CHECK(hex(averaging::encode(averaging::state_request{})) == "01");
    const auto payload = bytes_of({1, 2, 3});
    const auto chunk = averaging::encode(averaging::state_chunk{258, payload});
    CHECK(hex(chunk) == "02 01 00 00 00 00 00 00 03 00 00 00 01 02 03");
    averaging::state_chunk decoded;
    REQUIRE_FALSE(averaging::decode(chunk, decoded));
    CHECK(decoded.index == 258);
    CHECK(to_buffer(decoded.payload) == payload);

    const averaging::donor_record record{2.0, net::peer_address::sim(7, 9)};
    const auto bytes = averaging::encode(record);
    // version | f64 2.0 | sim (3), host "7", port 9, no peer
    CHECK(hex(bytes) == "01 00 00 00 00 00 00 00 40 03 01 37 09 00 00");
    averaging::donor_record back;
    REQUIRE_FALSE(averaging::decode(bytes, back));
    CHECK(back == record);
    // A PeerId in the address, or a non-finite priority, is refused both ways.
    CHECK_THROWS_AS(averaging::encode(averaging::donor_record{
                        1.0, net::peer_address::sim(7, 9, test::identity_of(1).id())}),
                    std::system_error);
    CHECK_THROWS_AS(averaging::encode(averaging::donor_record{
                        std::numeric_limits<double>::quiet_NaN(), net::peer_address::sim(7, 9)}),
                    std::system_error);
    auto nan = bytes;
    const auto nan_bits = std::bit_cast<std::uint64_t>(std::numeric_limits<double>::infinity());
    std::memcpy(nan.data() + 1, &nan_bits, 8);
    CHECK(averaging::decode(nan, back) == errc::corrupt_data);
}

TEST_CASE("state decoders refuse truncation, trailing bytes, oversized counts and bad fields",
          "[averaging][state][wire]") {
    averaging::state_header h;
    h.chunk_elements = 3;
    h.metadata = bytes_of("meta");
    h.tensor_sizes = {4, 0, 3};
    h.chunk_hashes.resize(3);
    const auto bytes = averaging::encode(h);
    averaging::state_header out;
    // Every truncation is refused, and so is one byte more.
    for (std::size_t n = 0; n < bytes.size(); ++n) {
        INFO("prefix of " << n << " bytes");
        CHECK(averaging::decode(byte_view(bytes).first(n), out) == errc::truncated_input);
    }
    auto longer = bytes;
    longer.push_back(std::byte{0});
    CHECK(averaging::decode(longer, out) == errc::trailing_data);

    const auto patched = [&](std::size_t offset, auto value) {
        auto copy = bytes;
        std::memcpy(copy.data() + offset, &value, sizeof value);
        return copy;
    };
    // Offsets: version 0, codec 1, chunk_elements 2, metadata length 6, metadata 10,
    // tensor count 14, sizes 18, chunk count 42, hashes 50.
    CHECK(averaging::decode(patched(0, std::uint8_t{2}), out) == errc::unsupported_version);
    CHECK(averaging::decode(patched(1, std::uint8_t{6}), out) == errc::corrupt_data);
    CHECK(averaging::decode(patched(2, std::uint32_t{0}), out) == errc::corrupt_data);
    CHECK(averaging::decode(patched(42, std::uint64_t{2}), out) == errc::corrupt_data);
    // Counts over the limits fail as such, before anything is allocated: a count of 2^32-1
    // tensors or 2^64-1 chunks with a few bytes behind it.
    averaging::state_limits limits;
    limits.max_tensors = 2;
    CHECK(averaging::decode(bytes, out, limits) == errc::length_limit_exceeded);
    CHECK(averaging::decode(patched(14, std::uint32_t{0xFFFFFFFF}), out) ==
          errc::length_limit_exceeded);
    CHECK(averaging::decode(patched(42, ~std::uint64_t{0}), out) == errc::length_limit_exceeded);
    limits = {};
    limits.max_metadata_bytes = 3;
    CHECK(averaging::decode(bytes, out, limits) == errc::length_limit_exceeded);
    limits = {};
    limits.max_total_elements = 6;
    CHECK(averaging::decode(bytes, out, limits) == errc::length_limit_exceeded);
    CHECK(averaging::decode(patched(18, ~std::uint64_t{0}), out) == errc::length_limit_exceeded);
    limits = {};
    limits.max_chunk_bytes = 16 + 4 * 3 - 1; // a full chunk of 3 floats with codec none: 28
    CHECK(averaging::decode(bytes, out, limits) == errc::length_limit_exceeded);
    limits.max_chunk_bytes = 28;
    CHECK_FALSE(averaging::decode(bytes, out, limits));

    // Chunks: truncation, trailing bytes, an index or payload over the limits.
    const auto chunk = averaging::encode(averaging::state_chunk{5, bytes});
    averaging::state_chunk c;
    for (std::size_t n = 0; n < chunk.size(); ++n)
        CHECK(averaging::decode(byte_view(chunk).first(n), c) == errc::truncated_input);
    auto chunk_longer = chunk;
    chunk_longer.push_back(std::byte{0});
    CHECK(averaging::decode(chunk_longer, c) == errc::trailing_data);
    limits = {};
    limits.max_chunks = 5;
    CHECK(averaging::decode(chunk, c, limits) == errc::length_limit_exceeded);
    limits = {};
    limits.max_chunk_bytes = bytes.size() - 1;
    CHECK(averaging::decode(chunk, c, limits) == errc::length_limit_exceeded);

    // Requests and donor records.
    averaging::state_request request;
    CHECK(averaging::decode({}, request) == errc::truncated_input);
    CHECK(averaging::decode(bytes_of({1, 0}), request) == errc::trailing_data);
    CHECK(averaging::decode(bytes_of({2}), request) == errc::unsupported_version);
    const auto record =
        averaging::encode(averaging::donor_record{1.5, net::peer_address::sim(12, 80)});
    averaging::donor_record d;
    for (std::size_t n = 0; n < record.size(); ++n)
        CHECK(averaging::decode(byte_view(record).first(n), d) == errc::truncated_input);
    auto record_longer = record;
    record_longer.push_back(std::byte{0});
    CHECK(averaging::decode(record_longer, d) == errc::trailing_data);
}

TEST_CASE("chunking: hashes cover each chunk's compressed payload, and the assembler checks them",
          "[averaging][state][wire]") {
    const auto s = make_state(3, {5, 0, 2, 0, 0, 6, 1});
    averaging::state_header h;
    REQUIRE_FALSE(averaging::make_header(s, compression::kind::none, 4, h));
    REQUIRE(h.tensor_sizes == std::vector<std::uint64_t>{5, 0, 2, 0, 0, 6, 1});
    REQUIRE(h.chunk_hashes.size() == 4); // 14 elements in chunks of 4: 4 4 4 2
    std::vector<float> flat;
    for (const auto& t : s.tensors)
        flat.insert(flat.end(), t.begin(), t.end());
    std::vector<byte_buffer> messages;
    for (std::uint64_t c = 0; c < 4; ++c) {
        const auto begin = static_cast<std::size_t>(c * 4);
        const auto values = std::span<const float>(flat).subspan(begin, c == 3 ? 2 : 4);
        const auto payload = compression::compress(compression::kind::none, values);
        std::array<std::byte, 32> expected;
        crypto_generichash(reinterpret_cast<unsigned char*>(expected.data()), 32,
                           reinterpret_cast<const unsigned char*>(payload.data()), payload.size(),
                           nullptr, 0);
        CHECK(h.chunk_hashes[c] == expected);
        byte_buffer message;
        REQUIRE_FALSE(averaging::append_chunk_message(c, compression::kind::none, values, message));
        CHECK(message == averaging::encode(averaging::state_chunk{c, payload}));
        messages.push_back(message);
    }
    const auto assemble = [&](std::vector<byte_buffer> stream) -> std::error_code {
        averaging::detail::state_assembler a(h);
        for (const auto& m : stream) {
            averaging::state_chunk c;
            if (auto ec = averaging::decode(m, c)) return ec;
            if (auto ec = a.add(c)) return ec;
        }
        if (!a.complete()) return errc::truncated_input;
        if (!averaging::bitwise_equal(a.take(), s)) return errc::size_mismatch;
        return {};
    };
    CHECK_FALSE(assemble(messages));
    auto swapped = messages;
    std::swap(swapped[1], swapped[2]);
    CHECK(assemble(swapped) == errc::protocol_violation);
    for (std::size_t byte : {12u, 20u, 31u}) { // compression header, first value, last value
        auto flipped = messages;
        flipped[1][byte] ^= std::byte{0x80};
        INFO("flipped byte " << byte);
        CHECK(assemble(flipped) == errc::corrupt_data);
    }
    // A state without elements has no chunks.
    averaging::state_snapshot empty;
    empty.metadata = bytes_of("only metadata");
    empty.tensors = {{}, {}};
    REQUIRE_FALSE(averaging::make_header(empty, compression::kind::none, 4, h));
    CHECK(h.chunk_hashes.empty());
    averaging::detail::state_assembler a(h);
    CHECK(a.complete());
    CHECK(averaging::bitwise_equal(a.take(), empty));
}

TEST_CASE("parse_donors orders by priority, then PeerId, and skips what it cannot use",
          "[averaging][state]") {
    dht::key_entry entry;
    entry.key = bytes_of(averaging::donors_key(prefix));
    const auto add = [&](std::uint8_t who, byte_buffer value) {
        entry.dictionary[test::marker_of(test::identity_of(who))] =
            dht::stored_value{std::move(value), time_point{1h}, {}};
    };
    const auto record = [](double priority, std::uint64_t node) {
        return averaging::encode(
            averaging::donor_record{priority, net::peer_address::sim(node, 1)});
    };
    add(1, record(5, 1));
    add(2, record(9, 2));
    add(3, record(5, 3));
    add(4, {});                  // withdrawn
    add(5, bytes_of({1, 2, 3})); // malformed
    add(6, record(100, 6));      // the caller itself
    // Subkeys that are not exactly one owner marker name nobody.
    const auto marker = test::marker_of(test::identity_of(7));
    auto twice = marker;
    twice.insert(twice.end(), marker.begin(), marker.end());
    for (const auto& subkey :
         {bytes_of("short subkey"), to_buffer(test::identity_of(8).id().view()), twice,
          bytes_of("x" + dht::owner_marker(test::identity_of(9).public_key()))})
        entry.dictionary[subkey] = dht::stored_value{record(50, 7), time_point{1h}, {}};
    const auto donors = averaging::parse_donors(entry, test::identity_of(6).id());
    REQUIRE(donors.size() == 3);
    CHECK(donors[0].id == test::identity_of(2).id());
    CHECK(donors[0].priority == 9);
    CHECK(donors[0].address == net::peer_address::sim(2, 1));
    const auto one = test::identity_of(1).id();
    const auto three = test::identity_of(3).id();
    const auto low = std::min(one, three);
    const auto high = std::max(one, three);
    CHECK(donors[1].id == low);
    CHECK(donors[2].id == high);
}

// ---- downloads, on both transports -------------------------------------------------------------

TEMPLATE_TEST_CASE("a newcomer's downloaded state is bit-identical to the donor's",
                   "[averaging][state]", sim_world, tcp_world) {
    swarm<TestType> s;
    start(s);
    const auto shared = make_state(11, big_sizes);
    averaging::server_options options;
    options.chunk_size_bytes = 64 * 1024 + 12; // not a power of two: chunks straddle tensors
    auto donor = serve(s, 1, shared, 3, options);
    auto [ec, result] = load(s, 4);
    REQUIRE_FALSE(ec);
    CHECK(same_bits(result.contents, shared));
    CHECK(result.donor == s.members[1].rpc->id());
    CHECK(result.priority == 3);
    CHECK(result.failures.empty());
    std::size_t total = 0;
    for (const auto n : big_sizes)
        total += n;
    const std::size_t chunk_elements = options.chunk_size_bytes / 4;
    const std::size_t chunks = (total + chunk_elements - 1) / chunk_elements;
    CHECK(result.chunks == chunks);
    CHECK(chunks > 60);
    const auto& stats = donor->statistics();
    CHECK(stats.uploads_started == 1);
    CHECK(stats.uploads_completed == 1);
    CHECK(stats.chunks_sent == chunks);
    // Every member can download it, the donor itself excepted (it is not its own donor).
    auto [again_ec, again] = load(s, 0);
    REQUIRE_FALSE(again_ec);
    CHECK(same_bits(again.contents, shared));
    auto [self_ec, self] = load(s, 1);
    CHECK(self_ec == errc::not_found);
    // The blocking form refuses to run on the io thread.
    std::optional<std::error_code> blocking;
    asio::post(s.members[2].rpc->get_executor(), [&] {
        try {
            averaging::load_state(*s.members[2].rpc, *s.members[2].dht, prefix);
            blocking = std::error_code{};
        } catch (const std::system_error& e) {
            blocking = e.code();
        }
    });
    REQUIRE(s.world.run_until([&] { return blocking.has_value(); }, 60s));
    CHECK(*blocking == errc::wrong_thread);
}

TEST_CASE("with compute pools, donor and newcomer hash and (de)compress chunks there, and the "
          "download is exactly what the codec gives",
          "[averaging][state]") {
    // Pools outlive the swarm, whose servers and loads post to them.
    asio::thread_pool donor_pool(2), newcomer_pool(2);
    swarm<tcp_world> s;
    start(s);
    const auto shared = make_state(31, big_sizes);
    // One donor per codec (a node serves one handler per method), the later one preferred;
    // each time one pool is held busy first, which must hold the download up.
    struct case_t {
        std::size_t member;
        compression::kind codec;
        asio::thread_pool* held;
    };
    const case_t cases[] = {{1, compression::kind::none, &donor_pool},
                            {2, compression::kind::float16, &newcomer_pool}};
    std::vector<std::unique_ptr<server_type<tcp_world>>> servers;
    for (const auto& c : cases) {
        averaging::server_options options;
        options.codec = c.codec;
        options.chunk_size_bytes = 64 * 1024 + 12;
        servers.push_back(serve(s, c.member, shared, static_cast<double>(c.member), options,
                                donor_pool.get_executor()));
        averaging::load_options how;
        how.compute = newcomer_pool.get_executor();
        std::promise<void> release;
        const std::shared_future<void> busy = release.get_future().share();
        for (int thread = 0; thread < 2; ++thread)
            asio::post(*c.held, [busy] { busy.wait(); });
        std::optional<std::pair<std::error_code, averaging::downloaded_state>> got;
        averaging::async_load_state(*s.members[4].rpc, *s.members[4].dht, prefix, how,
                                    [&](std::error_code ec, averaging::downloaded_state d) {
                                        got.emplace(ec, std::move(d));
                                    });
        const auto second_later = std::chrono::steady_clock::now() + 1s;
        s.world.run_until([&] { return got || std::chrono::steady_clock::now() > second_later; });
        CHECK_FALSE(got.has_value()); // no chunk can be hashed or checked meanwhile
        release.set_value();
        REQUIRE(s.world.run_until([&] { return got.has_value(); }));
        auto& [ec, result] = *got;
        REQUIRE_FALSE(ec);
        CHECK(result.donor == s.members[c.member].rpc->id());
        CHECK(result.chunks > 60);
        CHECK(servers.back()->statistics().chunks_sent == result.chunks);
        // float16 keeps NaN and infinities and rounds the rest.
        REQUIRE(result.contents.tensors.size() == shared.tensors.size());
        for (std::size_t t = 0; t < shared.tensors.size(); ++t) {
            const auto& original = shared.tensors[t];
            std::vector<float> expected(original.size());
            if (!original.empty())
                REQUIRE_FALSE(compression::decompress_into(compression::compress(c.codec, original),
                                                           expected));
            const auto& got_tensor = result.contents.tensors[t];
            REQUIRE(got_tensor.size() == expected.size());
            if (!expected.empty()) // memcmp must not see the null data() of an empty vector
                CHECK(std::memcmp(got_tensor.data(), expected.data(),
                                  got_tensor.size() * sizeof(float)) == 0);
        }
    }
}

TEMPLATE_TEST_CASE("the donor with the higher priority is chosen", "[averaging][state]", sim_world,
                   tcp_world) {
    swarm<TestType> s;
    start(s);
    const auto low_state = make_state(21, {1000, 0, 33});
    const auto high_state = make_state(22, {1000, 0, 33});
    auto low = serve(s, 1, low_state, 7);
    auto high = serve(s, 2, high_state, 8);
    auto [ec, result] = load(s, 5);
    REQUIRE_FALSE(ec);
    CHECK(result.donor == s.members[2].rpc->id());
    CHECK(result.priority == 8);
    CHECK(same_bits(result.contents, high_state));
    CHECK(low->statistics().uploads_started == 0);
    // A new priority takes effect with the next advertisement.
    low->set_priority(9);
    auto [aec] = test::wait_for<std::error_code>(s.world, [&](auto h) { low->async_advertise(h); });
    REQUIRE_FALSE(aec);
    auto [ec2, result2] = load(s, 5);
    REQUIRE_FALSE(ec2);
    CHECK(result2.donor == s.members[1].rpc->id());
    CHECK(same_bits(result2.contents, low_state));
}

TEMPLATE_TEST_CASE("a donor that dies mid-download: the newcomer finishes from the next one",
                   "[averaging][state]", sim_world, tcp_world) {
    swarm<TestType> s;
    start(s);
    const auto first_state = make_state(31, big_sizes);
    const auto second_state = make_state(32, big_sizes);
    averaging::server_options options;
    options.chunk_size_bytes = 32 * 1024;
    auto preferred = serve(s, 1, first_state, 10, options);
    auto fallback = serve(s, 2, second_state, 5, options);
    std::optional<std::tuple<std::error_code, averaging::downloaded_state>> out;
    averaging::async_load_state(
        *s.members[4].rpc, *s.members[4].dht, prefix, {},
        [&](std::error_code ec, averaging::downloaded_state r) { out.emplace(ec, std::move(r)); });
    REQUIRE(s.world.run_until([&] { return preferred->statistics().chunks_sent >= 3; }, 3600s));
    REQUIRE_FALSE(out);
    kill(s, 1);
    REQUIRE(s.world.run_until([&] { return out.has_value(); }, 3600s));
    auto& [ec, result] = *out;
    REQUIRE_FALSE(ec);
    CHECK(preferred->statistics().uploads_completed == 0);
    CHECK(result.donor == s.members[2].rpc->id());
    CHECK(same_bits(result.contents, second_state));
    REQUIRE(result.failures.size() == 1);
    CHECK(result.failures[0].donor == s.members[1].rpc->id());
    CHECK(result.failures[0].priority == 10);
    CHECK(result.failures[0].error);
    CHECK(result.failures[0].error != errc::corrupt_data);
    CHECK(fallback->statistics().uploads_completed == 1);
}

TEMPLATE_TEST_CASE("a corrupted chunk is detected on arrival and the newcomer falls back",
                   "[averaging][state]", sim_world, tcp_world) {
    swarm<TestType> s;
    start(s);
    const auto shared = make_state(41, {5000, 0, 12345, 7});
    std::size_t served = 0;
    install_corrupt_donor(s, 3, shared, 1000, 2, served);
    advertise_by_hand(s, 3, 50);
    auto honest = serve(s, 1, shared, 1);
    averaging::load_options options;
    options.donor_timeout = 1000s; // a check at the end only would run into this
    auto [ec, result] = load(s, 5, options);
    REQUIRE_FALSE(ec);
    CHECK(served == 1);
    CHECK(result.donor == s.members[1].rpc->id());
    CHECK(same_bits(result.contents, shared));
    REQUIRE(result.failures.size() == 1);
    CHECK(result.failures[0].donor == s.members[3].rpc->id());
    CHECK(result.failures[0].error == errc::corrupt_data);

    // With the honest donor gone, the corrupt one is all there is: an error, never its state.
    auto [sec] = test::wait_for<std::error_code>(s.world, [&](auto h) { honest->async_stop(h); });
    REQUIRE_FALSE(sec);
    auto [cec, corrupt] = load(s, 5, options);
    CHECK(cec == errc::corrupt_data);
    CHECK(corrupt.contents.tensors.empty());
    CHECK(corrupt.contents.metadata.empty());
    REQUIRE(corrupt.failures.size() == 1);
    CHECK(corrupt.failures[0].error == errc::corrupt_data);
    CHECK(served == 2);
}

TEMPLATE_TEST_CASE(
    "no donor gives not_found, and a stopped donor withdraws and answers not_a_donor",
    "[averaging][state]", sim_world, tcp_world) {
    swarm<TestType> s;
    start(s);
    auto [ec, result] = load(s, 2);
    CHECK(ec == errc::not_found);
    CHECK(result.failures.empty());

    const auto shared = make_state(51, {10});
    auto donor = serve(s, 1, shared, 1);
    auto [lec, listed] = test::wait_for<std::error_code, std::vector<averaging::donor_info>>(
        s.world, [&](auto h) { averaging::async_list_donors(*s.members[2].dht, prefix, h); });
    REQUIRE_FALSE(lec);
    REQUIRE(listed.size() == 1);
    CHECK(listed[0].id == s.members[1].rpc->id());
    CHECK(listed[0].address ==
          TestType::transport_type::to_address(s.members[1].endpoint).without_peer());

    auto [sec] = test::wait_for<std::error_code>(s.world, [&](auto h) { donor->async_stop(h); });
    REQUIRE_FALSE(sec);
    CHECK_FALSE(donor->serving());
    auto [ec2, result2] = load(s, 2);
    CHECK(ec2 == errc::not_found);

    // A newcomer that still calls it (e.g. from an older list) is told it is not a donor.
    std::optional<std::error_code> direct;
    asio::co_spawn(
        s.members[2].rpc->get_executor(),
        [&]() -> asio::awaitable<void> {
            auto& rpc = *s.members[2].rpc;
            net::call_stream call;
            typename swarm<TestType>::peer target = s.members[1].address();
            if (auto oec =
                    co_await rpc.open_call(target, averaging::state_method(prefix), 60s, call)) {
                direct = oec;
                co_return;
            }
            byte_buffer request = averaging::encode(averaging::state_request{});
            co_await call.write(std::move(request));
            co_await call.close_write();
            byte_buffer message;
            direct = co_await call.read(message);
        },
        asio::detached);
    REQUIRE(s.world.run_until([&] { return direct.has_value(); }, 3600s));
    CHECK(*direct == errc::not_a_donor);
    CHECK(donor->statistics().uploads_refused == 1);
}

// ---- attacks on the donor records (simulated network) -----------------------------------------

namespace {

/// The donors key as member `reader` reads it (a full lookup).
dht::key_entry read_donors(swarm<sim_world>& s, std::size_t reader) {
    auto [ec, entry] = test::wait_for<std::error_code, dht::key_entry>(s.world, [&](auto h) {
        s.members[reader].dht->async_get(bytes_of(averaging::donors_key(prefix)),
                                         dht::get_options{.latest = true}, h);
    });
    REQUIRE_FALSE(ec);
    return std::move(entry);
}

std::tuple<std::error_code, std::vector<averaging::donor_info>> list_donors(swarm<sim_world>& s,
                                                                            std::size_t reader) {
    return test::wait_for<std::error_code, std::vector<averaging::donor_info>>(
        s.world, [&](auto h) { averaging::async_list_donors(*s.members[reader].dht, prefix, h); });
}

/// What each node answers to `records` stored in turn, by the storage rule: a store wins only
/// with a strictly later expiration than what the node holds.
std::vector<std::vector<dht::store_status>> replay_oracle(swarm<sim_world>& s, std::size_t from,
                                                          const std::vector<dht::record>& records) {
    std::vector<std::vector<dht::store_status>> out(s.members.size());
    for (std::size_t i = 0; i < s.members.size(); ++i) {
        if (i == from) continue;
        auto held = test::held(s, i, records.front().key, *records.front().subkey);
        for (const auto& r : records) {
            const bool wins = !held || r.expiration > held->expiration;
            out[i].push_back(wins ? dht::store_status::stored : dht::store_status::outdated);
            if (wins) held = dht::stored_value{r.value, r.expiration, r.signature};
        }
    }
    return out;
}

} // namespace

TEST_CASE("a donor record is its owner's: forged, overwriting, tombstoning and replayed writes "
          "are refused",
          "[averaging][state][protection]") {
    swarm<sim_world> s;
    start(s);
    const std::size_t attacker = 5;
    const auto& attacker_identity = s.members[attacker].rpc->identity();
    const auto key = bytes_of(averaging::donors_key(prefix));
    const auto marker = test::marker_of(s.members[1].rpc->identity());
    const auto shared = make_state(61, {100, 3});
    auto donor = serve(s, 1, shared, 1);
    const auto address =
        sim_world::transport_type::to_address(s.members[1].endpoint).without_peer();

    // Under the donor's owner marker, signed by the donor.
    auto entry = read_donors(s, attacker);
    REQUIRE(entry.dictionary.size() == 1);
    const dht::stored_value advertised = entry.dictionary.at(marker);
    averaging::donor_record record;
    REQUIRE_FALSE(averaging::decode(advertised.value, record));
    CHECK(record == averaging::donor_record{1, address});
    const dht::record first = entry.to_record(marker, advertised);
    CHECK(first.signature.size() == 64);

    // To every node: a better offer at the attacker's address under the donor's marker, a
    // withdrawal, each unsigned and signed by the attacker, and the donor's record made to
    // last longer: all refused.
    const time_point later = advertised.expiration + 1s;
    const auto offer = averaging::encode(averaging::donor_record{
        1000, sim_world::transport_type::to_address(s.members[attacker].endpoint)});
    const dht::record overwrite{key, marker, offer, later, {}};
    const dht::record tombstone{key, marker, {}, later, {}};
    dht::record extended = first;
    extended.expiration = later;
    const auto statuses = test::raw_store_everywhere(
        s, attacker,
        {overwrite, test::signed_by(overwrite, attacker_identity), tombstone,
         test::signed_by(tombstone, attacker_identity), extended});
    for (std::size_t i = 0; i < swarm_size; ++i) {
        if (i == attacker) continue;
        INFO("node " << i);
        CHECK(statuses[i] == std::vector<dht::store_status>(5, dht::store_status::invalid));
    }
    auto [lec, listed] = list_donors(s, 3);
    REQUIRE_FALSE(lec);
    CHECK(listed == std::vector<averaging::donor_info>{{s.members[1].rpc->id(), 1, address}});

    // A newer advertisement (priority 2), then the first one again: it loses where the newer
    // one is held, and readers see the newer one.
    donor->set_priority(2);
    auto [aec] =
        test::wait_for<std::error_code>(s.world, [&](auto h) { donor->async_advertise(h); });
    REQUIRE_FALSE(aec);
    auto expected = replay_oracle(s, attacker, {first});
    CHECK(test::raw_store_everywhere(s, attacker, {first}) == expected);
    std::size_t outdated = 0;
    for (const auto& e : expected)
        outdated += !e.empty() && e.front() == dht::store_status::outdated ? 1 : 0;
    CHECK(outdated >= 4); // the replicas but the attacker's own node
    auto [lec2, listed2] = list_donors(s, 3);
    REQUIRE_FALSE(lec2);
    CHECK(listed2 == std::vector<averaging::donor_info>{{s.members[1].rpc->id(), 2, address}});
    auto [ec, loaded] = load(s, 3);
    REQUIRE_FALSE(ec);
    CHECK(loaded.donor == s.members[1].rpc->id());
    CHECK(same_bits(loaded.contents, shared));

    // The donor withdraws; neither of its records sent again brings it back.
    entry = read_donors(s, attacker);
    const dht::record last = entry.to_record(marker, entry.dictionary.at(marker));
    auto [sec] = test::wait_for<std::error_code>(s.world, [&](auto h) { donor->async_stop(h); });
    REQUIRE_FALSE(sec);
    expected = replay_oracle(s, attacker, {last, first});
    CHECK(test::raw_store_everywhere(s, attacker, {last, first}) == expected);
    auto [lec3, listed3] = list_donors(s, 3);
    CHECK(lec3 == errc::not_found);
}

TEST_CASE("a newcomer loads the state from the real donor while an attacker floods the donor "
          "records",
          "[averaging][state][protection]") {
    swarm<sim_world> s;
    start(s);
    const std::size_t attacker = 5;
    const auto& attacker_identity = s.members[attacker].rpc->identity();
    const auto key = bytes_of(averaging::donors_key(prefix));
    using transport = sim_world::transport_type;
    const auto shared = make_state(71, {1000, 0, 7});
    auto donor = serve(s, 1, shared, 5);
    const auto t0 = s.world.now();
    const auto offer = [](double priority, const net::sim::endpoint& at) {
        return averaging::encode(averaging::donor_record{priority, transport::to_address(at)});
    };
    // Better offers that lead nowhere: the attacker's own (no state served there), and
    // sybils' (keys it made) at the donor's address or the attacker's (a dial finds another
    // key there).
    auto [own_ec, own] = test::wait_for<std::error_code, dht::store_outcome>(s.world, [&](auto h) {
        s.members[attacker].dht->async_store(
            dht::record{.key = key,
                        .subkey = test::marker_of(attacker_identity),
                        .value = offer(99, s.members[attacker].endpoint),
                        .expiration = t0 + 4min,
                        .signature = {}},
            h);
    });
    REQUIRE_FALSE(own_ec);
    constexpr std::size_t sybils = 8;
    std::vector<dht::record> flood;
    std::vector<dht::store_status> expected;
    std::vector<averaging::donor_failure> failures;
    for (std::size_t n = 0; n < sybils; ++n) {
        const auto sybil = test::random_identity(9000 + n);
        const auto& at = s.members[n % 2 == 0 ? 1 : attacker].endpoint;
        flood.push_back(test::signed_by(
            {key, test::marker_of(sybil), offer(100.0 + static_cast<double>(n), at), t0 + 4min, {}},
            sybil));
        expected.push_back(dht::store_status::stored);
        failures.insert(failures.begin(),
                        averaging::donor_failure{sybil.id(), 100.0 + static_cast<double>(n),
                                                 make_error_code(errc::peer_id_mismatch)});
    }
    failures.push_back(
        averaging::donor_failure{attacker_identity.id(), 99, make_error_code(errc::refused)});
    // What no reader may take points at a port where nothing listens: the best offers under
    // the donor's marker (unsigned and signed by the attacker) and its withdrawal, refused;
    // under its PeerId's bytes (no marker) and subkeys a sybil signs that are not exactly
    // one marker, kept but named nobody; a year ahead, refused.
    const net::sim::endpoint dead{s.members[attacker].transport->node(), 999};
    const auto donor_marker = test::marker_of(s.members[1].rpc->identity());
    for (const dht::record& forged :
         {dht::record{key, donor_marker, offer(1000, dead), t0 + 4min, {}},
          dht::record{key, donor_marker, {}, t0 + 4min, {}}}) {
        flood.push_back(forged);
        flood.push_back(test::signed_by(forged, attacker_identity));
        expected.insert(expected.end(), {dht::store_status::invalid, dht::store_status::invalid});
    }
    const auto sybil = test::random_identity(8999);
    const auto marker = test::marker_of(sybil);
    auto twice = marker;
    twice.insert(twice.end(), marker.begin(), marker.end());
    flood.push_back(
        {key, to_buffer(s.members[1].rpc->id().view()), offer(2000, dead), t0 + 4min, {}});
    flood.push_back(test::signed_by({key, twice, offer(3000, dead), t0 + 4min, {}}, sybil));
    flood.push_back(test::signed_by({key, marker, offer(4000, dead), t0 + 8760h, {}}, sybil));
    expected.insert(expected.end(), {dht::store_status::stored, dht::store_status::stored,
                                     dht::store_status::too_far_ahead});
    const auto statuses = test::raw_store_everywhere(s, attacker, flood);
    for (std::size_t i = 0; i < swarm_size; ++i) {
        if (i == attacker) continue;
        INFO("node " << i);
        CHECK(statuses[i] == expected);
    }
    // The donor, the attacker and the sybils, with the bogus subkeys beside them.
    CHECK(read_donors(s, 3).dictionary.size() == 1 + 1 + sybils + 2);

    const auto refused_before = s.world.network.statistics().connections_refused;
    auto [ec, result] = load(s, 3);
    REQUIRE_FALSE(ec);
    CHECK(result.donor == s.members[1].rpc->id());
    CHECK(result.priority == 5);
    CHECK(same_bits(result.contents, shared));
    REQUIRE(result.failures.size() == failures.size());
    for (std::size_t n = 0; n < failures.size(); ++n) {
        INFO("failure " << n);
        CHECK(result.failures[n].donor == failures[n].donor);
        CHECK(result.failures[n].priority == failures[n].priority);
        CHECK(result.failures[n].error == failures[n].error);
    }
    // Nobody dialed what only the bogus subkeys named.
    CHECK(s.world.network.statistics().connections_refused == refused_before);
    CHECK(donor->statistics().uploads_completed == 1);
}
