"""moto's S3 served one request at a time.

Plain `moto_server` handles requests on several threads, and two racing
create-only PUTs (`If-None-Match: *`) on one key were seen to both succeed.
Serialising every request behind one lock makes conditional writes atomic,
which is what a real S3 guarantees and what bagel's close protocol relies on.

Usage: s3_server.py HOST PORT
"""

import sys
import threading

from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
from werkzeug.serving import run_simple

_app = DomainDispatcherApplication(create_backend_app)
_lock = threading.Lock()


def serialized(environ, start_response):
    with _lock:
        # Drain the whole response while holding the lock, so no part of a
        # request's work runs concurrently with another request.
        result = _app(environ, start_response)
        try:
            body = b"".join(result)
        finally:
            close = getattr(result, "close", None)
            if close is not None:
                close()
    return [body]


def main():
    host, port = sys.argv[1], int(sys.argv[2])
    print(f"s3 (moto, serialized) listening on {host}:{port}", flush=True)
    run_simple(host, port, serialized, threaded=True, use_reloader=False)


if __name__ == "__main__":
    main()
