"""moto's S3 served one request at a time, optionally surviving kill -9.

Plain `moto_server` handles requests on several threads, and two racing
create-only PUTs (`If-None-Match: *`) on one key were seen to both succeed.
Serialising every request behind one lock makes conditional writes atomic,
which is what a real S3 guarantees and what bagel's close protocol relies on.

moto keeps everything in memory. With `--journal FILE`, every request that
changed something (a successful PUT, POST or DELETE) is appended to FILE and
fsynced before its answer is sent, and a restart replays FILE in order, one
request at a time, as it first ran. So the fault-injection run can kill -9
this server and start it again without losing an acknowledged write: a
request cut off before its answer may or may not have taken effect, exactly
as with a real store.

A replay costs every request the store ever took, and a long fault run
makes hundreds of thousands (most of them for objects long deleted): after
replaying, the journal is compacted to the state it produced, one PUT per
bucket and per live object (written beside it, fsynced, renamed over it),
so a restart costs what the store holds plus what came since the last one.
Compaction is skipped (the full journal kept) when it could not reproduce
the state exactly: an object whose ETag is not its content's MD5 (a
multipart upload) would come back with another ETag.

Usage: s3_server.py HOST PORT [--journal FILE] [--bucket NAME]
"""

import base64
import hashlib
import io
import json
import os
import sys
import threading
import urllib.parse
import xml.etree.ElementTree as ET

from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
from werkzeug.serving import run_simple
from werkzeug.test import EnvironBuilder

_app = DomainDispatcherApplication(create_backend_app)
_lock = threading.Lock()
_journal = None

_MUTATING = {"PUT", "POST", "DELETE"}
# Request headers that change what a request does. `authorization` among
# them: moto lets an unsigned request create a key but answers 403 to one
# that overwrites an existing key, so a replay without it lost every
# overwrite (If-Match lease updates, repeated `_prelock` markers).
_KEEP = ("content-type", "if-none-match", "if-match", "x-amz-", "content-md5", "authorization")
# Journals written before `authorization` was kept: replay their requests as
# signed ones. moto does not check signatures, only that there is one.
_REPLAY_AUTHORIZATION = "AWS4-HMAC-SHA256 Credential=replay/20000101/us-east-1/s3/aws4_request"


def _call(environ):
    """Runs one request through moto; returns (status, headers, body)."""
    answer = {}

    def start_response(status, headers, exc_info=None):
        answer["status"] = status
        answer["headers"] = headers

    result = _app(environ, start_response)
    try:
        body = b"".join(result)
    finally:
        close = getattr(result, "close", None)
        if close is not None:
            close()
    return answer["status"], answer["headers"], body


def _record(environ, body):
    headers = {
        k[5:].replace("_", "-").lower(): v
        for k, v in environ.items()
        if k.startswith("HTTP_") and k[5:].replace("_", "-").lower().startswith(_KEEP)
    }
    if environ.get("CONTENT_TYPE"):
        headers["content-type"] = environ["CONTENT_TYPE"]
    entry = {
        "method": environ["REQUEST_METHOD"],
        "path": environ.get("PATH_INFO", "/"),
        "query": environ.get("QUERY_STRING", ""),
        "host": environ.get("HTTP_HOST", "localhost"),
        "headers": headers,
        "body": base64.b64encode(body).decode(),
    }
    _journal.write(json.dumps(entry) + "\n")
    _journal.flush()
    os.fsync(_journal.fileno())


def _environ(entry):
    builder = EnvironBuilder(
        method=entry["method"],
        path=entry["path"],
        query_string=entry["query"],
        headers={**entry["headers"], "Host": entry["host"]},
        data=base64.b64decode(entry["body"]),
    )
    try:
        return builder.get_environ()
    finally:
        builder.close()


def serialized(environ, start_response):
    with _lock:
        # Drain the whole response while holding the lock, so no part of a
        # request's work runs concurrently with another request.
        if _journal is not None and environ["REQUEST_METHOD"] in _MUTATING:
            length = int(environ.get("CONTENT_LENGTH") or 0)
            body = environ["wsgi.input"].read(length) if length else b""
            replay = dict(environ)
            replay["wsgi.input"] = io.BytesIO(body)
            status, headers, out = _call(replay)
            if status.startswith("2"):
                _record(environ, body)
        else:
            status, headers, out = _call(environ)
    start_response(status, headers)
    return [out]


class ReplayError(Exception):
    """A journaled request that succeeded once did not succeed again."""


def _replay(path):
    """Re-runs every journaled request in order; each must succeed again.

    The journal holds only requests that succeeded, and moto is
    deterministic, so a failure here means the replay is not faithful: fail
    loudly rather than serve a store that silently lost writes.
    """
    n = 0
    with open(path) as f:
        for line in f:
            try:
                entry = json.loads(line)
            except ValueError:
                break  # a torn last line: that request never answered
            entry["headers"].setdefault("authorization", _REPLAY_AUTHORIZATION)
            status, _, body = _call(_environ(entry))
            n += 1
            if not status.startswith("2"):
                raise ReplayError(
                    f"{path}: request {n} ({entry['method']} {entry['path']}) answered "
                    f"{status} on replay, {body[:200]!r}; it succeeded when first made"
                )
    return n


_S3 = "{http://s3.amazonaws.com/doc/2006-03-01/}"


def _get(path, query="", host="localhost"):
    env = _environ(
        {
            "method": "GET",
            "path": path,
            "query": query,
            "host": host,
            "headers": {"authorization": _REPLAY_AUTHORIZATION},
            "body": "",
        }
    )
    status, headers, body = _call(env)
    if not status.startswith("2"):
        raise ReplayError(f"compaction: GET {path}?{query} answered {status}")
    return dict((k.lower(), v) for k, v in headers), body


def _entry(method, path, headers, body):
    return {
        "method": method,
        "path": path,
        "query": "",
        "host": "localhost",
        "headers": {"authorization": _REPLAY_AUTHORIZATION, **headers},
        "body": base64.b64encode(body).decode(),
    }


def _state():
    """Every bucket and live object as journal entries that recreate them,
    or None when a PUT could not recreate one exactly (its ETag)."""
    _, listing = _get("/")
    buckets = [b.text for b in ET.fromstring(listing).iter(f"{_S3}Name")]
    entries = []
    for bucket in buckets:
        entries.append(_entry("PUT", f"/{bucket}", {}, b""))
        token = None
        while True:
            query = "list-type=2&max-keys=1000"
            if token:
                query += "&continuation-token=" + urllib.parse.quote(token, safe="")
            _, page = _get(f"/{bucket}", query)
            root = ET.fromstring(page)
            for item in root.iter(f"{_S3}Contents"):
                key = item.find(f"{_S3}Key").text
                headers, body = _get(f"/{bucket}/{key}")
                etag = headers.get("etag", "").strip('"')
                if etag != hashlib.md5(body).hexdigest():
                    return None
                kept = {"content-type": headers["content-type"]} if "content-type" in headers else {}
                entries.append(_entry("PUT", f"/{bucket}/{key}", kept, body))
            if root.findtext(f"{_S3}IsTruncated") != "true":
                break
            token = root.findtext(f"{_S3}NextContinuationToken")
    return entries


def _compact(path):
    """Rewrites the journal as the state it replayed to; returns the number
    of entries, or None when it keeps the full journal."""
    entries = _state()
    if entries is None:
        return None
    tmp = path + ".compact"
    with open(tmp, "w") as f:
        for e in entries:
            f.write(json.dumps(e) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, path)
    dir_fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return len(entries)


def main():
    global _journal
    args = sys.argv[1:]
    host, port = args[0], int(args[1])
    journal = bucket = None
    rest = args[2:]
    while rest:
        flag, value, rest = rest[0], rest[1], rest[2:]
        if flag == "--journal":
            journal = value
        elif flag == "--bucket":
            bucket = value
        else:
            sys.exit(f"unknown flag {flag}")
    if journal is not None:
        try:
            replayed = _replay(journal) if os.path.exists(journal) else 0
        except ReplayError as e:
            sys.exit(f"s3_server: {e}")
        compacted = _compact(journal) if replayed else None
        _journal = open(journal, "a")
        print(f"replayed {replayed} requests from {journal}", flush=True)
        if compacted is not None:
            print(f"compacted {journal} to {compacted} requests", flush=True)
    if bucket is not None:
        with _lock:
            env = EnvironBuilder(method="PUT", path=f"/{bucket}", headers={"Host": f"{host}:{port}"}).get_environ()
            status, _, _ = _call(env)
            if status.startswith("2") and _journal is not None:
                _record(env, b"")
    print(f"s3 (moto, serialized) listening on {host}:{port}", flush=True)
    run_simple(host, port, serialized, threaded=True, use_reloader=False)


if __name__ == "__main__":
    main()
