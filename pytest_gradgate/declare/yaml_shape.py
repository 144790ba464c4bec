"""A case file's shape checked before it is built into Python objects: how deep it nests and
how many values its aliases expand to.

Both are read from the parser's event stream, which libyaml produces without recursion and
in memory proportional to the text. Building the document is what costs: libyaml's composer
recurses once per level and overflows the C stack (a segfault that ends the whole pytest run)
on a document nested some ten thousand levels deep, and a few hundred bytes of anchors and
aliases (`&a [*b, *b, ...]`, nine levels of nine) stand for hundreds of millions of values that
every later walk of the case expands. A case file needs neither: a dozen levels, a few aliases.
"""

import yaml

from pytest_gradgate.errors import CaseError

MAX_DEPTH = 100                 # collections inside collections; a case file needs about 8
MAX_EXPANDED_VALUES = 1_000_000  # values the document stands for with every alias expanded

_LOADER = getattr(yaml, "CSafeLoader", None) or yaml.SafeLoader
_OPENS = (yaml.SequenceStartEvent, yaml.MappingStartEvent)
_CLOSES = (yaml.SequenceEndEvent, yaml.MappingEndEvent)


def shape_error(text, path):
    """A CaseError at the line where `text` nests too deeply or its aliases expand past the
    limit, else None. A syntax error is left to the loader, which words and places it."""
    # per open collection: [values inside it so far, its anchor]
    open_collections = [[0, None]]
    anchored = {}       # anchor -> how many values it stands for
    try:
        for event in yaml.parse(text, Loader=_LOADER):
            line = event.start_mark.line + 1 if event.start_mark else 1
            if isinstance(event, _OPENS):
                open_collections.append([0, event.anchor])
                if len(open_collections) - 1 > MAX_DEPTH:
                    return CaseError(f"the YAML nests collections deeper than {MAX_DEPTH} levels here (a case "
                                     "file needs about 8); is a bracket left open?", path, line)
                continue
            if isinstance(event, _CLOSES):
                size, anchor = open_collections.pop()
                size += 1
                if anchor is not None:
                    anchored[anchor] = size
            elif isinstance(event, yaml.ScalarEvent):
                size = 1
                if event.anchor is not None:
                    anchored[event.anchor] = 1
            elif isinstance(event, yaml.AliasEvent):
                size = anchored.get(event.anchor, 1)
            else:
                continue
            open_collections[-1][0] += size
            if open_collections[-1][0] > MAX_EXPANDED_VALUES:
                return CaseError(f"the YAML's aliases (*name) expand to more than {MAX_EXPANDED_VALUES:,} values "
                                 "by here; a case file needs a few: write the values out, or use fewer levels "
                                 "of aliases", path, line)
    except yaml.YAMLError:
        return None
    return None
