"""The check itself, run inside the worker: the engine (graph, backward, finite
differences), fast mode's directions, the metrics and diagnoses, and the Result."""
