#include "cli/commands.h"
#include "tributary/core/log.h"
#include "tributary/report/html_report.h"

namespace tributary::cli {

void add_report(CLI::App& app) {
  struct Args {
    std::string run, out;
    bool overwrite = false;
  };
  auto args = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("report", "write a self-contained HTML report of a run (open it in any browser)");
  cmd->add_option("run", args->run, "run directory (train.run_dir)")->required();
  cmd->add_option("--out", args->out, "the HTML file to write (default RUN/report.html)");
  cmd->add_flag("--overwrite", args->overwrite, "let --out replace an existing file");
  cmd->callback([args]() {
    refuse_existing_out(args->out, args->overwrite);
    const auto file = report::write_report(args->run, args->out);
    log::info("report of '{}' written: {}", args->run, fs::absolute(file).string());
  });
}

}  // namespace tributary::cli
