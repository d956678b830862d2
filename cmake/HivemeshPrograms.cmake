# The benchmark and example programs' command lines (CLI11) and JSON reports (nlohmann-json),
# found once for both folders and never a dependency of the library or the consumer tests.
# hivemesh_programs: an interface target with both and examples/common (program.hpp).

find_package(CLI11 CONFIG QUIET)
if(NOT TARGET CLI11::CLI11)
  message(FATAL_ERROR "hivemesh's benchmarks and examples need CLI11 (Debian: libcli11-dev); "
                      "install it (scripts/install-deps.sh) or configure with "
                      "-DHIVEMESH_BUILD_BENCHMARKS=OFF -DHIVEMESH_BUILD_EXAMPLES=OFF")
endif()
find_package(nlohmann_json 3 CONFIG QUIET)
if(NOT TARGET nlohmann_json::nlohmann_json)
  message(FATAL_ERROR "hivemesh's benchmarks and examples need nlohmann-json 3 (Debian: "
                      "nlohmann-json3-dev); install it (scripts/install-deps.sh) or configure "
                      "with -DHIVEMESH_BUILD_BENCHMARKS=OFF -DHIVEMESH_BUILD_EXAMPLES=OFF")
endif()

add_library(hivemesh_programs INTERFACE)
target_link_libraries(hivemesh_programs INTERFACE CLI11::CLI11 nlohmann_json::nlohmann_json)
target_include_directories(hivemesh_programs INTERFACE ${PROJECT_SOURCE_DIR}/examples/common)
