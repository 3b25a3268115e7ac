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
    """Public members, the native base's included, in definition order."""
    seen = {}
    for klass in reversed(cls.__mro__[:-1]):
        for name, value in vars(klass).items():
            if not name.startswith("_"):
                seen[name] = value
    return seen.items()


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


def main() -> None:
    out = [
        "# bagel for Python: API reference",
        "",
        "Generated from the package's docstrings by `python client/python/docs.py > docs/python.md`",
        "(with the wheel installed); do not edit by hand.",
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
    print("\n".join(out).rstrip() + "\n")


if __name__ == "__main__":
    main()
