"""How a runtime is reached from other hosts: its tcp host, node tag and CURVE keys.

A runtime without a :class:`Network` binds ipc only (single-host runs). With one, it also
binds ``tcp://HOST:0`` (CURVE-encrypted; without keys only on loopback with
``insecure_loopback``) and publishes a composite endpoint (see :mod:`transport.endpoint`), so
ObjectRefs and actor handles it creates can be used from any node, while processes of the
same node keep talking over ipc.

Actor processes inherit their node's network through ``ACTORRL_*`` environment variables
(:meth:`Network.to_env` / :meth:`Network.from_env`): the path of the keys directory, never
a key itself.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from transport.auth import Security, check_bind

ENV_HOST = "ACTORRL_TCP_HOST"
ENV_NODE = "ACTORRL_NODE_TAG"
ENV_KEYS = "ACTORRL_KEYS_DIR"
ENV_IDENTITY = "ACTORRL_KEY_IDENTITY"
ENV_INSECURE = "ACTORRL_INSECURE_LOOPBACK"


@dataclass(frozen=True)
class Network:
    """Network settings of one process."""

    host: str | None = None
    """Host (IP or name) to bind tcp on, port chosen by the OS; None: no tcp bind (the
    process only connects out, e.g. a client)."""
    node_tag: str | None = None
    """Processes with the same tag are on the same node and talk over ipc."""
    keys_dir: str | None = None
    """Directory of CURVE keys (``actorrl keys generate``); None: no encryption."""
    identity: str = "node"
    """Which key pair of ``keys_dir`` this process uses."""
    security: Security | None = None
    """Loaded keys (filled by :meth:`create`)."""
    insecure_loopback: bool = False
    """Allow binding tcp on loopback without keys (``--insecure-loopback``): any local
    user may then connect."""

    @classmethod
    def create(cls, host: str | None, node_tag: str | None = None,
               keys_dir: str | None = None, identity: str = "node", *,
               insecure_loopback: bool = False) -> Network:
        """Load the keys and check the bind rule (tcp needs keys; on loopback
        ``insecure_loopback`` waives that)."""
        security = Security.from_dir(keys_dir, identity) if keys_dir else None
        if host is not None:
            check_bind(f"tcp://{host}:0", security, insecure_loopback)
        return cls(host, node_tag, keys_dir, identity, security, insecure_loopback)

    def tcp_bind_address(self) -> str:
        """``tcp://HOST:0`` (IPv6 hosts bracketed)."""
        assert self.host is not None
        host = f"[{self.host}]" if ":" in self.host and not self.host.startswith("[") \
            else self.host
        return f"tcp://{host}:0"

    def to_env(self) -> dict[str, str]:
        """Environment variables that give a child process the same network."""
        env = {ENV_IDENTITY: self.identity}
        if self.host is not None:
            env[ENV_HOST] = self.host
        if self.node_tag is not None:
            env[ENV_NODE] = self.node_tag
        if self.keys_dir is not None:
            env[ENV_KEYS] = os.path.abspath(self.keys_dir)
        if self.insecure_loopback:
            env[ENV_INSECURE] = "1"
        return env

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Network | None:
        """The network a parent node passed down, or None (single-host run)."""
        env = os.environ if env is None else env
        host, node, keys = env.get(ENV_HOST), env.get(ENV_NODE), env.get(ENV_KEYS)
        if host is None and node is None and keys is None:
            return None
        return cls.create(host, node, keys, env.get(ENV_IDENTITY, "node"),
                          insecure_loopback=env.get(ENV_INSECURE) == "1")
