# Finds standalone Asio (header-only, Debian: libasio-dev) and defines Asio::Asio.
# Debian ships neither a CMake config nor, in every release, a pkg-config file, so the
# header is searched first and pkg-config is the fallback.
include(FindPackageHandleStandardArgs)
find_path(Asio_INCLUDE_DIR NAMES asio.hpp)
if(NOT Asio_INCLUDE_DIR)
  find_package(PkgConfig QUIET)
  if(PkgConfig_FOUND)
    pkg_check_modules(PC_Asio QUIET asio)
    find_path(Asio_INCLUDE_DIR NAMES asio.hpp HINTS ${PC_Asio_INCLUDE_DIRS})
  endif()
endif()
if(Asio_INCLUDE_DIR AND EXISTS "${Asio_INCLUDE_DIR}/asio/version.hpp")
  file(STRINGS "${Asio_INCLUDE_DIR}/asio/version.hpp" _asio_version_line
       REGEX "^#define ASIO_VERSION [0-9]+")
  string(REGEX REPLACE ".*ASIO_VERSION ([0-9]+).*" "\\1" _asio_v "${_asio_version_line}")
  math(EXPR _asio_major "${_asio_v} / 100000")
  math(EXPR _asio_minor "${_asio_v} / 100 % 1000")
  math(EXPR _asio_patch "${_asio_v} % 100")
  set(Asio_VERSION "${_asio_major}.${_asio_minor}.${_asio_patch}")
endif()
find_package_handle_standard_args(Asio REQUIRED_VARS Asio_INCLUDE_DIR VERSION_VAR Asio_VERSION)
if(Asio_FOUND AND NOT TARGET Asio::Asio)
  find_package(Threads REQUIRED)
  add_library(Asio::Asio INTERFACE IMPORTED)
  set_target_properties(Asio::Asio PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${Asio_INCLUDE_DIR}"
    INTERFACE_COMPILE_DEFINITIONS "ASIO_STANDALONE;ASIO_NO_DEPRECATED"
    INTERFACE_LINK_LIBRARIES Threads::Threads)
endif()
mark_as_advanced(Asio_INCLUDE_DIR)
