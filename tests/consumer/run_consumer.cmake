# Driver for the consumer tests registered in tests/consumer/CMakeLists.txt:
#   cmake -DMODE=<install|find_package|pkg_config|add_subdirectory> -DSETTINGS=<file>
#         -DCONFIG=<build type> -DWORK_DIR=<scratch dir> -DSOURCE_DIR=<tests/consumer>
#         -P run_consumer.cmake
# SETTINGS (written at configure time) holds the outer build's compiler, generator and
# paths as HM_<variable>. Every mode starts from an empty WORK_DIR, so a run never reuses
# the results of an earlier one.
cmake_minimum_required(VERSION 3.22)

foreach(_required MODE SETTINGS WORK_DIR SOURCE_DIR)
  if(NOT DEFINED ${_required})
    message(FATAL_ERROR "run_consumer.cmake: -D${_required}=... is required")
  endif()
endforeach()
include("${SETTINGS}")

# run(<command> <args...>): echoes the command and fails the test if it fails.
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE _result COMMAND_ECHO STDOUT)
  if(NOT _result STREQUAL "0")
    message(FATAL_ERROR "command failed (${_result})")
  endif()
endfunction()

# cache(<variable> <value>): adds an entry to the initial cache script given to the child
# project with `cmake -C`, so that paths and lists reach it without any quoting. Empty and
# NOTFOUND values are left out.
set(_init "")
function(cache name value)
  if(NOT "${value}" STREQUAL "" AND NOT "${value}" MATCHES "-NOTFOUND$")
    set(_init "${_init}set(${name} [==[${value}]==] CACHE STRING \"\")\n" PARENT_SCOPE)
  endif()
endfunction()
cache(CMAKE_CXX_COMPILER "${HM_CMAKE_CXX_COMPILER}")
cache(CMAKE_CXX_FLAGS "${HM_CMAKE_CXX_FLAGS}")
if(CONFIG)
  string(TOUPPER "${CONFIG}" _config_upper)
  cache(CMAKE_CXX_FLAGS_${_config_upper} "${HM_CMAKE_CXX_FLAGS_${_config_upper}}")
endif()
cache(CMAKE_CXX_COMPILER_LAUNCHER "${HM_CMAKE_CXX_COMPILER_LAUNCHER}")
cache(CMAKE_MAKE_PROGRAM "${HM_CMAKE_MAKE_PROGRAM}")
cache(CMAKE_BUILD_TYPE "${CONFIG}")
cache(Eigen3_DIR "${HM_Eigen3_DIR}")
cache(Torch_DIR "${HM_Torch_DIR}")
cache(CMAKE_FIND_USE_PACKAGE_REGISTRY OFF)

set(_generator_args -G "${HM_CMAKE_GENERATOR}")
if(HM_CMAKE_GENERATOR_PLATFORM)
  list(APPEND _generator_args -A "${HM_CMAKE_GENERATOR_PLATFORM}")
endif()
if(HM_CMAKE_GENERATOR_TOOLSET)
  list(APPEND _generator_args -T "${HM_CMAKE_GENERATOR_TOOLSET}")
endif()
set(_config_args "")
if(CONFIG)
  set(_config_args --config "${CONFIG}")
endif()
set(_ctest_config_args "")
if(CONFIG)
  set(_ctest_config_args -C "${CONFIG}")
endif()

# configure_build_run(<project dir>): configures the project with the cache entries
# collected so far, builds it and runs its own tests (a consumer project registers its
# program with add_test).
function(configure_build_run project_dir)
  set(_build "${WORK_DIR}/build")
  file(WRITE "${WORK_DIR}/init.cmake" "${_init}")
  run("${CMAKE_COMMAND}" ${_generator_args} -C "${WORK_DIR}/init.cmake" -S "${project_dir}"
      -B "${_build}")
  run("${CMAKE_COMMAND}" --build "${_build}" ${_config_args} --verbose)
  run("${CMAKE_CTEST_COMMAND}" --test-dir "${_build}" ${_ctest_config_args}
      --output-on-failure --no-tests=error)
endfunction()

# The default for an expectation the outer build did not set.
macro(default_on out value)
  if("${value}" STREQUAL "")
    set(${out} ON)
  else()
    set(${out} "${value}")
  endif()
endmacro()
default_on(_with_eigen "${HM_HIVEMESH_WITH_EIGEN}")
default_on(_with_torch "${HM_HIVEMESH_WITH_TORCH}")

# cache_backends(<WITH|EXPECT>): HIVEMESH_<word>_EIGEN and HIVEMESH_<word>_TORCH, as the outer
# build has HIVEMESH_WITH_EIGEN and HIVEMESH_WITH_TORCH.
macro(cache_backends word)
  cache(HIVEMESH_${word}_EIGEN ${_with_eigen})
  cache(HIVEMESH_${word}_TORCH ${_with_torch})
endmacro()

file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")

if(MODE STREQUAL "install")
  # Install this source tree into a fresh prefix, with only what a user would build.
  file(REMOVE_RECURSE "${HM_PREFIX}")
  set(_build "${WORK_DIR}/build")
  cache(CMAKE_INSTALL_PREFIX "${HM_PREFIX}")
  cache(CMAKE_PREFIX_PATH "${HM_CMAKE_PREFIX_PATH}")
  # hivemesh::compiled is left out: the test tree links it, and compiling it here would cost
  # every suite minutes for a package that is otherwise header-only.
  foreach(_option TESTS BENCHMARKS EXAMPLES FUZZERS COMPILED)
    cache(HIVEMESH_BUILD_${_option} OFF)
  endforeach()
  cache_backends(WITH)
  file(WRITE "${WORK_DIR}/init.cmake" "${_init}")
  run("${CMAKE_COMMAND}" ${_generator_args} -C "${WORK_DIR}/init.cmake"
      -S "${HM_PROJECT_SOURCE_DIR}" -B "${_build}")
  run("${CMAKE_COMMAND}" --build "${_build}" ${_config_args})
  run("${CMAKE_COMMAND}" --install "${_build}" ${_config_args})

  # Every public header is installed.
  file(GLOB_RECURSE _headers RELATIVE "${HM_PROJECT_SOURCE_DIR}/include"
       "${HM_PROJECT_SOURCE_DIR}/include/*")
  file(GLOB_RECURSE _installed RELATIVE "${HM_PREFIX}/include" "${HM_PREFIX}/include/*")
  list(SORT _headers)
  list(SORT _installed)
  if(NOT _headers STREQUAL _installed)
    message(FATAL_ERROR "installed headers differ from the source tree:\n"
                        "  source:    ${_headers}\n  installed: ${_installed}")
  endif()

  # The package files exist, and none points back into the source or build tree.
  set(_package_files "")
  foreach(_name hivemeshConfig.cmake hivemeshConfigVersion.cmake hivemeshTargets.cmake
                FindAsio.cmake FindSodium.cmake FindxxHash.cmake FindZstd.cmake
                HivemeshFindLibrary.cmake hivemesh.pc)
    file(GLOB_RECURSE _found "${HM_PREFIX}/${_name}")
    list(LENGTH _found _count)
    if(NOT _count EQUAL 1)
      message(FATAL_ERROR "expected one installed ${_name}, found ${_count}: ${_found}")
    endif()
    list(APPEND _package_files ${_found})
  endforeach()
  file(GLOB _backend_files "${HM_PREFIX}/*/cmake/hivemesh/hivemesh*Targets*.cmake"
       "${HM_PREFIX}/*/*/cmake/hivemesh/hivemesh*Targets*.cmake")
  list(APPEND _package_files ${_backend_files})
  foreach(_file IN LISTS _package_files)
    file(READ "${_file}" _text)
    foreach(_forbidden "${HM_PROJECT_SOURCE_DIR}/include" "${HM_PROJECT_SOURCE_DIR}/cmake"
                       "${_build}")
      string(FIND "${_text}" "${_forbidden}" _at)
      if(NOT _at EQUAL -1)
        message(FATAL_ERROR "${_file} refers to ${_forbidden}")
      endif()
    endforeach()
  endforeach()
  message(STATUS "hivemesh installed into ${HM_PREFIX}")

elseif(MODE STREQUAL "find_package")
  set(_prefix_path "${HM_PREFIX}")
  if(HM_CMAKE_PREFIX_PATH)
    string(APPEND _prefix_path ";${HM_CMAKE_PREFIX_PATH}")
  endif()
  cache(CMAKE_PREFIX_PATH "${_prefix_path}")
  cache(HIVEMESH_EXPECTED_PREFIX "${HM_PREFIX}")
  cache(HIVEMESH_EXPECTED_VERSION "${HM_PROJECT_VERSION}")
  cache_backends(EXPECT)
  configure_build_run("${SOURCE_DIR}/find_package")

elseif(MODE STREQUAL "add_subdirectory")
  cache(CMAKE_PREFIX_PATH "${HM_CMAKE_PREFIX_PATH}")
  cache(HIVEMESH_SOURCE_DIR "${HM_PROJECT_SOURCE_DIR}")
  cache_backends(WITH)
  configure_build_run("${SOURCE_DIR}/add_subdirectory")

elseif(MODE STREQUAL "pkg_config")
  if(NOT HM_HIVEMESH_PKG_CONFIG_EXECUTABLE)
    message("HIVEMESH-SKIP: pkg-config was not found when the tests were configured")
    return()
  endif()
  file(GLOB_RECURSE _pc "${HM_PREFIX}/hivemesh.pc")
  list(LENGTH _pc _count)
  if(NOT _count EQUAL 1)
    message(FATAL_ERROR "expected one installed hivemesh.pc, found: ${_pc}")
  endif()
  get_filename_component(_pc_dir "${_pc}" DIRECTORY)
  if("$ENV{PKG_CONFIG_PATH}" STREQUAL "")
    set(ENV{PKG_CONFIG_PATH} "${_pc_dir}")
  else()
    set(ENV{PKG_CONFIG_PATH} "${_pc_dir}:$ENV{PKG_CONFIG_PATH}")
  endif()

  # pkg_config(<out> <args...>): runs pkg-config on hivemesh and returns its output.
  function(pkg_config out)
    execute_process(COMMAND "${HM_HIVEMESH_PKG_CONFIG_EXECUTABLE}" ${ARGN} hivemesh
                    RESULT_VARIABLE _result OUTPUT_VARIABLE _output
                    OUTPUT_STRIP_TRAILING_WHITESPACE COMMAND_ECHO STDOUT)
    if(NOT _result STREQUAL "0")
      message(FATAL_ERROR "pkg-config ${ARGN} hivemesh failed (${_result})")
    endif()
    message(STATUS "pkg-config ${ARGN}: ${_output}")
    set(${out} "${_output}" PARENT_SCOPE)
  endfunction()
  pkg_config(_version --modversion)
  if(NOT _version STREQUAL HM_PROJECT_VERSION)
    message(FATAL_ERROR "hivemesh.pc says version ${_version}, expected ${HM_PROJECT_VERSION}")
  endif()
  pkg_config(_cflags --cflags)
  pkg_config(_libs --libs)
  string(FIND "${_cflags}" "-I${HM_PREFIX}/include" _at)
  if(_at EQUAL -1)
    message(FATAL_ERROR "pkg-config --cflags does not point into ${HM_PREFIX}/include")
  endif()

  # One file, compiled and linked with exactly those flags (plus the build's own).
  separate_arguments(_cflags UNIX_COMMAND "${_cflags}")
  separate_arguments(_libs UNIX_COMMAND "${_libs}")
  separate_arguments(_cxxflags UNIX_COMMAND "${HM_CMAKE_CXX_FLAGS}")
  set(_program "${WORK_DIR}/consumer")
  run("${HM_CMAKE_CXX_COMPILER}" ${_cxxflags} ${_cflags} -Wall -Wextra -Wpedantic -Werror
      "${SOURCE_DIR}/find_package/main.cpp" -o "${_program}" ${_libs})
  execute_process(COMMAND "${_program}" RESULT_VARIABLE _result OUTPUT_VARIABLE _output
                  ERROR_VARIABLE _output)
  message("${_output}")
  if(NOT _result STREQUAL "0" OR NOT _output MATCHES "hivemesh consumer: ok")
    message(FATAL_ERROR "the pkg-config consumer failed (${_result})")
  endif()

else()
  message(FATAL_ERROR "run_consumer.cmake: unknown MODE '${MODE}'")
endif()
