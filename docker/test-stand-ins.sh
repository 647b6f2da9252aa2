#!/usr/bin/env bash
# Stand-ins for the scale profile's postgres:17.6-bookworm and nginx:1.28-alpine, for running it where
# Docker Hub cannot be reached (CI): Debian's packages on the test base (docker/test-base.sh), with
# the interface compose.yaml uses of each official image.
#
#   docker/test-stand-ins.sh [BASE]     (default facegate-base:bookworm; makes the tags below)
#
#   facegate-stand-in/postgres:bookworm  PostgreSQL 15 (bookworm): POSTGRES_USER, POSTGRES_DB and
#                                        POSTGRES_PASSWORD_FILE at the first start, data in
#                                        /var/lib/postgresql/data, pg_isready, password logins (scram)
#   facegate-stand-in/nginx:sid          nginx from Debian sid (>= 1.27.3: `server … resolve`), wget for
#                                        the health check, logs on stdout/stderr, the official CMD
#
# An existing tag is reused: `docker rmi TAG` to remake it. Needs the base and a Debian mirror (the
# base's sources.list; sid's Release file is read without its expiry date, as a frozen mirror has it).
set -euo pipefail
base="${1:-facegate-base:bookworm}"
docker image inspect "$base" >/dev/null 2>&1 || { echo "test-stand-ins: $base is missing (docker/test-base.sh makes it)" >&2; exit 1; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

build() {  # TAG: the context is $work/context
    local tag="$1" start=$SECONDS
    if docker image inspect "$tag" >/dev/null 2>&1; then
        echo "test-stand-ins: $tag exists, reused"
        return
    fi
    DOCKER_BUILDKIT=0 docker build --quiet --network host --build-arg "BASE=$base" -t "$tag" "$work/context" >/dev/null
    echo "test-stand-ins: made $tag in $((SECONDS - start)) s"
}

# --- PostgreSQL ----------------------------------------------------------------------------------
rm -rf "$work/context" && mkdir "$work/context"
cat >"$work/context/entrypoint.sh" <<'ENTRYPOINT'
#!/bin/sh
# The official image's first start, in short: a cluster owned by postgres with POSTGRES_USER as its
# superuser (password from POSTGRES_PASSWORD_FILE), the database POSTGRES_DB, logins over the network
# by password; later starts find PG_VERSION and only run the server.
set -eu
: "${PGDATA:=/var/lib/postgresql/data}" "${POSTGRES_USER:=postgres}"
: "${POSTGRES_DB:=$POSTGRES_USER}"
mkdir -p "$PGDATA" /run/postgresql
chown postgres:postgres "$PGDATA" /run/postgresql
chmod 700 "$PGDATA"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    pwfile="$(mktemp)"
    cat "$POSTGRES_PASSWORD_FILE" >"$pwfile"
    chown postgres "$pwfile"
    runuser -u postgres -- initdb -D "$PGDATA" -U "$POSTGRES_USER" --pwfile="$pwfile" \
        --auth-local=trust --auth-host=scram-sha-256 --encoding=UTF8 --locale=C.UTF-8 >/dev/null
    rm -f "$pwfile"
    echo "listen_addresses = '*'" >>"$PGDATA/postgresql.conf"
    echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
    if [ "$POSTGRES_DB" != postgres ]; then
        echo "CREATE DATABASE \"$POSTGRES_DB\" OWNER \"$POSTGRES_USER\";" | runuser -u postgres -- postgres --single -D "$PGDATA" postgres >/dev/null
    fi
fi
exec runuser -u postgres -- postgres -D "$PGDATA"
ENTRYPOINT
cat >"$work/context/Dockerfile" <<'DOCKERFILE'
ARG BASE
FROM $BASE
# policy-rc.d: the package's scripts start no server during the build; the default cluster goes.
RUN printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d \
 && apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql-15 >/dev/null \
 && rm -rf /var/lib/apt/lists/* /var/lib/postgresql/15 /etc/postgresql/15
COPY entrypoint.sh /usr/local/bin/postgres-entrypoint
ENV PATH=/usr/lib/postgresql/15/bin:$PATH PGDATA=/var/lib/postgresql/data
STOPSIGNAL SIGINT
EXPOSE 5432
CMD ["sh", "/usr/local/bin/postgres-entrypoint"]
DOCKERFILE
build facegate-stand-in/postgres:bookworm

# --- nginx ---------------------------------------------------------------------------------------
# Its own debootstrap of sid (minbase + nginx + wget): sid's libraries do not go onto bookworm's.
tag=facegate-stand-in/nginx:sid
if docker image inspect "$tag" >/dev/null 2>&1; then
    echo "test-stand-ins: $tag exists, reused"
    exit 0
fi
command -v debootstrap >/dev/null || { echo "test-stand-ins: debootstrap is not installed (apt-get install debootstrap)" >&2; exit 1; }
start=$SECONDS
debootstrap --variant=minbase --include=nginx,wget sid "$work/root" ${DEBIAN_MIRROR:+"$DEBIAN_MIRROR"} >"$work/debootstrap.log" 2>&1 \
    || { tail -n 30 "$work/debootstrap.log" >&2; echo "test-stand-ins: debootstrap of sid failed" >&2; exit 1; }
rm -rf "$work/root/var/cache/apt/archives/"*.deb "$work/root/var/lib/apt/lists/"*
ln -sf /dev/stdout "$work/root/var/log/nginx/access.log"
ln -sf /dev/stderr "$work/root/var/log/nginx/error.log"
tar -C "$work/root" --numeric-owner -c . | docker import \
    --change 'EXPOSE 8000' --change 'CMD ["nginx", "-g", "daemon off;"]' - "$tag" >/dev/null
echo "test-stand-ins: made $tag in $((SECONDS - start)) s ($(docker run --rm "$tag" nginx -v 2>&1))"
