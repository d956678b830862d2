// A first-in first-out queue that allocates nothing until its first push. libstdc++'s
// std::deque allocates about 600 bytes when it is made, and a connection holds several
// queues that are empty almost all the time (a DHT node keeps dozens of connections).
#pragma once

#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

namespace hivemesh {

/// A queue over one vector: pop_front() moves a head index, and the live elements move down
/// when a push would otherwise grow storage that is at least half popped. Pushing
/// invalidates references, as for std::vector. Storage above `kept_capacity` elements is
/// released when the queue empties, so one burst does not hold memory for the connection's
/// lifetime.
template <class T>
class fifo {
public:
    using iterator = typename std::vector<T>::iterator;
    using const_iterator = typename std::vector<T>::const_iterator;

    static constexpr std::size_t kept_capacity = 16;

    fifo() = default;
    fifo(const fifo&) = default;
    fifo& operator=(const fifo&) = default;
    /// A queue moved from is empty.
    fifo(fifo&& other) noexcept
        : items_(std::move(other.items_))
        , head_(std::exchange(other.head_, 0)) {
        other.items_.clear();
    }
    fifo& operator=(fifo&& other) noexcept {
        items_ = std::move(other.items_);
        head_ = std::exchange(other.head_, 0);
        other.items_.clear();
        return *this;
    }

    bool empty() const noexcept { return head_ == items_.size(); }
    std::size_t size() const noexcept { return items_.size() - head_; }

    T& front() noexcept { return items_[head_]; }
    const T& front() const noexcept { return items_[head_]; }

    template <class... Args>
    T& emplace_back(Args&&... args) {
        // Drops the popped slots when they are at least half the storage (amortised O(1)).
        // Moved into fresh storage: T need not be assignable (Asio's channel payloads).
        if (head_ > 0 && items_.size() == items_.capacity() && 2 * head_ >= items_.size()) {
            std::vector<T> live;
            live.reserve(items_.capacity());
            for (auto it = begin(); it != end(); ++it)
                live.push_back(std::move(*it));
            items_.swap(live);
            head_ = 0;
        }
        return items_.emplace_back(std::forward<Args>(args)...);
    }
    void push_back(T value) { emplace_back(std::move(value)); }

    /// Removes the front element, releasing what it holds at once.
    void pop_front() {
        { [[maybe_unused]] T gone(std::move(items_[head_])); }
        if (++head_ == items_.size()) clear();
    }

    void clear() noexcept {
        head_ = 0;
        if (items_.capacity() > kept_capacity)
            std::vector<T>().swap(items_);
        else
            items_.clear();
    }

    /// Removes every element equal to `value`; returns how many.
    std::size_t erase(const T& value) {
        const auto first = std::remove(begin(), end(), value);
        const auto removed = static_cast<std::size_t>(end() - first);
        items_.erase(first, items_.end());
        if (empty()) clear();
        return removed;
    }

    iterator begin() noexcept { return items_.begin() + static_cast<std::ptrdiff_t>(head_); }
    iterator end() noexcept { return items_.end(); }
    const_iterator begin() const noexcept {
        return items_.begin() + static_cast<std::ptrdiff_t>(head_);
    }
    const_iterator end() const noexcept { return items_.end(); }

private:
    std::vector<T> items_;
    std::size_t head_ = 0;
};

} // namespace hivemesh
