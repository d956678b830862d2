# Included by both consumer projects (add_subdirectory/, find_package/).
# consumer_program(<how>): fails unless <how> defined hivemesh::hivemesh, then builds the
# project's main.cpp against it with warnings as errors and registers it as the project's test.
# A macro, not a function: enable_testing() only takes effect in the directory's own scope.
macro(consumer_program how)
  if(NOT TARGET hivemesh::hivemesh)
    message(FATAL_ERROR "${how} did not define hivemesh::hivemesh")
  endif()
  add_executable(consumer main.cpp)
  target_link_libraries(consumer PRIVATE hivemesh::hivemesh)
  if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
    target_compile_options(consumer PRIVATE -Wall -Wextra -Wpedantic -Werror)
  endif()
  enable_testing()
  add_test(NAME consumer COMMAND consumer)
endmacro()
