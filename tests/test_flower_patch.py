"""flower_pfl.tuned.patch: Flower's own object remembered once, callable while replaced,
put back by undo -- a plain method, a property and a module function alike; and the
measurement override each replacement has (``FLOWER_PFL_FLOWER_*=1``)."""

from __future__ import annotations

import types

from flower_pfl.tuned.patch import Replaced, kept


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


def test_kept_reads_the_override_only_at_1(monkeypatch):
    monkeypatch.delenv("FLOWER_PFL_FLOWER_TEST", raising=False)
    assert not kept("FLOWER_PFL_FLOWER_TEST")
    monkeypatch.setenv("FLOWER_PFL_FLOWER_TEST", "0")
    assert not kept("FLOWER_PFL_FLOWER_TEST")
    monkeypatch.setenv("FLOWER_PFL_FLOWER_TEST", "1")
    assert kept("FLOWER_PFL_FLOWER_TEST")
