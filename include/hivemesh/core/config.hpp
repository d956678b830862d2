// How hivemesh is compiled. Header-only is the default. With HIVEMESH_SEPARATE_COMPILATION
// (defined by linking hivemesh::compiled, as Asio's ASIO_SEPARATE_COMPILATION) the library's
// non-template functions are compiled once, in src/, and the headers only declare them:
// their bodies live in `impl/*.ipp` files, which a header includes only in header-only use.
#pragma once

/// Marks a non-template function whose body is in an `impl/*.ipp` file: inline in
/// header-only use, an ordinary external function compiled once in the compiled mode.
#if defined(HIVEMESH_SEPARATE_COMPILATION)
#define HIVEMESH_DECL
#else
#define HIVEMESH_DECL inline
#endif
