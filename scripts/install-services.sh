#!/usr/bin/env bash
# Installs the system packages the integration tests run for real (idempotent; root or sudo).
# Slurm: Debian's slurm-wlm (slurmctld, slurmd, scontrol, sinfo) and munge; tests/fixtures/slurm.py
# starts munged, slurmctld and one slurmd per node on this host (no systemd needed) from a temp dir.
# kcat: a Kafka client that is not ours (librdkafka), the foreign producer of
# tests/integration/test_poison_messages.py (tombstones, oversize messages).
# prometheus: the Prometheus server and promtool, which check deploy/prometheus/ (config, rules and
# their unit tests) and scrape a running `foreshock serve` in tests/integration/test_prometheus.py.
# chromium, chromium-driver: the headless browser that drives the status page in tests/e2e.
# Manifests under deploy/kubernetes/ are checked with the kubernetes client's models (Python), so
# kubectl is not needed (Debian's kubernetes-client is 1.20, older than the APIs they use).
set -euo pipefail
need=()
command -v slurmctld >/dev/null 2>&1 || need+=(slurm-wlm)
command -v munged >/dev/null 2>&1 || need+=(munge)
command -v kcat >/dev/null 2>&1 || need+=(kcat)
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v chromedriver >/dev/null 2>&1 || need+=(chromium-driver)
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
