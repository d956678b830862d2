# Settings for hivemesh's own tests, benchmarks and examples (never for consumers).

# hivemesh_developer_target(<target>): warnings (as errors with HIVEMESH_WERROR) and the
# sanitizers chosen with HIVEMESH_SANITIZE.
function(hivemesh_developer_target target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic)
  if(HIVEMESH_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
  if(HIVEMESH_SANITIZE)
    target_compile_options(${target} PRIVATE -fsanitize=${HIVEMESH_SANITIZE}
                           -fno-sanitize-recover=all -fno-omit-frame-pointer)
    target_link_options(${target} PRIVATE -fsanitize=${HIVEMESH_SANITIZE})
    # clang 14's function sanitizer cannot assemble coroutine frames ("Cannot represent a
    # difference across sections").
    if(CMAKE_CXX_COMPILER_ID MATCHES "Clang")
      target_compile_options(${target} PRIVATE -fno-sanitize=function)
    endif()
  endif()
endfunction()

# hivemesh_quiet_gcc_flow_warnings(<target>): g++ 12's flow-based warnings misfire inside
# libstdc++ and Asio on values held in coroutine frames under optimisation
# (-Wmaybe-uninitialized on std::pair<error_code, dht::key_entry>, -Wstringop-overread on
# vector<std::byte> compares, -Wmismatched-new-delete on Asio's awaitable frame allocator,
# -Wmaybe-uninitialized inside asio::use_future at -O1); for targets that instantiate the
# DHT value paths from coroutines or post with use_future. clang checks them all.
function(hivemesh_quiet_gcc_flow_warnings target)
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    target_compile_options(${target} PRIVATE -Wno-maybe-uninitialized -Wno-stringop-overread
                           -Wno-mismatched-new-delete)
  endif()
endfunction()

# hivemesh_swarm_target(<target>): HIVEMESH_SWARM_FLAGS for a target whose code the swarm-scale
# simulations spend their time in (hivemesh::compiled and the test programs marked SWARM), so
# that a build of unoptimised tests, quicker to compile, still runs those at optimised speed.
function(hivemesh_swarm_target target)
  separate_arguments(flags UNIX_COMMAND "${HIVEMESH_SWARM_FLAGS}")
  target_compile_options(${target} PRIVATE ${flags})
endfunction()

find_program(HIVEMESH_CCACHE ccache)
if(HIVEMESH_CCACHE AND NOT CMAKE_CXX_COMPILER_LAUNCHER)
  set(CMAKE_CXX_COMPILER_LAUNCHER "${HIVEMESH_CCACHE}" CACHE STRING "" FORCE)
endif()
