"""TEST HARNESS: steady chat traffic through a gateway, counted (a background thread)."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections import Counter

REQUEST_TIMEOUT_S = 10.0


class Load:
    def __init__(self, url: str, model: str, threads: int = 2) -> None:
        self.url = url
        self.model = model
        self.ok = 0
        self.failed: Counter[str] = Counter()
        self.instances: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, name=f"load-{i}", daemon=True)
            for i in range(threads)
        ]

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=REQUEST_TIMEOUT_S + 5)

    def one(self) -> tuple[int, str]:
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": "hello there"}],
            "max_tokens": 4,
        }
        request = urllib.request.Request(
            self.url + "/v1/chat/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as resp:
                resp.read()
                return resp.status, resp.headers.get("x-warmfleet-instance") or ""
        except urllib.error.HTTPError as err:
            with err:
                return err.code, ""
        except (urllib.error.URLError, OSError) as err:
            return 0, type(err).__name__

    def _run(self) -> None:
        while not self._stop.is_set():
            status, instance = self.one()
            with self._lock:
                if status == 200:
                    self.ok += 1
                    self.instances[instance] += 1
                else:
                    self.failed[f"{status} {instance}".strip()] += 1
            if status != 200:
                self._stop.wait(0.05)  # no busy loop while the gateway is not there

    def reset(self) -> None:
        """Count from now on (after the gateway and its instances came up)."""
        with self._lock:
            self.ok = 0
            self.failed.clear()
            self.instances.clear()

    @property
    def failures(self) -> int:
        return sum(self.failed.values())
