"""pyproject.toml declares what the code imports: every third-party module that the
installed packages import comes from a distribution named in the dependencies or an extra,
at a version that has what the code uses."""

import ast
import importlib.metadata
import re
import sys
import tomllib

from conftest import REPO

PACKAGE_DIRS = ("trace_gym", "agents", "sandbox")
# Each said so in pyproject.toml where its extra is declared: torch is installed by the
# Makefile as the CPU build (a plain requirement pulls a multi-GB CUDA build); Apple's
# tool_sandbox is not on PyPI and is installed from git without its old pins.
NOT_DECLARED_ON_PURPOSE = {"torch", "tool_sandbox"}


def declared() -> dict[str, str]:
    """Distribution name (normalized) -> its requirement text, over dependencies and every extra."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    requirements = list(project["dependencies"]) + [
        r for extra in project["optional-dependencies"].values() for r in extra
    ]
    return {_normal(re.split(r"[<>=!~\[ ;]", r, maxsplit=1)[0]): r for r in requirements}


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def imported_top_level_modules() -> dict[str, str]:
    """Module -> one file that imports it, for absolute imports in the installed packages."""
    local = {p.stem for d in PACKAGE_DIRS for p in (REPO / d).glob("*.py")} | {"trace_gym"}
    out: dict[str, str] = {}
    for folder in PACKAGE_DIRS:
        for path in sorted((REPO / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                names = (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module]
                    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                    else []
                )
                for name in names:
                    top = name.split(".")[0]
                    if top not in sys.stdlib_module_names and top not in local:
                        out.setdefault(top, str(path.relative_to(REPO)))
    return out


def test_every_imported_distribution_is_declared():
    distributions = importlib.metadata.packages_distributions()
    names = declared()
    missing = []
    for module, where in sorted(imported_top_level_modules().items()):
        if module in NOT_DECLARED_ON_PURPOSE:
            continue
        owners = {_normal(d) for d in distributions.get(module, [module])}
        if not owners & set(names):
            missing.append(f"{module} (imported by {where}; distribution {', '.join(sorted(owners))})")
    assert not missing, "declare in pyproject.toml: " + "; ".join(missing)


def test_matplotlib_and_the_transformers_dtype_keyword_are_declared():
    names = declared()
    assert "matplotlib" in names
    # from_pretrained(..., dtype=...) replaced torch_dtype= in transformers 4.56.
    uses_dtype = any(
        "from_pretrained(" in line and "dtype=" in line and "torch_dtype" not in line
        for p in (REPO / "trace_gym" / "llm").glob("*.py")
        for line in p.read_text().splitlines()
    )
    assert uses_dtype
    floor = re.search(r">=\s*([\d.]+)", names["transformers"]).group(1)
    assert tuple(int(x) for x in floor.split(".")[:2]) >= (4, 56), names["transformers"]


def test_every_package_folder_is_declared_for_the_wheel():
    """A package folder missing from ``[tool.setuptools] packages`` works in a clone and is
    absent from an installed wheel."""
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    dirs = {name: REPO / path for name, path in setuptools["package-dir"].items()}
    found = set()
    for name, folder in dirs.items():
        for init in folder.rglob("__init__.py"):
            relative = init.parent.relative_to(folder).parts
            if "__pycache__" not in relative and not any(p in ("tests", "prompts") for p in relative):
                found.add(".".join((name, *relative)))
    nested = {p for p in found if any(p.startswith(f"{d}.") for d in dirs if d != "trace_gym")}
    assert sorted(found - nested - set(setuptools["packages"])) == []
