#!/bin/bash
# The standby of docker-compose.ha.yml: copy the primary once (pg_basebackup, which
# also writes standby.signal and how to reach the primary), then run as a streaming
# standby. It has no synchronous standby of its own, so once promoted it commits at once.
set -euo pipefail
mkdir -p "${PGDATA}"
chown postgres:postgres "${PGDATA}"
chmod 700 "${PGDATA}"
if [ ! -s "${PGDATA}/PG_VERSION" ]; then
    gosu postgres pg_basebackup --host postgres --username keel --pgdata "${PGDATA}" \
        --wal-method stream --write-recovery-conf --checkpoint fast
fi
exec gosu postgres postgres -c synchronous_standby_names= -c hot_standby=on
