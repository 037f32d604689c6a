#include "cli/commands.h"
#include "tributary/artifacts/modules.h"
#include "tributary/core/log.h"
#include "tributary/interop/hf_export.h"
#include "tributary/interop/hf_import.h"

namespace tributary::cli {

void add_export_path(CLI::App& app) {
  struct Args {
    std::string run, out;
    int64_t path = 0;
    bool early_stopped = false;
  };
  auto args = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("export-path", "DiPaCo: write one path as a standalone dense checkpoint");
  cmd->add_option("run", args->run, "DiPaCo run directory")->required();
  cmd->add_option("--path", args->path, "path id (0 .. paths-1)")->required();
  cmd->add_option("--out", args->out, "output run directory (eval, generate and train --set dipaco.init_from load it)")
      ->required();
  cmd->add_flag("--early-stopped", args->early_stopped, "the path's parameters from its best held-out round");
  cmd->callback([args]() {
    DipacoRun run = load_dipaco_run(args->run);
    run.grid.path_modules(args->path);  // Error naming the range when out of it
    auto dir = export_path(run, args->path, args->out, args->early_stopped);
    log::info("path {} ({}) written as a dense checkpoint: {}", args->path,
              fmt::format("{}", fmt::join(run.grid.modules_of_path(args->path), " + ")), dir.string());
  });
}

void add_export(CLI::App& app) {
  struct Args {
    std::string run, format = "hf", out;
    int64_t path = -1;
  };
  auto args = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("export", "write a trained model in another layout (hf: Hugging Face Llama)");
  cmd->add_option("run", args->run, "run directory (its latest checkpoint) or checkpoint directory")->required();
  cmd->add_option(
         "--format", args->format,
         "hf: config.json + model.safetensors of LlamaForCausalLM (Qwen2ForCausalLM with q/k/v biases) + the tokenizer")
      ->check(CLI::IsMember({"hf"}));
  cmd->add_option("--out", args->out, "new or empty output directory")->required();
  cmd->add_option("--path", args->path, "DiPaCo runs: the path to export (0 .. paths-1)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  cmd->callback([args]() {
    const auto dir = export_hf(args->run, args->out, args->path >= 0 ? std::optional(args->path) : std::nullopt);
    log::info("exported '{}' in the Hugging Face Llama layout: {}", args->run, dir.string());
  });
}

void add_import(CLI::App& app) {
  struct Args {
    std::string dir, out, data = "data/default";
  };
  auto args = std::make_shared<Args>();
  auto* cmd = app.add_subcommand(
      "import", "read a Hugging Face Llama, Mistral or Qwen 2 checkpoint (and its tokenizer) as a checkpoint of ours");
  cmd->add_option("dir", args->dir, "directory with config.json, model.safetensors (or shards) and a tokenizer")
      ->required();
  cmd->add_option("--out", args->out, "new or empty run directory (eval, generate, export, train.init_from load it)")
      ->required();
  cmd->add_option("--data", args->data, "dataset for eval's validation split (its tokenizer must be the model's)");
  cmd->callback([args]() {
    const auto dir = import_hf(args->dir, args->out, args->data);
    log::info(
        "imported '{}' as a checkpoint: {} (its tokenizer for your text: data build TEXT --out DATA --tokenizer {}; "
        "continue it: train CONFIG --init-from {} --set data.dir=DATA)",
        args->dir, dir.string(), args->out, args->out);
  });
}

}  // namespace tributary::cli
