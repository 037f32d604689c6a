#include "tributary/launch/dist_env.h"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <string_view>
#include <thread>

#include "tributary/core/error.h"
#include "tributary/core/number_list.h"

extern char** environ;

namespace tributary {
namespace {

int parse_int(const std::map<std::string, std::string>& env, const std::string& key) {
  const std::string& v = env.at(key);
  try {
    size_t used = 0;
    int out = std::stoi(v, &used);
    if (used != v.size() || out < 0) throw std::invalid_argument(v);
    return out;
  } catch (const std::exception&) {
    fail("environment variable {}='{}' is not a non-negative integer", key, v);
  }
}

bool has(const std::map<std::string, std::string>& env, const char* key) { return env.count(key) != 0; }

void check(const DistEnv& d) {
  if (d.world_size < 1) fail("{}: world size {} must be >= 1", d.source, d.world_size);
  if (d.rank >= d.world_size) fail("{}: rank {} is not below the world size {}", d.source, d.rank, d.world_size);
  if (d.master_port <= 0 || d.master_port > 65535)
    fail("{}: master port {} is not a TCP port", d.source, d.master_port);
}

}  // namespace

std::string first_slurm_host(const std::string& nodelist) {
  // The first entry ends at a comma outside brackets.
  size_t depth = 0, end = nodelist.size();
  for (size_t i = 0; i < nodelist.size(); ++i) {
    if (nodelist[i] == '[') ++depth;
    if (nodelist[i] == ']') --depth;
    if (nodelist[i] == ',' && depth == 0) {
      end = i;
      break;
    }
  }
  std::string first = nodelist.substr(0, end);
  size_t open = first.find('[');
  if (open == std::string::npos) return first;
  std::string prefix = first.substr(0, open);
  std::string range = first.substr(open + 1, first.find(']') - open - 1);
  std::string head = range.substr(0, range.find_first_of(",-"));
  return prefix + head;
}

std::string attempt_prefix(int attempt) { return attempt > 0 ? "/attempt_" + std::to_string(attempt) : ""; }

DistEnv resolve_dist_env(const std::map<std::string, std::string>& env) {
  DistEnv d;
  if (has(env, "RANK") && has(env, "WORLD_SIZE")) {
    d.source = has(env, "TORCHELASTIC_RUN_ID") ? "torchrun" : "tributary";
    d.rank = parse_int(env, "RANK");
    d.world_size = parse_int(env, "WORLD_SIZE");
    d.local_rank = has(env, "LOCAL_RANK") ? parse_int(env, "LOCAL_RANK") : d.rank;
    d.local_world_size = has(env, "LOCAL_WORLD_SIZE") ? parse_int(env, "LOCAL_WORLD_SIZE") : d.world_size;
    if (has(env, "MASTER_ADDR")) d.master_addr = env.at("MASTER_ADDR");
    if (has(env, "MASTER_PORT")) d.master_port = parse_int(env, "MASTER_PORT");
    // RANK/WORLD_SIZE left over in a shell (or exported for another tool) would make a plain `train` host a store
    // and wait for peers that never come: a run of several processes names where its store is.
    if (d.world_size > 1 && d.source == "tributary" && !has(env, "MASTER_ADDR") && !has(env, "MASTER_PORT") &&
        !has(env, "TRIBUTARY_LAUNCHED"))
      fail(
          "RANK={} and WORLD_SIZE={} are set in the environment but MASTER_ADDR and MASTER_PORT are not: unset RANK "
          "and WORLD_SIZE to train in one process, or start the workers with `tributary launch` / torchrun (or set "
          "MASTER_ADDR and MASTER_PORT on every worker)",
          env.at("RANK"), env.at("WORLD_SIZE"));
    if (has(env, "TRIBUTARY_AGENT_STORE")) d.use_agent_store = true;  // tributary launch hosts the store
    d.joining = has(env, "TRIBUTARY_JOINING");
    if (has(env, "TRIBUTARY_ISLAND_LIFE")) d.island_life = parse_int(env, "TRIBUTARY_ISLAND_LIFE");
    if (has(env, "TRIBUTARY_ATTEMPT")) d.store_prefix = attempt_prefix(parse_int(env, "TRIBUTARY_ATTEMPT"));
    auto agent = env.find("TORCHELASTIC_USE_AGENT_STORE");
    if (agent != env.end() && (agent->second == "True" || agent->second == "true" || agent->second == "1")) {
      d.use_agent_store = true;
      int restart = has(env, "TORCHELASTIC_RESTART_COUNT") ? parse_int(env, "TORCHELASTIC_RESTART_COUNT") : 0;
      d.store_prefix = "/worker/attempt_" + std::to_string(restart);
    }
  } else if (has(env, "SLURM_PROCID") && has(env, "SLURM_NTASKS")) {
    d.source = "slurm";
    d.rank = parse_int(env, "SLURM_PROCID");
    d.world_size = parse_int(env, "SLURM_NTASKS");
    d.local_rank = has(env, "SLURM_LOCALID") ? parse_int(env, "SLURM_LOCALID") : 0;
    if (has(env, "SLURM_NTASKS_PER_NODE")) {
      std::string v = env.at("SLURM_NTASKS_PER_NODE");
      d.local_world_size = std::atoi(v.c_str());  // "4(x2)" -> 4
    }
    if (has(env, "MASTER_ADDR")) {
      d.master_addr = env.at("MASTER_ADDR");
    } else if (has(env, "SLURM_JOB_NODELIST")) {
      d.master_addr = first_slurm_host(env.at("SLURM_JOB_NODELIST"));
    }
    if (has(env, "MASTER_PORT")) d.master_port = parse_int(env, "MASTER_PORT");
  } else if (has(env, "OMPI_COMM_WORLD_RANK") && has(env, "OMPI_COMM_WORLD_SIZE")) {
    d.source = "mpi";
    d.rank = parse_int(env, "OMPI_COMM_WORLD_RANK");
    d.world_size = parse_int(env, "OMPI_COMM_WORLD_SIZE");
    d.local_rank = has(env, "OMPI_COMM_WORLD_LOCAL_RANK") ? parse_int(env, "OMPI_COMM_WORLD_LOCAL_RANK") : 0;
    if (has(env, "MASTER_ADDR")) d.master_addr = env.at("MASTER_ADDR");
    if (has(env, "MASTER_PORT")) d.master_port = parse_int(env, "MASTER_PORT");
  }
  check(d);
  return d;
}

DistEnv resolve_dist_env_from_process() {
  std::map<std::string, std::string> env;
  for (char** e = environ; *e; ++e) {
    std::string_view kv(*e);
    auto eq = kv.find('=');
    if (eq != std::string_view::npos) env.emplace(std::string(kv.substr(0, eq)), std::string(kv.substr(eq + 1)));
  }
  return resolve_dist_env(env);
}

}  // namespace tributary
