"""A leader in its own process: waits to lead `name`, then prints its
fencing token and what it inherited, and leads until its standard input
closes (or it is killed)."""

import json
import sys

import bagel

server, name = sys.argv[1], sys.argv[2]
client = bagel.Client(server)
with client.leader(name, ttl=1) as lease:
    print(json.dumps({"token": lease.fencing_tokens[name], "previous": lease.previous[name]}), flush=True)
    sys.stdin.read()
print("stepped down", flush=True)
