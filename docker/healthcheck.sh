#!/bin/bash
# Container healthcheck for apns-fleet workers: exits 0 when the admin endpoint answers
# GET <path> (default /healthz) with 200, 1 otherwise. It uses bash's /dev/tcp so that the
# runtime image needs neither curl nor wget.
#   usage: apns-fleet-healthcheck [path] [port]
# The port defaults to APNS_FLEET_ADMIN_PORT, then 9464; admin.host must accept connections on
# 127.0.0.1 (0.0.0.0 does). The simulator's admin port answers GET /counters the same way.
set -u
path="${1:-/healthz}"
port="${2:-${APNS_FLEET_ADMIN_PORT:-9464}}"
{ exec 3<>"/dev/tcp/127.0.0.1/${port}"; } 2>/dev/null || { echo "apns-fleet admin: nothing listens on 127.0.0.1:${port}" >&2; exit 1; }
printf 'GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n' "$path" >&3
IFS= read -r -t 5 status <&3 || exit 1
case "$status" in
    "HTTP/1."?" 200"*) exit 0 ;;
    *) echo "apns-fleet admin ${path}: ${status%$'\r'}" >&2; exit 1 ;;
esac
