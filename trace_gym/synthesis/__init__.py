"""Environment synthesis (TRACE stage 2): one training env per capability the agent lacks.

``synthesize(capabilities_path, target_id, analyst="openai:<model>")`` asks an
analyst LLM for an env.py per capability, gates and validates it in the
sandbox, repairs it from the validator's evidence, calibrates it with a policy
and registers it atomically in a registry dir with its provenance (see
``loop``). With ``analyst="registry"`` (offline) it synthesizes nothing: a
capability is served by a registry env whose manifest names it for that target
(``[capability] serves = [...]``), and the report says so plainly.

Nothing here is specific to one benchmark: any registered target with frozen
tool schemas will do. Env code is never imported or run in this process.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from trace_gym.artifacts import Identification, read_json, read_labels
from trace_gym.errors import TraceGymError
from trace_gym.identification.llm_analyst import compact
from trace_gym.identification.stats import LACKING
from trace_gym.registry import EnvKind, add_registry_dir, discover, get_entry, register_all, registry_dirs
from trace_gym.store import read_trajectories

from .analyst import SynthesisAnalyst
from .loop import AttemptKind, Outcome, Status, SynthesisConfig, SynthesisError, Synthesizer, extract_code
from .prompt import TEMPLATE_VERSION, Capability, target_context, template_hash

__all__ = [
    "synthesize",
    "SynthesisConfig",
    "SynthesisResult",
    "SynthesisError",
    "Outcome",
    "Status",
    "AttemptKind",
    "Capability",
    "load_capabilities",
    "serving_envs",
    "extract_code",
    "TEMPLATE_VERSION",
    "template_hash",
]


@dataclass
class SynthesisResult:
    target: str
    analyst: str
    registry_dir: str
    outcomes: list[Outcome] = field(default_factory=list)
    calls: int = 0
    tokens: int = 0
    cache_hits: int = 0
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        lines = []
        for o in self.outcomes:
            lines.append(f"  {o.status.upper():<16} {o.capability}: {o.message}")
        counts = {s: sum(o.status == s for o in self.outcomes) for s in dict.fromkeys(o.status for o in self.outcomes)}
        lines.append(
            f"{len(self.outcomes)} capabilities for {self.target}: "
            + ", ".join(f"{n} {s}" for s, n in counts.items())
            + f"; {sum(len(o.attempts) for o in self.outcomes)} attempts; analyst {self.analyst}: "
            f"{self.calls} calls, {self.tokens} tokens, {self.cache_hits} cached answers"
        )
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "analyst": self.analyst,
            "registry_dir": self.registry_dir,
            "calls": self.calls,
            "tokens": self.tokens,
            "cache_hits": self.cache_hits,
            "notes": self.notes,
            "outcomes": [o.as_dict() for o in self.outcomes],
        }


def load_capabilities(
    path: str | Path,
    *,
    only: list[str] | None = None,
    trajectories: str | Path | None = None,
    evidence_per_capability: int = 6,
    trajectories_per_capability: int = 3,
) -> list[Capability]:
    """The selected capabilities of ``capabilities.json`` (identify's output; a list of
    ``{name, description}`` also works), with the LACKING evidence of ``labels.jsonl``
    beside it and, given the trajectories file, a few compacted failed trajectories."""
    path = Path(path)
    data = read_json(path, "trace-gym identify")
    if isinstance(data, dict) and "version" in data:  # identify's output
        identified = Identification.load(path)
        rows = [{"name": c.name, "description": c.description} for c in identified.selected]
        labels = identified.labels
    else:  # a user's own list of {name, description}, with labels.jsonl beside it if any
        rows = data.get("selected", data.get("capabilities")) if isinstance(data, dict) else data
        if not isinstance(rows, list) or not all(
            isinstance(r, dict) and r.get("name") and r.get("description") for r in rows
        ):
            raise TraceGymError(
                f"{path} must hold a list of capabilities with name and description (identify's 'selected')"
            )
        labels = read_labels(path.parent / Identification.LABELS)
    lacking: dict[str, list[tuple[str, str]]] = {}
    for label in labels:
        if label.label == LACKING:
            lacking.setdefault(label.capability, []).append((label.episode_id, label.evidence))
    if only:
        unknown = sorted(set(only) - {r["name"] for r in rows})
        if unknown:
            raise TraceGymError(
                f"--only {', '.join(unknown)}: not in {path} (it has {', '.join(r['name'] for r in rows) or 'none'})"
            )
        rows = [r for r in rows if r["name"] in only]
    by_episode = {}
    if trajectories:
        by_episode = {t.episode_id: t for t in read_trajectories(trajectories)}

    capabilities = []
    for row in rows:
        pairs = lacking.get(row["name"], [])
        evidence = list(dict.fromkeys(e for _, e in pairs if e))[:evidence_per_capability]
        failed = [by_episode[ep] for ep, _ in pairs if ep in by_episode and not by_episode[ep].success]
        shown = [compact(t, budget=3000, per_message=300) for t in failed[:trajectories_per_capability]]
        capabilities.append(Capability(row["name"], row["description"], evidence, shown))
    return capabilities


def serving_envs(capability: str, target: str) -> list[Any]:
    """Registry envs whose manifest names ``capability`` for ``target``."""
    out = []
    for entry in discover().values():
        served = entry.capability.get("serves") or []
        if (
            entry.kind == EnvKind.SYNTHESIZED
            and entry.target == target
            and (capability in served or entry.capability.get("name") == capability)
        ):
            out.append(entry)
    return out


def default_registry_dir() -> Path:
    return registry_dirs()[0]


def synthesize(
    capabilities: str | Path | list[Capability],
    target: str,
    *,
    analyst: str = "registry",
    registry_dir: str | Path | None = None,
    config: SynthesisConfig | None = None,
    only: list[str] | None = None,
    trajectories: str | Path | None = None,
    cache_dir: str | Path | None = None,
    base_url: str | None = None,
    api_key: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> SynthesisResult:
    """Synthesize (or, offline, find) one env per capability for ``target``."""
    entry = get_entry(target)
    if entry.kind != EnvKind.TARGET:
        raise TraceGymError(f"{target} is not a target; synthesis trains for a target such as trace/tau2-retail-v0")
    caps = (
        capabilities
        if isinstance(capabilities, list)
        else load_capabilities(capabilities, only=only, trajectories=trajectories)
    )
    say = progress or (lambda message: None)
    registry = Path(registry_dir) if registry_dir else default_registry_dir()
    result = SynthesisResult(entry.id, analyst, str(registry))

    if add_registry_dir(registry):
        result.notes.append(
            f"{registry} is not on the registry path: set TRACE_GYM_REGISTRY_PATH={registry} "
            "for other processes to see its envs"
        )
    if analyst == "registry":
        for cap in caps:
            served = serving_envs(cap.name, entry.id)
            if served:
                ids = ", ".join(f"{e.id} ({e.validation_status()})" for e in served)
                result.outcomes.append(
                    Outcome(
                        cap.name,
                        Status.SERVED,
                        f"served by the registry env {ids}; nothing was synthesized",
                        env_id=served[0].id,
                        path=str(served[0].path),
                    )
                )
            else:
                result.outcomes.append(
                    Outcome(
                        cap.name,
                        Status.NOT_SYNTHESIZED,
                        f"no registry env serves it for {entry.id}; run with --analyst openai:<model>",
                    )
                )
            say(f"{cap.name}: {result.outcomes[-1].message}")
        return result

    client = SynthesisAnalyst(analyst, cache_dir=cache_dir, base_url=base_url, api_key=api_key)
    trajectories_list = None
    if trajectories:
        trajectories_list = [
            t for t in read_trajectories(trajectories) if t.env_id.removeprefix("trace_gym:") == entry.id
        ]
    say(f"reading {entry.id}: tool schemas, policy and sample results")
    context = target_context(entry, trajectories_list)
    say("context: " + "; ".join(context.sources))
    synthesizer = Synthesizer(client, entry, context, registry, config, progress=say)
    for i, cap in enumerate(caps, 1):
        say(f"[{i}/{len(caps)}] {cap.name}")
        outcome = synthesizer.run(cap)
        result.outcomes.append(outcome)
        if outcome.status is Status.REGISTERED:
            register_all()
        say(f"{cap.name}: {outcome.message}")
    result.calls, result.tokens, result.cache_hits = client.calls, client.tokens, client.cache_hits
    return result
