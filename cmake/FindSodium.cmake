# Finds libsodium (Debian: libsodium-dev) and defines Sodium::Sodium.
include(${CMAKE_CURRENT_LIST_DIR}/HivemeshFindLibrary.cmake)
hivemesh_find_library(Sodium HEADER sodium.h LIBRARY sodium PKG libsodium TARGET Sodium::Sodium)
