#!/usr/bin/env bash
# Rolling upgrade of the scale profile (docs/scaling.md, "Upgrades without downtime"): one replica at
# a time is recreated from the new image and waited for until it is healthy (its /readyz answers
# 200: models warm, gallery reachable) before the next one goes. The other replica serves meanwhile;
# nginx retries on it every request the recreated one refused, and the new one opens its port only
# once warm (FACEGATE_WARM_UP_BEFORE_LISTENING), so no request fails.
#
#   docker/rolling-upgrade.sh [REPLICA …]      (default: facegate-a facegate-b)
#
# Build or pull the new image first (e.g. `docker compose -f compose.yaml --profile scale build`,
# or set FACEGATE_IMAGE). COMPOSE (default "docker compose -f compose.yaml --profile scale") and
# TIMEOUT (seconds per replica, default 300) override.
set -euo pipefail
compose=${COMPOSE:-docker compose -f compose.yaml --profile scale}
timeout=${TIMEOUT:-300}
replicas=("$@")
[ ${#replicas[@]} -gt 0 ] || replicas=(facegate-a facegate-b)
for replica in "${replicas[@]}"; do
    echo "rolling-upgrade: recreating $replica"
    $compose up -d --no-deps --force-recreate "$replica"
    id=$($compose ps -q "$replica")
    waited=0
    until [ "$(docker inspect -f '{{.State.Health.Status}}' "$id")" = healthy ]; do
        if [ "$waited" -ge "$timeout" ] || [ "$(docker inspect -f '{{.State.Status}}' "$id")" != running ]; then
            echo "rolling-upgrade: $replica is not healthy after ${waited}s; the others still serve. Its log:" >&2
            docker logs --tail 30 "$id" >&2
            exit 1
        fi
        sleep 2
        waited=$((waited + 2))
    done
    echo "rolling-upgrade: $replica healthy after ${waited}s"
done
echo "rolling-upgrade: done"
