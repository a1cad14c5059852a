"""flower_pfl.tuned.patch: Flower's own object remembered once, callable while replaced,
put back by undo -- a plain method, a property and a module function alike; a replacement's
places installed once, ours made of Flower's own where asked (``From``); and the
measurement override each replacement has (``FLOWER_PFL_FLOWER_*=1``)."""

from __future__ import annotations

import sys
import types

import pytest

from flower_pfl.tuned.patch import From, Replaced, kept


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


def test_install_puts_ours_in_every_place_once_and_flowers_finds_the_owner(monkeypatch):
    module = types.ModuleType("fake_flower_places")
    module.Owner = type("Owner", (), {"method": lambda self: "flower"})
    module.func = lambda: "flower"
    monkeypatch.setitem(sys.modules, "fake_flower_places", module)
    own_method, own_func = vars(module.Owner)["method"], module.func
    made = []

    def wrap(flowers):
        made.append(flowers)
        return lambda self: "ours, then " + flowers(self)

    replaced = Replaced({"fake_flower_places:Owner.method": From(wrap),
                         "fake_flower_places:func": lambda: "ours"})
    assert not replaced.installed() and replaced.flowers("method") is own_method
    replaced.install()
    replaced.install()  # once: Flower's not wrapped twice
    assert replaced.installed() and made == [own_method]
    assert module.Owner().method() == "ours, then flower" and module.func() == "ours"
    assert replaced.flowers("method") is own_method and replaced.flowers("func") is own_func
    with pytest.raises(KeyError):
        replaced.flowers("other")
    replaced.undo()
    assert not replaced.installed() and vars(module.Owner)["method"] is own_method
    assert module.func is own_func


def test_kept_reads_the_override_only_at_1(monkeypatch):
    monkeypatch.delenv("FLOWER_PFL_FLOWER_TEST", raising=False)
    assert not kept("FLOWER_PFL_FLOWER_TEST")
    monkeypatch.setenv("FLOWER_PFL_FLOWER_TEST", "0")
    assert not kept("FLOWER_PFL_FLOWER_TEST")
    monkeypatch.setenv("FLOWER_PFL_FLOWER_TEST", "1")
    assert kept("FLOWER_PFL_FLOWER_TEST")
