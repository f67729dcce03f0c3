#!/bin/bash
# Patroni's post_bootstrap on the node that creates the cluster: keel's user and database.
# $1 is a connection string as the superuser; the password comes from the environment.
set -euo pipefail
psql "$1" -v ON_ERROR_STOP=1 -v password="${KEEL_DB_PASSWORD}" <<'SQL'
CREATE ROLE keel LOGIN PASSWORD :'password';
CREATE DATABASE keel OWNER keel;
SQL
