// optim::collaborative_optimizer: taking and restoring its whole state, for checkpoints
// (included by optim/collaborative.hpp).
#pragma once

#include "hivemesh/optim/collaborative.hpp"

#include <asio/use_future.hpp>

#include <memory>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

namespace hivemesh::optim {

template <net::transport Transport>
checkpoint collaborative_optimizer<Transport>::state_dict() {
    if (running_in_this_thread(state_->executor))
        throw std::system_error(errc::wrong_thread,
                                "hivemesh::optim::collaborative_optimizer::state_dict on an io "
                                "thread: use async_state_dict");
    return async_state_dict(asio::use_future).get();
}

template <net::transport Transport>
void collaborative_optimizer<Transport>::load_state_dict(checkpoint state) {
    if (running_in_this_thread(state_->executor))
        throw std::system_error(errc::wrong_thread,
                                "hivemesh::optim::collaborative_optimizer::load_state_dict on an "
                                "io thread: use async_load_state_dict");
    async_load_state_dict(std::move(state), asio::use_future).get();
}

template <net::transport Transport>
asio::awaitable<std::pair<std::error_code, checkpoint>>
collaborative_optimizer<Transport>::take_checkpoint(shared_ptr st) {
    checkpoint c;
    if (st->closed) co_return std::pair{make_error_code(errc::cancelled), std::move(c)};
    if (st->stepping.exchange(true))
        co_return std::pair{make_error_code(errc::invalid_argument), std::move(c)};
    const detail::flag_release release{st->stepping};
    // A background update still changes the optimizer's state: the checkpoint has it applied.
    if (st->delayed_round) {
        step_report ignored;
        co_await apply_delayed(st, true, ignored);
    }
    auto copy = [&c, &self = *st] {
        c.run_id = self.options.run_id;
        c.epoch = self.epoch.load();
        c.optimizer = self.local.name();
        c.step_count = self.local.step_count();
        c.parameters = detail::copies_of(parameter_values(self));
        c.buffers = detail::copies_of(self.model.averaged);
        c.integer_buffers = integer_values(self);
        c.optimizer_state = detail::copies_of(self.local.state_tensors(self.params));
        if (self.outer) {
            c.outer_start = self.start_values;
            c.outer_state = detail::copies_of(self.outer->state_tensors(self.outer_params));
            c.outer_step_count = self.outer->step_count();
        }
    };
    co_await offload(st->compute, copy);
    co_return std::pair{std::error_code{}, std::move(c)};
}

template <net::transport Transport>
std::error_code collaborative_optimizer<Transport>::check_checkpoint(shared& st,
                                                                     const checkpoint& c) {
    const auto refuse = [](errc e, const std::string& why) {
        log::warning("optim", "checkpoint refused: ", why);
        return make_error_code(e);
    };
    if (c.run_id != st.options.run_id)
        return refuse(errc::invalid_argument,
                      "it is of run \"" + c.run_id + "\", not \"" + st.options.run_id + "\"");
    if (c.optimizer != st.local.name())
        return refuse(errc::invalid_argument,
                      "its local optimizer is " + c.optimizer + ", not " + st.local.name());
    if (!detail::same_sizes(parameter_values(st), c.parameters))
        return refuse(errc::size_mismatch, "its parameters differ in number or size");
    if (!detail::same_sizes(st.model.averaged, c.buffers) ||
        !detail::same_sizes(st.model.carried, c.integer_buffers))
        return refuse(errc::size_mismatch, "its buffers differ in number or size");
    if (!detail::same_sizes(st.local.state_tensors(st.params), c.optimizer_state))
        return refuse(errc::size_mismatch, "its local optimizer's state differs in number or size");
    if (st.outer) {
        if (!detail::same_sizes(st.start_values, c.outer_start) ||
            !detail::same_sizes(st.outer->state_tensors(st.outer_params), c.outer_state))
            return refuse(errc::size_mismatch, "its DiLoCo state differs in number or size");
    } else if (!c.outer_start.empty() || !c.outer_state.empty()) {
        return refuse(errc::size_mismatch, "it holds DiLoCo state, and this optimizer has none");
    }
    for (const auto* list :
         {&c.parameters, &c.buffers, &c.optimizer_state, &c.outer_start, &c.outer_state})
        if (!detail::all_finite(*list))
            return refuse(errc::corrupt_data, "it holds a value that is not finite");
    return {};
}

template <net::transport Transport>
asio::awaitable<std::error_code>
collaborative_optimizer<Transport>::restore_checkpoint(shared_ptr st, checkpoint c) {
    if (st->closed) co_return make_error_code(errc::cancelled);
    if (st->stepping.exchange(true)) co_return make_error_code(errc::invalid_argument);
    const detail::flag_release release{st->stepping};
    std::error_code ec;
    auto check = [&] { ec = check_checkpoint(*st, c); }; // a pass over every value
    co_await offload(st->compute, check);
    if (ec) co_return ec;
    // What is running would write over the restored state.
    co_await drop_delayed(st);
    co_await abandon(st->scheduled_round);
    co_await abandon(st->scheduled_state);
    auto restore = [&] {
        auto& self = *st;
        if ((ec = write_integers(self, c.integer_buffers))) return;
        for (std::size_t i = 0; i < self.params.size(); ++i)
            self.params[i].value.copy_from(c.parameters[i]);
        for (std::size_t i = 0; i < self.model.averaged.size(); ++i)
            self.model.averaged[i].copy_from(c.buffers[i]);
        const auto local_state = self.local.state_tensors(self.params);
        for (std::size_t i = 0; i < local_state.size(); ++i)
            local_state[i].copy_from(c.optimizer_state[i]);
        self.local.set_step_count(c.step_count);
        if (self.outer) {
            // Element by element: outer_params refer to these vectors.
            for (std::size_t i = 0; i < self.start_values.size(); ++i)
                self.start_values[i] = c.outer_start[i];
            const auto outer_state = self.outer->state_tensors(self.outer_params);
            for (std::size_t i = 0; i < outer_state.size(); ++i)
                outer_state[i].copy_from(c.outer_state[i]);
            self.outer->set_step_count(c.outer_step_count);
        }
    };
    co_await offload(st->compute, restore);
    if (ec) co_return ec;
    log::info("optim", "restored the checkpoint of epoch ", c.epoch, " (optimizer step ",
              c.step_count, ")");
    enter_epoch(*st, c.epoch);
    co_await publish_served_state(st);
    co_return std::error_code{};
}

} // namespace hivemesh::optim
