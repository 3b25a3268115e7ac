"""Renders the API reference of the installed `bagel` package, from its
docstrings and signatures, as Markdown (docs/python.md):

    python client/python/docs.py > docs/python.md
"""

from __future__ import annotations

import inspect

import bagel
from bagel import errors

CLASSES = [
    bagel.Client,
    bagel.Lease,
    bagel.Store,
    bagel.Writer,
    bagel.Messages,
    bagel.Message,
    bagel.AuditReport,
    bagel.Metronome,
]


def signature(obj) -> str:
    try:
        return str(inspect.signature(obj))
    except (TypeError, ValueError):
        return "(...)"


def doc(obj) -> str:
    return inspect.getdoc(obj) or ""


def members(cls):
    """Public members, the native base's included, by name (the native
    class lists them in no fixed order)."""
    seen = {}
    for klass in reversed(cls.__mro__[:-1]):
        for name, value in vars(klass).items():
            if not name.startswith("_"):
                seen[name] = value
    return sorted(seen.items())


def render_class(cls) -> list:
    out = [f"## `bagel.{cls.__name__}`", ""]
    text = doc(cls)
    if text:
        out += [text, ""]
    if cls is bagel.Client:
        out += [f"`bagel.Client{signature(cls)}`", ""]
    for name, value in members(cls):
        if isinstance(value, (property, type(bagel.Lease.id))) or inspect.isdatadescriptor(value):
            out += [f"* `{name}` (attribute): {' '.join(doc(value).split())}"]
        elif callable(value):
            out += ["", f"### `{cls.__name__}.{name}{signature(value)}`", ""]
            if doc(value):
                out += [doc(value), ""]
    out.append("")
    return out


INSTALL = """
## Install

The package is one abi3 wheel for CPython 3.9 and later, built from this
repository (a Rust toolchain, as in docs/development.md; no system
protoc). pip builds it with maturin, the build backend
`client/python/pyproject.toml` names, and installs it:

```sh
python3 -m venv .venv
.venv/bin/pip install ./client/python             # or: "./client/python[grpc]", below
.venv/bin/python -c 'import bagel; print(bagel.__version__)'
```

To build the wheel once and install it elsewhere:
`pip wheel ./client/python -w dist` (or `maturin build --release --out
dist` in `client/python`), then `pip install dist/bagel-*.whl`.
`import bagel` needs no other package.

### The gRPC modules, beside the package

The package ships the modules protoc generates from bagel's `.proto`
files as `bagel.v1` (`lease_pb2`, `lease_pb2_grpc`, `witness_pb2`,
`time_pb2`, `bag_pb2`, `summary_pb2`, with type stubs), for a program
that also speaks bagel's gRPC API itself. They need `grpcio` and
`protobuf`, which the `grpc` extra installs:

```python
import grpc
from bagel.v1 import lease_pb2, lease_pb2_grpc

stub = lease_pb2_grpc.LeaseServiceStub(grpc.insecure_channel("127.0.0.1:7420"))
print(stub.ServerInfo(lease_pb2.ServerInfoRequest()).server_id)
```

Generate no `bagel/v1` of your own where the package is installed: the
installed `bagel` package is found first, and its `bagel.v1` is the one
imported. (They are the same code: `client/python/grpc_gen.py` writes
them from `proto/`, and the package's tests fail when they are stale.)
"""


NOT_BOUND = """
## What the package does not bind, and why

* **Fencing a process tree** (`bagel run`): a Python process cannot be
  fenced from inside; `client.leader` raises `LeaseLost` and the
  application must stop. Run the Python program under `bagel run` when it
  must be killed on loss.
* **The operator's calls** of `LeaseBackend` (list, watch, describe,
  history, server info, access info): the CLI does them, with its JSON
  contract; a Python program that needs them can run `bagel ... --json`.
* **Hand-offs between processes** (`Lease::lease_ref`, the token, the
  holder key): a `Lease` lives in the process that acquired it; the CLI's
  lease files are the way to pass a lease on.
* **Release and renewal options** beyond the watermark (metadata, a signed
  time for the watermark, `settled_through`, `close_before_reading`), and
  `own_holder_key`: rarely needed, and each needs its rules explained
  before it is exposed.
* **Cluster migration** (`next_servers`) and bearer tokens: a list of
  servers works; migration and tokens are for the CLI's operators for now.
* **S3 leases on an unchecked clock** (`--unsafe-local-clock`): not exposed
  on purpose; an S3 lease store needs Roughtime.
* **Attested summaries** (an attester key), summaries made by the
  metronome, close observers and read progress callbacks: `summarize()`
  publishes unattested summaries, and `read(trust_summarizer=...)` reads
  attested ones made by the CLI.
* **Clocks and stores of one's own** (`SignedClock`, `CheckedClock`,
  `BagStore`, `FsOps`), `BagConfig` beyond `grace`: a Rust extension
  point, not a Python one.
"""


def main() -> None:
    out = [
        "# bagel for Python: API reference",
        "",
        "Generated from the package's docstrings by `python client/python/docs.py > docs/python.md`",
        "(with the wheel installed); do not edit by hand.",
        *INSTALL.splitlines(),
        "",
        "## Overview",
        "",
        doc(bagel),
        "",
        f"## `bagel.open_store{signature(bagel.open_store)}`",
        "",
        doc(bagel.open_store),
        "",
    ]
    for cls in CLASSES:
        out += render_class(cls)
    out += ["## Exceptions (`bagel.errors`, also at `bagel.*`)", "", doc(errors), ""]
    for name in errors.__all__:
        exc = getattr(errors, name)
        bases = ", ".join(b.__name__ for b in exc.__bases__)
        out += [f"### `{name}({bases})`", "", doc(exc), ""]
    out += NOT_BOUND.splitlines()
    print("\n".join(out).rstrip() + "\n")


if __name__ == "__main__":
    main()
