# Finds zstd (Debian: libzstd-dev) and defines Zstd::Zstd.
include(${CMAKE_CURRENT_LIST_DIR}/HivemeshFindLibrary.cmake)
hivemesh_find_library(Zstd HEADER zstd.h LIBRARY zstd PKG libzstd TARGET Zstd::Zstd)
