"""Where mutations go: the backward code of a ggml tree, parsed with tree-sitter.

C is parsed with tree-sitter's C and C++ grammars (ggml.c, vec.h; ops.cpp), not with regular
expressions: an operator, an operand or a literal is a node of the parse tree, so a mutation
replaces exactly that node's bytes, and code that a grammar cannot parse (a macro it does not
expand) is an ERROR node whose inside gets no mutation rather than a wrong one.

The sites:
- src/ggml.c: ggml_compute_backward, whose `case GGML_OP_X:` (and `case GGML_UNARY_OP_X:`)
  blocks are each op's backward graph, and the helpers every op's gradient goes through
  (ggml_add_or_set, ggml_acc_or_set, ggml_add1_or_set, ggml_sub_or_set);
- src/ggml-cpu/ops.cpp: the CPU kernels of the backward ops (every ggml_compute_forward_*_back*
  and out_prod, which mul_mat's backward runs);
- src/ggml-cpu/vec.h: the vector helpers of the backward kernels (*_backward_*).

Code under `#ifndef NDEBUG` gets no mutant: the gate's Release build compiles it out.

Each mutant names the op(s) whose backward runs its code: the case label around it, the op a
kernel serves (KERNEL_OPS), or every op for the shared helpers.
"""

import hashlib
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from pytest_gradgate.errors import UsageError
from pytest_gradgate.mutate.operators import mutations

BACKWARD_HELPERS = ("ggml_add_or_set", "ggml_acc_or_set", "ggml_add1_or_set", "ggml_sub_or_set")
GGML_C_FUNCTIONS = ("ggml_compute_backward",) + BACKWARD_HELPERS
KERNEL = re.compile(r"^ggml_compute_forward_(\w*_back\w*|out_prod\w*)$")
VEC_HELPER = re.compile(r"^ggml_vec_\w*backward\w*$|^ggml_\w*_backward_f(32|16)$")
# a backward kernel -> the gate's op whose backward runs it
KERNEL_OPS = {"repeat_back": "repeat", "silu_back": "silu", "rms_norm_back": "rms_norm", "out_prod": "mul_mat",
              "get_rows_back": "get_rows", "soft_max_ext_back": "soft_max", "rope_back": "rope_ext",
              "im2col_back": "im2col", "pool_2d_back": "pool_2d", "cross_entropy_loss_back": "cross_entropy_loss",
              "flash_attn_back": "flash_attn_ext"}
# ggml op label -> the gate's ops it stands for, where the names differ
OP_LABELS = {"ROPE": ("rope_ext", "rope_multi"), "SOFT_MAX": ("soft_max", "soft_max_ext"), "PERMUTE": ("permute",),
             "CPY": ("cpy",), "GLU": ("swiglu", "reglu", "geglu_split", "swiglu_split")}
ALL_OPS = "*"


@dataclass(frozen=True)
class Mutant:
    id: str             # a digest of where and what: the same mutant in a resumed run
    path: str           # relative to the ggml root
    line: int           # 1-based
    function: str
    ops: tuple          # the gate's ops whose backward runs this code; ("*",) for every op
    operator: str
    description: str
    start: int          # byte offsets of the replaced text in the file
    end: int
    original: str
    replacement: str

    def apply(self, text):
        """The file's bytes with this mutation -> bytes."""
        return text[:self.start] + self.replacement.encode() + text[self.end:]

    def diff_line(self, text):
        """The mutated line before and after: '- old' / '+ new'."""
        line_start = text.rfind(b"\n", 0, self.start) + 1
        line_end = text.find(b"\n", self.end)
        line_end = len(text) if line_end < 0 else line_end
        old = text[line_start:line_end].decode("utf-8", "replace")
        new = (text[line_start:self.start] + self.replacement.encode() + text[self.end:line_end]).decode("utf-8", "replace")
        return f"- {old.strip()}\n+ {new.strip()}"

    def to_dict(self):
        return dict(asdict(self), ops=list(self.ops))


def _parser(path):
    try:
        from tree_sitter import Language, Parser
        import tree_sitter_c
        import tree_sitter_cpp
    except ImportError as exc:
        raise UsageError("gradgate mutate needs tree-sitter and its C and C++ grammars: "
                         "pip install 'pytest-gradgate[mutate]' (or pip install tree-sitter tree-sitter-c "
                         f"tree-sitter-cpp) ({exc})") from None
    grammar = tree_sitter_cpp if Path(path).suffix in (".cpp", ".cc", ".h") else tree_sitter_c
    return Parser(Language(grammar.language()))


FILES = {"src/ggml.c": lambda name: name in GGML_C_FUNCTIONS,
         "src/ggml-cpu/ops.cpp": lambda name: bool(KERNEL.match(name)),
         "src/ggml-cpu/vec.h": lambda name: bool(VEC_HELPER.match(name))}


def _function_name(node):
    declarator = node.child_by_field_name("declarator")
    while declarator is not None and declarator.type not in ("identifier", "field_identifier"):
        declarator = declarator.child_by_field_name("declarator")
    return declarator.text.decode() if declarator is not None else None


def _functions(root, wanted):
    """Function definitions whose name `wanted` accepts -> [(name, node)]: at file level, or in
    the blocks a header wraps them in (extern "C" { }, #ifdef ... #endif), not inside a body."""
    out, stack = [], [root]
    while stack:
        node = stack.pop()
        for child in reversed(node.children):
            if child.type == "function_definition":
                name = _function_name(child)
                if name and wanted(name):
                    out.append((name, child))
            elif child.type in ("linkage_specification", "declaration_list", "preproc_if", "preproc_ifdef",
                                "preproc_else", "preproc_elif"):
                stack.append(child)
    return sorted(out, key=lambda item: item[1].start_byte)


def _kernel_ops(name):
    stem = name[len("ggml_compute_forward_"):]
    for key in sorted(KERNEL_OPS, key=len, reverse=True):
        if stem.startswith(key):
            return (KERNEL_OPS[key],)
    return (stem.split("_back")[0],)


def _case_ops(node):
    """The ops of the innermost `case GGML_OP_X:` / `case GGML_UNARY_OP_X:` around node."""
    while node is not None:
        if node.type == "case_statement":
            value = node.child_by_field_name("value")
            label = value.text.decode() if value is not None else ""
            m = re.match(r"GGML_(?:UNARY_|GLU_)?OP_(\w+)$", label)
            if m and label != "GGML_OP_UNARY" and label != "GGML_OP_GLU":
                return OP_LABELS.get(m.group(1), (m.group(1).lower(),))
        node = node.parent
    return (ALL_OPS,)


def _inside_error(node, top):
    while node is not None and node != top:
        if node.type == "ERROR" or node.is_missing:
            return True
        node = node.parent
    return False


def _debug_only(node, top):
    """Whether node is in an `#ifndef NDEBUG` block: compiled out of the Release build the gate
    runs, so a mutant there could only survive."""
    while node is not None and node != top:
        if node.type == "preproc_ifdef":
            name = node.child_by_field_name("name")
            if name is not None and name.text == b"NDEBUG" and node.children and node.children[0].type == "#ifndef":
                return True
        node = node.parent
    return False


def _walk(node):
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(reversed(n.children))


def mutants(ggml_root, ops=None, lines=None):
    """Every mutant of the tree's backward code, in file order. `ops`: keep those whose code some
    op of it runs (a shared helper's only when ops is None). `lines`: {path: set of line numbers}
    to keep (--since)."""
    ggml_root = Path(ggml_root)
    out = []
    for rel, wanted in FILES.items():
        path = ggml_root / rel
        if not path.is_file():
            continue
        if lines is not None and rel not in lines:
            continue
        text = path.read_bytes()
        # a mutant's id holds the file's content: a report's verdicts are for this text only
        file_digest = hashlib.sha1(text).hexdigest()
        tree = _parser(path).parse(text)
        for name, fn in _functions(tree.root_node, wanted):
            fn_ops = _kernel_ops(name) if rel.endswith("ops.cpp") else None
            body = fn.child_by_field_name("body")
            if body is None:
                continue
            for node in _walk(body):
                for start, end, replacement, operator, description in mutations(node):
                    if _inside_error(node, fn) or _debug_only(node, fn):
                        continue
                    line = text.count(b"\n", 0, start) + 1
                    if lines is not None and line not in lines[rel]:
                        continue
                    site_ops = fn_ops if fn_ops is not None else (
                        _case_ops(node) if name == "ggml_compute_backward" else (ALL_OPS,))
                    if rel.endswith("vec.h"):
                        site_ops = (name.split("ggml_vec_")[-1].split("_backward")[0].replace("ggml_", ""),)
                    if ops is not None and not set(site_ops) & set(ops):
                        continue
                    original = text[start:end].decode("utf-8", "replace")
                    digest = hashlib.sha1(f"{rel}:{start}:{end}:{replacement}:{file_digest}".encode()).hexdigest()[:12]
                    out.append(Mutant(digest, rel, line, name, tuple(site_ops), operator, description, start, end,
                                      original, replacement))
    # one mutant per (place, replacement): two rules may propose the same text
    seen, unique = set(), []
    for m in out:
        if (m.path, m.start, m.end, m.replacement) not in seen:
            seen.add((m.path, m.start, m.end, m.replacement))
            unique.append(m)
    return unique


def changed_lines(ggml_root, since):
    """{path relative to the ggml root: set of lines} that commits after `since` added or changed
    in the backward files (git diff -U0), for --since."""
    import subprocess
    root = Path(ggml_root).resolve()
    top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=root, capture_output=True, text=True)
    if top.returncode != 0:
        raise UsageError(f"--since {since}: {root} is not in a git checkout")
    prefix = root.relative_to(Path(top.stdout.strip()).resolve())
    paths = [str(prefix / rel) for rel in FILES]
    diff = subprocess.run(["git", "diff", "-U0", since, "--", *paths], cwd=root, capture_output=True, text=True)
    if diff.returncode != 0:
        raise UsageError(f"--since {since}: git diff failed: {diff.stderr.strip()}")
    out, current = {}, None
    for line in diff.stdout.splitlines():
        if line.startswith("+++ "):
            name = line[4:].strip()
            current = None if name == "/dev/null" else str(Path(name[2:] if name.startswith("b/") else name).relative_to(prefix))
            if current is not None:
                out.setdefault(current, set())
        elif line.startswith("@@") and current is not None:
            m = re.search(r"\+(\d+)(?:,(\d+))?", line)
            start, count = int(m.group(1)), int(m.group(2) or 1)
            out[current].update(range(start, start + count))
    return out
