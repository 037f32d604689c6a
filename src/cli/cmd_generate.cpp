#include "cli/commands.h"
#include "tributary/runtime/flops.h"
#include "tributary/runtime/inference.h"

namespace tributary::cli {

void add_generate(CLI::App& app) {
  struct Args {
    std::string checkpoint, prompt, device = "cpu";
    GenerateOptions options;
    int64_t threads = 0;
  };
  auto args = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("generate", "sample text from a checkpoint");
  cmd->add_option("checkpoint", args->checkpoint, "checkpoint directory or run directory")->required();
  cmd->add_option("--prompt", args->prompt, "text to continue");
  cmd->add_option("--tokens", args->options.max_new_tokens, "new tokens to sample");
  cmd->add_option("--temperature", args->options.temperature, "softmax temperature (0: greedy)");
  cmd->add_option("--top-k", args->options.top_k, "sample among the k most likely tokens (0: all)");
  cmd->add_option("--seed", args->options.seed, "sampling seed");
  cmd->add_option("--device", args->device, "torch device");
  cmd->add_option("--threads", args->threads, "intra-op threads (0: all cores)");
  cmd->callback([args]() {
    configure_threads(args->threads);
    auto device = parse_device(args->device);
    auto loaded = load_model(args->checkpoint, device);
    loaded.model->eval();
    auto ids = generate(*loaded.model, loaded.tokenizer->encode(args->prompt), loaded.tokenizer->eot_id(),
                        args->options, device);
    std::printf("%s%s\n", args->prompt.c_str(), loaded.tokenizer->decode(ids).c_str());
  });
}

}  // namespace tributary::cli
