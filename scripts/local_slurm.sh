#!/usr/bin/env bash
# A single-node Slurm cluster on 127.0.0.1 for tests: `posbench submit` against a real scheduler.
#
#   scripts/local_slurm.sh start DIR   install Slurm and munge (Debian packages) if missing, write
#                                      DIR/slurm.conf, start munged, slurmctld and slurmd as root,
#                                      wait until the node is idle; then: export SLURM_CONF=DIR/slurm.conf
#   scripts/local_slurm.sh stop DIR    stop the three daemons by the PIDs they wrote under DIR
#
# Everything (config, munge key and socket, state, spool, logs, PID files) lives under DIR, found
# by the commands through SLURM_CONF: nothing under /etc is read or changed. No systemd and no
# cgroups: processes are tracked by parent PID (proctrack/linuxproc), tasks are not bound
# (task/none) and no accounting is gathered, which is what a container or a CI runner allows.
set -euo pipefail

usage() { echo "usage: $0 start|stop DIR" >&2; exit 2; }
[ $# -eq 2 ] || usage
action=$1
dir=$(realpath -m "$2")
conf=$dir/slurm.conf

install() {
    command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null \
        && command -v sbatch >/dev/null && return
    [ "$(id -u)" -eq 0 ] || { echo "error: installing Slurm needs root" >&2; exit 2; }
    export DEBIAN_FRONTEND=noninteractive
    # The package lists of a fresh machine may be empty or stale: update once, then install.
    apt-get install -y -q slurmctld slurmd munge >/dev/null 2>&1 \
        || { apt-get update -q >/dev/null && apt-get install -y -q slurmctld slurmd munge >/dev/null; }
}

write_config() {
    local host cpus
    host=$(hostname -s)
    cpus=$(nproc)
    mkdir -p "$dir"/{state,spool,log,munge}
    chmod 700 "$dir/munge"
    dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
    chmod 600 "$dir/munge/munge.key"
    # MinJobAge and the scheduler parameters: finished jobs leave the queue within seconds and a
    # submitted job starts at once, so `sbatch --wait` and the tests see jobs end promptly.
    cat > "$conf" <<EOF
ClusterName=posbench
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
ReturnToService=2
MinJobAge=5
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
}

start() {
    if [ -f "$dir/slurmctld.pid" ] && kill -0 "$(cat "$dir/slurmctld.pid")" 2>/dev/null; then
        echo "error: a Slurm of $dir is running; stop it first" >&2
        exit 2
    fi
    install
    write_config
    export SLURM_CONF=$conf
    munged --force --key-file="$dir/munge/munge.key" --socket="$dir/munge/munge.socket" \
        --pid-file="$dir/munged.pid" --log-file="$dir/log/munged.log" --seed-file="$dir/munge/munged.seed"
    slurmctld
    slurmd
    local state=""
    for _ in $(seq 120); do
        state=$(sinfo -h -o %T 2>/dev/null || true)
        [ "$state" = idle ] && { echo "Slurm is up: export SLURM_CONF=$conf"; return; }
        sleep 0.5
    done
    echo "error: the node did not become idle within 60 s (state: ${state:-no answer}); logs in $dir/log" >&2
    stop
    exit 1
}

stop() {
    local name pid
    for name in slurmd slurmctld munged; do
        [ -f "$dir/$name.pid" ] || continue
        pid=$(cat "$dir/$name.pid")
        kill "$pid" 2>/dev/null || continue
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
        kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
        rm -f "$dir/$name.pid"
    done
}

case $action in
    start) start ;;
    stop) stop ;;
    *) usage ;;
esac
