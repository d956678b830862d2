// Transport benchmarks on loopback TCP: small-RPC round trips (p50, p99) and bulk stream
// throughput through hivemesh's RPC, encrypted and plaintext, next to a raw Asio TCP socket
// pair measured the same way in the same binary.
//
// Setup: the server and the client each run their own io_context on their own thread (two
// cores, two threads). Each benchmark iteration is one batch, timed inside the client's
// coroutine (manual time), so no cross-thread hand-off is measured.
//
// Names: pingpong/<kind>/size:<bytes>, bulk/<kind>/mib:<MiB per iteration>, with <kind>
//   raw_tcp, secure_stream_encrypted (records sealed straight onto a raw socket, no
//   multiplexer: the ceiling for encrypted RPC), rpc_plaintext, rpc_encrypted.
// Counters: p50_us, p99_us (round trips); bytes_per_second (bulk, payload bytes).
//
//   bench_net --benchmark_out=net.json --benchmark_out_format=json
#include <hivemesh/net/node.hpp>
#include <hivemesh/net/secure_stream.hpp>
#include <hivemesh/net/tcp.hpp>

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/read.hpp>
#include <asio/use_future.hpp>
#include <asio/write.hpp>

#include "bench_main.hpp"

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

namespace {

using hivemesh::bench::fail;

using namespace hivemesh;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

constexpr int calls_per_batch = 2000;
constexpr std::size_t bulk_message = std::size_t{1} << 20;

/// An io_context on its own thread until destroyed.
class io_thread {
public:
    io_thread()
        : guard_(io_.get_executor())
        , thread_([this] { io_.run(); }) {}
    ~io_thread() { stop(); }
    /// Ends the thread; what it ran stays queued, undone, until the io_context goes.
    void stop() {
        if (!thread_.joinable()) return;
        guard_.reset();
        io_.stop();
        thread_.join();
    }
    asio::io_context& io() { return io_; }

private:
    asio::io_context io_;
    asio::executor_work_guard<asio::io_context::executor_type> guard_;
    std::thread thread_;
};

template <class Result>
Result run_on(asio::io_context& io, asio::awaitable<Result> work) {
    return asio::co_spawn(io, std::move(work), asio::use_future).get();
}

void report_latencies(benchmark::State& state, std::vector<double>& micros) {
    if (micros.empty()) return;
    std::sort(micros.begin(), micros.end());
    state.counters["p50_us"] = micros[micros.size() / 2];
    state.counters["p99_us"] = micros[micros.size() * 99 / 100];
    state.counters["calls"] = static_cast<double>(micros.size());
}

// ---- raw TCP -------------------------------------------------------------------------

struct raw_pair {
    io_thread server_thread, client_thread;
    asio::ip::tcp::socket server{server_thread.io()}, client{client_thread.io()};

    raw_pair() {
        asio::ip::tcp::acceptor acceptor(server_thread.io(), {asio::ip::address_v4::loopback(), 0});
        auto accepted = acceptor.async_accept(asio::use_future);
        client.connect(acceptor.local_endpoint());
        server = accepted.get();
        server.set_option(asio::ip::tcp::no_delay(true));
        client.set_option(asio::ip::tcp::no_delay(true));
    }
    // The threads stop before the sockets go: a benchmark's detached echo or drain loop
    // may still be waiting on `server`.
    ~raw_pair() {
        server_thread.stop();
        client_thread.stop();
    }
};

/// Echoes fixed-size messages until the peer closes.
asio::awaitable<void> raw_echo(asio::ip::tcp::socket& socket, std::size_t size) {
    byte_buffer buffer(size);
    while (true) {
        auto [ec, n] = co_await asio::async_read(socket, asio::buffer(buffer),
                                                 asio::experimental::as_tuple(asio::use_awaitable));
        if (ec) co_return;
        auto [wec, m] = co_await asio::async_write(
            socket, asio::buffer(buffer), asio::experimental::as_tuple(asio::use_awaitable));
        if (wec) co_return;
    }
}

void bm_pingpong_raw(benchmark::State& state) {
    const auto size = static_cast<std::size_t>(state.range(0));
    raw_pair pair;
    asio::co_spawn(pair.server_thread.io(), raw_echo(pair.server, size), asio::detached);
    std::vector<double> micros;
    for (auto _ : state) {
        const double seconds = run_on(pair.client_thread.io(), [&]() -> asio::awaitable<double> {
            byte_buffer buffer(size);
            const auto start = clock_type::now();
            for (int i = 0; i < calls_per_batch; ++i) {
                const auto t0 = clock_type::now();
                co_await asio::async_write(pair.client, asio::buffer(buffer), asio::use_awaitable);
                co_await asio::async_read(pair.client, asio::buffer(buffer), asio::use_awaitable);
                micros.push_back(
                    std::chrono::duration<double, std::micro>(clock_type::now() - t0).count());
            }
            co_return std::chrono::duration<double>(clock_type::now() - start).count();
        }());
        state.SetIterationTime(seconds);
    }
    report_latencies(state, micros);
    asio::error_code ignored;
    pair.client.shutdown(asio::socket_base::shutdown_both, ignored);
}

void bm_bulk_raw(benchmark::State& state) {
    const auto total = static_cast<std::size_t>(state.range(0)) << 20;
    raw_pair pair;
    asio::co_spawn(
        pair.server_thread.io(),
        [&]() -> asio::awaitable<void> {
            byte_buffer buffer(bulk_message);
            std::size_t drained = 0, next_ack = total;
            while (true) {
                auto [ec, n] = co_await pair.server.async_read_some(
                    asio::buffer(buffer), asio::experimental::as_tuple(asio::use_awaitable));
                if (ec) co_return;
                drained += n;
                for (; drained >= next_ack; next_ack += total) { // one ack per iteration
                    std::byte ack{1};
                    co_await asio::async_write(pair.server, asio::buffer(&ack, 1),
                                               asio::use_awaitable);
                }
            }
        },
        asio::detached);
    const byte_buffer chunk(bulk_message, std::byte{0x5A});
    for (auto _ : state) {
        const double seconds = run_on(pair.client_thread.io(), [&]() -> asio::awaitable<double> {
            const auto start = clock_type::now();
            // Uncapped, as the secure stream writes: asio::transfer_all() would cut every
            // 1 MiB chunk into 64 KiB syscalls and handicap the baseline.
            for (std::size_t sent = 0; sent < total; sent += chunk.size())
                co_await asio::async_write(pair.client, asio::buffer(chunk),
                                           net::transfer_all_uncapped{}, asio::use_awaitable);
            std::byte ack{};
            co_await asio::async_read(pair.client, asio::buffer(&ack, 1), asio::use_awaitable);
            co_return std::chrono::duration<double>(clock_type::now() - start).count();
        }());
        state.SetIterationTime(seconds);
    }
    state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                            static_cast<std::int64_t>(total));
    asio::error_code ignored;
    pair.client.shutdown(asio::socket_base::shutdown_both, ignored);
}

// ---- secure stream over raw TCP: the ceiling for encrypted RPC ------------------------

crypto::identity identity_of(std::uint8_t n) {
    std::array<std::byte, 32> seed{};
    seed.fill(std::byte{n});
    return crypto::identity::from_seed(seed);
}

/// Whole 1 MiB messages sealed as single records straight onto the socket, with no
/// multiplexer or RPC: what the cipher and TCP allow on one connection.
void bm_bulk_secure_stream(benchmark::State& state) {
    using secure_socket = net::secure_stream<asio::ip::tcp::socket>;
    const auto total = static_cast<std::size_t>(state.range(0)) << 20;
    raw_pair pair;
    secure_socket server(std::move(pair.server)), client(std::move(pair.client));
    const auto server_identity = identity_of(1), client_identity = identity_of(2);
    auto accepted =
        asio::co_spawn(pair.server_thread.io(),
                       server.handshake(crypto::role::listener, server_identity), asio::use_future);
    auto dialed =
        run_on(pair.client_thread.io(), client.handshake(crypto::role::dialer, client_identity));
    if (const auto ec = accepted.get(); ec || dialed)
        return fail(state, "handshake failed: " + (ec ? ec : dialed).message());
    // Awaited before `server` goes: a write it left pending would complete into a
    // destroyed stream.
    auto serving = asio::co_spawn(
        pair.server_thread.io(),
        [&]() -> asio::awaitable<void> {
            std::size_t drained = 0, next_ack = total;
            while (true) {
                byte_view message;
                const auto ec = co_await server.read(message);
                if (ec) co_return;
                drained += message.size();
                for (; drained >= next_ack; next_ack += total) {
                    const std::byte ack{1};
                    if (co_await server.write(byte_view(&ack, 1))) co_return;
                }
            }
        },
        asio::use_future);
    const byte_buffer chunk(bulk_message, std::byte{0x5A});
    std::error_code error;
    for (auto _ : state) {
        const double seconds = run_on(pair.client_thread.io(), [&]() -> asio::awaitable<double> {
            const auto start = clock_type::now();
            for (std::size_t sent = 0; sent < total && !error; sent += chunk.size())
                error = co_await client.write(chunk);
            byte_view ack;
            if (!error) error = co_await client.read(ack);
            co_return std::chrono::duration<double>(clock_type::now() - start).count();
        }());
        if (error) {
            fail(state, "secure stream failed: " + error.message());
            break;
        }
        state.SetIterationTime(seconds);
    }
    asio::post(pair.client_thread.io(), asio::use_future([&] { client.close(); })).get();
    asio::post(pair.server_thread.io(), asio::use_future([&] { server.close(); })).get();
    serving.get();
    if (!error)
        state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                                static_cast<std::int64_t>(total));
}

// ---- hivemesh RPC --------------------------------------------------------------------

struct rpc_pair {
    using node_type = net::node<net::tcp::transport>;
    io_thread server_thread, client_thread;
    net::tcp::transport server_transport{server_thread.io().get_executor()};
    net::tcp::transport client_transport{client_thread.io().get_executor()};
    std::optional<node_type> server, client;
    node_type::peer target;
    std::uint64_t sunk = 0;

    explicit rpc_pair(bool plaintext) {
        net::node_options options;
        options.security.plaintext = plaintext;
        options.mux.initial_window = 8u << 20;
        server.emplace(server_transport, identity_of(1), options);
        client.emplace(client_transport, identity_of(2), options);
        auto listener =
            server_transport.listen(asio::ip::tcp::endpoint(asio::ip::address_v4::loopback(), 0));
        target = {server->id(), listener.local_endpoint()};
        server->serve(std::move(listener));
        server->add_handler("echo",
                            [](const net::call_context&, byte_view request,
                               byte_buffer& response) -> asio::awaitable<std::error_code> {
                                response.assign(request.begin(), request.end());
                                co_return std::error_code{};
                            });
        server->add_stream_handler("sink",
                                   [this](const net::call_context&, net::call_stream& stream)
                                       -> asio::awaitable<std::error_code> {
                                       while (true) {
                                           byte_buffer m;
                                           const auto ec = co_await stream.read(m);
                                           if (ec == asio::error::eof) co_return std::error_code{};
                                           if (ec) co_return ec;
                                           sunk += m.size();
                                       }
                                   });
    }
    ~rpc_pair() {
        asio::post(client_thread.io(), asio::use_future([this] { client->close(); })).get();
        asio::post(server_thread.io(), asio::use_future([this] { server->close(); })).get();
    }
};

void bm_pingpong_rpc(benchmark::State& state, bool plaintext) {
    const auto size = static_cast<std::size_t>(state.range(0));
    rpc_pair pair(plaintext);
    std::vector<double> micros;
    std::error_code error;
    for (auto _ : state) {
        const double seconds = run_on(pair.client_thread.io(), [&]() -> asio::awaitable<double> {
            const byte_buffer request(size, std::byte{1});
            // Connect outside the timed loop.
            const auto connected = co_await pair.client->connect(pair.target);
            if (connected) error = connected;
            const auto start = clock_type::now();
            for (int i = 0; i < calls_per_batch && !error; ++i) {
                const auto t0 = clock_type::now();
                auto [ec, response] = co_await pair.client->async_call(
                    pair.target, "echo", request, 10s,
                    asio::experimental::as_tuple(asio::use_awaitable));
                if (ec || response.size() != size) error = ec ? ec : errc::corrupt_data;
                micros.push_back(
                    std::chrono::duration<double, std::micro>(clock_type::now() - t0).count());
            }
            co_return std::chrono::duration<double>(clock_type::now() - start).count();
        }());
        if (error) return fail(state, "call failed: " + error.message());
        state.SetIterationTime(seconds);
    }
    report_latencies(state, micros);
}

void bm_bulk_rpc(benchmark::State& state, bool plaintext) {
    const auto total = static_cast<std::size_t>(state.range(0)) << 20;
    rpc_pair pair(plaintext);
    // Shared, so every write sends it without a copy, as the raw socket pair does.
    const auto chunk = std::make_shared<const byte_buffer>(bulk_message, std::byte{0x5A});
    std::error_code error;
    for (auto _ : state) {
        const double seconds = run_on(pair.client_thread.io(), [&]() -> asio::awaitable<double> {
            const auto connected = co_await pair.client->connect(pair.target);
            if (connected) error = connected;
            const auto start = clock_type::now();
            net::call_stream stream;
            if (!error) error = co_await pair.client->open_call(pair.target, "sink", 600s, stream);
            for (std::size_t sent = 0; sent < total && !error; sent += chunk->size())
                error = co_await stream.write(chunk);
            if (!error) error = co_await stream.close_write();
            byte_buffer m;
            if (!error) {
                const auto end = co_await stream.read(m); // the handler's final status
                if (end != asio::error::eof) error = end;
            }
            co_return std::chrono::duration<double>(clock_type::now() - start).count();
        }());
        if (error) return fail(state, "stream failed: " + error.message());
        state.SetIterationTime(seconds);
    }
    state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                            static_cast<std::int64_t>(total));
}

void register_benchmarks() {
    const auto small_sizes = [](benchmark::internal::Benchmark* b) {
        b->ArgName("size")->Arg(64)->Arg(4096)->UseManualTime()->Unit(benchmark::kMillisecond);
    };
    const auto bulk_sizes = [](benchmark::internal::Benchmark* b) {
        b->ArgName("mib")->Arg(16)->Arg(512)->UseManualTime()->Unit(benchmark::kMillisecond);
    };
    small_sizes(benchmark::RegisterBenchmark("pingpong/raw_tcp", bm_pingpong_raw));
    small_sizes(benchmark::RegisterBenchmark("pingpong/rpc_plaintext", bm_pingpong_rpc, true));
    small_sizes(benchmark::RegisterBenchmark("pingpong/rpc_encrypted", bm_pingpong_rpc, false));
    bulk_sizes(benchmark::RegisterBenchmark("bulk/raw_tcp", bm_bulk_raw));
    bulk_sizes(benchmark::RegisterBenchmark("bulk/secure_stream_encrypted", bm_bulk_secure_stream));
    bulk_sizes(benchmark::RegisterBenchmark("bulk/rpc_plaintext", bm_bulk_rpc, true));
    bulk_sizes(benchmark::RegisterBenchmark("bulk/rpc_encrypted", bm_bulk_rpc, false));
}

} // namespace

int main(int argc, char** argv) {
    return hivemesh::bench::run_main(argc, argv, "bench_net", register_benchmarks);
}
