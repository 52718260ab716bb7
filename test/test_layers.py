"""The package's layers: each subpackage imports only itself and the layers below it, and no module
imports itself back through others (docs/architecture.md)."""

import ast
from pathlib import Path

import metavlm_ros

PACKAGE = Path(metavlm_ros.__path__[0])
#: Bottom to top. `metavlm_ros` itself (the version) sits at the bottom, cli.py at the top.
LAYERS = (
    'common',
    'method',
    'models',
    'footage',
    'training',
    'demo',
    'campaign',
    'assurance',
    'explain',
    'viewer',
    'ros',
    'commands',
    'cli',
)


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix('').parts
    return '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)


def imports_of(path: Path) -> set[str]:
    """Every metavlm_ros module `path` imports, at module level, in functions or for type checking."""
    found = set()
    package = module_name(path) if path.name == '__init__.py' else module_name(path).rpartition('.')[0]
    for node in ast.walk(ast.parse(path.read_text(encoding='utf-8'))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith('metavlm_ros'))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ''
            if node.level:
                anchor = package.split('.')[: len(package.split('.')) - node.level + 1]
                base = '.'.join(anchor + ([base] if base else []))
            if not base.startswith('metavlm_ros'):
                continue
            for alias in node.names:
                # `from metavlm_ros.method import search` imports a module; `from x import Name` its module.
                candidate = f'{base}.{alias.name}'
                found.add(candidate if candidate in MODULES else base)
    return {name for name in found if name in MODULES}


SOURCES = sorted(PACKAGE.rglob('*.py'))
MODULES = {module_name(p): p for p in SOURCES}


def layer(module: str) -> int:
    parts = module.split('.')
    return -1 if len(parts) == 1 else LAYERS.index(parts[1])


def test_every_subpackage_has_a_layer():
    subpackages = {p.parent.name for p in PACKAGE.glob('*/__init__.py')}
    modules = {p.stem for p in PACKAGE.glob('*.py') if p.name != '__init__.py'}
    assert subpackages | modules == set(LAYERS)


def test_imports_only_go_down():
    upward = [
        f'{name} imports {target}'
        for name, path in MODULES.items()
        for target in imports_of(path)
        if layer(target) > layer(name)
    ]
    assert not upward, '\n'.join(upward)


def test_no_import_cycles():
    graph = {name: imports_of(path) - {name} for name, path in MODULES.items()}
    # A package's __init__ is imported with every module in it: that edge is no cycle of ours.
    graph = {name: {t for t in targets if not name.startswith(t + '.')} for name, targets in graph.items()}
    state: dict[str, int] = {}
    cycles = []

    def visit(name: str, trail: list[str]) -> None:
        state[name] = 1
        for target in sorted(graph[name]):
            if state.get(target) == 1:
                cycles.append(' -> '.join(trail[trail.index(target) :] + [target]))
            elif target not in state:
                visit(target, trail + [target])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not cycles, '\n'.join(cycles)


def test_a_command_imports_no_other_command():
    # What two commands share lives in a layer below (ros/launcher.py for run and demo, ...).
    crossing = [
        f'{name} imports {target}'
        for name, path in MODULES.items()
        if name.startswith('metavlm_ros.commands.')
        for target in imports_of(path)
        if target.startswith('metavlm_ros.commands.') and target != name
    ]
    assert not crossing, '\n'.join(crossing)
