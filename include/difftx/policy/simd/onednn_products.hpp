// Who may multiply Linear's products of many rows besides difftx's own
// kernels: oneDNN's matmul in a build that links it (DIFFTX_ONEDNN, CMake's
// difftx::onednn; linear_onednn.hpp), nobody otherwise
// (linear_without_onednn.hpp, whose entries decline every product). The one
// place that asks.
#pragma once

#if defined(DIFFTX_ONEDNN)
#include "difftx/policy/simd/linear_onednn.hpp"
#else
#include "difftx/policy/simd/linear_without_onednn.hpp"
#endif
