"""The package's import graph, read from the source like a static check: every module imports, there is no
import cycle, no subpackage imports a module that imports it, and the low-level modules import nothing above
them (docs/design.md section 9)."""

import ast
import importlib
import pathlib
import re

import sps_jax

ROOT = pathlib.Path(sps_jax.__file__).parent
# What each low-level module may import from the package (nothing else).
LOW_LEVEL = {
    "sps_jax.vocab": set(),
    "sps_jax.names": set(),
    "sps_jax.cli": {"sps_jax.names"},
    "sps_jax.files": {"sps_jax.arguments", "sps_jax.cli", "sps_jax.cli_process", "sps_jax.locks",
                      "sps_jax.path_checks"},
    "sps_jax.cli_process": {"sps_jax.cli"},
    "sps_jax.arguments": {"sps_jax.cli", "sps_jax.names", "sps_jax.path_checks"},
    "sps_jax.path_checks": {"sps_jax.cli"},
    "sps_jax.locks": {"sps_jax.cli"},
    "sps_jax.folder_swap": {"sps_jax.cli", "sps_jax.cli_process", "sps_jax.files", "sps_jax.locks",
                            "sps_jax.path_checks"},
    "sps_jax.reading": {"sps_jax.cli", "sps_jax.path_checks"},
    "sps_jax.mesh": set(),
    "sps_jax.optim": set(),
    "sps_jax.hardware": set(),
    "sps_jax.masks": {"sps_jax.vocab", "sps_jax.names"},
    "sps_jax.model_config": {"sps_jax.masks", "sps_jax.names", "sps_jax.vocab"},
    # config imports both, so neither may import it
    "sps_jax.config_checks": {"sps_jax.arguments", "sps_jax.cli", "sps_jax.masks", "sps_jax.model_config",
                              "sps_jax.names", "sps_jax.path_checks"},
    "sps_jax.config_overrides": {"sps_jax.cli", "sps_jax.names"},
    "sps_jax.flops": {"sps_jax.masks", "sps_jax.hardware"},
    "sps_jax.plotting": {"sps_jax.cli", "sps_jax.files"},
    "sps_jax.torch_layout": set(),
    "sps_jax.torch_buffers": {"sps_jax.masks"},
    "sps_jax.tracking": {"sps_jax.cli", "sps_jax.files"},
    "sps_jax.token_folder": {"sps_jax.arguments", "sps_jax.cli", "sps_jax.path_checks", "sps_jax.reading"},
    "sps_jax.run_files": {"sps_jax.arguments", "sps_jax.cli", "sps_jax.files", "sps_jax.path_checks", "sps_jax.reading",
                          "sps_jax.token_folder", "sps_jax.tracking"},
    "sps_jax.run_config": {"sps_jax.cli", "sps_jax.config", "sps_jax.config_checks", "sps_jax.model_config",
                           "sps_jax.run_files"},
    "sps_jax.hub": set(),
    "sps_jax.kernel_tuning": set(),
    "sps_jax.block_tables": {"sps_jax.kernel_tuning", "sps_jax.masks"},
}

# What notebooks and config files reach as sps_jax.config.X (README gives notebooks load_config; configs/*.py call
# the builders; sentences name the section builders): defined in config.py itself, whatever moves around them.
CONFIG_API = {"load_config", "paper_config", "paper_model_section", "model_section", "train_config", "data_config",
              "mesh_config", "metrics_config", "run_name", "parse_arg", "parse_window", "DEFAULT_SCALE", "SCALES",
              "PAPER_SEQ_LEN"}
# ``config.X`` in the docs that names no module attribute: a run's config.json, a config file, a config's sections.
CONFIG_WORDS = {"json", "py", "a", "name", "model", "train", "data", "mesh", "metrics"}


def module_files() -> dict[str, pathlib.Path]:
    """{module name: source file} of every module of the package. The lm-eval task hooks under
    evaluation/tasks are data that lm-eval loads from the YAML folder, not modules of the package."""
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        if "tasks" in parts:
            continue
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imported_modules(name: str, path: pathlib.Path, modules) -> set[str]:
    """The package's modules that ``name`` imports anywhere in its source, lazy imports included.

    ``from a import b`` counts as importing module ``a.b`` when that is a module, else ``a``, and a module
    loaded by its name in a string (``cli_process.load``) counts too; the parent packages Python imports on the way
    are not counted.
    """
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
        elif _loads_by_name(node):
            found.add(node.args[0].value)
    return {m for m in found if m in modules and m != name}


def _loads_by_name(node) -> bool:
    """``cli_process.load("sps_jax.x")`` or ``importlib.import_module("sps_jax.x")``: an import all the same."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("load", "import_module") and len(node.args) == 1
            and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str))


def import_graph() -> dict[str, set[str]]:
    modules = module_files()
    return {name: imported_modules(name, path, modules) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one member (Tarjan's algorithm)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def unit(module: str) -> str:
    """The top-level module or subpackage a module belongs to."""
    return ".".join(module.split(".")[:2])


def test_the_cycle_check_finds_cycles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    assert unit("sps_jax.inference.kv_cache") == "sps_jax.inference" and unit("sps_jax.masks") == "sps_jax.masks"


def test_a_module_loaded_by_name_counts_as_imported(tmp_path):
    source = tmp_path / "lazy.py"
    source.write_text('def f():\n    return cli_process.load("sps_jax.runs")\n')  # how commands defer jax
    assert imported_modules("sps_jax.lazy", source, module_files()) == {"sps_jax.runs"}


def test_every_module_imports():
    for name in module_files():
        importlib.import_module(name)  # lm-eval modules included: the test extra installs lm-eval


def test_no_module_imports_one_that_imports_it():
    graph = import_graph()
    assert len(graph) > 40 and graph["sps_jax.trainer"] >= {"sps_jax.model", "sps_jax.data.loader"}
    assert "sps_jax.trainer" in graph["sps_jax.train"]  # the command imports its library
    assert cycles(graph) == []


def test_no_subpackage_imports_a_module_that_imports_the_subpackage():
    units: dict[str, set[str]] = {}
    for module, imported in import_graph().items():
        units.setdefault(unit(module), set()).update(unit(m) for m in imported if unit(m) != unit(module))
    assert cycles(units) == []


def test_low_level_modules_import_nothing_above_them():
    graph = import_graph()
    for module, allowed in LOW_LEVEL.items():
        assert graph[module] <= allowed, f"{module} imports {sorted(graph[module] - allowed)}"


def test_the_names_docs_and_config_files_take_from_config_are_defined_in_config_py():
    repo = ROOT.parent
    named = {name for doc in [repo / "README.md", *sorted((repo / "docs").glob("*.md"))]
             for name in re.findall(r"\bconfig\.([A-Za-z_]\w*)", doc.read_text())} - CONFIG_WORDS
    named |= {name for path in sorted((repo / "configs").glob("*.py"))
              for name in re.findall(r"\bsps_config\.(\w+)", path.read_text())}
    defined = set()
    for node in ast.parse((ROOT / "config.py").read_text()).body:  # an import would be a re-export, not a definition
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, ast.Assign):
            defined.update(target.id for target in node.targets if isinstance(target, ast.Name))
    assert sorted((named | CONFIG_API) - defined) == []
    assert "load_config" in named and "check_run_config" in named  # the docs' own mentions are read
