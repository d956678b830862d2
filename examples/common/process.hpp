// Child processes for the programs that start others (the trainer's peers, the Moshpit swarm
// demo's ranks, the thesis matrix's trainer runs), and gnuplot for their charts.
#pragma once

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

extern char** environ;

namespace hivemesh::program {

/// Where a child's standard streams go.
struct child_stdio {
    bool stdin_pipe = false;       ///< stdin is a pipe this process writes; else /dev/null
    bool stdout_pipe = false;      ///< stdout is a pipe this process reads; else stdout_file
    std::string stdout_file;       ///< truncated first; empty: inherited
    std::string stderr_file;       ///< appended to; empty: inherited
    bool stderr_to_stdout = false; ///< stderr goes where stdout goes (stderr_file is ignored)
};

/// A started child: its pid and this process's ends of its pipes (-1 where there is none;
/// both close on exec).
struct child_process {
    pid_t pid = -1;
    int stdin_fd = -1;
    int stdout_fd = -1;
};

/// Starts `program` (looked up in PATH when it has no '/') with `args` after argv[0], its
/// streams as `stdio` says. Throws std::system_error when it cannot, naming the program; a
/// program that is not there is std::errc::no_such_file_or_directory.
inline child_process spawn(const std::string& program, const std::vector<std::string>& args,
                           const child_stdio& stdio) {
    int in[2] = {-1, -1}, out[2] = {-1, -1};
    const auto close_all = [&] {
        for (int fd : {in[0], in[1], out[0], out[1]})
            if (fd >= 0) close(fd);
    };
    if ((stdio.stdin_pipe && pipe2(in, O_CLOEXEC) != 0) ||
        (stdio.stdout_pipe && pipe2(out, O_CLOEXEC) != 0)) {
        const int error = errno;
        close_all();
        throw std::system_error(error, std::generic_category(), "cannot make a pipe");
    }
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    if (stdio.stdin_pipe)
        posix_spawn_file_actions_adddup2(&actions, in[0], STDIN_FILENO);
    else
        posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
    if (stdio.stdout_pipe)
        posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
    else if (!stdio.stdout_file.empty())
        posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, stdio.stdout_file.c_str(),
                                         O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (stdio.stderr_to_stdout)
        posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
    else if (!stdio.stderr_file.empty())
        posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, stdio.stderr_file.c_str(),
                                         O_WRONLY | O_CREAT | O_APPEND, 0644);
    std::vector<std::string> all{program};
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : all)
        argv.push_back(a.data());
    argv.push_back(nullptr);
    child_process child;
    const int failed =
        posix_spawnp(&child.pid, program.c_str(), &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (failed != 0) {
        close_all();
        throw std::system_error(failed, std::generic_category(), "cannot start " + program);
    }
    if (in[0] >= 0) close(in[0]);
    if (out[1] >= 0) close(out[1]);
    child.stdin_fd = in[1];
    child.stdout_fd = out[0];
    return child;
}

/// Waits for the child to end; its status as waitpid gives it.
inline int wait_for(pid_t pid) {
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    return status;
}

/// Runs gnuplot on `script`, its messages going to `log`. Returns why there are no charts
/// (gnuplot missing or failing), or nothing when it drew them.
inline std::optional<std::string> run_gnuplot(const std::filesystem::path& script,
                                              const std::filesystem::path& log) {
    std::error_code ignored;
    std::filesystem::remove(log, ignored);
    try {
        child_stdio stdio;
        stdio.stdout_file = "/dev/null";
        stdio.stderr_file = log.string();
        const auto child = spawn("gnuplot", {script.string()}, stdio);
        const int status = wait_for(child.pid);
        if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return std::nullopt;
        return "gnuplot failed: see " + log.string();
    } catch (const std::system_error& e) {
        if (e.code() == std::errc::no_such_file_or_directory)
            return "gnuplot not found (Debian: gnuplot-nox): no charts";
        return std::string(e.what()) + ": no charts";
    }
}

} // namespace hivemesh::program
