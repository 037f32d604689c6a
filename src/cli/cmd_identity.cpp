// `tributary identity --file F`: the public key of the identity in F (made there if it does not exist), the line a
// run's admission list (dist.admission) holds for this participant (comm/identity.h).
#include <cstdio>

#include "cli/commands.h"
#include "tributary/comm/identity.h"

namespace tributary::cli {

void add_identity(CLI::App& app) {
  auto file = std::make_shared<std::string>();
  auto* cmd = app.add_subcommand(
      "identity",
      "print this participant's public key (for a run's admission list, dist.admission), making the key "
      "pair on first use");
  cmd->add_option("--file", *file, "the identity file: launch --secret-file F gives rank R the file F.identity-R")
      ->required();
  cmd->callback([file]() {
    const auto identity = comm::Identity::load_or_create(*file);
    std::printf("%s\n", identity.public_hex().c_str());
  });
}

}  // namespace tributary::cli
