"""Sleep/wake bookkeeping shared by the rollout engines (the CPU reference's serving mirror, the vLLM adapter): the
level asleep at, the refusals, what the engine held before it slept, and the WakeEvent of the last cycle. An engine
composes one `SleepWake` and keeps only its own sleep and wake (vLLM's `LLM.sleep` / `wake_up`, the mirror's
offload and discard), calling these around them in its own order."""
from __future__ import annotations

from typing import Callable

from ..record import KVScale, WakeEvent
from .protocol import EngineError

# what an engine refuses while asleep, by what was asked of it (`SleepWake.refuse_if_asleep`)
ASLEEP = {"generation": "generation requested while the engine is asleep",
          "install": "weights installed while the engine is asleep (wake it first)"}


class SleepWake:
    """One engine's sleep state. `level`: 0 awake, else the level (1 or 2) it sleeps at. `wake_event`: the last
    wake's WakeEvent (None before the first), updated in place as generations and syncs follow it."""

    def __init__(self):
        self.level = 0
        self.wake_event: WakeEvent | None = None
        self._pre_sleep: dict | None = None
        self._kv_before: dict[str, KVScale] | None = None

    def begin_sleep(self, level: int, digests: Callable[[], dict], kv_scales: Callable[[], dict]):
        """Refuses a level other than 1 or 2 and a sleep while asleep (EngineError); then keeps `digests()` and
        `kv_scales()`, the engine's state before it sleeps, read only once the sleep is accepted. The engine is
        asleep when it calls `slept`."""
        if level not in (1, 2):
            raise EngineError(f"sleep level must be 1 or 2, got {level}")
        if self.level:
            raise EngineError("the engine is already asleep")
        self._pre_sleep = digests()
        self._kv_before = kv_scales()

    def slept(self, level: int):
        """The engine sleeps at `level` (after `begin_sleep` and the engine's own sleep)."""
        self.level = level

    def begin_wake(self):
        """Refuses a wake while awake (EngineError); the engine is asleep until it calls `awake`."""
        if not self.level:
            raise EngineError("the engine is not asleep")

    def awake(self) -> int:
        """Awake now; returns the level it slept at."""
        level, self.level = self.level, 0
        return level

    def woke(self, level: int, after: dict, kv_scales: dict | None) -> WakeEvent:
        """The wake's WakeEvent, kept as `wake_event`: `after` (the state digests once awake) compared with the
        digests kept before the sleep names the parameters the wake did not restore; `kv_scales` are the scales
        right after the wake, beside those kept before the sleep."""
        self.wake_event = WakeEvent(level, sorted(n for n in after if after[n] != self._pre_sleep.get(n)),
                                    kv_scales_before=self._kv_before, kv_scales=kv_scales)
        return self.wake_event

    def synced(self):
        """A weight sync was installed: counted on the last wake's event."""
        if self.wake_event is not None:
            self.wake_event.synced_since = True
            self.wake_event.syncs_since += 1

    def note_generation(self):
        """A generation is served: after a level-2 wake with no sync since, that is the event's
        `generated_before_sync` (the weights it read are garbage)."""
        w = self.wake_event
        if w is not None and w.level == 2 and not w.synced_since:
            w.generated_before_sync = True

    def refuse_if_asleep(self, doing: str):
        """EngineError with `ASLEEP[doing]` ("generation", "install") while asleep."""
        if self.level:
            raise EngineError(ASLEEP[doing])


class Sleeps:
    """Mixed into an engine that composes a `SleepWake` as `sleepwake`: the protocol's read-only view of it."""
    sleepwake: SleepWake

    @property
    def sleep_level(self) -> int:
        """0 awake, else the level (1 or 2) the engine sleeps at."""
        return self.sleepwake.level

    @property
    def wake_event(self) -> WakeEvent | None:
        """The last wake's event (None before the first)."""
        return self.sleepwake.wake_event


__all__ = ["ASLEEP", "SleepWake", "Sleeps"]
