# Shared helpers for the tests/comm/*.sh drivers (sourced, not run).

fail() { echo "FAIL: $*" >&2; exit 1; }

# A TCP port that no socket uses right now, listening or connected. Drawn
# below the kernel's ephemeral range (ip_local_port_range), because a port in
# that range can be the local end of any live connection at any moment, and
# then rank 0 cannot bind it (seen: "Address already in use" in the suite).
free_port() {
  local lo=10000 hi tries=0 port
  hi=$(awk '{print $1 - 1}' /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null)
  [ -n "$hi" ] && [ "$hi" -gt $((lo + 1000)) ] || hi=32767
  while [ $tries -lt 50 ]; do
    port=$((lo + RANDOM % (hi - lo)))
    if ! ss -Htan "( sport = :$port or dport = :$port )" 2>/dev/null | grep -q .; then echo "$port"; return 0; fi
    tries=$((tries + 1))
  done
  return 1
}

# The tandem-* shared-memory segments present now, one per line, sorted.
shm_segments() { ls /dev/shm 2>/dev/null | grep '^tandem-' | sort; }

# Environment cleared of every launcher's variables, so that a test controls
# exactly which launcher the program sees.
LAUNCHER_VARS=(TANDEM_RANK TANDEM_WORLD_SIZE TANDEM_LOCAL_RANK TANDEM_LOCAL_SIZE TANDEM_STORE TANDEM_JOB_ID
  TANDEM_STORE_PORT OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE OMPI_COMM_WORLD_LOCAL_RANK
  OMPI_COMM_WORLD_LOCAL_SIZE OMPI_MCA_ess_base_jobid PMI_RANK PMI_SIZE SLURM_PROCID SLURM_NTASKS SLURM_LOCALID
  SLURM_JOB_ID SLURM_STEP_ID SLURM_STEP_NODELIST SLURM_JOB_NODELIST SLURM_STEP_TASKS_PER_NODE SLURM_TASKS_PER_NODE
  SLURM_STEP_NUM_NODES SLURM_JOB_NUM_NODES SLURM_NODEID SLURMD_NODENAME RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT TORCHELASTIC_RUN_ID)
clean_env() {
  local args=() v
  for v in "${LAUNCHER_VARS[@]}"; do args+=(-u "$v"); done
  env "${args[@]}" "$@"
}
