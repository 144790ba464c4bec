"""Declarations become Cases: YAML files and the fixture's arguments, graph expressions
(parsed with a whitelist), and shape checks that point at the offending line."""
