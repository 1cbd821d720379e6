// The CPU entries in float32 (kernels.hpp), compiled in a unit of their own.
#include "cpu_device.hpp"
#include "kernels_impl.hpp"

template struct difftx_python::kernels<float, difftx_python::cpu>;
