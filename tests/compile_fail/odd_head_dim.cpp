// Must not compile: D is the half head size and RoPE rotates pairs, so D is even.
#include <difftx/difftx.hpp>

int main() { difftx::MultiHead<float, 3> attention({.d_model = 8, .heads = 2}); }
