"""``engine: tuned``: every replacement of Flower's code, fenced behind one switch.

Each module here puts functions of ours in the place of Flower's, in the process that runs
Flower's simulation engine (the ServerApp's): :mod:`.linkstate_lookup` (a node's messages
found by destination first), :mod:`.engine_wakeup` (the engine and the waiting threads
woken by stored messages), :mod:`.actor_queue` with :mod:`.actor_keeper` (each actor handed
its next message while it works; a lost actor replaced).  :mod:`.patch` remembers Flower's
own objects (undoable), :mod:`.gate` holds the version gate and the checks of everything of
Flower's they touch, and :func:`flower_pfl.tuned.switch.install` -- called explicitly by
the ServerApp's ``main`` -- installs them all, or none.  Importing any of these modules
replaces nothing.  docs/engine.md.
"""
