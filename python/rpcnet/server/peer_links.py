"""A connection's COMM_* peer links (spec §11): the executors of PeerOpen, PeerAllreduce and
PeerClose, and how a failed allreduce reaches the connection's event loop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Future

from rpcnet.server.comm import CommError, CommHub, Exchange, PeerLink
from rpcnet.server.effects import PeerAllreduce, PeerOpen
from rpcnet.server.session import Session
from rpcnet.server.tokens import Tenant


class LinkFailed(Exception):
    """An allreduce launched on its peer link's thread failed (the link broke or timed out)."""

    def __init__(self, device: int, reason: str) -> None:
        super().__init__(reason)
        self.device = device
        self.reason = reason


class AllreduceWork:
    """The exchange and add of one COMM_ALLREDUCE, for `PeerLink.submit`: `attempt_inline` may
    start it on the device worker; called, it runs (or resumes) to the end on the link's thread."""

    def __init__(self, link: PeerLink, job: PeerAllreduce) -> None:
        self.link, self.job = link, job
        self.exchange: Exchange | None = None

    def attempt_inline(self, until: float | None) -> bool:
        """Advance until `until` (None: to the end); True when the whole allreduce is done."""
        job = self.job
        try:
            if self.exchange is None:
                self.exchange = Exchange(self.link, job.region, job.type_id, job.ne)
            finished = self.exchange.advance(until)
        except BaseException as exc:
            job.done()
            if isinstance(exc, CommError):
                raise LinkFailed(job.device, str(exc)) from exc
            raise
        if finished:
            job.done()
        return finished

    def __call__(self) -> None:
        self.attempt_inline(None)


class PeerLinks:
    """The peer links of one connection, by device. `failed` runs on the event loop when an
    allreduce launched on a link's thread failed (successes stay silent)."""

    def __init__(self, hub: CommHub, session: Session, failed: Callable[[LinkFailed], None]):
        self.hub, self.session, self.failed = hub, session, failed
        self.by_device: dict[int, PeerLink] = {}
        self.loop: asyncio.AbstractEventLoop | None = None  # set once the connection runs

    async def open(self, effect: PeerOpen, tenant: Tenant | None) -> bytes:
        """COMM_INIT: may wait for the peer server (other clients carry on); the reply."""
        req = effect.request
        link = await self.hub.open(
            req.device,
            req.rank,
            req.port,
            req.host,
            tenant.name if tenant else None,
            tenant.token if tenant else None,
        )
        if link is not None:
            self.by_device[req.device] = link
        return self.session.comm_init_done(req.device, link is not None)

    def allreduce(self, job: PeerAllreduce) -> None:
        """Queue the exchange and add on the link's thread, behind this connection's graphs.

        A decode step of a tensor split is graph, allreduce, graph, ...: it runs on the device
        worker and the link thread, each handing the next job to the other; the event loop only
        hears of an allreduce if it fails.
        """
        link = self.by_device[job.device]
        future = self.session.launch(link, AllreduceWork(link, job))
        future.add_done_callback(self._exchange_done)

    def close(self, device: int) -> None:
        """COMM_FREE, or a failed link: close the link of `device`, if there is one."""
        link = self.by_device.pop(device, None)
        if link is not None:
            link.close()

    def close_all(self) -> None:
        """The connection ends (also without COMM_FREE): wakes a waiting exchange."""
        for link in self.by_device.values():
            link.close()
        self.by_device.clear()

    def _exchange_done(self, future: Future[None]) -> None:
        """On the link thread: report a failed exchange to the loop."""
        exc = future.exception() if not future.cancelled() else None
        if isinstance(exc, LinkFailed) and self.loop is not None:
            try:
                self.loop.call_soon_threadsafe(self.failed, exc)
            except RuntimeError:  # the loop is closed: the server is gone anyway
                pass
