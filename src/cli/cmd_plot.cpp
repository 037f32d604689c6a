#include <spawn.h>
#include <sys/wait.h>

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"
#include "tributary/core/error.h"
#include "tributary/core/fs.h"
#include "tributary/core/log.h"

extern char** environ;

namespace tributary::cli {
namespace {

// A gnuplot single-quoted string: nothing inside is special except the quote itself, written twice. A line break
// would end the command, so paths holding control characters are refused rather than quoted.
std::string gnuplot_quote(const std::string& s, const char* what) {
  for (unsigned char c : s)
    if (c < 0x20 || c == 0x7f) fail("the {} '{}' holds a control character; gnuplot cannot take it", what, s);
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("''") : std::string(1, c);
  return out + "'";
}

// Runs `gnuplot SCRIPT` directly (no shell: nothing in a path is ever interpreted as a command). Its own messages
// go to our stderr.
void run_gnuplot(const fs::path& script) {
  std::string prog = "gnuplot", arg = script.string();
  char* argv[] = {prog.data(), arg.data(), nullptr};
  pid_t pid = 0;
  if (int rc = ::posix_spawnp(&pid, "gnuplot", nullptr, nullptr, argv, environ); rc != 0)
    fail("cannot run gnuplot: {} (install it: apt-get install gnuplot-nox)", std::strerror(rc));
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) fail("waiting for gnuplot failed: {}", std::strerror(errno));
  if (WIFSIGNALED(status)) fail("gnuplot was killed by signal {} while running '{}'", WTERMSIG(status), arg);
  if (WEXITSTATUS(status) == 127) fail("gnuplot is not installed (apt-get install gnuplot-nox)");
  if (WEXITSTATUS(status) != 0)
    fail("gnuplot failed on '{}' (exit {}): its message is above", arg, WEXITSTATUS(status));
}

}  // namespace

void add_plot(CLI::App& app) {
  struct Args {
    std::string run_dir, out;
    bool overwrite = false;
  };
  auto args = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("plot", "render a run's loss curves to PNG with gnuplot");
  cmd->add_option("run_dir", args->run_dir, "run directory holding metrics.jsonl")->required();
  cmd->add_option("--out", args->out, "PNG path (default: RUN_DIR/loss.png)");
  cmd->add_flag("--overwrite", args->overwrite, "let --out replace an existing file");
  cmd->callback([args]() {
    refuse_existing_out(args->out, args->overwrite);
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
      // The console's and the report's train loss: the mean over the logging interval (loss_avg); "loss" is the
      // interval's last step alone (lines written before loss_avg existed have only that).
      const char* train_key = j.contains("loss_avg") ? "loss_avg" : "loss";
      if (j.contains(train_key) && j[train_key].is_number())
        train_rows += fmt::format("{} {}\n", j["tokens"].get<double>(), j[train_key].get<double>());
      if (j.contains("val_loss") && j["val_loss"].is_number())
        val_rows += fmt::format("{} {}\n", j["tokens"].get<double>(), j["val_loss"].get<double>());
    }
    if (train_rows.empty()) fail("'{}' has no training lines to plot", metrics.string());
    fs::path train_dat = run / "plot_train.dat", val_dat = run / "plot_val.dat", script = run / "plot.gp";
    write_file(train_dat, train_rows, false);
    // A run without evaluation lines (train.eval_every = 0, or stopped before the first) has no validation curve.
    std::string curves =
        fmt::format("{} using 1:2 with lines lw 1.5 title 'train loss (mean over each logging interval)'",
                    gnuplot_quote(train_dat.string(), "run directory"));
    if (!val_rows.empty()) {
      write_file(val_dat, val_rows, false);
      curves += fmt::format(", {} using 1:2 with linespoints pt 7 lw 2 title 'validation loss'",
                            gnuplot_quote(val_dat.string(), "run directory"));
    }
    std::string gp = fmt::format(
        "set terminal pngcairo size 900,540 noenhanced font 'sans,10'\n"
        "set output {}\n"
        "set title {}\n"
        "set xlabel 'training tokens'\nset ylabel 'loss (nats/token)'\nset grid\nset key top right\n"
        "plot {}\n",
        gnuplot_quote(out.string(), "--out path"),
        gnuplot_quote("Tributary run: " + run.filename().string(), "run name"), curves);
    write_file(script, gp, false);
    try {
      run_gnuplot(script);
    } catch (...) {
      fs::remove(train_dat);
      fs::remove(val_dat);
      throw;  // the script stays, for a look at what gnuplot was given
    }
    fs::remove(train_dat);
    fs::remove(val_dat);
    fs::remove(script);
    std::printf("%s\n", out.c_str());
  });
}

}  // namespace tributary::cli
