// Every host-policy runner computing in float32 (see typed_runners.hpp).
#include "typed_runners.hpp"

template std::unique_ptr<difftx::cli::runner> difftx::cli::make_typed_runner<float>(const module_spec&, std::string_view,
                                                                  const policy_options&);
