"""flower_pfl.flower_patch: Flower's own object remembered once, callable while replaced,
put back by undo -- a plain method, a property and a module function alike; and the
switch / engine-loaded check every replacement makes first."""

from __future__ import annotations

import sys
import types

from flower_pfl import flower_patch
from flower_pfl.flower_patch import Replaced


class Owner:
    def method(self) -> str:
        return "flower"

    @property
    def prop(self) -> int:
        return 1


def test_put_remembers_flowers_own_once_and_undo_puts_it_back():
    module = types.ModuleType("fake_flower")
    module.func = lambda: "flower"
    own_method, own_prop = vars(Owner)["method"], vars(Owner)["prop"]
    replaced = Replaced()
    assert not replaced
    replaced.put(Owner, "method", lambda self: "ours")
    replaced.put(Owner, "method", lambda self: "ours again")  # Flower's stays remembered
    replaced.put(Owner, "prop", property(lambda self: 2))
    replaced.put(module, "func", lambda: "ours")
    assert replaced and Owner().method() == "ours again" and Owner().prop == 2
    assert module.func() == "ours"
    assert replaced.flowers("method", Owner) is own_method
    assert replaced.flowers("prop", Owner) is own_prop
    assert replaced.flowers("func", module)() == "flower"
    replaced.undo()
    assert not replaced and Owner().method() == "flower" and Owner().prop == 1
    assert module.func() == "flower"
    assert vars(Owner)["method"] is own_method and vars(Owner)["prop"] is own_prop
    assert replaced.flowers("method", Owner) is own_method  # not replaced: the owner's own


def test_wanted_honours_the_switch_and_the_engine_check(monkeypatch):
    monkeypatch.delenv("FLOWER_PFL_FLOWER_TEST", raising=False)
    monkeypatch.delitem(sys.modules, flower_patch.ENGINE_MODULE, raising=False)
    assert flower_patch.wanted("FLOWER_PFL_FLOWER_TEST")
    assert not flower_patch.wanted("FLOWER_PFL_FLOWER_TEST", engine_loaded_only=True)
    monkeypatch.setitem(sys.modules, flower_patch.ENGINE_MODULE, types.ModuleType("vce_api"))
    assert flower_patch.wanted("FLOWER_PFL_FLOWER_TEST", engine_loaded_only=True)
    monkeypatch.setenv("FLOWER_PFL_FLOWER_TEST", "1")
    assert not flower_patch.wanted("FLOWER_PFL_FLOWER_TEST", engine_loaded_only=True)
    assert not flower_patch.wanted("FLOWER_PFL_FLOWER_TEST")
