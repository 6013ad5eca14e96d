"""Lease renewal while a worker runs a session (§5): every `lease_s / 3`, fenced in Lua.

A refused renewal means another worker took the session over (this one froze past its
lease, or its clock lied): the keeper calls `on_lost` at once, which detaches the running
turn so this worker writes nothing more.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from .background import SessionLoop
from .errors import FxLeaseLostError, FxStoreUnavailableError
from .ids import now_ms
from .store.api import SessionStore

log = logging.getLogger("fxworker.leases")

RETRY_S = 0.2  # after a renewal met a store outage, the next try comes this soon


class LeaseKeeper(SessionLoop):
    """Renews one claimed lease until stopped; reports a lost lease through `on_lost`."""

    TASK_NAME = "lease"

    def __init__(
        self,
        store: SessionStore,
        session_id: str,
        epoch: int,
        *,
        lease_ms: int,
        on_lost: Callable[[BaseException], None],
    ) -> None:
        self.store = store
        self.session_id = session_id
        self.epoch = epoch
        self.lease_ms = lease_ms
        self.on_lost = on_lost
        self.expires_ms = now_ms() + lease_ms
        self.lost = False

    def __repr__(self) -> str:
        return (
            f"<LeaseKeeper session={self.session_id} epoch={self.epoch} "
            f"expires_in_ms={self.expires_ms - now_ms()} lost={self.lost}>"
        )

    async def _run(self) -> None:
        interval_s = self.lease_ms / 3000
        retry_s = min(interval_s, RETRY_S)
        wait_s = interval_s
        while not self.stopping:
            await asyncio.sleep(wait_s)
            wait_s = interval_s
            if self.stopping:
                return
            try:
                self.expires_ms = await self.store.renew(
                    self.session_id, self.epoch, lease_ms=self.lease_ms, now_ms=now_ms()
                ) or (now_ms() + self.lease_ms)
            except FxLeaseLostError as exc:
                self.lost = True
                log.warning("lease of %s epoch %s lost: %s", self.session_id, self.epoch, exc)
                self.on_lost(exc)
                return
            except FxStoreUnavailableError as exc:
                # Keep trying: the lease is still ours until it expires; if Redis stays
                # away that long, the next renewal is refused and we stop then.
                log.warning("renewing %s failed (%s); retrying", self.session_id, exc)
                if now_ms() >= self.expires_ms:
                    self.lost = True
                    self.on_lost(exc)
                    return
                # Soon, not a whole interval later: Redis may be back well before expiry.
                wait_s = retry_s
