"""Lanes: the finite differences of one big case over several copies of its forward graph.

Full mode evaluates the whole forward graph `stencil` times per parameter element, each time
on one thread, so that the reference shares no threading bug with the backward under test.
On a machine with idle cores a big case then leaves them idle: test-backend-ops' silu case
of 5,005 elements takes 0.4 s on one core while the other waits, where test-backend-ops
itself computes each forward on every core.

A lane is another copy of the case's forward graph, built from the case alone (the same
seed, so the same values), in a context, buffer and session of its own. The shim's
gg_numeric_grad_lanes runs one thread per lane; each takes elements as it goes and
computes their estimates on its own copy, each forward still on one thread. An element's
estimate is the same, to the bit, whichever lane computes it.

Lanes are made only where they pay: CPU cases in full mode whose numeric phase is estimated
(one forward timed, times the evaluations) at LANES_MIN_SECONDS or more, one more lane per
core idle at that moment, at most MAX_LANES (each copy holds the case's buffers again); see
lanes_for. GRADGATE_FD_LANES=N makes every full-mode CPU case use N (1: none).
"""

import os
import time

from pytest_gradgate.library import binding
from pytest_gradgate.errors import GradgateError
from pytest_gradgate.check.ggml_graph import GraphBuilder, build_forward, read_tensor, write_tensor

LANES_MIN_SECONDS = 0.05
MAX_LANES = 2
LANES_ENV = "GRADGATE_FD_LANES"


def wanted(case, lib, session, gf, evaluations):
    """How many lanes this case's numeric phase gets (1: the caller's alone)."""
    if case.mode != "full" or case.backend != "cpu":
        return 1
    forced = os.environ.get(LANES_ENV, "").strip()
    if forced:
        if not forced.isdigit() or not 1 <= int(forced) <= 8:
            raise GradgateError(f"{LANES_ENV}={forced!r}: give a whole number of lanes from 1 to 8, "
                                "or leave it unset (lanes for big cases only)")
        return int(forced)
    cores = os.cpu_count() or 1
    if cores < 2:
        return 1
    taken = []
    for _ in range(2):      # the first may pay for cold caches
        started = time.perf_counter()
        lib.gg_session_compute(session, gf)
        taken.append(time.perf_counter() - started)
    estimate_s = min(taken) * evaluations
    if estimate_s < LANES_MIN_SECONDS:
        return 1            # most cases: no need to look at the machine
    return lanes_for(cores, estimate_s, [_running_tasks() for _ in range(3)])


def lanes_for(cores, estimate_s, running):
    """The policy: lanes only for a numeric phase estimated at LANES_MIN_SECONDS or more, one
    per core that is idle now besides this one (running: a few looks at the machine's running
    tasks, this one included; None where unknown), at most MAX_LANES. A lane on a core that
    is already busy only shares it: each evaluation costs more (two vCPUs of one core, the
    caches) and the case is done no sooner, so a machine kept busy by other cases (the gate's
    jobs, pytest-xdist) gets none."""
    if estimate_s < LANES_MIN_SECONDS:
        return 1
    busy = None if None in running else sorted(running)[len(running) // 2]     # the median look
    idle = cores - 1 if busy is None else cores - busy
    return max(1, min(MAX_LANES, 1 + idle))


def _running_tasks():
    """Tasks running or runnable on the machine now, this one included (/proc/loadavg's 4th
    field), or None where it cannot be read."""
    try:
        with open("/proc/loadavg") as f:
            return int(f.read().split()[3].split("/")[0])
    except (OSError, ValueError, IndexError):
        return None


class LaneUnavailable(RuntimeError):
    """A lane's copy could not be made (memory, under --gradgate-max-memory say): the case runs
    on the lanes it has."""


class Lane:
    """One more copy of the case's forward graph, with its own session, on one thread."""

    def __init__(self, lib, case, lines, n_tensors):
        self.g = GraphBuilder(lib, case, n_tensors=n_tensors)
        self.session = binding.ffi.NULL
        try:
            self.params, _, _, self.loss = build_forward(self.g, case, lines)
            self.gf = self.g.forward_graph(self.loss)
            err = binding.ffi.new("char[256]")
            self.session = lib.gg_session_new(b"cpu", 1, err, 256)
            if self.session == binding.ffi.NULL:
                raise LaneUnavailable(f"a lane's session: {binding.ffi.string(err).decode()}")
            if not lib.gg_session_alloc(self.session, self.g.ctx):
                raise LaneUnavailable("could not allocate a lane's copy of the graph")
            for t, values in self.g.values:
                write_tensor(self.g, t, values)
        except BaseException:
            self.free()
            raise

    def same_values(self, name, values):
        """The copy's param `name` holds `values`: the copy is of the same case."""
        return (read_tensor(self.g, self.params[name]) == values).all()

    def free(self):
        if self.session != binding.ffi.NULL:
            self.g.lib.gg_session_free(self.session)
            self.session = binding.ffi.NULL
        self.g.free()


def numeric_grad(lib, session, gf, t, loss, lanes, name, h, g_h, g_half):
    """gg_numeric_grad over the caller's graph and the lanes' copies -> (ggml status, the
    lanes' CPU seconds summed: their own work, not the time they waited for a core)."""
    ffi = binding.ffi
    n_lanes = 1 + len(lanes)
    busy = ffi.new("double[]", n_lanes)
    status = lib.gg_numeric_grad_lanes(
        ffi.new("struct gg_session *[]", [session] + [lane.session for lane in lanes]),
        ffi.new("struct ggml_cgraph *[]", [gf] + [lane.gf for lane in lanes]),
        ffi.new("struct ggml_tensor *[]", [t] + [lane.params[name] for lane in lanes]),
        ffi.new("struct ggml_tensor *[]", [loss] + [lane.loss for lane in lanes]),
        n_lanes, h, ffi.from_buffer("double[]", g_h), ffi.from_buffer("double[]", g_half) if g_half is not None
        else ffi.NULL, busy)
    return status, sum(busy[k] for k in range(n_lanes))
