#!/usr/bin/env bash
# A two-node Slurm cluster on this one machine, for xlarun's multi-node tests.
#
#   scripts/slurm-cluster.sh start    install what is missing, start the daemons, wait for idle nodes
#   scripts/slurm-cluster.sh stop     cancel the cluster's jobs and stop the daemons this script started
#   scripts/slurm-cluster.sh status   show which daemons run and what sinfo says
#
# `start` reuses a cluster that already runs healthy with the configuration it would write now;
# anything else left over (a daemon down, nodes down, an older configuration, daemons of this
# configuration whose pid files are gone) is stopped first and a fresh cluster started.
#
# One slurmctld and two slurmd daemons (nodes n1 and n2, both 127.0.0.1, told apart by port)
# run from a private state directory; Slurm's clients and daemons find the configuration
# through SLURM_CONF. On success `start` and `status` print exactly one line on stdout,
# `SLURM_CONF=<path>`, so a caller can `export "$(scripts/slurm-cluster.sh start)"`;
# progress and errors go to stderr. Every command is safe to repeat.
#
# Needs root and Debian's slurmctld, slurmd, slurm-client and munge packages (installed on
# demand). Exit status: 0 done, 1 the cluster failed, 2 bad usage, 3 this machine cannot host
# the cluster (not root, packages not installable).
#
# Settings (environment):
#   XLARUN_SLURM_DIR   state directory (default /var/tmp/xlarun-slurm)
#   XLARUN_SLURM_PORT  slurmctld's port; the two slurmd daemons use the next two (default 16817)
#   XLARUN_SLURM_WAIT  seconds to wait for both nodes to become idle (default 60)

set -euo pipefail

STATE_DIR=${XLARUN_SLURM_DIR:-/var/tmp/xlarun-slurm}
CTLD_PORT=${XLARUN_SLURM_PORT:-16817}
READY_WAIT=${XLARUN_SLURM_WAIT:-60}
CONF="$STATE_DIR/slurm.conf"
NODES=(n1 n2)
PACKAGES=(slurmctld slurmd slurm-client munge)
MUNGE_KEY=/etc/munge/munge.key
MUNGE_PID_FILE=/run/munge/munged.pid
# Holds munged's pid only when this script started it: a munged that was already serving
# the machine is used but never stopped.
OWN_MUNGED="$STATE_DIR/munged.pid"

export SLURM_CONF="$CONF"

# Runs a command without the lock's descriptor (fd 9, see main): a daemon started by the command,
# directly or by a package's install script, would otherwise hold the lock for as long as it runs.
without_lock() { "$@" 9>&-; }

say() { printf 'slurm-cluster: %s\n' "$*" >&2; }
die() { say "$1"; exit "${2:-1}"; }

require_root() {
    [[ $(id -u) -eq 0 ]] || die "must run as root (the daemons switch users and bind to ports as root)" 3
}

packages_missing() {
    local pkg missing=()
    for pkg in "${PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
    done
    echo "${missing[@]}"
}

install_packages() {
    local missing log
    missing=$(packages_missing)
    [[ -z $missing ]] && return 0
    command -v apt-get >/dev/null || die "packages missing ($missing) and no apt-get to install them" 3
    say "installing $missing"
    log="$STATE_DIR/apt.log"
    # shellcheck disable=SC2086  # $missing is a list of package names
    if ! DEBIAN_FRONTEND=noninteractive without_lock apt-get install -y --no-install-recommends \
            -o DPkg::Lock::Timeout=300 $missing >"$log" 2>&1; then
        # Only stale or absent package lists are worth a refresh; other failures are final.
        grep -qE 'Unable to locate package|has no installation candidate|Failed to fetch' "$log" \
            || die "apt-get install failed: $(tail -n 1 "$log")" 3
        say "package lists are missing or stale: running apt-get update"
        without_lock apt-get update >>"$log" 2>&1 || die "apt-get update failed: $(tail -n 1 "$log")" 3
        # shellcheck disable=SC2086
        DEBIAN_FRONTEND=noninteractive without_lock apt-get install -y --no-install-recommends \
            -o DPkg::Lock::Timeout=300 $missing >>"$log" 2>&1 \
            || die "apt-get install failed: $(tail -n 1 "$log")" 3
    fi
}

munge_works() {
    munge -n 2>/dev/null | unmunge >/dev/null 2>&1
}

start_munged() {
    if [[ ! -s $MUNGE_KEY ]]; then
        say "creating $MUNGE_KEY"
        mungekey --create --keyfile="$MUNGE_KEY"
        chown munge:munge "$MUNGE_KEY"
        chmod 0400 "$MUNGE_KEY"
    fi
    munge_works && return 0
    say "starting munged"
    install -d -o munge -g munge -m 0755 /run/munge
    install -d -o munge -g munge -m 0700 /var/log/munge /var/lib/munge
    without_lock runuser -u munge -- /usr/sbin/munged </dev/null >/dev/null 2>&1 \
        || die "munged did not start; see /var/log/munge/munged.log"
    local i
    for ((i = 0; i < 50; i++)); do
        if munge_works; then
            cp "$MUNGE_PID_FILE" "$OWN_MUNGED"
            return 0
        fi
        sleep 0.1
    done
    die "munged started but does not answer; see /var/log/munge/munged.log"
}

ensure_node_names_resolve() {
    local node
    for node in "${NODES[@]}"; do
        if ! getent hosts "$node" >/dev/null; then
            say "adding $node to /etc/hosts"
            printf '127.0.0.1 %s\n' "$node" >>/etc/hosts
        fi
    done
}

conf_text() {
    local first_port=$((CTLD_PORT + 1)) last_port=$((CTLD_PORT + ${#NODES[@]}))
    cat <<EOF
# Written by scripts/slurm-cluster.sh: two nodes on this machine, told apart by port.
ClusterName=xlarun
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$STATE_DIR/ctld
SlurmdSpoolDir=$STATE_DIR/spool/%n
SlurmctldPidFile=$STATE_DIR/slurmctld.pid
SlurmdPidFile=$STATE_DIR/slurmd-%n.pid
SlurmctldLogFile=$STATE_DIR/log/slurmctld.log
SlurmdLogFile=$STATE_DIR/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
SwitchType=switch/none
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MailProg=/bin/true
ReturnToService=2
# Short timeouts: a test cluster should notice a dead daemon and end steps quickly.
SlurmdTimeout=30
KillWait=5
InactiveLimit=0
NodeName=n[1-${#NODES[@]}] NodeHostname=localhost NodeAddr=127.0.0.1 Port=$first_port-$last_port CPUs=$(nproc) State=UNKNOWN
PartitionName=debug Nodes=n[1-${#NODES[@]}] Default=YES MaxTime=INFINITE State=UP
EOF
}

write_conf() {
    mkdir -p "$STATE_DIR/ctld" "$STATE_DIR/log"
    local node
    for node in "${NODES[@]}"; do mkdir -p "$STATE_DIR/spool/$node"; done
    conf_text >"$CONF"
}

# True when the configuration on disk is the one this script writes now: a cluster started by an
# older version of the script, or on a machine with another CPU count, is not reused.
conf_is_current() {
    [[ -f $CONF ]] && [[ $(conf_text) == "$(<"$CONF")" ]]
}

# Prints the pid recorded in a pid file if that process is still alive and runs the named program.
live_pid() {
    local pid_file=$1 program=$2 pid
    [[ -s $pid_file ]] || return 1
    pid=$(<"$pid_file")
    [[ $pid =~ ^[0-9]+$ ]] || return 1
    [[ -r /proc/$pid/cmdline ]] || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q "$program" || return 1
    echo "$pid"
}

daemon_pid_files() {
    local node
    echo "$STATE_DIR/slurmctld.pid slurmctld"
    for node in "${NODES[@]}"; do echo "$STATE_DIR/slurmd-$node.pid slurmd"; done
}

# Slurm daemons started with this cluster's configuration that no pid file names (a pid file
# removed or overwritten): a second slurmctld or slurmd beside them would fight over the ports.
stray_daemon_pids() {
    local proc comm
    for proc in /proc/[0-9]*; do
        { read -r comm <"$proc/comm"; } 2>/dev/null || continue
        [[ $comm == slurmctld || $comm == slurmd ]] || continue
        if tr '\0' '\n' <"$proc/environ" 2>/dev/null | grep -qxF "SLURM_CONF=$CONF"; then
            echo "${proc#/proc/}"
        fi
    done
}

all_daemons_alive() {
    local pid_file program
    while read -r pid_file program; do
        live_pid "$pid_file" "$program" >/dev/null || return 1
    done < <(daemon_pid_files)
}

# True when every node's short sinfo state matches the extended regular expression.
nodes_in_state() {
    local pattern=$1 states
    states=$(timeout 10 sinfo -h -N -o '%N %t' 2>/dev/null | sort -u) || return 1
    [[ $(grep -cE " ($pattern)\$" <<<"$states") -eq ${#NODES[@]} ]]
}

# Sends SIGTERM, waits up to ten seconds, then SIGKILL.
end_process() {
    local pid=$1 i
    kill -TERM "$pid" 2>/dev/null || return 0
    for ((i = 0; i < 100; i++)); do
        kill -0 "$pid" 2>/dev/null || return 0
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
}

cancel_jobs() {
    live_pid "$STATE_DIR/slurmctld.pid" slurmctld >/dev/null || return 0
    local jobs deadline=$((SECONDS + 15))
    jobs=$(timeout 10 squeue -h -o '%i' 2>/dev/null) || return 0
    [[ -z $jobs ]] && return 0
    say "cancelling jobs: $(echo $jobs)"
    # shellcheck disable=SC2086  # $jobs is a list of job ids
    timeout 10 scancel $jobs 2>/dev/null || true
    while ((SECONDS < deadline)); do
        [[ -z $(timeout 10 squeue -h -o '%i' 2>/dev/null) ]] && return 0
        sleep 0.2
    done
    say "jobs still listed after 15 s; stopping the daemons anyway"
}

stop_slurm_daemons() {
    local pid_file program pid
    cancel_jobs
    # The node daemons first, so none is left talking to a controller that is gone.
    while read -r pid_file program; do
        if pid=$(live_pid "$pid_file" "$program"); then
            say "stopping $program (pid $pid)"
            end_process "$pid"
        fi
        rm -f "$pid_file"
    done < <(daemon_pid_files | tac)
    for pid in $(stray_daemon_pids); do
        say "stopping a daemon of this cluster that no pid file names (pid $pid)"
        end_process "$pid"
    done
}

stop_own_munged() {
    local pid
    if pid=$(live_pid "$OWN_MUNGED" munged); then
        say "stopping munged (pid $pid)"
        end_process "$pid"
    fi
    rm -f "$OWN_MUNGED"
}

show_logs() {
    local log
    for log in "$STATE_DIR"/log/*.log; do
        [[ -f $log ]] || continue
        say "--- last lines of $log"
        tail -n 15 "$log" >&2
    done
}

start_daemons() {
    local node
    say "starting slurmctld on 127.0.0.1:$CTLD_PORT"
    # -c: a fresh controller state each start, so no job or node state leaks between runs.
    without_lock slurmctld -c </dev/null >>"$STATE_DIR/log/launch.log" 2>&1 \
        || { show_logs; stop_slurm_daemons; die "slurmctld did not start"; }
    for node in "${NODES[@]}"; do
        say "starting slurmd for $node"
        without_lock slurmd -N "$node" </dev/null >>"$STATE_DIR/log/launch.log" 2>&1 \
            || { show_logs; stop_slurm_daemons; die "slurmd for $node did not start"; }
    done
    local deadline=$((SECONDS + READY_WAIT))
    while ((SECONDS < deadline)); do
        nodes_in_state idle && return 0
        sleep 0.5
    done
    say "sinfo after ${READY_WAIT} s:"
    timeout 10 sinfo -N >&2 || true
    show_logs
    stop_slurm_daemons
    die "nodes ${NODES[*]} did not become idle within ${READY_WAIT} s"
}

cmd_start() {
    install_packages
    start_munged
    ensure_node_names_resolve
    # Busy nodes count as up: another test session may be running a job on them.
    if all_daemons_alive && conf_is_current && nodes_in_state 'idle|mix|alloc|comp'; then
        say "already running"
    else
        # Whatever is left of an earlier, partial start goes before a clean one begins.
        stop_slurm_daemons
        write_conf
        start_daemons
        say "both nodes idle"
    fi
    echo "SLURM_CONF=$CONF"
}

cmd_stop() {
    stop_slurm_daemons
    stop_own_munged
}

cmd_status() {
    local pid_file program pid running=0
    while read -r pid_file program; do
        if pid=$(live_pid "$pid_file" "$program"); then
            say "$(basename "$pid_file" .pid): running (pid $pid)"
        else
            say "$(basename "$pid_file" .pid): not running"
            running=1
        fi
    done < <(daemon_pid_files)
    [[ $running -eq 0 ]] || return 1
    timeout 10 sinfo -N >&2
    echo "SLURM_CONF=$CONF"
}

main() {
    [[ $# -eq 1 ]] || die "usage: $0 start|stop|status" 2
    case $1 in
        status) cmd_status ;;
        start | stop)
            require_root
            mkdir -p "$STATE_DIR"
            # One command at a time: test sessions may start the cluster concurrently.
            exec 9>"$STATE_DIR/lock"
            flock -w 600 9 || die "another slurm-cluster.sh command holds $STATE_DIR/lock"
            "cmd_$1"
            ;;
        *) die "usage: $0 start|stop|status (got '$1')" 2 ;;
    esac
}

main "$@"
