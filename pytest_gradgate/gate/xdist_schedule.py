"""How pytest-xdist hands the gate's items to its workers: dealt in turn, a few at a time.

xdist's load scheduling first sends each worker a chunk of consecutive items, a quarter of
its share: 75 of the built-in suite's 604 under -n 2, 9 under -n 16. The gate runs its long
cases first (gate/order.py), so that first chunk held all five of them, and one worker ran
them one after the other (9-10 s on two cores) while the others ran everything else. Under
-n 2 that worker finished last, alone on a core for the last 0.6-0.9 s; under -n 4 on two
cores, 4.3 s after the other three. Under -n 16 it would be the whole run: by arithmetic, not
measured here, the rest of the suite is 7-8 s of cases, about half a second per worker.

Here the first items are dealt to the workers in turn, so the long ones go to different
workers, and each worker then gets one more item each time it finishes one: no worker holds
more than DEPTH items it has not finished, so all of them finish within about one case of
each other. DEPTH, not 1: pytest's worker asks for the item after next before it runs the
next one (pytest's `nextitem`, whose case the gate starts early: gate/ahead.py), and it
would wait on the controller for it at every item.

Only for a session whose items all come from case files, under --dist load (what -n gives)
without --maxschedchunk: there, items have no fixtures to share. Python tests keep xdist's
own chunks, which keep a module's tests (and its module-scoped fixtures) on one worker.
"""

from xdist.scheduler import LoadScheduling     # imported by the hook xdist calls, so xdist is there

DEPTH = 4
CASE_FILE_SUFFIXES = (".yaml", ".yml")

# what of xdist's LoadScheduling this one builds on; without any of it, xdist schedules alone
_NEEDED = ("pending", "node2pending", "node2collection", "collection", "_send_tests",
           "_check_nodes_have_same_collection", "collection_is_completed")


def make(config, log):
    """A DealtScheduling where it applies, else None (xdist's own choice)."""
    if config.getoption("dist", None) != "load" or config.getoption("maxschedchunk", None) is not None:
        return None
    scheduler = DealtScheduling(config, log)
    return scheduler if all(hasattr(scheduler, name) for name in _NEEDED) else None


def from_case_file(nodeid):
    """Is this item one of a YAML case file's (its node id's file part names one)?"""
    return nodeid.split("::", 1)[0].endswith(CASE_FILE_SUFFIXES)


class DealtScheduling(LoadScheduling):
    """xdist's load scheduling, dealing items one at a time when all are case items."""

    dealing = False

    def schedule(self):
        if self.collection is None and self.collection_is_completed:
            ids = next(iter(self.node2collection.values()), [])
            self.dealing = bool(ids) and all(from_case_file(i) for i in ids)
        if not self.dealing:
            return super().schedule()
        if self.collection is not None:    # a node that came up late: give it its share
            for node in self.nodes:
                self.check_schedule(node)
            return None
        if not self._check_nodes_have_same_collection():
            self.log("**Different tests collected, aborting run**")
            return None
        self.collection = next(iter(self.node2collection.values()))
        self.pending[:] = range(len(self.collection))
        for _ in range(DEPTH):
            for node in self.nodes:
                self._send_tests(node, 1)
        if not self.pending:
            for node in self.nodes:
                node.shutdown()
        return None

    def check_schedule(self, node, duration=0):
        if not self.dealing:
            return super().check_schedule(node, duration=duration)
        if node.shutting_down:
            return None
        if self.pending:
            missing = DEPTH - len(self.node2pending[node])
            if missing > 0:
                self._send_tests(node, missing)
        else:
            node.shutdown()
        return None
