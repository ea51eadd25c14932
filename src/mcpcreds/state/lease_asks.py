"""What a lease holder asks of the shared bucket and what it is granted, and the bounds of a
pause: plain values, apart from Redis (redis_state.py), so that the memory state and the lease
service use them without importing redis or cryptography."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from ..limits.leases import MIN_SHARED_DEMAND, SHARED_BURST_FLOOR

MAX_PAUSE: Final = 86400.0  # the longest pause the API lets anyone set
MAX_BATCH: Final = 64  # callers served by one run of the bucket script


@dataclass(frozen=True, slots=True)
class LeaseAsk:
    """A holder's lease asked of the shared bucket: `demand` and `least_shared` in permits per
    period, `holding` the (share per period, burst) it spends now, `leasable` the part of the burst
    holders may have together."""

    lease: str
    demand: float
    seconds: float
    spare: int = 0
    holding: tuple[float, int] | None = None
    release: bool = False
    leasable: float = 1 - SHARED_BURST_FLOOR
    least_shared: float = MIN_SHARED_DEMAND
    least: float = 0.0  # a holder that holds nothing is given no share under this ("not now")

    @classmethod
    def release_of(cls, lease: str) -> LeaseAsk:
        """Give `lease` back (its holder stopped spending it)."""
        return cls(lease, 0.0, 0.001, release=True)


@dataclass(frozen=True, slots=True)
class LeaseReply:
    """What the shared bucket granted: `share` permits per period, `burst`, `initial` permits
    moved to the holder's bucket now, a pause remaining (an upstream 429: nothing granted), and
    the other holders (of any sidecar) to tell to renew now."""

    share: float
    burst: int
    initial: int
    paused: float
    told: tuple[str, ...] = ()  # lease ids to tell to renew now (their fair part changed)
    dropped: bool = False  # not worth holding (under `least`): not kept in the shared state
