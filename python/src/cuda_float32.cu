// The CUDA entries in float32 (kernels.hpp), compiled in a unit of their own.
#include "cuda_device.cuh"
#include "kernels_impl.hpp"

template struct difftx_python::kernels<float, difftx_python::cuda>;
