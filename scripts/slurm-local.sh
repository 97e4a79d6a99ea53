#!/usr/bin/env bash
# A single-node Slurm on this machine, for trying `--executor slurm` and for the tests in tests/core/test_slurm.py.
#
#   scripts/slurm-local.sh start    # munged, slurmctld and slurmd on localhost; prints the SLURM_CONF line
#   scripts/slurm-local.sh status   # sinfo through this cluster's config
#   scripts/slurm-local.sh stop     # stops the daemons this script started
#
# Needs Debian's slurm-wlm and munge (apt-get install -y slurm-wlm munge) and root (the daemons run as
# root: SlurmUser=root). Everything lives in $AUDITOR_SLURM_DIR (default /tmp/attention-auditor-slurm):
# slurm.conf, state, spool, logs and pid files. Clients find the cluster through SLURM_CONF:
#   export SLURM_CONF=/tmp/attention-auditor-slurm/slurm.conf
# The node is this machine with the CPUs and memory `slurmd -C` reports; one partition, `debug`.
set -euo pipefail

DIR="${AUDITOR_SLURM_DIR:-/tmp/attention-auditor-slurm}"
CONF="$DIR/slurm.conf"
CTLD_PORT="${AUDITOR_SLURM_PORT:-6817}"
export SLURM_CONF="$CONF"

die() { echo "slurm-local: $*" >&2; exit 1; }

need_binaries() {
    local missing=()
    for b in slurmctld slurmd munged sinfo sbatch srun; do
        command -v "$b" >/dev/null 2>&1 || missing+=("$b")
    done
    [ ${#missing[@]} -eq 0 ] || die "missing ${missing[*]}; install them with: apt-get install -y slurm-wlm munge"
}

alive() {  # alive PIDFILE: the process named in PIDFILE runs
    [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null
}

start_munge() {
    if munge -n </dev/null >/dev/null 2>&1; then return 0; fi  # a munged already answers
    if [ ! -s /etc/munge/munge.key ]; then
        mkdir -p /etc/munge
        if command -v mungekey >/dev/null 2>&1; then mungekey --create --force >/dev/null
        else dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=128 status=none; fi
        chmod 400 /etc/munge/munge.key
        if id munge >/dev/null 2>&1; then chown munge:munge /etc/munge/munge.key; fi
    fi
    mkdir -p /run/munge /var/log/munge /var/lib/munge
    if id munge >/dev/null 2>&1; then
        chown munge:munge /run/munge /var/log/munge /var/lib/munge /etc/munge
        runuser -u munge -- munged --pid-file=/run/munge/munged.pid
    else
        munged --force --pid-file=/run/munge/munged.pid
    fi
    cp /run/munge/munged.pid "$DIR/munged.pid"  # started here: `stop` stops it
    for _ in $(seq 50); do munge -n </dev/null >/dev/null 2>&1 && return 0; sleep 0.1; done
    die "munged did not start; see /var/log/munge/munged.log"
}

write_conf() {
    local node
    node="$(slurmd -C | head -n 1)"  # NodeName=<host> CPUs=.. Boards=.. ... RealMemory=..
    [[ "$node" == NodeName=* ]] || die "slurmd -C printed no node line: $node"
    local host="${node%% *}"; host="${host#NodeName=}"
    mkdir -p "$DIR/state" "$DIR/spool" "$DIR/log"
    cat >"$CONF" <<EOF
# Made by scripts/slurm-local.sh: a single-node Slurm on localhost (root runs everything).
ClusterName=auditor-local
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$((CTLD_PORT + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/pgid
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MailProg=/bin/true
KillWait=2
MinJobAge=300
SchedulerParameters=sched_interval=2
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
$node NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
}

wait_idle() {
    for _ in $(seq 150); do
        state="$(timeout 5 sinfo -h -o %T 2>/dev/null | head -n 1 || true)"
        case "$state" in idle|mixed|allocated) return 0 ;; esac
        sleep 0.2
    done
    die "the node did not come up (state '${state:-none}'); see $DIR/log/slurmctld.log and slurmd.log"
}

start() {
    need_binaries
    [ "$(id -u)" -eq 0 ] || die "run it as root (the daemons run as SlurmUser=root)"
    mkdir -p "$DIR"
    if alive "$DIR/slurmctld.pid" && alive "$DIR/slurmd.pid"; then
        wait_idle; echo "export SLURM_CONF=$CONF"; return 0
    fi
    start_munge
    write_conf
    alive "$DIR/slurmctld.pid" || slurmctld -f "$CONF"
    alive "$DIR/slurmd.pid" || slurmd -f "$CONF"
    wait_idle
    scontrol update nodename="$(sinfo -h -o %N | head -n 1)" state=resume >/dev/null 2>&1 || true
    echo "export SLURM_CONF=$CONF"
}

stop() {
    for name in slurmd slurmctld munged; do
        local pidfile="$DIR/$name.pid"
        if alive "$pidfile"; then
            local pid; pid="$(cat "$pidfile")"
            kill "$pid"
            for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        fi
        rm -f "$pidfile"
    done
}

status() {
    [ -f "$CONF" ] || die "not started here (no $CONF); run: $0 start"
    alive "$DIR/slurmctld.pid" || die "slurmctld is not running; run: $0 start"
    timeout 10 sinfo
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    status) status ;;
    *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
