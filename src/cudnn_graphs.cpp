// cuDNN's attention graphs, compiled once for difftx's own programs (CMake
// target difftx_cudnn_graphs, which defines DIFFTX_CUDNN_GRAPHS_COMPILED_ONCE
// for every unit that links it): see difftx/policy/cuda/attention_cudnn_graph.hpp.
#include <difftx/policy/cuda/attention_cudnn_graph_build.hpp>
