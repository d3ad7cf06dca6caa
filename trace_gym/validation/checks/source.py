"""Checks that read the env's source and start nothing: the sandbox's static gate and the contract's shape."""

from __future__ import annotations

import ast

from trace_gym.sandbox import check_source
from ..context import Context
from ..report import CheckResult


def check_static_gate(ctx: Context) -> CheckResult:
    findings = check_source(ctx.source)
    if findings:
        return CheckResult(
            "static_gate", False, "; ".join(str(f) for f in findings[:5]), {"findings": [str(f) for f in findings]}
        )
    return CheckResult("static_gate", True, f"{len(ctx.source.splitlines())} lines, only allowed imports and names")


def check_contract_shape(ctx: Context) -> CheckResult:
    tree = ast.parse(ctx.source)
    problems = []
    doc = ast.get_docstring(tree) or ""
    if not doc.lower().startswith("transfer rationale"):
        problems.append("the module docstring must start with 'Transfer rationale:' (why success here transfers)")
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    env_class = classes.get("Environment")
    methods = {n.name for n in env_class.body if isinstance(n, ast.FunctionDef)} if env_class else set()
    if env_class is None:
        problems.append("no class Environment")
    for method in ("reset", "step", "reward", "oracle"):
        if env_class is not None and method not in methods:
            problems.append(f"Environment has no {method}()")
    if not any(
        isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "TOOLS" for t in n.targets)
        for n in tree.body
    ):
        problems.append("no module-level TOOLS list")
    if problems:
        return CheckResult("contract_shape", False, "; ".join(problems))
    return CheckResult("contract_shape", True, "transfer rationale, TOOLS, Environment with reset/step/reward/oracle")
