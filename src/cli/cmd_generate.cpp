#include "cli/commands.h"
#include "tributary/artifacts/inference.h"
#include "tributary/artifacts/modules.h"
#include "tributary/artifacts/routes.h"
#include "tributary/core/log.h"
#include "tributary/data/tokenizer.h"
#include "tributary/perf/flops.h"
#include "tributary/routing/router.h"

namespace tributary::cli {

void add_generate(CLI::App& app) {
  struct Args {
    std::string checkpoint, prompt, device = "cpu";
    GenerateOptions options;
    int64_t threads = 0, path = -1;
  };
  auto args = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("generate", "sample text from a checkpoint");
  cmd->add_option("checkpoint", args->checkpoint, "checkpoint directory or run directory")->required();
  cmd->add_option("--prompt", args->prompt, "text to continue");
  cmd->add_option("--tokens", args->options.max_new_tokens, "new tokens to sample")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 24));
  cmd->add_option("--temperature", args->options.temperature, "softmax temperature (0: greedy)")
      ->check(finite_range(0, 1e6));
  cmd->add_option("--top-k", args->options.top_k, "sample among the k most likely tokens (0: all)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  cmd->add_option("--seed", args->options.seed, "sampling seed");
  cmd->add_option("--path", args->path, "DiPaCo run: use this path instead of routing the prompt")
      ->check(CLI::Range(int64_t{-1}, int64_t{1} << 30));
  cmd->add_option("--device", args->device, "torch device");
  cmd->add_option("--threads", args->threads, "intra-op threads (0: all cores)")
      ->check(CLI::Range(int64_t{0}, kMaxThreads));
  cmd->callback([args]() {
    configure_threads(args->threads);
    auto device = parse_device(args->device);
    if (is_dipaco_run(args->checkpoint)) {  // route the prompt's first 32 tokens to one path
      DipacoRun run = load_dipaco_run(args->checkpoint);
      Routes routes = load_routes(run.config.dipaco.routes, device);
      auto tokenizer = load_tokenizer(routes.info.data);
      auto ids = tokenizer->encode(args->prompt);
      const int64_t path = args->path >= 0 ? args->path : routes.route_sequence(ids, tokenizer->eot_id(), device);
      run.grid.path_modules(path);  // Error naming the range when out of it
      log::info("prompt routed to path {} ({})", path,
                fmt::format("{}", fmt::join(run.grid.modules_of_path(path), " + ")));
      auto model = assemble_dense(run, path);
      model->to(device);
      model->eval();
      auto out = generate(*model, ids, tokenizer->eot_id(), args->options, device);
      std::printf("%s%s\n", args->prompt.c_str(), tokenizer->decode(out).c_str());
      return;
    }
    auto loaded = load_model(args->checkpoint, device);
    loaded.model->eval();
    // A model whose tokenizer begins every document with a special token (Llama 3) sees its prompt begin with it too.
    auto prompt = loaded.tokenizer->encode(args->prompt);
    if (const auto bos = loaded.tokenizer->bos_id()) prompt.insert(prompt.begin(), *bos);
    auto ids = generate(*loaded.model, prompt, loaded.tokenizer->eot_id(), args->options, device);
    std::printf("%s%s\n", args->prompt.c_str(), loaded.tokenizer->decode(ids).c_str());
  });
}

}  // namespace tributary::cli
