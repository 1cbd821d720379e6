// The subcommands of difftx. Each add_<name>_command registers one on the app
// with its options and a callback that does the work; run_app (app.cpp) maps what the
// callbacks throw to exit codes (input_error: 3, CLI11 errors: 2,
// CLI::RuntimeError(code): code). The option helpers below are shared.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include <difftx/io/dtype.hpp>
#include <difftx/ops/int8.hpp>

namespace difftx::cli {

// Every command's --help ends with this.
inline const std::string exit_codes_help =
    "Exit codes: 0 ok, 1 a check failed, 2 usage error, 3 bad input (unreadable or malformed file, missing weight,\n"
    "wrong shape, non-finite value in an input or a result, more memory than can be allocated), with a one-line\n"
    "message naming the file, the tensor and what was expected.";

void add_run_command(CLI::App& app);
void add_check_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_retrieval_command(CLI::App& app);  // the training demo (cmd_retrieval.cpp)
void add_generate_command(CLI::App& app);   // text generation, greedy or sampled, with the KV cache (cmd_generate.cpp)
void add_convert_command(CLI::App& app);    // DiffLlama folders to difftx files and back (cmd_convert.cpp)
void add_tokenize_command(CLI::App& app);   // text to the ids generate --text feeds, and back (cmd_tokenize.cpp)

// The largest count any option takes (heads, widths, lengths, indices): far
// above any real layer, far below where products of a few counts overflow.
inline constexpr long long max_count = 1LL << 24;
// The most threads --threads takes (OpenMP runtimes fail in their own ways past a few thousand).
inline constexpr int max_threads = 1024;

// n in [low, max_count], with a one-line message otherwise.
CLI::Validator count_in(long long low);
// A finite number > 0 (or >= 0 with allow_zero), with a one-line message otherwise.
CLI::Validator positive_finite(bool allow_zero = false);

// --policy NAME: a policy in the registry that can run here (a usage error
// otherwise: cuda without a device); defaults to the fastest CPU policy built.
CLI::Option* add_policy_option(CLI::App& command, std::string& policy);
// --policy A,B,...: the same for each of a list.
CLI::Option* add_policies_option(CLI::App& command, std::vector<std::string>& policies);
// --dtype NAME: float64, float32, bfloat16 or float16; defaults to float32.
CLI::Option* add_dtype_option(CLI::App& command, std::string& dtype);
// --module NAME: a kind of the table on the command line (module_kinds.hpp; required unless the command also takes --model).
CLI::Option* add_module_option(CLI::App& command, std::string& module);
// The dtype of a validated --dtype, refusing one the policy does not compute in (a usage error).
io::dtype checked_dtype(const std::string& dtype, const std::string& policy);

// Low-bit inference (low_bit_options.cpp): --logit-bits B (4..8, or 16: off);
// --weights-dtype / --kv-dtype same|int8, read with storage_of.
CLI::Option* add_logit_bits_option(CLI::App& command, int& bits);
CLI::Option* add_storage_option(CLI::App& command, const std::string& name, std::string& storage, const std::string& what);
inference_dtype storage_of(const std::string& storage);

}  // namespace difftx::cli
