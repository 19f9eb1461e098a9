"""No import cycles among the project's packages: every module's imports (at the top or inside a
function: a lazy import that breaks a cycle at run time is still a cycle), resolved to the
project's modules, form a graph without a cycle. One edge is added by hand: kernels/__init__.py
gathers a device's kernels by name (importlib), so it imports every kernels/<family>/cpu.py and
cuda.py. Importing a module also runs its packages' __init__ files; those implicit edges are
left out, as every package whose __init__ imports its modules would otherwise be a cycle."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("tinygrad_like", "nn", "optim", "accounting", "training")


def modules():
    """module name -> path, for every .py file of the packages."""
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports_of(name, path, known):
    """The project modules that the module `name` (at path) imports."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:  # `from a import b`: the module a.b, else a itself
                targets.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    return {t for t in targets if t in known and t != name}


def test_no_import_cycle():
    known = modules()
    graph = {name: imports_of(name, path, known) for name, path in known.items()}
    graph["tinygrad_like.kernels"] |= {
        name
        for name in known
        if name.startswith("tinygrad_like.kernels.") and name.rsplit(".", 1)[-1] in ("cpu", "cuda")
    }
    state, stack = {}, []  # a depth-first walk: 1 on the stack, 2 done

    def visit(node):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycle = stack[stack.index(nxt) :] + [nxt]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    assert len(graph) > 100  # the scan saw the packages
