"""Files mqfed creates are private to the user it runs as (adapter helper).

A node's files hold messages (retained.sqlite, spill/*.sqlite, sessions.sqlite), secrets
(secret, mosquitto.conf) and what clients do (node.log, mosquitto.log, state.json). The node
and the cluster launcher run with umask 077, so every file they (and the Mosquitto they start)
create is 0600 and every folder 0700; the folders Mosquitto's own user must pass through to
reach its socket (the run dirs, the socket fallback root) are made 0711: traversable, not
listable.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["PRIVATE_UMASK", "TRAVERSABLE", "make_private", "make_traversable"]

PRIVATE_UMASK = 0o077
TRAVERSABLE = 0o711


def make_private() -> int:
    """Set this process's umask to PRIVATE_UMASK (inherited by its children); returns the
    previous one."""
    return os.umask(PRIVATE_UMASK)


def make_traversable(path: Path) -> None:
    """Create `path` and its missing parents as TRAVERSABLE folders (modes set explicitly,
    past the umask); existing folders are left as they are."""
    missing = [p for p in [path, *path.parents] if not p.exists()]
    for folder in reversed(missing):
        folder.mkdir(exist_ok=True)
        folder.chmod(TRAVERSABLE)
