// The CPU entries in float64 (kernels.hpp), compiled in a unit of their own.
#include "cpu_device.hpp"
#include "kernels_impl.hpp"

template struct difftx_python::kernels<double, difftx_python::cpu>;
