"""`trace-gym targets new` scaffolds a target of the user's own that plays as it is, and
an installed package registers its envs through the `trace_gym.registry` entry point."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest

from conftest import run_cli


def test_a_scaffolded_target_plays_freezes_and_refuses_mistakes(tmp_path):
    registry = tmp_path / "mine"
    made = run_cli("targets", "new", "order-desk", "--dir", str(registry))
    assert made.returncode == 0, made.stderr
    assert f"export TRACE_GYM_REGISTRY_PATH={registry}" in made.stdout
    folder = registry / "order-desk"
    assert "class OrderDeskEnv(gym.Env)" in (folder / "order_desk.py").read_text()
    env = {"TRACE_GYM_REGISTRY_PATH": str(registry)}
    out = tmp_path / "oracle.jsonl"
    played = run_cli(
        "rollout",
        "--env",
        "trace/order-desk-v0",
        "--agent",
        "oracle",
        "--split",
        "train",
        "--out",
        str(out),
        "--no-progress",
        env=env,
    )
    assert played.returncode == 0, played.stderr
    assert "12 episodes, pass rate 1.000" in played.stdout
    idle = run_cli(
        "rollout",
        "--env",
        "trace/order-desk-v0",
        "--agent",
        "message_only",
        "--split",
        "train",
        "--out",
        str(tmp_path / "idle.jsonl"),
        "--no-progress",
        env=env,
    )
    assert idle.returncode == 0 and "pass rate 0.000" in idle.stdout  # the reward asks for the work, not a reply
    import sys

    sys.path.insert(0, str(folder))
    try:
        from order_desk import OrderDeskEnv
    finally:
        sys.path.remove(str(folder))
    desk, rewards = OrderDeskEnv(split="train"), []
    for task in desk.task_ids:  # an agent that always cancels, then looks: never right
        desk.reset(options={"task_id": task})
        desk.step('{"name": "cancel_order", "arguments": {"order_id": "%s"}}' % desk.order)
        desk.step('{"name": "get_order", "arguments": {"order_id": "%s"}}' % desk.order)
        rewards.append(desk.step("Done.")[1])
    assert rewards == [0.0] * len(desk.task_ids)
    desk.reset(options={"task_id": 0})
    observation, _, done, _, _ = desk.step('{"name": "get_order", "arguments": {"order_id": ')
    assert not done and observation.startswith("Error")  # a malformed call is answered, not a goodbye
    with pytest.raises(ValueError, match="not in the train split"):
        desk.reset(options={"task_id": "13"})  # a test task, asked of the train split
    frozen = run_cli("targets", "freeze", "trace/order-desk-v0", env=env)
    assert frozen.returncode == 0, frozen.stderr
    tools = json.loads((folder / "tools.json").read_text())
    assert {t["function"]["name"] for t in (tools["tools"] if isinstance(tools, dict) else tools)} == {
        "get_order",
        "cancel_order",
    }
    assert (folder / "results.json").exists()

    for args, extra, words in (
        (["order-desk", "--dir", str(registry)], env, "already registered"),
        (["order-desk", "--dir", str(registry)], {}, "already exists"),
        (["Order_Desk"], {}, "lowercase"),
        (["json"], {}, "taken by an installed module"),
    ):
        refused = run_cli("targets", "new", *args, env=extra, cwd=tmp_path)
        assert refused.returncode == 2 and words in refused.stderr, refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1


def test_an_installed_package_registers_its_envs_by_entry_point(tmp_path):
    site = tmp_path / "site"
    package = site / "desk_envs"
    assert run_cli("targets", "new", "order-desk", "--dir", str(package)).returncode == 0
    (package / "__init__.py").write_text("")
    info = site / "desk_envs-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: desk-envs\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[trace_gym.registry]\ndesk = desk_envs\nbroken = no_such_package_here\nnested = loud_pkg.envs\n"
    )
    (site / "loud_pkg" / "envs").mkdir(parents=True)  # a dotted entry point; its package's code must not run
    (site / "loud_pkg" / "__init__.py").write_text("raise RuntimeError('imported at import trace_gym')\n")
    (site / "loud_pkg" / "envs" / "__init__.py").write_text("")
    shutil.copytree(package / "order-desk", site / "loud_pkg" / "envs" / "other-desk")
    manifest = site / "loud_pkg" / "envs" / "other-desk" / "manifest.toml"
    manifest.write_text(manifest.read_text().replace("trace/order-desk-v0", "trace/other-desk-v0"))
    env = {"PYTHONPATH": str(site), "TRACE_GYM_REGISTRY_PATH": ""}
    listed = run_cli("envs", "list", "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    assert {"trace/order-desk-v0", "trace/other-desk-v0"} <= {row["id"] for row in json.loads(listed.stdout)}
    assert "imported at import" not in listed.stderr
    assert "no_such_package_here" in listed.stderr and "not registered" in listed.stderr  # a warning, not a failure
    played = run_cli(
        "rollout",
        "--env",
        "trace/order-desk-v0",
        "--agent",
        "oracle",
        "--split",
        "test",
        "--out",
        str(tmp_path / "o.jsonl"),
        "--no-progress",
        env=env,
    )
    assert played.returncode == 0 and "4 episodes, pass rate 1.000" in played.stdout, played.stderr


def test_prompts_name_what_the_targets_agent_is(tmp_path):
    """The analyst's and the router's prompts say what the target's agent is, from its
    manifest's `agent` words (a training env: its target's), and those words, which no
    behaviour reads, leave an env's code hash (and so its validation) as it was."""
    from trace_gym.hashing import code_hash
    from trace_gym.registry import agent_words, read_manifest
    from trace_gym.routing import RouteCapability, Router

    retail = agent_words("trace/tau2-retail-v0")
    assert retail.startswith("a retail store's customer-service agent")
    assert agent_words("trace/tool-precision-v0") == retail and "phone" in agent_words("trace/toolsandbox-v0")
    assert agent_words("trace/no-such-env-v0") == "a tool-using agent"
    folder = tmp_path / "desk"
    folder.mkdir()
    (folder / "manifest.toml").write_text(
        'id = "trace/desk-v0"\nkind = "target"\nentry_point = "desk:Desk"\n'
        'description = "Order desk: cancel pending orders."\n'
    )
    assert read_manifest(folder).agent == "a tool-using agent on trace/desk-v0 (Order desk)"
    before = code_hash(folder)
    (folder / "manifest.toml").write_text((folder / "manifest.toml").read_text() + 'agent = "a desk clerk"\n')
    assert read_manifest(folder).agent == "a desk clerk" and code_hash(folder) == before
    (folder / "manifest.toml").write_text((folder / "manifest.toml").read_text() + '[kwargs]\nagent = "llm"\n')
    assert code_hash(folder) != before  # an `agent` the constructor reads is behaviour, and hashed

    class Scores:
        name = "fixed"

        def score(self, conversation, labels, **_):
            return {label: 0.0 for label in labels}

    caps = [RouteCapability("precise_arguments", "Exact argument values.", "a")]
    system = Router(Scores(), caps, agent=retail).prompt("Cancel order #W1.")[0]["content"]
    assert retail in system and "customer-service tasks" not in Router(Scores(), caps).prompt("x")[0]["content"]


BANK = Path(__file__).parents[1] / "examples" / "bank-support" / "bank-support"


@pytest.mark.parametrize(
    "mistake, command, says",
    [
        ("tools not frozen", ["envs", "new", "lookups", "--target", "trace/my-bank-v0"], "tools.json: not found"),
        ("entry point's class", ["rollout"], "entry_point 'bank_support:Nope' does not load"),
        ("entry point's module", ["rollout"], "No module named 'bank_suport'"),
        ("misspelt keyword", ["rollout"], "unexpected keyword argument 'max_stepz'"),
        ("entry point not text", ["rollout"], "needs 'entry_point = \"module:Class\"', got 5"),
        ("kwargs not a table", ["rollout"], "[kwargs] must be a table"),
        ("bad TOML", ["rollout"], "not valid TOML"),
        ("no oracle", ["rollout"], "has no oracle: the oracle agent plays a target's oracle_actions()"),
        ("module raises", ["rollout"], "does not load: NameError: name 'SPLITZ' is not defined"),
        ("unknown split", ["rollout"], "manifest.toml) has no split 'dev' (KeyError: 'dev'; a target has train and"),
        ("misspelt call error", ["rollout"], "[call_errors] has no 'unknown_tol'; it takes first_missing_only"),
        ("call error not text", ["rollout"], "[call_errors] prefix must be a str, got int"),
        ("misspelt field", ["rollout"], "manifest.toml: has no field 'descripton'; it takes id, kind"),
        ("misspelt capability field", ["rollout"], "manifest.toml: [capability] has no field 'nmae'; it takes name"),
        ("no spaces", ["rollout"], "The environment must specify an action space."),
        ("no task ids", ["rollout"], "has no task list: a target lists its split's task ids in task_ids"),
        ("observation not text", ["rollout"], "BankSupportEnv.reset returned a list, not text"),
        ("tool not a schema", ["rollout"], "BankSupportEnv.reset: info['tools']: not an OpenAI function schema"),
        ("tool not a schema", ["targets", "freeze"], "info['tools']: not an OpenAI function schema"),
        ("reward out of range", ["rollout"], "BankSupportEnv.step ended an episode with reward 5.0, not a number in"),
    ],
)
def test_a_targets_mistake_is_one_line_naming_its_file(tmp_path, mistake, command, says):
    registry = tmp_path / "mine"
    folder = registry / "my-bank"
    folder.mkdir(parents=True)
    shutil.copy(BANK / "bank_support.py", folder)
    manifest = (BANK / "manifest.toml").read_text().replace("trace/bank-support-v0", "trace/my-bank-v0")
    manifest = {
        "entry point's class": manifest.replace("bank_support:BankSupportEnv", "bank_support:Nope"),
        "entry point's module": manifest.replace("bank_support:BankSupportEnv", "bank_suport:BankSupportEnv"),
        "misspelt keyword": manifest + "\n[kwargs]\nmax_stepz = 4\n",
        "entry point not text": manifest.replace('"bank_support:BankSupportEnv"', "5"),
        "kwargs not a table": manifest.replace("entry_point =", "kwargs = 3\nentry_point ="),
        "bad TOML": manifest.replace("kind = ", "kind "),
        "misspelt call error": manifest + '\n[call_errors]\nunknown_tol = "Error: no {name}"\n',
        "call error not text": manifest + "\n[call_errors]\nprefix = 3\n",
        "misspelt field": manifest.replace("description =", "descripton ="),
        "misspelt capability field": manifest + '\n[capability]\nnmae = "x"\n',
    }.get(mistake, manifest)
    module = folder / "bank_support.py"
    broken = {
        "no spaces": ("self.observation_space = self.action_space = AnyText(10_000)", "self.spaces = None"),
        "no task ids": ("[str(i) for i in SPLITS[split]]", "[]"),
        "observation not text": ("return opening, {", "return [opening], {"),
        "tool not a schema": ('{"type": "function", "function": {"name": name', '{"function": {"nam": name'),
        "reward out of range": ("reward = (0.7 *", "reward = 5 * (0.7 *"),
    }
    if mistake in broken:
        old, new = broken[mistake]
        assert old in module.read_text()
        module.write_text(module.read_text().replace(old, new))
    if mistake == "no oracle":
        module.write_text(module.read_text().replace("def oracle_actions(self):", "def solutions(self):"))
    if mistake == "module raises":
        module.write_text(module.read_text().replace("SPLITS = {", "SPLITS = SPLITZ or {"))
    (folder / "manifest.toml").write_text(manifest)
    if command == ["rollout"]:
        split = "dev" if mistake == "unknown split" else "train"
        command = ["rollout", "--env", "trace/my-bank-v0", "--agent", "oracle", "--split", split]
        command += ["--out", str(tmp_path / "out.jsonl"), "--no-progress"]
    elif command == ["targets", "freeze"]:
        command = [*command, "trace/my-bank-v0"]
        (folder / "tools.json").write_text("[]\n")
    else:
        command += ["--dir", str(tmp_path / "envs")]
    refused = run_cli(*command, env={"TRACE_GYM_REGISTRY_PATH": str(registry)})
    assert refused.returncode == 2 and says in refused.stderr, refused.stderr
    lines = refused.stderr.strip().splitlines()
    assert all(line.startswith("trace-gym: ") for line in lines), lines  # no traceback, no source lines
    assert [line for line in lines if not line.startswith("trace-gym: warning: ")] == lines[-1:]  # one error
    played = ("no oracle", "observation not text", "tool not a schema", "reward out of range")
    named = {"tools not frozen": folder / "tools.json", "no task ids": "trace/my-bank-v0"}
    named.update({mistake: "trace/my-bank-v0" if mistake == "no oracle" else "BankSupportEnv" for mistake in played})
    assert str(named.get(mistake, folder / "manifest.toml")) in refused.stderr
    assert not (tmp_path / "envs").exists()  # nothing half made
    if mistake not in played:  # (the store opens before the agent meets its first task)
        assert not (tmp_path / "out.jsonl").exists()
    if command[:2] == ["targets", "freeze"]:
        assert (folder / "tools.json").read_text() == "[]\n" and not (folder / "results.json").exists()


def test_a_broken_manifest_is_named_when_asked_for_and_warned_of_otherwise(tmp_path, monkeypatch):
    from trace_gym.errors import ManifestError
    from trace_gym.registry import get_entry, register_all

    for name, entry_point in (("good-desk", "bank_support:BankSupportEnv"), ("bad-desk", "no colon")):
        folder = tmp_path / name
        folder.mkdir()
        manifest = (BANK / "manifest.toml").read_text().replace("bank-support-v0", f"{name}-v0")
        (folder / "manifest.toml").write_text(manifest.replace("bank_support:BankSupportEnv", entry_point))
    monkeypatch.setenv("TRACE_GYM_REGISTRY_PATH", str(tmp_path))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        register_all()  # registration skips it quietly: it is reported where it is asked for
    with pytest.raises(ManifestError, match=r"bad-desk/manifest.toml: a target needs 'entry_point"):
        get_entry("trace/bad-desk-v0")
    with pytest.warns(UserWarning, match=r"skipping an env folder: .*bad-desk"):
        assert get_entry("trace/good-desk-v0").path == tmp_path / "good-desk"
    listed = run_cli("envs", "list", env={"TRACE_GYM_REGISTRY_PATH": str(tmp_path)})
    assert listed.returncode == 0 and "trace/good-desk-v0" in listed.stdout, listed.stderr
    assert listed.stderr.splitlines() == [  # once, on one line, however many readers of the registry met it
        f"trace-gym: warning: skipping an env folder: {tmp_path / 'bad-desk' / 'manifest.toml'}: a target needs "
        "'entry_point = \"module:Class\"', got 'no colon'"
    ]


def test_a_manifest_kind_is_one_of_the_registry_kinds(tmp_path):
    from trace_gym.errors import ManifestError
    from trace_gym.registry import EnvKind, ValidationStatus, read_manifest

    entry = read_manifest(BANK)
    assert entry.kind is EnvKind.TARGET and entry.validation_status() is ValidationStatus.TRUSTED
    manifest = (BANK / "manifest.toml").read_text()
    assert 'kind = "target"' in manifest
    for given in ('"trainer"', '"Target"', '["target"]', "1"):
        (tmp_path / "manifest.toml").write_text(manifest.replace('kind = "target"', f"kind = {given}"))
        with pytest.raises(ManifestError, match=r"'kind' must be 'target' or 'synthesized', got "):
            read_manifest(tmp_path)


def test_a_targets_reward_is_held_to_zero_to_one_with_rounding_forgiven():
    import numpy as np

    from trace_gym.env import check_target_reward
    from trace_gym.errors import TargetContractError

    class Plain:  # not a trace-gym env: its reward is checked
        pass

    for given, taken in ((0.34 + 0.56 + 0.1, 1.0), (np.float32(0.5), 0.5), (np.bool_(True), 1.0), (-1e-9, 0.0)):
        assert check_target_reward(Plain(), given) == taken
    for given in (1.01, -0.5, float("nan"), "1", None):
        with pytest.raises(TargetContractError, match="Plain.step ended an episode with reward"):
            check_target_reward(Plain(), given)
