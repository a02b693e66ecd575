"""An emulated fleet: many instances in one process, one port each (the programmatic API).

    async with EmulatedFleet(build_spec(instances=4, kv_capacity_tokens=32_768)) as fleet:
        fleet.urls                 # ["http://127.0.0.1:PORT", ...]
        await fleet.kill(1)        # abrupt death: resets, stream cuts, listener closed
        await fleet.restart(1)     # back on the same URL with an empty cache
        fleet.set_faults(2, FaultSpec(error_rate=0.5))
        fleet.stats()              # per-instance engine counters (None while down)

Leaving the ``async with`` stops every instance and every task the fleet started.
"""

from __future__ import annotations

import os
from types import TracebackType
from typing import Any

import zmq

from warmfleet.emulator.config import EmulatorSpec, FaultSpec
from warmfleet.emulator.instance import EmulatedInstance
from warmfleet.emulator.tokenizer import EmulatorTokenizer
from warmfleet.engine.events import EngineStats


class EmulatedFleet:
    def __init__(self, config: EmulatorSpec | None = None) -> None:
        self.config = config if config is not None else EmulatorSpec()
        self.engine_spec = self.config.engine_spec()
        self._zmq: zmq.Context[Any] | None = None
        if self.config.kv_events is not None:
            self._zmq = zmq.Context()
        tokenizer = EmulatorTokenizer()  # shared: memoised prompts serve every instance
        self.instances = [
            EmulatedInstance(
                i,
                self.config,
                engine_spec=self.engine_spec,
                tokenizer=tokenizer,
                zmq_context=self._zmq,
            )
            for i in range(self.config.instances)
        ]

    async def __aenter__(self) -> EmulatedFleet:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def start(self) -> None:
        try:
            for instance in self.instances:
                await instance.start()
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        for instance in self.instances:
            await instance.close()
        context, self._zmq = self._zmq, None
        if context is not None:
            context.term()

    # ------------------------------------------------------------------ access

    @property
    def urls(self) -> list[str]:
        return [instance.url for instance in self.instances]

    def instance(self, index: int) -> EmulatedInstance:
        return self.instances[index]

    async def kill(self, index: int) -> None:
        await self.instances[index].kill()

    async def restart(self, index: int) -> None:
        await self.instances[index].restart()

    def set_faults(self, index: int, faults: FaultSpec) -> None:
        self.instances[index].set_faults(faults)

    def stats(self) -> list[EngineStats | None]:
        return [instance.stats() for instance in self.instances]

    def ready_info(self) -> dict[str, Any]:
        """What ``warmfleet emulate`` prints (one JSON line) and writes to ``--ports-file``."""
        spec = self.engine_spec
        return {
            "event": "ready",
            "pid": os.getpid(),
            "model": self.config.model,
            "preset": spec.name,
            "block_size": spec.block_tokens,
            "kv_capacity_tokens": spec.kv_capacity_tokens,
            "speedup": self.config.speedup,
            "urls": self.urls,
            "instances": [
                {"name": i.name, "url": i.url, "port": i.port, "running": i.running}
                for i in self.instances
            ],
        }
