// Who am I in a distributed run? Resolved from, in this order of precedence (what torchrun/Slurm users expect):
//   explicit launcher values > torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT,
//   TORCHELASTIC_USE_AGENT_STORE + TORCHELASTIC_RESTART_COUNT -> store prefix /worker/attempt_N)
//   > Slurm (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_JOB_NODELIST: the first host is the master)
//   > OpenMPI (OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK) > a single process.
// Pure function of an environment map, so it is tested without touching the real environment.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace tributary {

struct DistEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string store_prefix;  // non-empty when workers share an agent's store (torchrun), or a run launch started again
  bool use_agent_store = false;   // torchrun's agent already runs the TCPStore server
  std::string source = "single";  // tributary | torchrun | slurm | mpi | single
  bool joining = false;           // TRIBUTARY_JOINING: restarted by launch --max-restarts to join the running run
  // TRIBUTARY_ISLAND_LIFE (launch --restart-island): this machine's island's life, -1 without the flag; each start
  // of the island again is one more, and its groups live under keys of their own.
  int island_life = -1;

  bool distributed() const { return world_size > 1; }
  bool lead() const { return rank == 0 && !joining; }  // writes metrics and the run directory at start
};

DistEnv resolve_dist_env(const std::map<std::string, std::string>& env);
DistEnv resolve_dist_env_from_process();  // reads environ

// The store keys of `tributary launch`'s attempt n (TRIBUTARY_ATTEMPT): launch starts a run again after a death in
// its start-up under fresh keys on the same store; attempt 0 has none.
std::string attempt_prefix(int attempt);

// "node[01-04,07],gpu5" -> "node01": the first host of a compressed Slurm host list.
std::string first_slurm_host(const std::string& nodelist);

}  // namespace tributary
