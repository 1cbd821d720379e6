// How the tool's modules and models compute: every choice a command line makes
// of a policy, declared once. add_policy_options registers the flags, CLI11
// parses them once (a value that is not one of a flag's names is a usage
// error naming the flag), and the whole struct goes to make_runner and
// make_language_model_runner, where detail::make_policy gives each policy the
// fields it has. module_spec and language_model_spec say what a module is;
// this says how to compute it.
#pragma once

#include <string>
#include <string_view>

#include <CLI/CLI.hpp>

#include <difftx/policy/cuda/attention_path.hpp>

namespace difftx::cli {

// policy::simd's choices under the names the flags take. They mirror
// policy::bf16_product and policy::simd::matmul_library, whose headers nvcc
// (runners_cuda.cu) does not compile.
enum class bf16_product_choice { automatic, converting, dot_instructions };
enum class matmul_choice { automatic, difftx, onednn };

struct policy_options {
  int threads = 0;  // --threads: a policy with threads (simd); 0 means its default (OMP_NUM_THREADS)
  bf16_product_choice bf16_product = bf16_product_choice::automatic;  // --bf16-product: simd, bfloat16
  matmul_choice matmuls = matmul_choice::automatic;                    // --matmul: simd
  bool amx_tiles = true;                                               // --amx/--no-amx: simd's AMX tiles
  policy::cuda_attention cuda_attention = default_cuda_attention;      // --cuda-attention: cuda
  bool packed_weights = false;  // --packed-weights: a language model's layers also in oneDNN's layout (simd)
};

using difftx::name_of;  // policy::cuda_attention's
std::string_view name_of(bf16_product_choice choice);
std::string_view name_of(matmul_choice choice);

// The options add_policy_options made, for a command's own needs() and excludes().
struct policy_option_flags {
  CLI::Option *threads = nullptr, *bf16_product = nullptr, *matmul = nullptr, *amx = nullptr,
              *cuda_attention = nullptr, *packed_weights = nullptr;
};

// --threads, --bf16-product, --matmul, --amx/--no-amx and --cuda-attention on command,
// into options (their defaults: options' values as they are; threads_default
// says --threads' in the help), and --packed-weights where the command loads
// language models.
policy_option_flags add_policy_options(CLI::App& command, policy_options& options, const std::string& threads_default,
                                       bool packed_weights);

}  // namespace difftx::cli
