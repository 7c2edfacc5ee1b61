#!/usr/bin/env bash
# lightning-habana's examples/pytorch/multi_tenants.sh, reduced: jobs of `mnist_trainer.py --run_type=basic
# --devices=2` run at the same time on one node, each on two cards of its own (HABANA_VISIBLE_MODULES) and with a
# port of its own for its ranks (MASTER_PORT). The example started four jobs on an 8-card node (ports 1234, 1244,
# 1255, 1266); here TENANTS jobs (default 2), the interpreter is $PYTHON, the ports come from $TENANT_PORTS, and a
# failing job fails the script (the example's bare `wait` returned 0 whatever the jobs did).

set -ex

HERE="$(cd "$(dirname "$0")" && pwd)"
PYTHON="${PYTHON:-python}"
TENANTS="${TENANTS:-2}"
read -r -a PORTS <<< "${TENANT_PORTS:-1234 1244 1255 1266}"

jobs=()
for ((tenant = 0; tenant < TENANTS; tenant++)); do
    HABANA_VISIBLE_MODULES="$((2 * tenant)),$((2 * tenant + 1))" MASTER_PORT="${PORTS[$tenant]}" \
        "$PYTHON" -u "$HERE/mnist_trainer.py" -v --run_type="basic" --devices="2" &
    jobs+=("$!")
done

status=0
for job in "${jobs[@]}"; do
    wait "$job" || status=$?
done
exit "$status"
