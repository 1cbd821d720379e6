// The CPU entries in bfloat16 (kernels.hpp), compiled in a unit of their own.
#include "cpu_device.hpp"
#include "kernels_impl.hpp"

template struct difftx_python::kernels<Eigen::bfloat16, difftx_python::cpu>;
