# hivemesh_find_library(<Name> HEADER <h> LIBRARY <lib...> PKG <module> TARGET <ns::tgt>)
# Shared by the find modules: looks for a header and a library in the usual places,
# falls back to pkg-config for hints, and defines an imported target.
include_guard(GLOBAL)
include(FindPackageHandleStandardArgs)

macro(hivemesh_find_library name)
  cmake_parse_arguments(_hfl "" "HEADER;PKG;TARGET" "LIBRARY" ${ARGN})
  find_path(${name}_INCLUDE_DIR NAMES ${_hfl_HEADER})
  find_library(${name}_LIBRARY NAMES ${_hfl_LIBRARY})
  if(NOT ${name}_INCLUDE_DIR OR NOT ${name}_LIBRARY)
    find_package(PkgConfig QUIET)
    if(PkgConfig_FOUND)
      pkg_check_modules(PC_${name} QUIET ${_hfl_PKG})
      find_path(${name}_INCLUDE_DIR NAMES ${_hfl_HEADER} HINTS ${PC_${name}_INCLUDE_DIRS})
      find_library(${name}_LIBRARY NAMES ${_hfl_LIBRARY} HINTS ${PC_${name}_LIBRARY_DIRS})
      set(${name}_VERSION ${PC_${name}_VERSION})
    endif()
  endif()
  find_package_handle_standard_args(${name}
    REQUIRED_VARS ${name}_LIBRARY ${name}_INCLUDE_DIR VERSION_VAR ${name}_VERSION)
  if(${name}_FOUND AND NOT TARGET ${_hfl_TARGET})
    add_library(${_hfl_TARGET} UNKNOWN IMPORTED)
    set_target_properties(${_hfl_TARGET} PROPERTIES
      IMPORTED_LOCATION "${${name}_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${${name}_INCLUDE_DIR}")
  endif()
  mark_as_advanced(${name}_INCLUDE_DIR ${name}_LIBRARY)
endmacro()
