#!/bin/bash
# Run once by the postgres image when it creates the primary's data directory: let the
# standby stream from it as the keel user (a superuser, so it may replicate).
set -euo pipefail
echo "host replication ${POSTGRES_USER} all scram-sha-256" >> "${PGDATA}/pg_hba.conf"
