#!/usr/bin/python3
"""Open an h2c connection (prior knowledge) with the python h2 library, optionally ask the
simulator's admin endpoint for GOAWAY, and print the GOAWAY that arrives as JSON.

Usage: h2-wait-goaway.py PORT [ADMIN_GOAWAY_URL] [TIMEOUT_SECONDS]
"""
import json
import socket
import sys
import time
import urllib.request

import h2.config
import h2.connection
import h2.events

port = int(sys.argv[1])
admin = sys.argv[2] if len(sys.argv) > 2 and sys.argv[2] else None
timeout = float(sys.argv[3]) if len(sys.argv) > 3 else 5.0

sock = socket.create_connection(("127.0.0.1", port))
conn = h2.connection.H2Connection(config=h2.config.H2Configuration(client_side=True))
conn.initiate_connection()
sock.sendall(conn.data_to_send())
started = time.monotonic()
asked = False
# GOAWAY is asked for only once the server's SETTINGS came: before, on a busy host, the
# simulator may not have taken the connection in yet, and the GOAWAY would go to nobody.
settled = False
sock.settimeout(0.1)
while time.monotonic() - started < timeout:
    if admin and not asked and settled:
        urllib.request.urlopen(urllib.request.Request(admin, method="POST")).read()
        asked = True
    try:
        data = sock.recv(65536)
    except socket.timeout:
        continue
    if not data:
        break
    for event in conn.receive_data(data):
        if isinstance(event, h2.events.RemoteSettingsChanged):
            settled = True
        if isinstance(event, h2.events.ConnectionTerminated):
            print(json.dumps({"error_code": int(event.error_code),
                              "additional_data": (event.additional_data or b"").decode(),
                              "after_seconds": round(time.monotonic() - started, 3)}))
            sys.exit(0)
    sock.sendall(conn.data_to_send())
print(json.dumps({"error_code": None}))
