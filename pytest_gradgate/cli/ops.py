"""What a case may use: the ops of the op table with their signatures, the
consumers, the producers and the losses, from the same tables the loader checks against, so the list is
never out of date.

    gradgate ops            # all four tables
    gradgate ops --json     # the same, machine-readable
"""

import json

from pytest_gradgate.ops.consumers import CONSUMERS, DEFAULT_CONSUMERS
from pytest_gradgate.ops.losses import LOSSES
from pytest_gradgate.ops.producers import DEFAULT_PRODUCERS, PRODUCERS
from pytest_gradgate.ops.table import OPS


def signature(spec):
    """`concat(a, b, dim=0)`: tensor arguments, optional tensors, then params with defaults."""
    parts = list(spec.tensors) + [f"{t}=None" for t in spec.optional_tensors]
    parts += [p.name if p.required else f"{p.name}={p.default!r}" for p in spec.params]
    return f"{spec.name}({', '.join(parts)})"


def tables():
    return {
        "ops": [{"name": s.name, "ggml_op": s.ggml_op, "signature": signature(s), "note": s.note}
                for s in OPS.values()],
        "consumers": [{"name": c.name, "doc": c.doc, "default": c.name in DEFAULT_CONSUMERS}
                      for c in CONSUMERS.values()],
        "producers": [{"name": p.name, "doc": p.doc, "default": p.name in DEFAULT_PRODUCERS}
                      for p in PRODUCERS.values()],
        "losses": [{"name": lo.name, "doc": lo.doc} for lo in LOSSES.values()],
    }


def format_text(data):
    lines = ["ops (graph expressions call them by these names):"]
    width = 40      # long signatures (rope_ext) get a line of their own
    for o in data["ops"]:
        note = f"  -- {o['note']}" if o["note"] else ""
        if len(o["signature"]) > width:
            lines.append(f"  {o['signature']}")
            lines.append(f"  {'':{width}s}  {o['ggml_op']}{note}")
        else:
            lines.append(f"  {o['signature']:{width}s}  {o['ggml_op']}{note}")
    lines += ["", "consumers (* = in the default set):"]
    for c in data["consumers"]:
        lines.append(f"  {'*' if c['default'] else ' '} {c['name']:24s} {c['doc']}")
    lines += ["", "producers (* = in the default set):"]
    for p in data["producers"]:
        lines.append(f"  {'*' if p['default'] else ' '} {p['name']:24s} {p['doc']}")
    lines += ["", "losses:"]
    for lo in data["losses"]:
        lines.append(f"    {lo['name']:24s} {lo['doc']}")
    return "\n".join(lines)


def add_arguments(parser):
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")


def run(args):
    data = tables()
    print(json.dumps(data, indent=2) if args.json else format_text(data))
    return 0
