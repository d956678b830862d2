#include <hivemesh/core/log.hpp>

#include <catch2/catch.hpp>

#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace hlog = hivemesh::log;
using hlog::level;

namespace {

// Restores the global logging state when a test ends, however it ends.
class log_state_guard {
public:
    log_state_guard() {
        // There is no getter for the threshold: find it by probing.
        for (const level l :
             {level::trace, level::debug, level::info, level::warning, level::error}) {
            if (hlog::enabled(l)) {
                threshold_ = l;
                return;
            }
        }
    }
    ~log_state_guard() {
        hlog::set_sink({});
        hlog::set_level(threshold_);
    }
    log_state_guard(const log_state_guard&) = delete;
    log_state_guard& operator=(const log_state_guard&) = delete;

private:
    level threshold_ = level::off;
};

struct record {
    level lvl;
    std::string component;
    std::string message;
};

// Installs a sink that appends to `out`.
void capture_into(std::vector<record>& out) {
    hlog::set_sink([&out](level l, std::string_view component, std::string_view message) {
        out.push_back({l, std::string(component), std::string(message)});
    });
}

// Counts how often it is formatted.
struct counted {
    int* formats;
    friend std::ostream& operator<<(std::ostream& os, const counted& c) {
        ++*c.formats;
        return os << "counted";
    }
};

// Redirects std::cerr into a string for the lifetime of the object.
class cerr_capture {
public:
    cerr_capture()
        : old_(std::cerr.rdbuf(text_.rdbuf())) {}
    ~cerr_capture() { std::cerr.rdbuf(old_); }
    cerr_capture(const cerr_capture&) = delete;
    cerr_capture& operator=(const cerr_capture&) = delete;
    std::string str() const { return text_.str(); }

private:
    std::ostringstream text_;
    std::streambuf* old_;
};

} // namespace

TEST_CASE("level names", "[core][log]") {
    CHECK(std::string(hlog::to_string(level::trace)) == "trace");
    CHECK(std::string(hlog::to_string(level::debug)) == "debug");
    CHECK(std::string(hlog::to_string(level::info)) == "info");
    CHECK(std::string(hlog::to_string(level::warning)) == "warning");
    CHECK(std::string(hlog::to_string(level::error)) == "error");
    CHECK(std::string(hlog::to_string(level::off)) == "off");
}

TEST_CASE("a custom sink receives level, component and formatted message", "[core][log]") {
    const log_state_guard guard;
    std::vector<record> got;
    capture_into(got);
    hlog::set_level(level::trace);

    hlog::write(level::trace, "core", "t");
    hlog::debug("dht", "lookup of ", 3, " keys");
    hlog::info("net", "x=", 5, ' ', 2.5);
    hlog::warning("averaging", std::string("peer "), "gone");
    hlog::error("optim", -1);
    hlog::info("empty");

    REQUIRE(got.size() == 6);
    CHECK(got[0].lvl == level::trace);
    CHECK(got[0].component == "core");
    CHECK(got[0].message == "t");
    CHECK(got[1].lvl == level::debug);
    CHECK(got[1].component == "dht");
    CHECK(got[1].message == "lookup of 3 keys");
    CHECK(got[2].lvl == level::info);
    CHECK(got[2].component == "net");
    CHECK(got[2].message == "x=5 2.5");
    CHECK(got[3].lvl == level::warning);
    CHECK(got[3].component == "averaging");
    CHECK(got[3].message == "peer gone");
    CHECK(got[4].lvl == level::error);
    CHECK(got[4].component == "optim");
    CHECK(got[4].message == "-1");
    CHECK(got[5].lvl == level::info);
    CHECK(got[5].component == "empty");
    CHECK(got[5].message.empty());
}

TEST_CASE("messages below the threshold are dropped", "[core][log]") {
    const log_state_guard guard;
    std::vector<record> got;
    capture_into(got);

    hlog::set_level(level::warning);
    CHECK_FALSE(hlog::enabled(level::trace));
    CHECK_FALSE(hlog::enabled(level::debug));
    CHECK_FALSE(hlog::enabled(level::info));
    CHECK(hlog::enabled(level::warning));
    CHECK(hlog::enabled(level::error));
    hlog::debug("c", "d");
    hlog::info("c", "i");
    hlog::warning("c", "w");
    hlog::error("c", "e");
    REQUIRE(got.size() == 2);
    CHECK(got[0].message == "w");
    CHECK(got[1].message == "e");

    got.clear();
    hlog::set_level(level::error);
    hlog::warning("c", "w");
    hlog::error("c", "e");
    REQUIRE(got.size() == 1);
    CHECK(got[0].lvl == level::error);

    got.clear();
    hlog::set_level(level::off);
    CHECK_FALSE(hlog::enabled(level::error));
    hlog::error("c", "e");
    CHECK(got.empty());

    // `off` is a threshold, never a message level.
    hlog::set_level(level::trace);
    CHECK_FALSE(hlog::enabled(level::off));
    hlog::write(level::off, "c", "never");
    CHECK(got.empty());
}

TEST_CASE("messages below the threshold are not formatted", "[core][log]") {
    const log_state_guard guard;
    std::vector<record> got;
    capture_into(got);
    int formats = 0;
    const counted c{&formats};

    hlog::set_level(level::info);
    hlog::debug("c", c);
    hlog::write(level::trace, "c", c, c);
    CHECK(formats == 0);
    CHECK(got.empty());

    hlog::info("c", c, " and ", c);
    CHECK(formats == 2);
    REQUIRE(got.size() == 1);
    CHECK(got[0].message == "counted and counted");

    hlog::set_level(level::off);
    hlog::error("c", c);
    CHECK(formats == 2);
}

TEST_CASE("set_sink({}) restores the standard error sink", "[core][log]") {
    const log_state_guard guard;
    hlog::set_level(level::info);
    std::vector<record> got;
    const cerr_capture err;

    capture_into(got);
    hlog::warning("net", "to the sink");
    CHECK(got.size() == 1);
    CHECK(err.str().empty());

    hlog::set_sink({});
    hlog::warning("net", "to stderr ", 42);
    hlog::info("dht", "also");
    hlog::debug("dht", "dropped");
    CHECK(got.size() == 1); // the old sink is no longer called
    CHECK(err.str() == "[hivemesh warning] net: to stderr 42\n"
                       "[hivemesh info] dht: also\n");

    // An empty std::function is the same as {}.
    capture_into(got);
    hlog::set_sink(hlog::sink{});
    hlog::error("x", "y");
    CHECK(got.size() == 1);
    CHECK(err.str().size() > 0);
    CHECK(err.str().substr(err.str().rfind('[')) == "[hivemesh error] x: y\n");
}

TEST_CASE("calls into the sink are serialised", "[core][log]") {
    const log_state_guard guard;
    hlog::set_level(level::info);
    long calls = 0; // deliberately not atomic: the logger's mutex protects it
    std::size_t chars = 0;
    hlog::set_sink([&](level, std::string_view, std::string_view message) {
        ++calls;
        chars += message.size();
    });
    constexpr int per_thread = 5000;
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t)
        threads.emplace_back([] {
            for (int i = 0; i < per_thread; ++i)
                hlog::info("mt", "abc", 1);
        });
    for (auto& t : threads)
        t.join();
    CHECK(calls == 4 * per_thread);
    CHECK(chars == 4u * per_thread * 4u);
}
