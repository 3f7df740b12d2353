#!/usr/bin/python3
"""Drive an APNs endpoint (the apns-fleet simulator) with aioapns, a client nobody here wrote.

Usage: aioapns-check.py SPEC.json
SPEC: {"port": 2197, "ca_file": "...", "topic": "...", "alpn": false,
       "key_file": "...", "key_id": "...", "team_id": "...",   (token auth)
       "client_cert": "...",                                    (or certificate auth)
       "requests": [{"token": "...", "payload": {...}, "push_type": "alert"}]}
Prints one JSON list of {"token", "status", "reason"} results on standard output.
The server certificate is verified against ca_file for the host name "localhost".
"""
import asyncio
import json
import ssl
import sys

from aioapns import APNs, NotificationRequest, PushType
import aioapns.connection as connection


async def main(spec):
    for cls in (connection.APNsProductionClientProtocol, connection.APNsDevelopmentClientProtocol):
        cls.APNS_SERVER = "localhost"
        cls.APNS_PORT = spec["port"]
    context = ssl.create_default_context(cafile=spec["ca_file"])
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if spec.get("alpn"):
        context.set_alpn_protocols(["h2"])
    if spec.get("client_cert"):
        client = APNs(client_cert=spec["client_cert"], topic=spec["topic"], ssl_context=context, max_connections=1)
    else:
        client = APNs(key=spec["key_file"], key_id=spec["key_id"], team_id=spec["team_id"],
                      topic=spec["topic"], ssl_context=context, max_connections=1)
    results = []
    for item in spec["requests"]:
        request = NotificationRequest(
            device_token=item["token"],
            message=item.get("payload", {"aps": {"alert": "hello from aioapns"}}),
            push_type=PushType(item["push_type"]) if item.get("push_type") else None,
        )
        result = await asyncio.wait_for(client.send_notification(request), timeout=10)
        results.append({"token": item["token"], "status": int(result.status), "reason": result.description,
                        "apns_id_matches": result.notification_id == request.notification_id})
    print(json.dumps(results))


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        asyncio.run(main(json.load(f)))
