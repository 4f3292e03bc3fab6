#!/usr/bin/env bash
# Installs the system packages the integration tests run for real (idempotent; root or sudo).
# Slurm: Debian's slurm-wlm (slurmctld, slurmd, scontrol, sinfo) and munge; tests/fixtures/slurm.py
# starts munged, slurmctld and one slurmd per node on this host (no systemd needed) from a temp dir.
# kcat: a Kafka client that is not ours (librdkafka), the foreign producer of
# tests/integration/test_poison_messages.py (tombstones, oversize messages).
set -euo pipefail
need=()
command -v slurmctld >/dev/null 2>&1 || need+=(slurm-wlm)
command -v munged >/dev/null 2>&1 || need+=(munge)
command -v kcat >/dev/null 2>&1 || need+=(kcat)
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
