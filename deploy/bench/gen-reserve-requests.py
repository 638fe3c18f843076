#!/usr/bin/env python3
"""Pre-generated HTTP requests for deploy/bench/reserve.sh (outside the timed window).

One request per line, CRLF written as TAB (the wrk script turns it back at load time), so the
load tool only hands out prepared bytes during the run, the same work for both sides.

  ours   PREFIX N HOSTPORT ACTIVITY ITEM JWT_SECRET PURCHASE_SECRET > file
         POST /api/v1/activities/A/items/S/reserve with a valid HS256 JWT (sub = user) and a
         purchase token for (user, A, S), signed as gateway/src/purchase_token.rs does.
  anchor PREFIX N HOSTPORT SKU > file
         GET /reserve/SKU?u=<user>&r=<request id> (the OpenResty anchor of ../shared/bench).

Users are PREFIX0 .. PREFIX(N-1): distinct within a file, and across files with distinct
prefixes.
"""
import base64
import hashlib
import hmac
import json
import sys
import time


def b64(b: bytes) -> str:
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


def main() -> None:
    kind, prefix, n, host = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    out = sys.stdout
    lines = []
    if kind == "ours":
        a, s, jwt_secret, pt_secret = sys.argv[5], sys.argv[6], sys.argv[7], sys.argv[8]
        jkey, pkey = jwt_secret.encode(), pt_secret.encode()
        now = int(time.time())
        exp_ms = (now + 7200) * 1000
        head = b64(json.dumps({"alg": "HS256", "typ": "JWT"}, separators=(",", ":")).encode())
        path = f"/api/v1/activities/{a}/items/{s}/reserve"
        for i in range(n):
            user = f"{prefix}{i}"
            claims = b64(json.dumps({"sub": user, "exp": now + 7200}, separators=(",", ":")).encode())
            signing = f"{head}.{claims}".encode()
            jwt = f"{head}.{claims}.{b64(hmac.new(jkey, signing, hashlib.sha256).digest())}"
            mac = hmac.new(pkey, f"v1|{user}|{a}|{s}|{exp_ms}".encode(), hashlib.sha256).digest()
            body = json.dumps({"purchase_token": f"{exp_ms}.{b64(mac)}", "request_id": f"r{user}"},
                              separators=(",", ":"))
            lines.append(
                f"POST {path} HTTP/1.1\tHost: {host}\tAuthorization: Bearer {jwt}\t"
                f"Content-Type: application/json\tContent-Length: {len(body)}\t\t{body}\n")
            if len(lines) >= 4096:
                out.write("".join(lines))
                lines.clear()
    elif kind == "anchor":
        sku = sys.argv[5]
        for i in range(n):
            user = f"{prefix}{i}"
            lines.append(f"GET /reserve/{sku}?u={user}&r=r{user} HTTP/1.1\tHost: {host}\t\t\n")
            if len(lines) >= 4096:
                out.write("".join(lines))
                lines.clear()
    else:
        sys.exit(f"unknown kind {kind}")
    out.write("".join(lines))


if __name__ == "__main__":
    main()
