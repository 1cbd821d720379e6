#pragma once
// <immintrin.h>, included before Eigen and xsimd include it, so that the
// pragma below covers its text. GCC 12 reports the "undefined" pass-through
// operand of its own AVX-512 intrinsics as an uninitialised variable in every
// function they are inlined into (GCC bug 105593, fixed in GCC 13); the
// warning is located in the header, so it is silenced there and nowhere else.
#if (defined(__x86_64__) || defined(__i386__)) && !defined(__CUDACC__)
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#else
#include <immintrin.h>
#endif
#endif
