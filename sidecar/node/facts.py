"""`NodeView`: what the admin API and the metrics read of a running node (read-only).

`sidecar.node.node.Node` satisfies it; `admin/` and `observability/` take this view instead of the
node itself, so they never import `sidecar.node.node` (which builds them: no import cycle) and
never reach into its private fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from sidecar.broker.process import MosquittoProcess
    from sidecar.config import NodeConfig
    from sidecar.drain.service import DrainService
    from sidecar.journal.service import JournalService
    from sidecar.local.event_stream import EventStream
    from sidecar.local.events import ProtocolError
    from sidecar.local.link import LocalLink
    from sidecar.membership.etcd import EtcdMembership
    from sidecar.peering.tls import PeerTls
    from sidecar.routing.service import RoutingService
    from sidecar.routing.table import SubscriptionTable
    from sidecar.sessions.service import SessionService
    from sidecar.wills.service import WillService


class NodeView(Protocol):
    """A running node's parts and state, as the admin API and the metrics see them."""

    @property
    def config(self) -> NodeConfig: ...
    @property
    def stream(self) -> EventStream: ...
    @property
    def table(self) -> SubscriptionTable: ...
    @property
    def broker(self) -> MosquittoProcess | None: ...
    @property
    def link(self) -> LocalLink | None: ...
    @property
    def routing(self) -> RoutingService | None: ...
    @property
    def sessions(self) -> SessionService | None: ...
    @property
    def wills(self) -> WillService | None: ...
    @property
    def drainer(self) -> DrainService | None:
        """The node's drain (`mqfed ctl drain`); None while starting."""
    @property
    def journal(self) -> JournalService | None: ...
    @property
    def peer_tls(self) -> PeerTls | None: ...
    @property
    def membership(self) -> EtcdMembership | None: ...
    @property
    def ready(self) -> bool: ...
    @property
    def started_at(self) -> float: ...
    @property
    def protocol_error(self) -> ProtocolError | None: ...
    @property
    def stopping(self) -> bool:
        """A graceful stop has begun."""
    @property
    def peers(self) -> Mapping[str, str]:
        """The peers this node routes to (node id -> gRPC address)."""
