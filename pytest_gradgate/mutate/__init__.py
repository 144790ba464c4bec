"""gradgate mutate: does the suite gate the backward code of the tree under test?

Mutation testing. `sites.py` parses the backward code of a ggml tree (ggml_compute_backward and
the helpers it combines gradients with in src/ggml.c; the CPU kernels of the backward ops in
src/ggml-cpu/ops.cpp; the backward helpers of src/ggml-cpu/vec.h) with tree-sitter and lists
the standard mutations each site allows (`operators.py`). `runner.py` plants them one at a
time in a copy of the tree, builds it through the gate's own build path (ccache compiles the
one file that changed) and runs the selected cases with `pytest --gradgate -x`: a mutant the
gate turns red is killed, one it leaves green survives, one that does not compile is counted
apart. `report.py` keeps the results in a JSON file written after every mutant, which a run
interrupted and started again resumes from.
"""
