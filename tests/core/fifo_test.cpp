#include <hivemesh/core/fifo.hpp>
#include <hivemesh/core/random.hpp>

#include <catch2/catch.hpp>

#include <deque>
#include <memory>
#include <vector>

using hivemesh::fifo;

namespace {

/// Movable, not default-constructible and not assignable, as Asio's channel payloads.
struct payload {
    explicit payload(int v)
        : value(std::make_unique<int>(v)) {}
    payload(payload&&) noexcept = default;
    payload& operator=(payload&&) = delete;
    std::unique_ptr<int> value;
};

template <class T>
std::vector<T> contents(const fifo<T>& q) {
    return {q.begin(), q.end()};
}

} // namespace

TEST_CASE("fifo: first in, first out, against std::deque", "[core][fifo]") {
    hivemesh::random_generator random(7);
    fifo<int> q;
    std::deque<int> oracle;
    int next = 0;
    for (int step = 0; step < 20000; ++step) {
        // Phases that grow and drain, so the storage fills, compacts and empties.
        const bool grow = (step / 500) % 2 == 0;
        if (oracle.empty() || random.uniform(10) < (grow ? 7u : 3u)) {
            q.push_back(next);
            oracle.push_back(next++);
        } else {
            REQUIRE(q.front() == oracle.front());
            q.pop_front();
            oracle.pop_front();
        }
        REQUIRE(q.size() == oracle.size());
        REQUIRE(q.empty() == oracle.empty());
    }
    CHECK(contents(q) == std::vector<int>(oracle.begin(), oracle.end()));
    q.clear();
    CHECK(q.empty());
    CHECK(q.begin() == q.end());
}

TEST_CASE("fifo: pop_front releases what the element holds", "[core][fifo]") {
    fifo<std::shared_ptr<int>> q;
    auto shared = std::make_shared<int>(1);
    q.push_back(shared);
    q.push_back(std::make_shared<int>(2));
    CHECK(shared.use_count() == 2);
    q.pop_front();
    CHECK(shared.use_count() == 1);
    CHECK(*q.front() == 2);
}

TEST_CASE("fifo: erase removes every equal element and keeps the order", "[core][fifo]") {
    fifo<int> q;
    for (int v : {1, 2, 3, 2, 4})
        q.push_back(v);
    q.pop_front();
    CHECK(q.erase(2) == 2);
    CHECK(contents(q) == std::vector<int>{3, 4});
    CHECK(q.erase(9) == 0);
    CHECK(q.erase(3) == 1);
    CHECK(q.erase(4) == 1);
    CHECK(q.empty());
}

TEST_CASE("fifo: a queue moved from is empty", "[core][fifo]") {
    fifo<int> q;
    for (int v : {1, 2, 3})
        q.push_back(v);
    q.pop_front();
    fifo<int> moved(std::move(q));
    CHECK(contents(moved) == std::vector<int>{2, 3});
    CHECK(q.empty()); // NOLINT(bugprone-use-after-move): what the test is about
    CHECK(q.size() == 0);
    q.push_back(7);
    fifo<int> assigned;
    assigned = std::move(moved);
    CHECK(contents(assigned) == std::vector<int>{2, 3});
    CHECK(moved.empty()); // NOLINT(bugprone-use-after-move)
    CHECK(contents(q) == std::vector<int>{7});
}

TEST_CASE("fifo: elements that can only be moved", "[core][fifo]") {
    fifo<payload> q;
    for (int round = 0; round < 3; ++round) {
        for (int v = 0; v < 40; ++v)
            q.emplace_back(v);
        for (int v = 0; v < 30; ++v) {
            REQUIRE(*q.front().value == v);
            q.pop_front();
        }
        for (int v = 40; v < 50; ++v)
            q.push_back(payload(v));
        for (int v = 30; v < 50; ++v) {
            REQUIRE(*q.front().value == v);
            q.pop_front();
        }
        CHECK(q.empty());
    }
}
