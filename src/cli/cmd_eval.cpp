#include <cmath>

#include "cli/commands.h"
#include "tributary/core/error.h"
#include "tributary/core/log.h"
#include "tributary/data/dataset.h"
#include "tributary/runtime/flops.h"
#include "tributary/runtime/inference.h"

namespace tributary::cli {

void add_eval(CLI::App& app) {
  struct Args {
    std::string checkpoint, data, device = "cpu", split = "val";
    int64_t batches = 0, batch_size = 16, threads = 0;
  };
  auto args = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("eval", "evaluate a checkpoint: loss, perplexity, bits per byte");
  cmd->add_option("checkpoint", args->checkpoint, "checkpoint directory or run directory")->required();
  cmd->add_option("--data", args->data, "dataset directory (default: the checkpoint's data.dir)");
  cmd->add_option("--split", args->split, "train or val")->check(CLI::IsMember({"train", "val"}));
  cmd->add_option("--batches", args->batches, "number of batches (default: the whole split)");
  cmd->add_option("--batch-size", args->batch_size, "sequences per batch");
  cmd->add_option("--device", args->device, "torch device");
  cmd->add_option("--threads", args->threads, "intra-op threads (0: all cores)");
  cmd->callback([args]() {
    configure_threads(args->threads);
    check_blas();
    auto device = parse_device(args->device);
    auto loaded = load_model(args->checkpoint, device);
    Dataset dataset = Dataset::open(args->data.empty() ? loaded.config.data.dir : args->data);
    if (dataset.vocab_size() > loaded.config.model.vocab_size)
      fail("dataset '{}' has {} token ids but the model only {}: evaluate on data built with the same tokenizer",
           dataset.dir().string(), dataset.vocab_size(), loaded.config.model.vocab_size);
    auto tokens = std::make_shared<const std::vector<uint32_t>>(dataset.load_tokens(args->split));
    BatchLoader loader(tokens, {.batch_size = args->batch_size, .context = loaded.config.model.context, .shuffle = false},
                       dataset.dir().string() + " " + args->split);
    int64_t batches = args->batches > 0 ? std::min(args->batches, loader.num_windows() / args->batch_size)
                                        : loader.num_windows() / args->batch_size;
    auto result = evaluate(*loaded.model, loader, batches, device);
    double bpb = result.loss / std::log(2.0) / dataset.bytes_per_token(args->split);
    std::printf("step %lld | %s loss %.4f | ppl %.3f | %.4f bits/byte | %lld tokens | unigram %.4f bits/byte\n",
                static_cast<long long>(loaded.step), args->split.c_str(), result.loss, std::exp(result.loss), bpb,
                static_cast<long long>(result.num_tokens),
                dataset.unigram_val_bits_per_token() / dataset.bytes_per_token("val"));
  });
}

}  // namespace tributary::cli
