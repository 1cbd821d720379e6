// The CUDA entries in bfloat16 (kernels.hpp), compiled in a unit of their own.
#include "cuda_device.cuh"
#include "kernels_impl.hpp"

template struct difftx_python::kernels<Eigen::bfloat16, difftx_python::cuda>;
