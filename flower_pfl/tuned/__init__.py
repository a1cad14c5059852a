"""``engine: tuned``: every replacement of Flower's code, fenced behind one switch.

Each replacement module puts functions of ours in the place of Flower's in one of Flower's
processes (the simulation's: :mod:`.linkstate_lookup`, :mod:`.engine_wakeup`,
:mod:`.actor_queue`; a deployment's: :mod:`.grid_poll`, :mod:`.array_packing`,
:mod:`.node_waits`, :mod:`.superexec_start`, :mod:`.warm_clientapp`, :mod:`.pull_backoff`).
:mod:`.patch` is the one piece they are built on (the places taken, Flower's own objects
remembered, undoable), :mod:`.gate` holds the version gate and the checks of everything of
Flower's they touch, and :func:`flower_pfl.tuned.switch.install` installs a process' set,
or none.  Importing any of these modules replaces nothing.  docs/engine.md lists each
replacement with the gain it measured; no new one comes without an issue asking for it.
"""
