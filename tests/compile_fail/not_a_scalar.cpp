// Must not compile: a number type without a difftx::scalar_traits specialisation.
#include <string>

#include <difftx/difftx.hpp>

int main() { difftx::RMSNorm<std::string> norm(8); }
