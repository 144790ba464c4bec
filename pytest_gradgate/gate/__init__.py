"""pytest's side of the gate: settings, per-session state, which files are collected,
the items, and the baseline of known failures."""
