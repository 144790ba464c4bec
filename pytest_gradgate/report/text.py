"""Plain-text rendering of a Result, for pytest's failure output and the fixture."""


def format_number(value, spec=".3g"):
    """A number for people: '-' for missing, str() for what will not format."""
    if value is None:
        return "-"
    try:
        return format(value, spec)
    except (TypeError, ValueError):
        return str(value)


def format_result(result):
    r = result if isinstance(result, dict) else result.to_dict()
    lines = [f"{r['case_id']}: {r['status'].upper()} (phase {r['phase']}, op {r.get('op') or '?'}, "
             + (f"producer {r['producer']}, " if r.get("producer", "none") != "none" else "")
             + f"consumer {r['consumer']}, loss {r['loss']}, backend {r['backend']}"
             + (f", backward on {r['threads']} threads" if r.get("backend") == "cpu" and r.get("threads") else "") + ")"]
    origin = r.get("origin") or {}
    if origin.get("path"):
        lines.append(f"  declared at {origin['path']}:{origin.get('line')}")
    if r.get("diagnosis"):
        lines.append(f"  diagnosis: {r['diagnosis']}")
    if r.get("message") and r["message"] not in (r.get("diagnosis") or ""):
        lines.append(f"  {r['message']}")
    if r.get("signal"):
        lines.append(f"  signal: {r['signal']}")
    if r.get("mode") in ("equivalence", "parity"):
        lines.extend(_equivalence_lines(r))
        return "\n".join(lines)
    for p in r.get("params") or []:
        excluded = ", ".join(f"{n} {why}" for why, n in (p.get("excluded") or {}).items()) or "none"
        lines.append(
            f"  param {p['name']} {p.get('shape')}: MAA {format_number(p.get('maa'))} (limit {format_number(p.get('limit'))}), "
            f"cosine {format_number(p.get('cosine'), '.4f')}, norm ratio {format_number(p.get('norm_ratio'), '.4g')}, "
            f"max |a-n| {format_number(p.get('max_abs_err'))}, compared {p.get('n_compared')} of {p.get('n_elements')} "
            f"(left out: {excluded}), power {'yes' if p.get('power') else 'NO (blind)'}")
        if not p.get("passed"):
            for w in p.get("worst") or []:
                lines.append(f"      at {w['index']}: analytic {w['analytic']:+.6g}  numeric {w['numeric']:+.6g}")
    return "\n".join(lines)


def _equivalence_lines(r):
    """Forwards first (a differing forward is the whole story), then each param of each pair."""
    if r.get("mode") == "parity":
        lines = ["  parity: analytic gradients of two sides against each other, limit from both sides' roundoff"
                 + (f" (formulations: {', '.join(r['formulations'])})" if r.get("formulations") else "")]
    else:
        lines = [f"  formulations: {', '.join(r.get('formulations') or [])} (analytic gradients against each "
                 "other, limit from their f32 roundoff)"]
    for f in r.get("forward") or []:
        lines.append(f"  forward {f.get('pair')}: NMSE {format_number(f.get('nmse'))} (limit {format_number(f.get('limit'))}), "
                     f"cosine {format_number(f.get('cosine'), '.6f')}, max |diff| {format_number(f.get('max_abs_diff'))}")
    for p in r.get("params") or []:
        changed = f" (changed on the {p['changed']} side)" if p.get("changed") else ""
        lines.append(f"  param {p['name']} {p.get('shape')} {p.get('pair')}{changed}: NMSE {format_number(p.get('nmse'))} "
                     f"(limit {format_number(p.get('limit'))}), cosine {format_number(p.get('cosine'), '.6f')}, "
                     f"norm ratio {format_number(p.get('norm_ratio'), '.6g')}, max |diff| "
                     f"{format_number(p.get('max_abs_diff'))} over {p.get('n_elements')} elements")
        if not p.get("passed"):
            a, b = (p.get("labels") or ["a", "b"])[:2]
            for w in p.get("worst") or []:
                lines.append(f"      at {w['index']}: {a} {w.get(a, float('nan')):+.6g}  {b} {w.get(b, float('nan')):+.6g}")
    return lines
