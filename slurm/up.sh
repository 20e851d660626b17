#!/usr/bin/env bash
# A single-node SLURM cluster for development and tests (munge, slurmdbd, slurmctld, slurmd).
#
# Idempotent: installs Debian's packages if missing, writes /etc/slurm/{slurm,slurmdbd}.conf
# (only files it wrote before or that don't exist), starts only the daemons that are not
# running, records what it started in $PRX_SLURM_STATE (default /run/prx-slurm) so
# slurm/down.sh stops exactly those, and waits until `sinfo` shows the node idle.
# Accounting (sacct) uses the local MariaDB at 127.0.0.1:3306 when it answers; without it the
# cluster runs without accounting and the Pipes client falls back to `scontrol show job`.
# Needs root (daemons run as root; munged as the munge user).
set -euo pipefail

STATE=${PRX_SLURM_STATE:-/run/prx-slurm}
CONF=/etc/slurm
MARK="# written by prx_assets slurm/up.sh"
DB_HOST=${PRX_SLURM_DB_HOST:-127.0.0.1}
DB_PORT=${PRX_SLURM_DB_PORT:-3306}
DB_PASS=${PRX_SLURM_DB_PASS:-prx-slurm}
say() { echo "slurm/up.sh: $*" >&2; }
die() { say "$*"; exit 1; }

[ "$(id -u)" = 0 ] || die "must run as root (it installs packages and starts daemons); run: sudo bash slurm/up.sh"

node_state() { timeout 5 sinfo -h -n localhost -o %t 2>/dev/null | head -1 || true; }

# Already up (ours or someone else's): nothing to do.
if command -v sinfo >/dev/null && [[ "$(node_state)" =~ ^(idle|mix|alloc) ]]; then
  say "cluster already up (node localhost $(node_state))"; exit 0
fi

pkgs=()
for p in slurmctld slurmd slurm-client slurmdbd munge; do
  dpkg -s "$p" >/dev/null 2>&1 || pkgs+=("$p")
done
if [ ${#pkgs[@]} -gt 0 ]; then
  say "installing ${pkgs[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q --no-install-recommends "${pkgs[@]}" >/dev/null \
    || { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends "${pkgs[@]}" >/dev/null; } \
    || die "could not install ${pkgs[*]} with apt-get; install them and re-run"
fi

mkdir -p "$STATE" /var/lib/slurm/slurmctld /var/lib/slurm/slurmd /var/log/slurm /run/slurm "$CONF"

# Accounting through the local MariaDB when it answers.
ACCOUNTING=0
if command -v mysql >/dev/null && mysql -h "$DB_HOST" -P "$DB_PORT" -u root -e "select 1" >/dev/null 2>&1; then
  mysql -h "$DB_HOST" -P "$DB_PORT" -u root <<SQL
CREATE DATABASE IF NOT EXISTS slurm_acct_db;
CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$DB_PASS';
CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
CREATE USER IF NOT EXISTS 'slurm'@'%' IDENTIFIED BY '$DB_PASS';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'%';
FLUSH PRIVILEGES;
SQL
  ACCOUNTING=1
else
  say "MariaDB at $DB_HOST:$DB_PORT does not answer for root: running without accounting (no sacct)"
fi

ours() { [ ! -e "$1" ] || head -1 "$1" | grep -qF "$MARK"; }
CPUS=$(nproc)
MEM_MB=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 * 8 / 10 ))
if ours "$CONF/slurm.conf"; then
  {
    echo "$MARK"
    cat <<CONF
ClusterName=prx
SlurmctldHost=localhost
SlurmUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MinJobAge=3600
KillWait=5
StateSaveLocation=/var/lib/slurm/slurmctld
SlurmdSpoolDir=/var/lib/slurm/slurmd
SlurmctldPidFile=/run/slurm/slurmctld.pid
SlurmdPidFile=/run/slurm/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$MEM_MB State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
    if [ $ACCOUNTING = 1 ]; then
      printf '%s\n' AccountingStorageType=accounting_storage/slurmdbd AccountingStorageHost=localhost \
        AccountingStoragePort=6819 JobAcctGatherType=jobacct_gather/linux
    else
      echo JobAcctGatherType=jobacct_gather/none
    fi
  } > "$CONF/slurm.conf"
else
  say "$CONF/slurm.conf was not written by this script: using it as it is"
fi
if [ $ACCOUNTING = 1 ] && ours "$CONF/slurmdbd.conf"; then
  umask 077
  cat > "$CONF/slurmdbd.conf" <<CONF
$MARK
AuthType=auth/munge
DbdHost=localhost
DbdPort=6819
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=$DB_HOST
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=$DB_PASS
StorageLoc=slurm_acct_db
LogFile=/var/log/slurm/slurmdbd.log
PidFile=/run/slurm/slurmdbd.pid
CONF
  chmod 600 "$CONF/slurmdbd.conf"
  umask 022
fi

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...
  local n=$(( $1 * 5 )) what=$2; shift 2
  for _ in $(seq "$n"); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
  die "timed out waiting for $what; see /var/log/slurm/"
}
started() {  # started NAME PIDFILE: record the daemon's own pid (read from its pid file)
  local pid=""
  for _ in $(seq 50); do
    pid=$(cat "$2" 2>/dev/null || true)
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && break; sleep 0.1
  done
  [ -n "$pid" ] || die "$1 started but wrote no pid file $2"
  echo "$1 $pid" >> "$STATE/started"; say "started $1 (pid $pid)"
}

# munged
if ! pgrep -x munged >/dev/null; then
  [ -s /etc/munge/munge.key ] || { dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null;
                                   chown munge:munge /etc/munge/munge.key; chmod 400 /etc/munge/munge.key; }
  mkdir -p /run/munge && chown munge:munge /run/munge
  runuser -u munge -- /usr/sbin/munged
  wait_for 10 munged pgrep -x munged
  started munged /run/munge/munged.pid
fi
# slurmdbd
if [ $ACCOUNTING = 1 ] && ! pgrep -x slurmdbd >/dev/null; then
  /usr/sbin/slurmdbd
  wait_for 30 slurmdbd sacctmgr -n list cluster
  started slurmdbd /run/slurm/slurmdbd.pid
fi
# slurmctld
if ! pgrep -x slurmctld >/dev/null; then
  /usr/sbin/slurmctld
  wait_for 30 slurmctld scontrol ping
  started slurmctld /run/slurm/slurmctld.pid
fi
# slurmd
if ! pgrep -x slurmd >/dev/null; then
  /usr/sbin/slurmd -N localhost
  started slurmd /run/slurm/slurmd.pid
fi
for _ in $(seq 150); do
  st=$(node_state)
  [[ "$st" =~ ^(idle|mix|alloc) ]] && { say "node localhost $st (accounting: $ACCOUNTING)"; exit 0; }
  [[ "$st" =~ ^(down|drain|drng) ]] && scontrol update nodename=localhost state=resume >/dev/null 2>&1 || true
  sleep 0.2
done
die "node localhost did not become idle (state: $(node_state)); see /var/log/slurm/slurmd.log"
