#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"
#include "tributary/core/error.h"
#include "tributary/core/fs.h"
#include "tributary/core/log.h"

namespace tributary::cli {

void add_plot(CLI::App& app) {
  struct Args {
    std::string run_dir, out;
  };
  auto args = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("plot", "render a run's loss curves to PNG with gnuplot");
  cmd->add_option("run_dir", args->run_dir, "run directory holding metrics.jsonl")->required();
  cmd->add_option("--out", args->out, "PNG path (default: RUN_DIR/loss.png)");
  cmd->callback([args]() {
    fs::path run = args->run_dir;
    fs::path metrics = run / "metrics.jsonl";
    if (!fs::exists(metrics)) fail("'{}' has no metrics.jsonl: is it a run directory?", run.string());
    fs::path out = args->out.empty() ? run / "loss.png" : fs::path(args->out);
    std::string train_rows, val_rows;
    std::istringstream in(read_file(metrics));
    std::string line;
    int64_t line_no = 0;
    while (std::getline(in, line)) {
      ++line_no;
      auto j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_discarded()) fail("{}:{}: not a JSON line", metrics.string(), line_no);
      if (!j.contains("tokens") || !j["tokens"].is_number()) continue;  // e.g. DiPaCo's per-round lines
      if (j.contains("loss")) train_rows += fmt::format("{} {}\n", j["tokens"].get<double>(), j["loss"].get<double>());
      if (j.contains("val_loss"))
        val_rows += fmt::format("{} {}\n", j["tokens"].get<double>(), j["val_loss"].get<double>());
    }
    if (train_rows.empty()) fail("'{}' has no training lines to plot", metrics.string());
    fs::path train_dat = run / "plot_train.dat", val_dat = run / "plot_val.dat", script = run / "plot.gp";
    write_file(train_dat, train_rows, false);
    write_file(val_dat, val_rows.empty() ? train_rows : val_rows, false);
    std::string gp = fmt::format(
        "set terminal pngcairo size 900,540 enhanced font 'sans,10'\n"
        "set output '{}'\n"
        "set title 'Tributary run: {}'\n"
        "set xlabel 'training tokens'\nset ylabel 'loss (nats/token)'\nset grid\nset key top right\n"
        "plot '{}' using 1:2 with lines lw 1.5 title 'train loss', '{}' using 1:2 with linespoints pt 7 lw 2 title "
        "'validation loss'\n",
        out.string(), run.filename().string(), train_dat.string(), val_dat.string());
    write_file(script, gp, false);
    int rc = std::system(fmt::format("gnuplot '{}' 2>&1", script.string()).c_str());
    fs::remove(train_dat);
    fs::remove(val_dat);
    if (rc != 0) fail("gnuplot failed (exit {}); is gnuplot installed? (apt-get install gnuplot-nox)", rc);
    fs::remove(script);
    std::printf("%s\n", out.c_str());
  });
}

}  // namespace tributary::cli
