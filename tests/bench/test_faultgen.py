"""The replay's fault generator (bench/faultgen.py) is independent of the rules it judges."""

import ast
import builtins
import io
import random
from pathlib import Path
from typing import Any

import pytest

from bench import faultgen
from bench.faultgen import KINDS, SOURCES, draw_params, generate
from hub.monitoring import RULE_FILES

MODULE = Path(faultgen.__file__)


def test_the_generator_imports_nothing_that_knows_the_rules() -> None:
    """Only the standard library: not hub.monitoring (the rule files), not yaml, not the scorer."""
    tree = ast.parse(MODULE.read_text())
    imported = {
        (node.module or "") if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    ours = {name for name in imported if name.split(".")[0] in {"hub", "bench", "portal", "spawner", "yaml"}}
    assert ours == set(), f"bench/faultgen.py imports {ours}: the generator must not see the rules"
    for rules in RULE_FILES:
        assert rules.name not in MODULE.read_text(), f"bench/faultgen.py names {rules.name}"


def test_a_replay_is_generated_with_the_rule_files_unreadable(monkeypatch: pytest.MonkeyPatch) -> None:
    rules = {str(p.resolve()) for p in RULE_FILES}
    real_open = builtins.open

    def guarded(file: Any, *args: Any, **kwargs: Any) -> Any:
        if str(Path(str(file)).resolve()) in rules:
            raise AssertionError(f"the generator opened {file}")
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", guarded)
    monkeypatch.setattr(io, "open", guarded)
    replay = generate(seed=3, days=2, faults_per_kind=1)
    assert {(f.kind, f.shape) for f in replay.faults} == {
        (k, s.name) for k, (_, _, shapes) in KINDS.items() for s in shapes
    }


def test_every_shape_names_its_sources_and_every_source_is_used() -> None:
    used = {source for _, _, shapes in KINDS.values() for s in shapes for source in s.sources}
    assert used <= set(SOURCES), used - set(SOURCES)
    assert set(SOURCES) - used == set(), f"sources no shape uses: {set(SOURCES) - used}"


def test_the_drawn_shapes_stay_in_their_sources_ranges() -> None:
    rng = random.Random(7)
    hangs = [dict(draw_params(rng, "hung_gpu", "collective_hang")) for _ in range(500)]
    assert min(h["sm_active"] for h in hangs) >= 1 / 108 and max(h["sm_active"] for h in hangs) <= 32 / 108
    assert {10.0, 30.0} <= {h["minutes"] for h in hangs}  # PyTorch's NCCL watchdog, now and before 2.2
    xids = {dict(draw_params(rng, "xid_storm", "hardware_xid"))["code"] for _ in range(500)}
    assert xids == set(map(float, faultgen.HARDWARE_XIDS))
    assert not xids & set(map(float, faultgen.APPLICATION_XIDS))
    reboots = [dict(draw_params(rng, "node_down", "quick_reboot"))["minutes"] for _ in range(100)]
    assert set(reboots) <= {1, 2, 3}
