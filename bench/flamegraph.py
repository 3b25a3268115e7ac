#!/usr/bin/env python3
"""A flame graph from `perf script` output, with no tools beyond Python.

    perf record -F 999 -g -p "$(pgrep -x bagel-server)" -o perf.data -- sleep 5
    perf script -i perf.data | bench/flamegraph.py "title" > profile.svg

Collapses each sample's stack (root first), then draws one box per frame,
as wide as its share of the samples; hovering shows the count and share.
The same picture `inferno-flamegraph` draws, without its search and zoom,
so a profile can be made where nothing can be installed. With
`--folded`, prints the collapsed stacks (`a;b;c count`) instead, for
`inferno-flamegraph` or for grepping.
"""

import html
import re
import sys
from collections import Counter

WIDTH, ROW, FONT = 1200, 16, 11


def collapse(lines):
    stacks, frames, comm = Counter(), [], None
    for line in lines:
        line = line.rstrip("\n")
        if not line.strip():
            if comm is not None and frames:
                stacks[";".join([comm] + frames[::-1])] += 1
            frames, comm = [], None
        elif not line.startswith((" ", "\t")):
            comm = line.split()[0]
        else:
            parts = line.strip().split(None, 1)
            sym = parts[1] if len(parts) > 1 else "[unknown]"
            sym = re.sub(r"\s+\(\S*\)$", "", sym)  # the DSO
            sym = re.sub(r"\+0x[0-9a-f]+$", "", sym)  # the offset
            frames.append(sym or "[unknown]")
    if comm is not None and frames:
        stacks[";".join([comm] + frames[::-1])] += 1
    return stacks


def tree(stacks):
    root = {"n": 0, "kids": {}}
    for stack, n in stacks.items():
        node = root
        node["n"] += n
        for frame in stack.split(";"):
            node = node["kids"].setdefault(frame, {"n": 0, "kids": {}})
            node["n"] += n
    return root


def colour(name):
    h = sum(map(ord, name)) % 60
    if "[k]" in name or name.startswith(("__", "entry_", "do_", "tcp_", "sys_")):
        return f"rgb({200 + h % 55},{120 + h},{60})"
    return f"rgb({230},{100 + h * 2},{40 + h})"


def svg(root, title):
    total = max(root["n"], 1)
    boxes, depth_max = [], 0

    def walk(node, x, depth):
        nonlocal depth_max
        for name, kid in sorted(node["kids"].items()):
            w = kid["n"] / total * (WIDTH - 20)
            if w >= 0.3:
                boxes.append((name, kid["n"], 10 + x, depth, w))
                depth_max = max(depth_max, depth)
                walk(kid, x, depth + 1)
            x += w

    walk(root, 0.0, 0)
    height = (depth_max + 3) * ROW + 30
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'font-family="monospace" font-size="{FONT}">',
        f'<rect width="100%" height="100%" fill="#f8f8f0"/>',
        f'<text x="{WIDTH / 2}" y="18" text-anchor="middle" font-size="15">{html.escape(title)}</text>',
    ]
    for name, n, x, depth, w in boxes:
        y = height - (depth + 2) * ROW
        label = html.escape(name)
        tip = f"{label} ({n} samples, {100 * n / total:.2f}%)"
        chars = int(w / (FONT * 0.6))
        text = label if len(name) <= chars else html.escape(name[: max(chars - 2, 0)]) + ".."
        out.append(
            f'<g><title>{tip}</title><rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{ROW - 1}" '
            f'fill="{colour(name)}" rx="2"/>'
            + (f'<text x="{x + 3:.1f}" y="{y + ROW - 4}">{text}</text>' if chars >= 3 else "")
            + "</g>"
        )
    out.append("</svg>")
    return "\n".join(out)


def main():
    args = sys.argv[1:]
    stacks = collapse(sys.stdin)
    if args and args[0] == "--folded":
        for stack, n in stacks.most_common():
            print(stack, n)
        return
    print(svg(tree(stacks), args[0] if args else "flame graph"))


if __name__ == "__main__":
    main()
