// A command-line DHT node: run one in each of two shells and exchange values.
//
//   dht_node [--listen HOST:PORT] [--bootstrap ADDRESS]... [--identity FILE] [--client]
//            [--plaintext] [--ttl SECONDS]
//
// The first line of stdout is `listening <address>` (or `client <peer id>` with --client);
// give that address to another node's --bootstrap. Then one command per line on stdin,
// each answered by exactly one line on stdout:
//
//   put KEY VALUE          ok <replicas> | error <message>
//   put KEY SUBKEY VALUE   (a dictionary subkey) ok <replicas> | error <message>
//   get KEY                value <VALUE> expires_in <s> | dict SUB=V ... | not_found | error ...
//   peers                  peers <nodes in the routing table>
//   address                the first line again
//   marker                 marker <owner marker>: put it in a key or subkey to protect it
//   quit                   (or end of input) closes the node and exits
//
// Keys, subkeys and values are words (no whitespace); bytes that are not printable ASCII
// are shown as \xNN. Values live --ttl seconds (default 240; at most 300, as nodes refuse
// expirations further ahead: dht::storage_limits::max_lifetime). A key holds either a plain
// value or a dictionary: a put of the other kind replaces it (the later expiration wins).
//
// Threading: one io thread runs the network and the DHT; the main thread reads stdin and
// uses the blocking DHT calls, which must not run on the io thread.
#include <hivemesh/crypto.hpp>
#include <hivemesh/dht/node.hpp>
#include <hivemesh/dht/validator.hpp>
#include <hivemesh/net/address.hpp>
#include <hivemesh/net/node.hpp>
#include <hivemesh/net/tcp.hpp>

#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>

#include "program.hpp"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <future>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

using namespace hivemesh;
using namespace std::chrono_literals;

namespace {

using rpc_node_type = net::node<net::tcp::transport>;
using dht_node_type = dht::node<net::tcp::transport>;

struct options {
    asio::ip::tcp::endpoint listen{asio::ip::address_v4::loopback(), 0};
    std::vector<rpc_node_type::peer> bootstrap;
    std::optional<std::string> identity_file;
    bool client = false;
    bool plaintext = false;
    long long ttl_seconds = 240;
};

/// "HOST:PORT", with an IPv6 host in brackets: "[::1]:4242".
asio::ip::tcp::endpoint parse_host_port(std::string_view text) {
    const auto colon = text.rfind(':');
    if (colon == std::string_view::npos) throw CLI::ValidationError("--listen", "needs HOST:PORT");
    std::string_view host = text.substr(0, colon);
    const std::string_view port_text = text.substr(colon + 1);
    if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
        host = host.substr(1, host.size() - 2);
    unsigned port = 0;
    const auto [end, ec] =
        std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
    if (ec != std::errc{} || end != port_text.data() + port_text.size() || port > 65535)
        throw CLI::ValidationError("--listen", "bad port in " + std::string(text));
    std::error_code bad;
    const auto ip = asio::ip::make_address(std::string(host), bad);
    if (bad) throw CLI::ValidationError("--listen", "bad host in " + std::string(text));
    return {ip, static_cast<std::uint16_t>(port)};
}

rpc_node_type::peer parse_peer(std::string_view text) {
    std::string_view reason;
    const auto address = net::peer_address::parse(text, &reason);
    if (!address)
        throw CLI::ValidationError("--bootstrap", "bad address \"" + std::string(text) +
                                                      "\": " + std::string(reason));
    if (!address->peer)
        throw CLI::ValidationError("--bootstrap",
                                   "address without /p2p/<PeerId>: " + std::string(text));
    const auto endpoint = net::tcp::to_endpoint(*address);
    if (!endpoint)
        throw CLI::ValidationError("--bootstrap",
                                   "address is not ip4 or ip6: " + std::string(text));
    return {*address->peer, *endpoint};
}

options parse_options(int argc, char** argv) {
    CLI::App app{"A command-line DHT node: run one in each of two shells and exchange values.",
                 "dht_node"};
    app.option_defaults()->always_capture_default();
    app.footer("Commands on stdin, one answer line each on stdout: put KEY VALUE | put KEY SUBKEY "
               "VALUE | get KEY | peers | address | marker | quit");
    options out;
    std::string listen = "127.0.0.1:0";
    std::vector<std::string> bootstrap;
    app.add_option("--listen", listen, "where to listen (port 0: an ephemeral port)")
        ->type_name("HOST:PORT");
    app.add_option("--bootstrap", bootstrap,
                   "a node to join, e.g. /ip4/127.0.0.1/tcp/4242/p2p/<PeerId> (repeatable)")
        ->type_name("ADDRESS");
    app.add_option("--identity", out.identity_file,
                   "load the key pair from FILE, creating it if absent (default: a fresh "
                   "identity)")
        ->type_name("FILE");
    app.add_flag("--client", out.client, "ask but serve nothing (no listening socket)");
    app.add_flag("--plaintext", out.plaintext,
                 "authenticated but unencrypted connections (all nodes must agree)");
    const auto max_ttl =
        std::chrono::duration_cast<std::chrono::seconds>(dht::storage_limits{}.max_lifetime);
    app.add_option("--ttl", out.ttl_seconds,
                   "lifetime in seconds of the values this node puts (nodes refuse more)")
        ->check(CLI::Range(1LL, static_cast<long long>(max_ttl.count())));
    try {
        app.parse(argc, argv);
        out.listen = parse_host_port(listen);
        for (const auto& address : bootstrap)
            out.bootstrap.push_back(parse_peer(address));
    } catch (const CLI::ParseError& e) {
        program::exit_after(app, e);
    }
    return out;
}

/// Bytes as one word of text: printable ASCII as is, everything else (and '\') as \xNN.
std::string printable(byte_view bytes) {
    static constexpr char hex[] = "0123456789abcdef";
    std::string out;
    out.reserve(bytes.size());
    for (const auto b : bytes) {
        const auto c = static_cast<unsigned char>(b);
        if (c > 0x20 && c < 0x7F && c != '\\') {
            out += static_cast<char>(c);
        } else {
            out += "\\x";
            out += hex[c >> 4];
            out += hex[c & 0xF];
        }
    }
    return out;
}

std::vector<std::string> split_words(const std::string& line) {
    std::istringstream in(line);
    std::vector<std::string> words;
    for (std::string word; in >> word;)
        words.push_back(std::move(word));
    return words;
}

/// One line on stdout, flushed: the other shell (or a script) waits for it.
void answer(const std::string& line) {
    std::cout << line << std::endl;
}

/// Runs `f` on the io thread and returns its result (for state owned by that thread).
template <class F>
auto on_io_thread(asio::io_context& io, F f) {
    std::packaged_task<std::invoke_result_t<F>()> task(std::move(f));
    auto result = task.get_future();
    asio::post(io, [&task] { task(); });
    return result.get();
}

class session {
public:
    session(dht_node_type& dht, asio::io_context& io, std::string first_line, std::string marker,
            std::chrono::seconds ttl)
        : dht_(dht)
        , io_(io)
        , first_line_(std::move(first_line))
        , marker_(std::move(marker))
        , ttl_(ttl) {}

    /// Answers one command line; false for quit.
    bool handle(const std::string& line) {
        const auto words = split_words(line);
        if (words.empty()) return true; // blank lines get no answer
        const auto& command = words[0];
        try {
            if (command == "quit" || command == "exit") return false;
            if (command == "put" && (words.size() == 3 || words.size() == 4))
                put(words);
            else if (command == "get" && words.size() == 2)
                get(words[1]);
            else if (command == "peers" && words.size() == 1)
                answer("peers " +
                       std::to_string(on_io_thread(io_, [this] { return dht_.table().size(); })));
            else if (command == "address" && words.size() == 1)
                answer(first_line_);
            else if (command == "marker" && words.size() == 1)
                answer("marker " + marker_);
            else if (command == "put" || command == "get" || command == "peers" ||
                     command == "address" || command == "marker")
                answer("error usage: put KEY VALUE | put KEY SUBKEY VALUE | get KEY | peers | "
                       "address | marker | quit");
            else
                answer("error unknown command: " + printable(as_bytes(command)));
        } catch (const std::system_error& e) {
            answer("error " + e.code().message());
        } catch (const std::exception& e) {
            answer(std::string("error ") + e.what());
        }
        return true;
    }

private:
    void put(const std::vector<std::string>& words) {
        const auto expiration = wall_clock().now() + ttl_;
        const auto outcome = words.size() == 3
                                 ? dht_.store(as_bytes(words[1]), as_bytes(words[2]), expiration)
                                 : dht_.store(as_bytes(words[1]), as_bytes(words[2]),
                                              as_bytes(words[3]), expiration);
        answer("ok " + std::to_string(outcome.replicas));
    }

    void get(const std::string& key) {
        const auto entry = dht_.get(as_bytes(key), dht::get_options{true});
        if (!entry || entry->empty()) {
            answer("not_found");
            return;
        }
        if (entry->plain) {
            const auto left = std::chrono::duration_cast<std::chrono::seconds>(
                entry->plain->expiration - wall_clock().now());
            answer("value " + printable(entry->plain->value) + " expires_in " +
                   std::to_string(std::max<long long>(0, left.count())));
            return;
        }
        std::string line = "dict";
        for (const auto& [subkey, value] : entry->dictionary)
            line += ' ' + printable(subkey) + '=' + printable(value.value);
        answer(line);
    }

    dht_node_type& dht_;
    asio::io_context& io_;
    std::string first_line_;
    std::string marker_;
    std::chrono::seconds ttl_;
};

int run(const options& opts) {
    asio::io_context io;
    net::tcp::transport transport(io.get_executor());
    auto identity = opts.identity_file ? crypto::identity::load_or_create(*opts.identity_file)
                                       : crypto::identity::generate();
    net::node_options rpc_options;
    rpc_options.security.plaintext = opts.plaintext;
    rpc_node_type rpc(transport, std::move(identity), rpc_options);

    std::optional<net::tcp::transport::listener_type> listener;
    std::optional<asio::ip::tcp::endpoint> announce;
    std::string first_line;
    if (opts.client) {
        first_line = "client " + rpc.id().to_string();
    } else {
        listener.emplace(transport.listen(opts.listen));
        announce = listener->local_endpoint();
        // Others cannot dial a wildcard address: announce loopback instead.
        if (announce->address().is_unspecified())
            announce->address(announce->address().is_v4()
                                  ? asio::ip::address(asio::ip::address_v4::loopback())
                                  : asio::ip::address(asio::ip::address_v6::loopback()));
        first_line = "listening " + net::tcp::to_address(*announce, rpc.id()).to_string();
    }
    dht_node_type dht(rpc, announce); // checks and signs owner markers for `identity`
    if (listener) rpc.serve(std::move(*listener));

    auto work = asio::make_work_guard(io);
    std::promise<void> stopped;
    auto io_done = stopped.get_future();
    std::thread io_thread([&] {
        try {
            io.run();
        } catch (const std::exception& e) {
            std::cerr << "dht_node: io thread: " << e.what() << '\n';
        }
        stopped.set_value();
    });
    const auto shutdown = [&] {
        asio::post(io, [&] {
            dht.close();
            rpc.close();
        });
        work.reset();
        // Closing ends every operation under way; stop the loop anyway if one lingers.
        if (io_done.wait_for(5s) != std::future_status::ready) io.stop();
        io_thread.join();
    };

    int exit_code = 0;
    try {
        answer(first_line);
        if (!opts.bootstrap.empty()) {
            try {
                dht.bootstrap(opts.bootstrap);
            } catch (const std::system_error& e) {
                // Not fatal: the maintenance loop contacts the initial peers again.
                std::cerr << "dht_node: bootstrap failed: " << e.code().message()
                          << " (none of the --bootstrap nodes answered: are they up, and do "
                             "all nodes agree on --plaintext? Retrying in the background)\n";
            }
        }
        session s(dht, io, first_line, dht::owner_marker(rpc.identity().public_key()),
                  std::chrono::seconds(opts.ttl_seconds));
        for (std::string line; std::getline(std::cin, line);)
            if (!s.handle(line)) break;
    } catch (const std::exception& e) {
        std::cerr << "dht_node: " << e.what() << '\n';
        exit_code = 1;
    }
    shutdown();
    return exit_code;
}

} // namespace

int main(int argc, char** argv) {
    const options opts = parse_options(argc, argv);
    try {
        return run(opts);
    } catch (const std::exception& e) {
        std::cerr << "dht_node: " << e.what() << '\n';
        return 1;
    }
}
