// Each subcommand registers itself on the CLI11 app; the callbacks are thin: parse, build objects, call the library.
#pragma once

#include <CLI/CLI.hpp>

namespace tributary::cli {

void add_train(CLI::App& app);
void add_eval(CLI::App& app);
void add_generate(CLI::App& app);
void add_data(CLI::App& app);
void add_plot(CLI::App& app);
void add_plan(CLI::App& app);
void add_launch(CLI::App& app);
void add_route(CLI::App& app);
void add_export_path(CLI::App& app);

}  // namespace tributary::cli
