#!/usr/bin/env bash
# `make test-slurm`: the tiny pipeline on a real single-node SLURM cluster brought up on this machine.
#
# As root: installs the Debian packages slurm-wlm and munge when missing, starts munged, slurmctld and slurmd
# directly (no systemd) with generated configs (one node, Gres=gpu:1 backed by a placeholder device, no accounting),
# runs the tiny config through snakemake-executor-plugin-slurm with the shipped profile (profiles/slurm, fitted to
# the node) and checks it with tests/slurm/slurm_checks.py against a local run of the same config. The daemons it
# started are stopped by PID on exit. Without root or apt-get it prints "SKIPPED: ..." and exits 0.
#
# Hyperopt storage: when PostgreSQL can be started here (tests/postgres/cluster.py; the '.[postgres]' extra), the
# SLURM run's two workers share a study on a throwaway PostgreSQL server (MARKETRL_OPTUNA_STORAGE, inherited by
# the jobs), and the local reference runs its own hyperopt on the journal file: the studies must be equal. Without
# PostgreSQL it says so and uses the journal, with the local run reusing the SLURM run's hyperopt results.
#
# Environment: PYTHON (default .venv/bin/python; needs the '.[slurm]' extra), MARKETRL_SLURM_KEEP=1 keeps the
# work directory (it is always kept on failure).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PYTHON=${PYTHON:-$REPO/.venv/bin/python}
KEEP=${MARKETRL_SLURM_KEEP:-0}
CTLD_PORT=16817
SLURMD_PORT=16818
RUN_TIMEOUT_S=900

say() { echo "test-slurm: $*"; }
skip() {
  echo "SKIPPED: $*"
  exit 0
}
fail() {
  echo "FAILED: $*" >&2
  exit 1
}

# ------------------------------------------------------------------------------------------- preconditions
[ "$(id -u)" = 0 ] || skip "test-slurm needs root to install and start SLURM daemons (running as $(id -un))"
command -v apt-get >/dev/null 2>&1 || skip "no apt-get here; test-slurm installs the Debian packages slurm-wlm and munge"
slurm_running() { grep -qsx -e slurmctld -e slurmd /proc/[0-9]*/comm; } # no procps needed
if [ -e /etc/slurm/slurm.conf ] || slurm_running; then
  skip "this machine already has a SLURM installation (/etc/slurm/slurm.conf or running daemons); not starting a test cluster beside it"
fi
[ -x "$PYTHON" ] || fail "no Python at $PYTHON (run 'make setup' or set PYTHON=...)"
"$PYTHON" -c 'import snakemake_executor_plugin_slurm' 2>/dev/null ||
  fail "snakemake-executor-plugin-slurm is missing from $PYTHON's environment: pip install -c requirements.lock -e '.[slurm]'"

missing_tools() {
  local tool
  for tool in munged slurmctld slurmd sbatch squeue scontrol sinfo srun; do
    command -v "$tool" >/dev/null 2>&1 || PATH="$PATH:/usr/sbin" command -v "$tool" >/dev/null 2>&1 || return 0
  done
  return 1
}
if missing_tools; then
  say "installing slurm-wlm and munge (apt-get)"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurm-wlm munge) \
    >/tmp/test-slurm-apt.log 2>&1 ||
    skip "apt-get could not install slurm-wlm and munge (offline?); see /tmp/test-slurm-apt.log"
fi
export PATH="$PATH:/usr/sbin"
say "$(slurmctld -V), $(munged -V 2>&1 | head -1)"

# ------------------------------------------------------------------------------------------- cleanup on exit
WORK=$(mktemp -d /tmp/marketrl-slurm.XXXXXX)
chmod 755 "$WORK"
CL=$WORK/cluster
PIDS_TO_STOP=() # daemons, newest first
SAMPLER_PID=""
PG_DIR=""
RUN_SLURM_CREATED=0
RUN_SLURM_SAVED=0
[ -d /run/slurm ] || RUN_SLURM_CREATED=1

stop_pid() { # stop one process we started: TERM, then KILL after 10 s
  local pid=$1
  kill -0 "$pid" 2>/dev/null || return 0
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 50); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.2
  done
  kill -KILL "$pid" 2>/dev/null || true
}

cleanup() {
  local status=$?
  set +e
  [ -n "$SAMPLER_PID" ] && stop_pid "$SAMPLER_PID"
  if [ -f "$CL/slurmctld.pid" ] && [ -n "${SLURM_CONF:-}" ]; then
    squeue -h -o %i 2>/dev/null | xargs -r scancel 2>/dev/null # jobs of this test cluster only
  fi
  for pid in "${PIDS_TO_STOP[@]}"; do stop_pid "$pid"; done
  [ -n "$PG_DIR" ] && (cd "$REPO" && "$PYTHON" -m tests.postgres.cluster stop "$PG_DIR")
  if [ "$(readlink /run/slurm/conf 2>/dev/null)" = "$CL" ]; then
    rm -f /run/slurm/conf # our link for srun inside jobs
    [ "$RUN_SLURM_CREATED" = 1 ] && rmdir /run/slurm 2>/dev/null
  fi
  if [ "$RUN_SLURM_SAVED" = 1 ] && [ ! -e /run/slurm/conf ] && [ ! -L /run/slurm/conf ]; then
    mv "$WORK/run-slurm-conf.saved" /run/slurm/conf # what stood there before, back
  fi
  if [ "$status" = 0 ] && [ "$KEEP" != 1 ]; then
    rm -rf "$WORK"
  else
    echo "test-slurm: work directory kept: $WORK (daemon logs in $CL/log)" >&2
  fi
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

wait_for_file() { # path, seconds
  for _ in $(seq $(($2 * 5))); do
    [ -s "$1" ] && return 0
    sleep 0.2
  done
  return 1
}

# ------------------------------------------------------------------------------------------- the cluster
HOST=$(hostname -s)
CPUS=$(nproc)
MEM_MB=$(awk '/MemTotal/ {print int($2 / 1024 * 0.9)}' /proc/meminfo) # a bit below the real memory
mkdir -p "$CL"/{state,spool,log,dev,munge}

# Placeholder GPU: a character device node with NVIDIA's major number, so slurmd sets CUDA_VISIBLE_DEVICES;
# a plain file where mknod is not allowed (GPU scheduling works the same).
mknod "$CL/dev/nvidia0" c 195 0 2>/dev/null || : >"$CL/dev/nvidia0"

# munge: a fresh key and our own socket, so a system munged (if any) is left alone.
chown munge:munge "$CL/munge"
chmod 755 "$CL/munge" # munged: the socket directory must be searchable by all
dd if=/dev/urandom of="$CL/munge/munge.key" bs=1024 count=1 status=none
chown munge:munge "$CL/munge/munge.key"
chmod 400 "$CL/munge/munge.key"
MUNGE_SOCKET=$CL/munge/munge.socket
runuser -u munge -- munged --key-file="$CL/munge/munge.key" --socket="$MUNGE_SOCKET" \
  --pid-file="$CL/munge/munged.pid" --log-file="$CL/munge/munged.log" --seed-file="$CL/munge/munged.seed" ||
  fail "munged did not start; see $CL/munge/munged.log"
wait_for_file "$CL/munge/munged.pid" 10 || fail "munged wrote no PID file"
PIDS_TO_STOP=("$(cat "$CL/munge/munged.pid")" "${PIDS_TO_STOP[@]}")
munge -S "$MUNGE_SOCKET" -n | unmunge -S "$MUNGE_SOCKET" >/dev/null || fail "munge round trip failed"

cat >"$CL/slurm.conf" <<EOF
# Generated by tests/slurm/run_slurm_test.sh: a throwaway single-node cluster.
ClusterName=marketrltest
SlurmctldHost=$HOST(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCKET
StateSaveLocation=$CL/state
SlurmdSpoolDir=$CL/spool
SlurmctldPidFile=$CL/slurmctld.pid
SlurmdPidFile=$CL/slurmd.pid
SlurmctldLogFile=$CL/log/slurmctld.log
SlurmdLogFile=$CL/log/slurmd.log
# Inside a container without systemd or cgroup delegation.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SlurmdParameters=config_overrides
# Backfill every second, so CPU jobs run beside the one GPU job instead of queueing behind waiting GPU jobs.
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1
# No slurmdbd: sacct cannot answer, the profile polls squeue, and finished jobs stay visible for an hour.
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MinJobAge=3600
ReturnToService=2
GresTypes=gpu
NodeName=$HOST NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$MEM_MB Gres=gpu:1 State=UNKNOWN
PartitionName=main Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
EOF
cat >"$CL/gres.conf" <<EOF
AutoDetect=off
NodeName=$HOST Name=gpu File=$CL/dev/nvidia0
EOF
export SLURM_CONF=$CL/slurm.conf
# The plugin strips SLURM_CONF from the environment of the srun inside each job; srun then looks for
# /run/slurm/conf/slurm.conf (where a configless slurmd caches its config), so link our config directory there.
# No SLURM daemon runs here (checked above), so whatever stands at /run/slurm/conf is a leftover (a killed earlier
# run's link, a configless cache): set it aside for the test and put it back on exit.
if [ -e /run/slurm/conf ] || [ -L /run/slurm/conf ]; then
  say "/run/slurm/conf exists with no SLURM daemon running; set aside to $WORK/run-slurm-conf.saved for the test"
  mv /run/slurm/conf "$WORK/run-slurm-conf.saved" || fail "could not move /run/slurm/conf aside"
  RUN_SLURM_SAVED=1
fi
mkdir -p /run/slurm
ln -s "$CL" /run/slurm/conf

slurmctld -f "$SLURM_CONF" || fail "slurmctld did not start; see $CL/log/slurmctld.log"
wait_for_file "$CL/slurmctld.pid" 15 || fail "slurmctld wrote no PID file; see $CL/log/slurmctld.log"
PIDS_TO_STOP=("$(cat "$CL/slurmctld.pid")" "${PIDS_TO_STOP[@]}")
slurmd -f "$SLURM_CONF" -N "$HOST" || fail "slurmd did not start; see $CL/log/slurmd.log"
wait_for_file "$CL/slurmd.pid" 15 || fail "slurmd wrote no PID file; see $CL/log/slurmd.log"
PIDS_TO_STOP=("$(cat "$CL/slurmd.pid")" "${PIDS_TO_STOP[@]}")

state=""
for _ in $(seq 60); do
  state=$(sinfo -h -n "$HOST" -o %T 2>/dev/null || true)
  [ "$state" = idle ] && break
  sleep 1
done
[ "$state" = idle ] || fail "node $HOST is '$state', not idle, after 60 s; see $CL/log/slurmd.log"
[ "$(timeout 60 srun -N1 hostname)" = "$(hostname)" ] || fail "srun hostname did not run on $HOST"
timeout 60 srun --gpus=1 true || fail "a one-GPU srun did not run (gres/gpu misconfigured?)"
say "cluster up: node $HOST idle, $CPUS CPUs, ${MEM_MB} MB, gpu:1 ($(sinfo -h -o '%G'))"

# ------------------------------------------------------------------------------------------- hyperopt storage
STORAGE=journal
pg_unavailable=$(cd "$REPO" && "$PYTHON" -c 'from tests.postgres.cluster import unavailable; print(unavailable())')
if [ -z "$pg_unavailable" ]; then
  PG_DIR=$WORK/postgres
  PG_URL=$(cd "$REPO" && "$PYTHON" -m tests.postgres.cluster start "$PG_DIR") ||
    fail "PostgreSQL did not start; see $PG_DIR/server.log"
  STORAGE=postgres
  say "hyperopt storage: PostgreSQL on ${PG_URL##*@} (a throwaway cluster in $PG_DIR)"
else
  say "hyperopt storage: journal file ($pg_unavailable)"
fi

# ------------------------------------------------------------------------------------------- the runs
SLURM_RUN=$WORK/slurm_run
LOCAL_RUN=$WORK/local_run
mkdir -p "$SLURM_RUN" "$LOCAL_RUN"
checks() { (cd "$REPO" && "$PYTHON" -m tests.slurm.slurm_checks "$@"); }
checks config "$REPO/tests/configs/tiny.yaml" "$SLURM_RUN/config.yaml"
cp "$SLURM_RUN/config.yaml" "$LOCAL_RUN/config.yaml"
checks profile "$REPO/profiles/slurm/config.yaml" "$WORK/profile"

# squeue once a second: the evidence that SLURM, not Snakemake, held GPU jobs back.
(while :; do
  echo "t=$(date +%s)"
  squeue -h -o '%i|%k|%T|%r' 2>/dev/null || true
  sleep 1
done) >"$WORK/squeue.log" &
SAMPLER_PID=$!

say "running the tiny pipeline through SLURM in $SLURM_RUN"
started=$(date +%s)
(
  cd "$SLURM_RUN"
  [ "$STORAGE" = postgres ] && export MARKETRL_OPTUNA_STORAGE=$PG_URL # the jobs inherit it through sbatch
  timeout "$RUN_TIMEOUT_S" "$PYTHON" -m snakemake -s "$REPO/Snakefile" \
    --workflow-profile "$WORK/profile" results/eval_report.html
) >"$WORK/slurm_run.log" 2>&1 || {
  tail -n 60 "$WORK/slurm_run.log" >&2
  fail "the pipeline failed under SLURM; log: $WORK/slurm_run.log, job logs: $SLURM_RUN/results/logs"
}
say "SLURM run done in $(($(date +%s) - started)) s"
stop_pid "$SAMPLER_PID"
SAMPLER_PID=""
scontrol show job -o >"$WORK/scontrol.txt"

# The local reference: the same config without SLURM, on the default journal storage. With PostgreSQL it runs its
# own hyperopt: per-slot seeds make each trial independent of which worker claims it (and the tiny study is too
# small for the pruner), so the studies must agree. With the journal it is given the SLURM run's hyperopt results
# (and may not run the hyperopt rules), as before. gpu=2: the local run need not serialize its GPU-flagged jobs
# (they train on the CPU).
say "running the same config locally in $LOCAL_RUN"
started=$(date +%s)
mkdir -p "$LOCAL_RUN/results"
[ "$STORAGE" = journal ] && cp -r "$SLURM_RUN/results/hyperopt" "$LOCAL_RUN/results/hyperopt"
(
  cd "$LOCAL_RUN"
  unset MARKETRL_OPTUNA_STORAGE
  excluded=(-e all)
  [ "$STORAGE" = journal ] && excluded+=(-e hyperopt_worker -e hyperopt_best)
  mapfile -t rules < <("$PYTHON" -m snakemake -s "$REPO/Snakefile" --list-rules 2>/dev/null | grep -vx "${excluded[@]}")
  timeout "$RUN_TIMEOUT_S" "$PYTHON" -m snakemake -s "$REPO/Snakefile" results/eval_report.html --cores 2 \
    --resources gpu=2 --allowed-rules "${rules[@]}"
) >"$WORK/local_run.log" 2>&1 || {
  tail -n 60 "$WORK/local_run.log" >&2
  fail "the local reference run failed; log: $WORK/local_run.log"
}
say "local run done in $(($(date +%s) - started)) s"

pg_args=()
[ "$STORAGE" = postgres ] && pg_args=(--postgres-password-file "$PG_DIR/pwfile")
checks check --slurm-run "$SLURM_RUN" --local-run "$LOCAL_RUN" --scontrol "$WORK/scontrol.txt" \
  --squeue "$WORK/squeue.log" "${pg_args[@]}" || fail "checks failed (above); work directory $WORK"
say "PASSED"
