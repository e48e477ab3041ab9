"""Settings: declared once in ``config.py``, read nowhere else, listed in ``docs/settings.md``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from thunder_fuser import config
from thunder_fuser.inspect import debug

ROOT = Path(__file__).resolve().parents[1]


def test_docs_list_every_setting_as_config_declares_it():
    assert (ROOT / "docs" / "settings.md").read_text() == config.markdown(), (
        "docs/settings.md is stale: python -m thunder_fuser.config > docs/settings.md")


def test_no_module_but_config_reads_the_environment():
    readers = [str(p.relative_to(ROOT)) for p in (ROOT / "thunder_fuser").rglob("*.py")
               if p.name != "config.py" and re.search(r"os\.environ|os\.getenv", p.read_text())]
    assert readers == []


def test_every_thunder_fuser_variable_the_package_names_is_declared():
    named = set()
    for p in (ROOT / "thunder_fuser").rglob("*.py"):
        named |= set(re.findall(r"THUNDER_FUSER_[A-Z_]+[A-Z]", p.read_text()))
    assert named <= set(config.SETTINGS), named - set(config.SETTINGS)


def test_an_unknown_dump_stage_is_an_error_that_lists_the_valid_ones(monkeypatch):
    monkeypatch.setenv("THUNDER_FUSER_DUMP", "segments,kernel")
    with pytest.raises(ValueError, match="unknown kernel; the valid ones are region, segments, layout, all"):
        debug.enabled("segments")


@pytest.mark.parametrize("value, on", [("1", True), ("0", False), ("off", False), ("", True), ("yes", True)])
def test_a_flag_reads_one_way(monkeypatch, value, on):
    monkeypatch.setenv("THUNDER_FUSER_DONATE", value)
    assert config.flag("THUNDER_FUSER_DONATE") is on


def test_a_bad_number_names_the_setting(monkeypatch):
    monkeypatch.setenv("THUNDER_FUSER_MAX_PLANS", "many")
    with pytest.raises(ValueError, match="THUNDER_FUSER_MAX_PLANS='many': expected a whole number"):
        config.integer("THUNDER_FUSER_MAX_PLANS")


def test_every_patch_is_a_choice_of_its_setting_and_each_took():
    """``THUNDER_FUSER_PATCHES`` names every patch ``patches/`` has and the optimizer step's
    (``optimizers/jit_patch.py``, a later stage), and on this thunder each one applies (a
    patch that finds thunder changed says False and leaves it)."""
    from thunder_fuser.optimizers.jit_patch import jit_torch_optimizer_steps
    from thunder_fuser.patches import PATCHES, apply_patches

    choices = set(config._declared("THUNDER_FUSER_PATCHES").choices) - {"all", "none"}
    assert choices == set(PATCHES) | {"jit_optimizer_step"}
    assert apply_patches() == dict.fromkeys(PATCHES, True)
    assert jit_torch_optimizer_steps()
