// Every runner computing in float64 (see runner_impl.hpp).
#include "runner_impl.hpp"

template std::unique_ptr<difftx::cli::runner> difftx::cli::make_typed_runner<double>(const module_spec&, std::string_view);
