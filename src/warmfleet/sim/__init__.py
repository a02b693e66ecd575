"""Virtual-time fleet simulation (pure): one kernel, ``sim.simulator.Simulator``, runs routing
strategies built by ``routing.factory`` over simulated instances (``EngineModel``, or a
calibrated ``sim.servers.SlotServer``), with scale events and an optional fleet controller
(``sim.fleet``); workloads, metrics, scenario documents, the strategy comparison
(``sim.runner``) and the scale-out what-if (``sim.whatif``, ``sim.scaleout``) are built on it.

May import ``core``, ``api``, ``routing``, ``engine``, ``cache`` and ``control``; never a shell,
``warmfleet.edge`` or ``warmfleet.kube``. Callers pass scenario documents in as text and trace
files as explicit paths (only ``sim.workloads.traces`` opens those); nothing here finds a file.
"""
