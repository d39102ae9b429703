#!/usr/bin/env bash
# A one-node SLURM cluster on this machine, to try and test the sweep's SLURM executor:
#
#   bash scripts/slurm_cluster.sh up       # install what is missing (apt), start it, wait for an idle node
#   bash scripts/slurm_cluster.sh status   # which of its daemons run; sinfo
#   bash scripts/slurm_cluster.sh env      # the line to paste into a shell: export SLURM_CONF=...
#   bash scripts/slurm_cluster.sh down     # stop exactly the daemons `up` started (by their PIDs)
#
# As root, without systemd or cgroups: munged, a local MariaDB (so that sacct answers; submitit reads
# job states through it), slurmdbd, slurmctld and slurmd, on ports of their own. Everything it writes
# (configuration, PIDs, logs, spool, database) lives in $SLURM_CLUSTER_DIR
# (default /var/tmp/cacheable-moe-slurm). SLURM's commands find the cluster through
# SLURM_CONF=$SLURM_CLUSTER_DIR/etc/slurm.conf.
set -euo pipefail

DIR=${SLURM_CLUSTER_DIR:-/var/tmp/cacheable-moe-slurm}
PARTITION=${SLURM_CLUSTER_PARTITION:-debug}
PORT_BASE=${SLURM_CLUSTER_PORT_BASE:-16817}   # slurmctld, slurmd, slurmdbd, MariaDB: four ports from here
WAIT_S=${SLURM_CLUSTER_WAIT_S:-120}            # per daemon; generous, a loaded machine is slow, not broken
CLUSTER=cacheablemoe
CTLD_PORT=$PORT_BASE SLURMD_PORT=$((PORT_BASE + 1)) DBD_PORT=$((PORT_BASE + 2)) DB_PORT=$((PORT_BASE + 3))
PACKAGES=(slurm-wlm slurmdbd munge mariadb-server mariadb-client)
DAEMONS=(munged mariadbd slurmdbd slurmctld slurmd)  # start order; `down` stops them in reverse
MUNGE_SOCKET=/run/munge/munge.socket.2
export SLURM_CONF=$DIR/etc/slurm.conf

die() { echo "error: slurm_cluster.sh: $*" >&2; exit 2; }

pid_of() {  # the PID `up` recorded for daemon $1, if that process still runs that program
  local file=$DIR/run/$1.pid pid
  [[ -s $file ]] || return 1
  pid=$(<"$file")
  [[ -r /proc/$pid/comm && $(cat "/proc/$pid/comm" 2>/dev/null) == "$1"* ]] || return 1
  echo "$pid"
}

running() { pid_of "$1" >/dev/null; }

STARTED=()  # the daemons this `up` started (the others ran already)

start() {  # start() NAME COMMAND...: in its own session, output to its log, its PID recorded
  local name=$1; shift
  running "$name" && return 0
  setsid "$@" >>"$DIR/log/$name.out" 2>&1 </dev/null 9>&- &  # 9: the lock of `up`, not theirs
  echo $! >"$DIR/run/$name.pid"
  STARTED+=("$name")
}

wait_until() {  # wait_until WHAT LOG COMMAND...: polls COMMAND until it succeeds; on time-out prints LOG
  local what=$1 log=$2; shift 2
  local end=$((SECONDS + WAIT_S))
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS > end)); then
      echo "error: slurm_cluster.sh: no $what within ${WAIT_S}s; the end of $log:" >&2
      tail -n 30 "$log" >&2 2>/dev/null || true
      exit 3
    fi
    sleep 0.5
  done
}

install_missing() {
  local missing=() pkg
  for pkg in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  ((${#missing[@]})) || return 0
  command -v apt-get >/dev/null || die "${missing[*]} missing and no apt-get here; install SLURM 22.05+, munge and MariaDB yourself"
  echo "installing ${missing[*]} (apt)"
  local attempt
  for attempt in 1 2 3; do  # a mirror hiccup is retried, a real failure shows apt's log
    if apt-get update -qq >"$DIR/log/apt.log" 2>&1 &&
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >>"$DIR/log/apt.log" 2>&1; then
      return 0
    fi
    sleep $((attempt * 5))
  done
  tail -n 20 "$DIR/log/apt.log" >&2
  die "apt-get could not install ${missing[*]} (log: $DIR/log/apt.log)"
}

write_configs() {
  local host node mem cpus
  host=$(hostname -s)
  # The node as slurmd sees it (a node configured larger than that would be drained).
  node=$(slurmd -C | head -n 1)
  mem=$(sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' <<<"$node")
  cpus=$(sed -n 's/.*CPUs=\([0-9]*\).*/\1/p' <<<"$node")
  [[ -n $mem && -n $cpus ]] || die "cannot read this machine's CPUs and memory from 'slurmd -C': $node"
  [[ -s $DIR/etc/db.pass ]] || (umask 077 && head -c 18 /dev/urandom | base64 | tr -d '/+=' >"$DIR/etc/db.pass")
  cat >"$DIR/etc/slurm.conf" <<EOF
# Written by scripts/slurm_cluster.sh: one node ($host), one partition ($PARTITION).
ClusterName=$CLUSTER
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# A requeued job waits cred_expire seconds before it may start again (default 120).
AuthInfo=cred_expire=10
CredType=cred/munge
StateSaveLocation=$DIR/spool/slurmctld
SlurmdSpoolDir=$DIR/spool/slurmd
SlurmctldPidFile=$DIR/spool/slurmctld.pid
SlurmdPidFile=$DIR/spool/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/backfill
# Look at pending jobs every few seconds (defaults: 60 and 30): a requeued job starts again soon after it may.
SchedulerParameters=sched_interval=3,bf_interval=3
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
DefMemPerCPU=$((mem / cpus))
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=5
JobAcctGatherParams=OverMemoryKill
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=$DBD_PORT
ReturnToService=2
SlurmctldTimeout=60
SlurmdTimeout=120
MessageTimeout=30
KillWait=30
MinJobAge=600
$node State=UNKNOWN NodeAddr=127.0.0.1 NodeHostname=$host
PartitionName=$PARTITION Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
  (umask 077 && cat >"$DIR/etc/slurmdbd.conf" <<EOF
# Written by scripts/slurm_cluster.sh: accounting in the local MariaDB it starts.
AuthType=auth/munge
DbdHost=localhost
DbdPort=$DBD_PORT
SlurmUser=root
LogFile=$DIR/log/slurmdbd.log
PidFile=$DIR/spool/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=$(<"$DIR/etc/db.pass")
StorageLoc=slurm_acct_db
EOF
  )
}

munge_answers() { munge --socket="$MUNGE_SOCKET" -n 2>/dev/null | unmunge --socket="$MUNGE_SOCKET" >/dev/null 2>&1; }

sql() { mariadb --no-defaults --socket="$DIR/db/mysqld.sock" -uroot -e "$1"; }

node_idle() { sinfo --noheader --nodes="$(hostname -s)" --format=%T | grep -qE '^(idle|mixed|allocated)'; }

up() {
  [[ $(id -u) == 0 ]] || die "must run as root (it installs packages and starts SLURM's daemons as root)"
  mkdir -p "$DIR"/{etc,run,log,munge,db,spool/slurmctld,spool/slurmd}
  chmod 700 "$DIR" "$DIR/munge"
  exec 9>"$DIR/run/lock"
  flock 9  # two `up`s at once (parallel test workers) start one cluster
  local t0=$SECONDS
  install_missing
  local t_daemons=$SECONDS
  write_configs

  [[ -s $DIR/munge/munge.key ]] || (umask 077 && dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none)
  # MUNGE's default socket: SLURM's clients (sacctmgr too) look for it there. A munged already
  # answering on it (the system's) serves this cluster as well, and is left alone by `down`.
  if ! running munged && ! munge_answers; then
    mkdir -p "$(dirname "$MUNGE_SOCKET")"
    start munged munged --foreground --force --socket="$MUNGE_SOCKET" --key-file="$DIR/munge/munge.key" \
      --pid-file="$DIR/munge/munged.pid" --log-file="$DIR/log/munged.log" --seed-file="$DIR/munge/munged.seed"
  fi
  wait_until "munged answering" "$DIR/log/munged.log" munge_answers

  if [[ ! -d $DIR/db/mysql ]]; then
    mariadb-install-db --no-defaults --user=root --datadir="$DIR/db" --auth-root-authentication-method=socket \
      --skip-test-db >"$DIR/log/mariadb-install.log" 2>&1 || { tail -n 20 "$DIR/log/mariadb-install.log" >&2; die "mariadb-install-db failed"; }
  fi
  start mariadbd mariadbd --no-defaults --user=root --datadir="$DIR/db" --socket="$DIR/db/mysqld.sock" \
    --port="$DB_PORT" --bind-address=127.0.0.1 --pid-file="$DIR/db/mariadbd.pid" --log-error="$DIR/log/mariadb.log" \
    --innodb-buffer-pool-size=64M --innodb-log-file-size=16M
  wait_until "MariaDB answering" "$DIR/log/mariadb.log" sql "SELECT 1"
  local pass
  pass=$(<"$DIR/etc/db.pass")
  sql "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$pass'; ALTER USER 'slurm'@'127.0.0.1' IDENTIFIED BY '$pass';
       GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1'; FLUSH PRIVILEGES;"

  start slurmdbd slurmdbd -D
  wait_until "slurmdbd answering" "$DIR/log/slurmdbd.log" sacctmgr --noheader list cluster
  sacctmgr --immediate --quiet add cluster "$CLUSTER" >/dev/null 2>&1 || true  # exists already: fine

  start slurmctld slurmctld -D
  wait_until "slurmctld answering" "$DIR/log/slurmctld.log" scontrol ping
  start slurmd slurmd -D
  wait_until "an idle node" "$DIR/log/slurmd.log" node_idle
  wait_until "sacct answering" "$DIR/log/slurmdbd.log" sacct --noheader --allusers --starttime=now-1minute
  local how="already running"
  ((${#STARTED[@]})) && how="started ${STARTED[*]}"
  echo "slurm cluster up in $((SECONDS - t0))s (daemons: $((SECONDS - t_daemons))s; $how): partition $PARTITION, $(sinfo --noheader --format='%c CPUs, %m MB' | head -n 1)"
  echo "export SLURM_CONF=$SLURM_CONF"
}

down() {
  local i name pid stopped=()
  for ((i = ${#DAEMONS[@]} - 1; i >= 0; i--)); do
    name=${DAEMONS[i]}
    pid=$(pid_of "$name") || { rm -f "$DIR/run/$name.pid"; continue; }
    kill "$pid"
    local end=$((SECONDS + 30))
    while kill -0 "$pid" 2>/dev/null && ((SECONDS < end)); do sleep 0.2; done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
    rm -f "$DIR/run/$name.pid"
    stopped+=("$name")
  done
  echo "slurm cluster down${stopped:+ (stopped ${stopped[*]})}"
}

status() {
  local name rc=0
  for name in "${DAEMONS[@]}"; do
    if pid=$(pid_of "$name"); then echo "$name: running (pid $pid)"; else echo "$name: stopped"; rc=1; fi
  done
  ((rc == 0)) && sinfo
  return $rc
}

case ${1:-} in
  up) up ;;
  down) down ;;
  status) status ;;
  env) echo "export SLURM_CONF=$SLURM_CONF" ;;
  *) echo "usage: bash scripts/slurm_cluster.sh up|down|status|env" >&2; exit 2 ;;
esac
