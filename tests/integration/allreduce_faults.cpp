// The all-reduce fault matrix of tests/averaging/allreduce_test.cpp across five OS processes
// on loopback TCP (issue 5): four nodes and a client, each a child process of this program
// with its own node, listener and compute pool. For each fault (fail before, fail while
// sending, slow sending, fail while reducing, slow reducing, cancel) and victim, the parent
// starts five children, lets them average once, and checks the oracles of the simulated test:
// the healthy peers finish by their deadline, every element is the weighted mean of the
// contributors its part names or the peer's own value, and the exact outcomes where the fault
// fixes them. A failure is a real death: the victim sends itself SIGKILL at the hook point,
// so its sockets close without a goodbye; "fail before" is killed by the parent before the
// round starts.
//
//   allreduce_faults [Catch2 options]     the parent (the CTest entry)
//   allreduce_faults --child <parent pid> <case> <index> <fault> <victim> <time scale>
//
// A child talks to the parent over its stdin and stdout, a line at a time:
//   child  HELLO <peer id> <port>          (port 0: the client listens nowhere)
//   parent PEERS <id> <port> (five times)
//   child  READY                  parent GO
//   child  RESULT <status> <elapsed us> <elements averaged> <elements total> <participants>
//          PART <begin> <size> <reducer> <contributors> (one a part)
//          VALUES <float bits in hex> (every element)
//          END
//   parent EXIT                   (until every report is in, the others may still need us)
// Ports come from the kernel (port 0) and travel in HELLO, so runs never collide.
// HIVEMESH_FAULTS_TIME_SCALE (default 1) stretches every timeout and delay, for slow machines.
#define CATCH_CONFIG_RUNNER
#include "support/faults.hpp"
#include "support/identities.hpp"

#include <hivemesh/averaging/allreduce.hpp>
#include <hivemesh/core/random.hpp>
#include <hivemesh/net/node.hpp>
#include <hivemesh/net/tcp.hpp>

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <asio/thread_pool.hpp>

#include <catch2/catch.hpp>

#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <future>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace hivemesh::test {
namespace {

using namespace std::chrono_literals;
using averaging::allreduce_result;
using averaging::member_role;
using averaging::part_outcome;
using steady = std::chrono::steady_clock;

// ---- what parent and children agree on ---------------------------------------------------

constexpr std::size_t group_size = 5;
constexpr std::size_t client = 4; // members 0-3 are nodes
constexpr std::size_t elements = 5000;
constexpr std::size_t span_elements = 1250; // each node's span
constexpr std::size_t part_bytes = 1000;    // 250 floats: five parts a span
constexpr std::size_t part_elements = part_bytes / sizeof(float);

/// The victim dies, so it has no report to check.
bool kills_victim(fault f) {
    return f == fault::fail_before || f == fault::fail_sending || f == fault::fail_reducing;
}

/// Timeouts and fault delays. Each delay beats the timeout it must outlast by two seconds or
/// more, so a loaded machine's scheduling hiccups cannot turn a dropped peer into a late one.
struct timings {
    double scale = 1;

    duration of(duration d) const { return std::chrono::duration_cast<duration>(d * scale); }
    duration sender_timeout() const { return of(1500ms); }
    duration reducer_timeout() const { return of(3s); }
    /// Slow sending: before every part from the third on.
    duration slow_send_delay() const { return of(4s); }
    /// Slow reducing: before every part of its span from the second on (four of them).
    duration slow_reduce_delay() const { return of(5s); }
    /// Every round's deadline: well above the slow reducer's 4 x 5 s.
    duration round_timeout() const { return of(40s); }
    /// A healthy peer gives up on a silent peer after at most reducer_timeout; the rest is
    /// slack for a loaded machine, still far below the round deadline.
    duration healthy_limit() const { return reducer_timeout() + of(4s); }
};

std::vector<member_role> member_roles() {
    std::vector<member_role> roles(group_size, member_role::node);
    roles[client] = member_role::client;
    return roles;
}

std::vector<std::size_t> member_spans() {
    std::vector<std::size_t> spans(group_size, span_elements);
    spans[client] = 0;
    return spans;
}

/// A member's values in [1, 2) and weight in [1, 5), from the case and its index.
struct member_values {
    std::vector<float> values;
    double weight = 1;
};

member_values initial_values(std::size_t case_index, std::size_t member) {
    random_generator rng(1000 * (case_index + 1) + member);
    member_values out;
    out.values.resize(elements);
    for (auto& v : out.values)
        v = 1.0f + static_cast<float>(rng.uniform_real());
    out.weight = 1.0 + 4.0 * rng.uniform_real();
    return out;
}

averaging::group_id group_id_of(std::size_t case_index) {
    averaging::group_id id{};
    random_generator rng(77 + case_index);
    for (auto& b : id)
        b = static_cast<std::byte>(rng() & 0xFF);
    return id;
}

std::string bits_of(const std::vector<bool>& bits) {
    if (bits.empty()) return "-";
    std::string out;
    for (const bool b : bits)
        out += b ? '1' : '0';
    return out;
}

std::optional<std::vector<bool>> parse_bits(const std::string& text) {
    std::vector<bool> out;
    if (text == "-") return out;
    for (const char c : text) {
        if (c != '0' && c != '1') return std::nullopt;
        out.push_back(c == '1');
    }
    return out;
}

// ---- the child ---------------------------------------------------------------------------

struct child_arguments {
    pid_t parent = 0;
    std::size_t case_index = 0;
    std::size_t index = 0;
    fault kind = fault::fail_before;
    std::size_t victim = 0;
    timings times;
};

std::string next_line() {
    std::string line;
    if (!std::getline(std::cin, line)) throw std::runtime_error("the parent went away");
    return line;
}

void send_line(const std::string& line) {
    std::cout << line << '\n' << std::flush;
}

/// The hooks that make this peer the victim of `kind`.
averaging::allreduce_hooks victim_hooks(fault kind, const timings& times,
                                        asio::cancellation_signal& cancel) {
    averaging::allreduce_hooks hooks;
    // An abrupt death: no destructor runs, the kernel closes the sockets.
    auto die = [] { std::raise(SIGKILL); };
    switch (kind) {
    case fault::fail_before: // the parent kills us before the round
        break;
    case fault::fail_sending:
        hooks.before_send = [die](std::size_t, std::size_t part) {
            if (part == 2) die();
            return duration::zero();
        };
        break;
    case fault::slow_sending:
        hooks.before_send = [delay = times.slow_send_delay()](std::size_t, std::size_t part) {
            return part >= 2 ? delay : duration::zero();
        };
        break;
    case fault::fail_reducing:
        hooks.before_reduce = [die](std::size_t part) {
            if (part == 2) die();
            return duration::zero();
        };
        break;
    case fault::slow_reducing:
        hooks.before_reduce = [delay = times.slow_reduce_delay()](std::size_t part) {
            return part >= 1 ? delay : duration::zero();
        };
        break;
    case fault::cancel:
        // Hooks run on the node's executor, where the cancellation slot must be emitted.
        hooks.before_send = [&cancel, emitted = false](std::size_t, std::size_t part) mutable {
            if (part == 2 && !emitted) {
                emitted = true;
                cancel.emit(asio::cancellation_type::terminal);
            }
            return duration::zero();
        };
        break;
    }
    return hooks;
}

struct round_outcome {
    std::error_code ec;
    allreduce_result result;
    steady::duration elapsed{};
};

std::string status_of(std::error_code ec) {
    if (!ec) return "ok";
    if (ec == errc::cancelled) return "cancelled";
    return std::string(ec.category().name()) + ":" + std::to_string(ec.value());
}

int child_main(const child_arguments& a) {
    using transport_type = net::tcp::transport;
    using service_type = averaging::allreduce_service<transport_type>;
    // No orphans: die with the parent, and in any case after a generous bound.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != a.parent) return 1; // the parent died before prctl
    ::alarm(static_cast<unsigned>(300 * a.times.scale));
    // One write a line, so the five children's lines do not interleave.
    log::set_sink(
        [index = a.index](log::level l, std::string_view component, std::string_view message) {
            std::ostringstream line;
            line << "[peer " << index << " " << log::to_string(l) << "] " << component << ": "
                 << message << '\n';
            const std::string text = line.str();
            [[maybe_unused]] const auto written = ::write(STDERR_FILENO, text.data(), text.size());
        });

    const auto roles = member_roles();
    const auto spans = member_spans();
    averaging::allreduce_options options;
    options.part_size_bytes = part_bytes;
    options.sender_timeout = a.times.sender_timeout();
    options.reducer_timeout = a.times.reducer_timeout();

    // The pool outlives the io_context: handlers queued there hold strands on the pool.
    asio::thread_pool compute(2);
    asio::io_context io(1);
    transport_type transport(io.get_executor());
    net::node<transport_type> rpc(transport, identity_of(static_cast<std::uint8_t>(a.index + 1)));
    std::uint16_t port = 0;
    if (roles[a.index] != member_role::client) {
        auto listener =
            transport.listen(asio::ip::tcp::endpoint(asio::ip::address_v4::loopback(), 0));
        port = listener.local_endpoint().port();
        rpc.serve(std::move(listener));
    }
    service_type service(rpc, options, compute.get_executor());
    asio::cancellation_signal cancel;
    if (a.index == a.victim) service.set_hooks(victim_hooks(a.kind, a.times, cancel));

    auto work = asio::make_work_guard(io);
    std::thread io_thread([&io] { io.run(); });
    struct stopper { // the io thread ends on every way out
        asio::io_context& io;
        std::thread& thread;
        ~stopper() {
            io.stop();
            if (thread.joinable()) thread.join();
        }
    } stop_io{io, io_thread};

    send_line("HELLO " + rpc.id().to_string() + " " + std::to_string(port));
    std::istringstream peers(next_line());
    std::string word;
    if (!(peers >> word) || word != "PEERS") throw std::runtime_error("expected PEERS");
    averaging::group_info<asio::ip::tcp::endpoint> group;
    group.id = group_id_of(a.case_index);
    for (std::size_t k = 0; k < group_size; ++k) {
        std::string id;
        unsigned peer_port = 0;
        if (!(peers >> id >> peer_port)) throw std::runtime_error("short PEERS line");
        auto& member = group.members.emplace_back();
        member.peer.id = crypto::peer_id::from_string(id);
        member.role = roles[k];
        if (roles[k] != member_role::client)
            member.peer.endpoint = asio::ip::tcp::endpoint(asio::ip::address_v4::loopback(),
                                                           static_cast<std::uint16_t>(peer_port));
    }
    if (group.members[a.index].peer.id != rpc.id()) throw std::runtime_error("not at my index");
    auto mine = initial_values(a.case_index, a.index);
    send_line("READY");
    if (next_line() != "GO") throw std::runtime_error("expected GO");

    std::promise<round_outcome> done;
    asio::post(io, [&] {
        const auto started = steady::now();
        auto handler = [&done, started](std::error_code ec, allreduce_result result) {
            done.set_value({ec, std::move(result), steady::now() - started});
        };
        service.async_allreduce(group, a.index, spans, std::span<float>(mine.values), mine.weight,
                                a.times.round_timeout(),
                                asio::bind_cancellation_slot(cancel.slot(), std::move(handler)));
    });
    const auto outcome = done.get_future().get();

    const auto& r = outcome.result;
    std::ostringstream report;
    report << "RESULT " << status_of(outcome.ec) << ' '
           << std::chrono::duration_cast<std::chrono::microseconds>(outcome.elapsed).count() << ' '
           << r.elements_averaged << ' ' << r.elements_total << ' ' << bits_of(r.participants)
           << '\n';
    for (const auto& part : r.parts)
        report << "PART " << part.begin << ' ' << part.size << ' ' << part.reducer << ' '
               << bits_of(part.contributors) << '\n';
    report << "VALUES";
    char hex[12];
    for (const float v : mine.values) {
        std::uint32_t bits = 0;
        std::memcpy(&bits, &v, sizeof bits);
        std::snprintf(hex, sizeof hex, " %08x", static_cast<unsigned>(bits));
        report << hex;
    }
    report << "\nEND";
    send_line(report.str());

    if (next_line() != "EXIT") throw std::runtime_error("expected EXIT");
    std::promise<void> closed;
    asio::post(io, [&] {
        rpc.close();
        closed.set_value();
    });
    closed.get_future().wait();
    return 0;
}

std::optional<child_arguments> parse_child(int argc, char** argv) {
    if (argc != 8) return std::nullopt;
    try {
        child_arguments a;
        a.parent = static_cast<pid_t>(std::stol(argv[2]));
        a.case_index = std::stoul(argv[3]);
        a.index = std::stoul(argv[4]);
        const auto kind = fault_named(argv[5]);
        a.victim = std::stoul(argv[6]);
        a.times.scale = std::stod(argv[7]);
        if (!kind || a.index >= group_size || a.victim >= group_size || !(a.times.scale > 0))
            return std::nullopt;
        a.kind = *kind;
        return a;
    } catch (const std::exception&) {
        return std::nullopt;
    }
}

// ---- the parent --------------------------------------------------------------------------

/// A child with its stdin and stdout as pipes; killed and reaped on destruction.
class child_process {
public:
    explicit child_process(const std::vector<std::string>& args) {
        int in[2], out[2];
        // Close-on-exec: no child inherits another child's pipe ends.
        if (::pipe2(in, O_CLOEXEC) != 0) throw std::system_error(errno, std::generic_category());
        if (::pipe2(out, O_CLOEXEC) != 0) {
            const int saved = errno;
            ::close(in[0]);
            ::close(in[1]);
            throw std::system_error(saved, std::generic_category());
        }
        posix_spawn_file_actions_t actions;
        posix_spawn_file_actions_init(&actions);
        posix_spawn_file_actions_adddup2(&actions, in[0], STDIN_FILENO);
        posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
        std::vector<char*> argv;
        for (const auto& s : args)
            argv.push_back(const_cast<char*>(s.c_str()));
        argv.push_back(nullptr);
        const int failed = posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), environ);
        posix_spawn_file_actions_destroy(&actions);
        ::close(in[0]);
        ::close(out[1]);
        to_ = in[1];
        from_ = out[0];
        if (failed != 0) {
            pid_ = -1;
            close_pipes();
            throw std::system_error(failed, std::generic_category(), "posix_spawn");
        }
    }
    child_process(const child_process&) = delete;
    child_process& operator=(const child_process&) = delete;
    ~child_process() {
        kill();
        reap(true);
        close_pipes();
    }

    /// False if the child no longer reads (it died).
    bool send(const std::string& line) {
        const std::string text = line + '\n';
        std::size_t done = 0;
        while (done < text.size()) {
            const auto n = ::write(to_, text.data() + done, text.size() - done);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) return false;
            done += static_cast<std::size_t>(n);
        }
        return true;
    }

    /// The next line, or nullopt at the end of the child's output or at `deadline`
    /// (`timed_out` tells which).
    std::optional<std::string> receive(steady::time_point deadline, bool& timed_out) {
        timed_out = false;
        while (true) {
            if (const auto nl = buffer_.find('\n'); nl != std::string::npos) {
                std::string line = buffer_.substr(0, nl);
                buffer_.erase(0, nl + 1);
                return line;
            }
            const auto left =
                std::chrono::ceil<std::chrono::milliseconds>(deadline - steady::now());
            if (left <= 0ms) {
                timed_out = true;
                return std::nullopt;
            }
            pollfd p{from_, POLLIN, 0};
            const int ready =
                ::poll(&p, 1, static_cast<int>(std::min<std::int64_t>(left.count(), 1000)));
            if (ready < 0 && errno != EINTR) return std::nullopt;
            if (ready <= 0) continue;
            char chunk[65536];
            const auto n = ::read(from_, chunk, sizeof chunk);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) return std::nullopt;
            buffer_.append(chunk, static_cast<std::size_t>(n));
        }
    }

    void kill() {
        if (pid_ > 0 && !exited_) ::kill(pid_, SIGKILL);
    }

    /// Waits until `deadline` for the exit (then kills); describes how the child ended:
    /// "exit 0", "exit 1", "signal 9", ...
    std::string wait(steady::time_point deadline) {
        while (!reap(false) && steady::now() < deadline)
            std::this_thread::sleep_for(10ms);
        if (!exited_) {
            kill();
            reap(true);
            return "hung (killed)";
        }
        return how_;
    }

private:
    bool reap(bool block) {
        if (pid_ <= 0 || exited_) return exited_;
        int status = 0;
        pid_t got = 0;
        do
            got = ::waitpid(pid_, &status, block ? 0 : WNOHANG);
        while (got < 0 && errno == EINTR);
        if (got != pid_) return false;
        exited_ = true;
        if (WIFEXITED(status)) how_ = "exit " + std::to_string(WEXITSTATUS(status));
        if (WIFSIGNALED(status)) how_ = "signal " + std::to_string(WTERMSIG(status));
        return true;
    }
    void close_pipes() {
        if (to_ >= 0) ::close(to_);
        if (from_ >= 0) ::close(from_);
        to_ = from_ = -1;
    }

    pid_t pid_ = -1;
    int to_ = -1;
    int from_ = -1;
    bool exited_ = false;
    std::string how_;
    std::string buffer_;
};

/// One child's report of its round.
struct report {
    std::string status;
    steady::duration elapsed{};
    allreduce_result result;
    std::vector<float> values;
};

/// Reads RESULT ... END; nullopt (with `why`) if the child ended or wrote something else.
std::optional<report> receive_report(child_process& child, steady::time_point deadline,
                                     std::string& why) {
    bool timed_out = false;
    auto next = [&]() -> std::optional<std::string> {
        auto line = child.receive(deadline, timed_out);
        if (!line) why = timed_out ? "no report by the deadline" : "ended without a report";
        return line;
    };
    auto line = next();
    if (!line) return std::nullopt;
    report out;
    {
        std::istringstream in(*line);
        std::string word, participants;
        long long elapsed_us = 0;
        if (!(in >> word >> out.status >> elapsed_us >> out.result.elements_averaged >>
              out.result.elements_total >> participants) ||
            word != "RESULT") {
            why = "not a RESULT line: " + line->substr(0, 200);
            return std::nullopt;
        }
        out.elapsed = std::chrono::microseconds(elapsed_us);
        auto bits = parse_bits(participants);
        if (!bits) {
            why = "bad participants";
            return std::nullopt;
        }
        out.result.participants = std::move(*bits);
    }
    while ((line = next())) {
        std::istringstream in(*line);
        std::string word;
        in >> word;
        if (word == "PART") {
            part_outcome part;
            std::string contributors;
            if (!(in >> part.begin >> part.size >> part.reducer >> contributors)) break;
            auto bits = parse_bits(contributors);
            if (!bits) break;
            part.contributors = std::move(*bits);
            out.result.parts.push_back(std::move(part));
        } else if (word == "VALUES") {
            std::string hex;
            while (in >> hex) {
                const auto bits = static_cast<std::uint32_t>(std::stoul(hex, nullptr, 16));
                float v = 0;
                std::memcpy(&v, &bits, sizeof v);
                out.values.push_back(v);
            }
        } else if (word == "END") {
            return out;
        } else {
            break;
        }
    }
    if (why.empty()) why = "malformed report line: " + line.value_or("").substr(0, 200);
    return std::nullopt;
}

/// The expected value of element e under `who`: the weighted mean of their initial values.
double mean_of(const std::vector<member_values>& initial, std::size_t e,
               const std::vector<bool>& who) {
    double sum = 0, weights = 0;
    for (std::size_t j = 0; j < who.size(); ++j)
        if (who[j]) {
            sum += initial[j].weight * static_cast<double>(initial[j].values[e]);
            weights += initial[j].weight;
        }
    return sum / weights;
}

/// What a wrong value is, for the failure message: the sum of w_j x_j over the members of
/// one set divided by the weights of another (equal sets: a plain mean), or nothing known.
std::string explain(const std::vector<member_values>& initial, std::size_t e, float value) {
    std::string out;
    for (unsigned summed = 1; summed < (1u << group_size); ++summed)
        for (unsigned weighed = 1; weighed < (1u << group_size); ++weighed) {
            double sum = 0, weights = 0;
            for (std::size_t j = 0; j < group_size; ++j) {
                if (summed >> j & 1)
                    sum += initial[j].weight * static_cast<double>(initial[j].values[e]);
                if (weighed >> j & 1) weights += initial[j].weight;
            }
            if (std::abs(value - sum / weights) > 1e-6 * std::abs(value)) continue;
            std::vector<bool> a(group_size), b(group_size);
            for (std::size_t j = 0; j < group_size; ++j) {
                a[j] = summed >> j & 1;
                b[j] = weighed >> j & 1;
            }
            out += summed == weighed
                       ? " the mean of " + bits_of(a)
                       : " the sum of " + bits_of(a) + " over the weights of " + bits_of(b);
        }
    return out.empty() ? " not a (mis)weighted mean of any members" : out;
}

/// Every element of member i is the mean its part names, or its own initial value.
void check_consistent(const std::vector<member_values>& initial, std::size_t i, const report& r) {
    REQUIRE(r.values.size() == elements);
    std::size_t covered = 0;
    for (const auto& part : r.result.parts) {
        REQUIRE(part.begin == covered);
        REQUIRE(part.begin + part.size <= elements);
        REQUIRE((part.contributors.empty() || part.contributors.size() == group_size));
        covered += part.size;
        for (std::size_t e = part.begin; e < part.begin + part.size; ++e) {
            INFO("peer " << i << " element " << e << " reducer " << part.reducer);
            if (!part.averaged()) {
                REQUIRE(r.values[e] == initial[i].values[e]);
                continue;
            }
            const double want = mean_of(initial, e, part.contributors);
            if (std::abs(r.values[e] - want) > 1e-6 * std::abs(want))
                FAIL("value " << r.values[e] << ", want " << want << " (the mean of "
                              << bits_of(part.contributors) << ", as the part says); the value is"
                              << explain(initial, e, r.values[e]));
        }
    }
    REQUIRE(covered == elements);
}

std::vector<bool> all_but(std::size_t excluded) {
    std::vector<bool> out(group_size, true);
    out[excluded] = false;
    return out;
}

double seconds(steady::duration d) {
    return std::chrono::duration<double>(d).count();
}

timings configured_timings() {
    timings t;
    if (const char* text = std::getenv("HIVEMESH_FAULTS_TIME_SCALE")) {
        t.scale = std::atof(text);
        if (!(t.scale > 0)) t.scale = 1;
    }
    return t;
}

void run_case(std::size_t case_index, fault kind, std::size_t victim, const timings& times) {
    const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
    std::vector<member_values> initial;
    for (std::size_t i = 0; i < group_size; ++i)
        initial.push_back(initial_values(case_index, i));

    // Destroyed before any other way out of this function: no child outlives it.
    std::deque<child_process> children;
    for (std::size_t i = 0; i < group_size; ++i)
        children.emplace_back(
            std::vector<std::string>{self, "--child", std::to_string(::getpid()),
                                     std::to_string(case_index), std::to_string(i), to_string(kind),
                                     std::to_string(victim), std::to_string(times.scale)});

    // Start-up under ASan on a loaded machine can take seconds.
    const auto setup_deadline = steady::now() + times.of(60s);
    auto expect = [&](std::size_t i, const std::string& what) {
        bool timed_out = false;
        auto line = children[i].receive(setup_deadline, timed_out);
        INFO("peer " << i << (timed_out ? " timed out" : " ended") << " waiting for " << what);
        REQUIRE(line);
        return *line;
    };
    std::string peers = "PEERS";
    for (std::size_t i = 0; i < group_size; ++i) {
        std::istringstream hello(expect(i, "HELLO"));
        std::string word, id;
        unsigned port = 0;
        REQUIRE((hello >> word >> id >> port));
        REQUIRE(word == "HELLO");
        CHECK(id == identity_of(static_cast<std::uint8_t>(i + 1)).id().to_string());
        CHECK((port == 0) == (i == client));
        peers += " " + id + " " + std::to_string(port);
    }
    for (auto& child : children)
        REQUIRE(child.send(peers));
    for (std::size_t i = 0; i < group_size; ++i)
        REQUIRE(expect(i, "READY") == "READY");

    if (kind == fault::fail_before) { // dead, port closed, before anyone starts
        children[victim].kill();
        REQUIRE(children[victim].wait(steady::now() + 10s) == "signal 9");
    }
    for (std::size_t i = 0; i < group_size; ++i)
        if (!(i == victim && kind == fault::fail_before)) REQUIRE(children[i].send("GO"));

    // Every report is due by the round deadline; the slack covers reporting and start-up.
    const auto report_deadline = steady::now() + times.round_timeout() + times.of(30s);
    std::vector<std::optional<report>> reports(group_size);
    for (std::size_t i = 0; i < group_size; ++i) {
        if (i == victim && kind == fault::fail_before) continue;
        std::string why;
        reports[i] = receive_report(children[i], report_deadline, why);
        if (i == victim && kills_victim(kind)) {
            INFO("the victim was to die at the hook, but it reported");
            CHECK_FALSE(reports[i]);
            continue;
        }
        INFO("peer " << i << ": " << why);
        REQUIRE(reports[i]);
    }
    for (auto& child : children)
        child.send("EXIT"); // fails harmlessly for the dead
    const auto exit_deadline = steady::now() + times.of(30s);
    for (std::size_t i = 0; i < group_size; ++i) {
        INFO("peer " << i);
        const auto how = children[i].wait(exit_deadline);
        if (i == victim && kills_victim(kind))
            CHECK(how == "signal 9"); // killed by its own hook (or by us, for fail_before)
        else
            CHECK(how == "exit 0");
    }

    std::ostringstream peer_lines; // how each ended, for the log, before any check stops us
    peer_lines << "allreduce_faults: " << to_string(kind) << ", victim " << victim;
    for (std::size_t i = 0; i < group_size; ++i) {
        peer_lines << "\n  peer " << i << ": ";
        if (!reports[i]) {
            peer_lines << "died";
            continue;
        }
        const auto& r = *reports[i];
        peer_lines << r.status << " after " << seconds(r.elapsed) << " s, "
                   << 100 * r.result.fraction_averaged() << "% averaged";
    }
    std::cerr << peer_lines.str() << '\n';

    for (std::size_t i = 0; i < group_size; ++i) {
        if (!reports[i]) continue;
        const auto& r = *reports[i];
        INFO("peer " << i << " finished after " << seconds(r.elapsed) << " s, status " << r.status
                     << ", averaged " << r.result.fraction_averaged());
        CHECK(r.elapsed <= times.round_timeout());
        // Nobody healthy waits much longer than the reducer timeout; a canceller stops at once.
        const bool slow_victim =
            i == victim && (kind == fault::slow_sending || kind == fault::slow_reducing);
        if (!slow_victim) CHECK(r.elapsed <= times.healthy_limit());
        if (i == victim && kind == fault::cancel)
            CHECK(r.status == "cancelled");
        else
            CHECK(r.status == "ok");
        CHECK(r.result.elements_total == elements);
        check_consistent(initial, i, r);
        if (i != victim) CHECK(r.result.fraction_averaged() > 0.5);
    }
    // Part q of a span is (begin % 1250) / 250.
    const auto part_index = [](const part_outcome& part) {
        return (part.begin % span_elements) / part_elements;
    };
    if (kind == fault::slow_sending) {
        // Parts 0 and 1 came in time and include the victim; later ones do not.
        for (std::size_t i = 0; i < group_size; ++i) {
            if (i == victim) continue;
            for (const auto& part : reports[i]->result.parts) {
                INFO("peer " << i << " part at " << part.begin);
                REQUIRE(part.averaged());
                if (part.reducer == victim) continue; // it reduced its own span fully
                CHECK(part.contributors[victim] == (part_index(part) < 2));
            }
        }
    }
    if (kind == fault::slow_reducing) {
        // Part 0 of the victim's span came back in time, parts 1-4 stayed local.
        for (std::size_t i = 0; i < group_size; ++i) {
            if (i == victim) continue;
            INFO("peer " << i);
            CHECK(reports[i]->result.fraction_averaged() == 0.8);
            for (const auto& part : reports[i]->result.parts)
                CHECK(part.averaged() == (part.reducer != victim || part_index(part) == 0));
        }
        // The victim itself averaged its whole span, slowly, within its deadline.
        CHECK(reports[victim]->result.fraction_averaged() == 1.0);
        CHECK(reports[victim]->elapsed >= 4 * times.slow_reduce_delay());
    }
    if (kind == fault::fail_before) {
        // Exactly: the victim's span (if it had one) stayed local, the rest is the mean of
        // everyone else.
        for (std::size_t i = 0; i < group_size; ++i) {
            if (i == victim) continue;
            INFO("peer " << i);
            CHECK(reports[i]->result.participants == all_but(victim));
            CHECK(reports[i]->result.fraction_averaged() == (victim == client ? 1.0 : 0.75));
        }
    }
}

} // namespace

TEST_CASE("allreduce faults over TCP processes (5 peers, one a client): healthy peers finish "
          "by their deadline and every element ends averaged or local, as the result says",
          "[allreduce][faults][tcp]") {
    const auto times = configured_timings();
    std::size_t case_index = 0;
    for (const auto kind : all_faults) {
        const bool reducing_fault = kind == fault::fail_reducing || kind == fault::slow_reducing;
        for (const std::size_t victim : {std::size_t{1}, client}) {
            ++case_index;
            if (reducing_fault && victim == client) continue; // a client reduces nothing
            DYNAMIC_SECTION(to_string(kind) << ", victim " << victim) {
                const auto started = steady::now();
                run_case(case_index, kind, victim, times);
                std::cerr << "  (" << seconds(steady::now() - started)
                          << " s with start and exit)\n";
            }
        }
    }
}

} // namespace hivemesh::test

int main(int argc, char** argv) {
    if (argc > 1 && std::string_view(argv[1]) == "--child") {
        const auto arguments = hivemesh::test::parse_child(argc, argv);
        if (!arguments) {
            std::cerr << "allreduce_faults: bad --child arguments\n";
            return 2;
        }
        try {
            return hivemesh::test::child_main(*arguments);
        } catch (const std::exception& e) {
            std::cerr << "allreduce_faults: peer " << arguments->index << ": " << e.what() << '\n';
            return 1;
        }
    }
    std::signal(SIGPIPE, SIG_IGN); // a dead child's pipe is a write error, not our death
    return Catch::Session().run(argc, argv);
}
