#!/usr/bin/env bash
# Manual override of a broker group's failover on Kubernetes. The members elect their master
# through etcd (the "election" ConfigMap) and replace a lost one by themselves; this script is
# for when the election cannot: no member of the SyncStateSet is left (the group waits rather
# than lose acknowledged messages), or the group runs without an election.
#
#   k8s/scripts/promote-slave.sh <broker-group> [namespace]     e.g. broker-a mqstore
#
# 1. Asks each commitlog member of the group for its HA state (`mqstore ha state`, inside the pod).
# 2. Refuses when a master still answers (a switch needs the old master gone; see README).
# 3. Promotes the SLAVE (`mqstore ha promote`). Under the election this asks etcd for the
#    leadership (refused while another member holds it); FORCE=1 elects the slave even when it is
#    not in the SyncStateSet: what only the lost master held is lost (an unclean election).
#    Without an election it begins a new epoch, saved on the pod's volume. Gateways find the new
#    master on their own. When the old master's pod comes back, it rejoins as the new master's
#    SLAVE (its unreplicated tail is cut).
# ROLE=ASYNC_MASTER|SYNC_MASTER picks the new master's role without an election (default: the
# old master's; under the election the group's MQSTORE_MASTER_ROLE).
set -euo pipefail
group="${1:?usage: $0 <broker-group> [namespace]}"
ns="${2:-mqstore}"

role_of() {  # the role in the title of `mqstore ha state`, or nothing when the pod does not answer
  kubectl -n "$ns" exec "$1" -c commitlog -- mqstore ha state 2>/dev/null \
    | grep -oE 'SYNC_MASTER|ASYNC_MASTER|SLAVE' | head -n 1 || true
}

master="" slave=""
for i in 0 1; do
  pod="$group-commitlog-$i"
  role="$(role_of "$pod")"
  echo "$pod: ${role:-no answer}"
  case "$role" in
    SLAVE) slave="$pod" ;;
    SYNC_MASTER | ASYNC_MASTER) master="$pod" ;;
  esac
done
if [ -n "$master" ]; then
  echo "$master still answers as the master of $group: nothing to promote" >&2
  exit 1
fi
if [ -z "$slave" ]; then
  echo "no SLAVE of $group answers: nothing can be promoted" >&2
  exit 1
fi
echo "promoting $slave"
args=()
[ -n "${ROLE:-}" ] && args+=(--role "$ROLE")
[ "${FORCE:-0}" = 1 ] && args+=(--force)
kubectl -n "$ns" exec "$slave" -c commitlog -- mqstore ha promote "${args[@]}"
