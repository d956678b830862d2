# Finds xxHash (Debian: libxxhash-dev) and defines xxHash::xxHash.
include(${CMAKE_CURRENT_LIST_DIR}/HivemeshFindLibrary.cmake)
hivemesh_find_library(xxHash HEADER xxhash.h LIBRARY xxhash PKG libxxhash TARGET xxHash::xxHash)
