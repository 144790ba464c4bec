"""One side of a parity check: a case's analytic gradients, nothing compared here.

A parity item (gate/parity.py) runs the same case on two sides (the tree under test and a
reference tree, or the CUDA backend and the CPU) and compares what each computed with
check/parity.py. Each side runs in its own worker, since two builds of ggml export the same
symbols and cannot share a process. This is what such a worker runs: each formulation of the
case (its graph, or each of an equivalence case's) with one backward pass and no finite
differences, so it runs at real sizes. The GradientSets are written to the file the case
names (Case.gradients_out, a .npz) rather than sent through the pipe: at 1.5B head sizes
they are megabytes, which JSON would carry slowly.
"""

import json
import time

import numpy as np

from pytest_gradgate.check import gradsets
from pytest_gradgate.check.equivalence import _Stop, compute_formulation
from pytest_gradgate.check.outcome import Phase, Status
from pytest_gradgate.check.result import Result

_META = "__meta__"


def formulations(case):
    """label -> graph: an equivalence case's formulations, else the case's one graph."""
    return dict(case.equivalent) if case.equivalent else {"graph": case.graph}


def run_case(case, lib, phase=lambda name: None):
    """Compute each formulation's GradientSet on case.backend and write them to case.gradients_out."""
    started = time.perf_counter()
    result = Result.for_case(case)
    sets = []
    try:
        for label, graph in formulations(case).items():
            sets.append(compute_formulation(case, lib, label, graph, phase))
    except _Stop as stop:
        return stop.finish(result, started)
    phase(Phase.COMPARE)
    write_sets(case.gradients_out, sets)
    result.n_compared = sum(int(v.size) for s in sets for v in s.grads.values())
    return result.finish(Status.PASSED, Phase.DONE, started=started)


def write_sets(path, sets):
    arrays, meta = {}, []
    for i, s in enumerate(sets):
        arrays[f"{i}.output"] = s.output
        for j, (name, values) in enumerate(s.grads.items()):
            arrays[f"{i}.grad.{j}"] = values
        meta.append({"label": s.label, "output_shape": list(s.output_shape), "params": list(s.grads),
                     "shapes": {k: list(v) for k, v in s.shapes.items()}, "forward_steps": s.forward_steps,
                     "steps": s.steps, "matmuls": s.matmuls, "forward_matmuls": s.forward_matmuls,
                     "precision": s.precision})
    arrays[_META] = np.array(json.dumps(meta))
    with open(path, "wb") as handle:
        np.savez(handle, **arrays)


def read_sets(path):
    """The GradientSets write_sets wrote, in their order."""
    with np.load(path, allow_pickle=False) as data:
        meta = json.loads(str(data[_META]))
        sets = []
        for i, m in enumerate(meta):
            grads = {name: data[f"{i}.grad.{j}"] for j, name in enumerate(m["params"])}
            sets.append(gradsets.GradientSet(m["label"], data[f"{i}.output"], tuple(m["output_shape"]), grads,
                                             {k: tuple(v) for k, v in m["shapes"].items()}, m["forward_steps"],
                                             m["steps"], matmuls=m["matmuls"],
                                             forward_matmuls=m["forward_matmuls"], precision=m["precision"]))
    return sets
