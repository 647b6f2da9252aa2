#!/usr/bin/env bash
# Rolling upgrade of the scale profile (docs/scaling.md, "Upgrades without downtime"): one replica at
# a time is recreated from the new image, waited for until it is healthy (its /readyz answers 200:
# models warm, gallery reachable) and until nginx really sends it requests, before the next one goes.
# The other replica serves meanwhile; nginx retries on it every request the recreated one refused,
# the stopping one finishes what it was sent (and closes its keep-alive connections only when idle),
# and the new one opens its port only once warm (FACEGATE_WARM_UP_BEFORE_LISTENING): no request fails.
#
#   docker/rolling-upgrade.sh [REPLICA …]      (default: facegate-a facegate-b)
#
# Build or pull the new image first (e.g. `docker compose -f compose.yaml --profile scale build`,
# or set FACEGATE_IMAGE). COMPOSE (default "docker compose -f compose.yaml --profile scale"), LB (the
# nginx service, default lb) and TIMEOUT (seconds per replica, default 300) override.
set -euo pipefail
compose=${COMPOSE:-docker compose -f compose.yaml --profile scale}
lb=${LB:-lb}
timeout=${TIMEOUT:-300}
replicas=("$@")
[ ${#replicas[@]} -gt 0 ] || replicas=(facegate-a facegate-b)

# nginx routes to the container $1 once a probe through its upstream group (the loopback-only
# listener of docker/nginx.conf, which names the address that answered) is answered by it. least_conn
# spreads idle probes over the replicas, so a few probes reach each one that nginx can reach.
routed() {
    local addresses answered
    addresses=" $(docker inspect -f '{{range .NetworkSettings.Networks}}{{.IPAddress}}:8000 {{end}}' "$1")"
    answered=$($compose exec -T "$lb" sh -c \
        'for _ in 1 2 3 4 5 6; do wget -S -q -O /dev/null http://127.0.0.1:8081/healthz 2>&1; done' \
        | tr -d '\r' | sed -n 's/^ *[Xx]-[Ff]acegate-[Uu]pstream: *\([^ ,]*\)$/\1/p') || true
    for address in $answered; do
        [[ "$addresses" == *" $address "* ]] && return 0
    done
    return 1
}

wait_routed() {  # REPLICA CONTAINER: until nginx routes to it, or fail after TIMEOUT
    local waited=0
    until routed "$2"; do
        if [ "$waited" -ge "$timeout" ]; then
            echo "rolling-upgrade: nginx does not route to $1 after ${waited}s; stopping here, the others still serve" >&2
            exit 1
        fi
        sleep 1
        waited=$((waited + 1))
    done
}

# Never stop a replica while another one is not taking requests.
for replica in "${replicas[@]}"; do
    wait_routed "$replica" "$($compose ps -q "$replica")"
done

for replica in "${replicas[@]}"; do
    echo "rolling-upgrade: recreating $replica"
    start=$SECONDS
    $compose up -d --no-deps --force-recreate "$replica"
    id=$($compose ps -q "$replica")
    until [ "$(docker inspect -f '{{.State.Health.Status}}' "$id")" = healthy ]; do
        if [ $((SECONDS - start)) -ge "$timeout" ] || [ "$(docker inspect -f '{{.State.Status}}' "$id")" != running ]; then
            echo "rolling-upgrade: $replica is not healthy after $((SECONDS - start))s; the others still serve. Its log:" >&2
            docker logs --tail 30 "$id" >&2
            exit 1
        fi
        sleep 1
    done
    healthy=$((SECONDS - start))
    wait_routed "$replica" "$id"
    echo "rolling-upgrade: $replica healthy after ${healthy}s, served through nginx after $((SECONDS - start))s"
done
echo "rolling-upgrade: done"
