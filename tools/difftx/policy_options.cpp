// The policy flags every command shares (policy_options.hpp).
#include "policy_options.hpp"

#include <array>
#include <vector>

#include "commands.hpp"

namespace difftx::cli {

namespace {

constexpr std::array bf16_product_choices{bf16_product_choice::automatic, bf16_product_choice::converting,
                                          bf16_product_choice::dot_instructions};
constexpr std::array matmul_choices{matmul_choice::automatic, matmul_choice::difftx, matmul_choice::onednn};
constexpr std::array cuda_attention_choices{policy::cuda_attention::difftx, policy::cuda_attention::cudnn};

// --name VALUE into `value`, where VALUE is name_of one of `choices`;
// anything else is a usage error naming the flag and the value.
template <class Choice, std::size_t Count>
CLI::Option* add_choice(CLI::App& command, const std::string& name, Choice& value,
                        const std::array<Choice, Count>& choices, const std::string& help) {
  std::vector<std::string> names;
  for (const auto c : choices) names.emplace_back(name_of(c));
  return command
      .add_option_function<std::string>(
          name,
          [&value, choices](const std::string& given) {
            for (const auto c : choices)
              if (name_of(c) == given) value = c;
          },
          help)
      ->check(CLI::IsMember(names))
      ->default_str(std::string(name_of(value)));
}

}  // namespace

std::string_view name_of(bf16_product_choice choice) {
  switch (choice) {
    case bf16_product_choice::converting: return "converting";
    case bf16_product_choice::dot_instructions: return "dot_instructions";
    case bf16_product_choice::automatic: break;
  }
  return "automatic";
}

std::string_view name_of(matmul_choice choice) {
  switch (choice) {
    case matmul_choice::difftx: return "difftx";
    case matmul_choice::onednn: return "onednn";
    case matmul_choice::automatic: break;
  }
  return "automatic";
}

policy_option_flags add_policy_options(CLI::App& command, policy_options& options, const std::string& threads_default,
                                       bool packed_weights) {
  policy_option_flags flags;
  flags.threads = command
                      .add_option("--threads", options.threads,
                                  "threads of a policy that runs several (simd; at most " + std::to_string(max_threads) +
                                      "; default: " + threads_default + ")")
                      ->check(CLI::Range(1, max_threads));
  flags.bf16_product = add_choice(
      command, "--bf16-product", options.bf16_product, bf16_product_choices,
      "simd, bfloat16: what the matrix products run on; automatic takes the CPU's bfloat16 dot-product instruction "
      "(vdpbf16ps) where it was measured faster than converting to float (AMD Zen 4 and later), converting and "
      "dot_instructions force one (the policy column names the one that ran)");
  flags.matmul = add_choice(
      command, "--matmul", options.matmuls, matmul_choices,
      "simd: who multiplies products of many rows (prefill, training); automatic takes oneDNN's matmul where this "
      "build has it and it was measured faster (float32, bfloat16, int8 weights), difftx and onednn force one (the "
      "policy column names oneDNN's kernel when it ran)");
  flags.amx = command.add_flag(
      "--amx,!--no-amx", options.amx_tiles,
      "simd: AMX tiles in the attention's score tiles (bfloat16, and int8 Q·Kᵀ) and in bfloat16 products of 5 to 16 "
      "rows (several prompts decoded together), on by default; where this CPU or OS has no AMX the AVX-512 kernels "
      "run, and --no-amx forces them (the policy column says \"amx tiles\" when tiles ran)");
  flags.cuda_attention = add_choice(
      command, "--cuda-attention", options.cuda_attention, cuda_attention_choices,
      "cuda: whose attention kernels run: difftx's own, or cuDNN's fused attention where it applies (float16/bfloat16, "
      "sm_80 and newer; difftx's elsewhere) in a build with cuDNN; the policy column counts what ran");
  if (packed_weights)
    flags.packed_weights = command.add_flag(
        "--packed-weights", options.packed_weights,
        "simd: the language model's layer weights also in oneDNN's packed layout, which a prompt's products then read "
        "(a second copy of them; nothing where oneDNN does not take the products)");
  return flags;
}

}  // namespace difftx::cli
