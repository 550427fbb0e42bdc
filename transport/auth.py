"""CURVE keys, key files and a ZAP allow-list authenticator driven by the event loop.

Every process of a cluster has one *identity*: a CURVE key pair it uses both as a server
(its tcp endpoints) and as a client (when it connects to others). ``actorrl keys generate``
writes three identities into one directory::

    coordinator.public  coordinator.secret   the coordinator daemon
    node.public         node.secret          node agents and the actors they run
    client.public       client.secret        clients (``actorrl submit``, ``Client(...)``)

``NAME.public`` holds the z85 public key, ``NAME.secret`` the z85 secret key (mode 0600;
a secret readable by group or others is refused). Every ``*.public`` file in the directory
is on the allow-list: a peer whose key is not there is refused during the handshake by the
:class:`ZapAuthenticator` and gets nothing, not even an error reply. To admit another
client, drop its ``.public`` file in the directory of every host and restart.

Rule enforced by :func:`check_bind`: binding tcp requires keys; on loopback an explicit
``insecure_loopback`` flag may waive that (ipc needs none: its socket sits in a private
directory).

Roles: every allowed key has a *role*, taken from its file name (:func:`role_of_name`):
``coordinator*.public`` is the coordinator (:data:`ROLE_COORDINATOR`), ``node*.public`` a
node (:data:`ROLE_NODE`), ``admin*.public`` an administrator (:data:`ROLE_ADMIN`) and any
other name a client (:data:`ROLE_CLIENT`). The ZAP handler hands ``ROLE:KEY`` back to
libzmq as the connection's user id, which libzmq attaches to every message of that peer
(:class:`transport.rpc.Request` reads it as ``role`` and ``key``); servers check it with
:func:`check_role`. Connections without CURVE (ipc, keyless loopback) carry no role.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import zmq
import zmq.utils.z85

from transport.sockets import context, is_loopback_address

log = logging.getLogger(__name__)

ZAP_ENDPOINT = "inproc://zeromq.zap.01"
DEFAULT_IDENTITIES = ("coordinator", "node", "client")
ROLE_COORDINATOR = "coordinator"
"""The coordinator's own key: it drives nodes (``node.*``) and may do what an admin may."""
ROLE_NODE = "node"
"""Node agents and the actors they run: ``coord.register_node`` / ``heartbeat`` /
``actor_died`` / ``leave``; no ``job.*``, no client methods."""
ROLE_CLIENT = "client"
"""Clients: ``job.*`` and the client ``coord.*`` methods, on their own jobs and sessions."""
ROLE_ADMIN = "admin"
"""An operator: what a client may, on every job and session, plus ``coord.shutdown``."""
ROLES = (ROLE_COORDINATOR, ROLE_NODE, ROLE_CLIENT, ROLE_ADMIN)
ROLE_UNKNOWN = "unknown"
"""A connection whose user id is not ``ROLE:KEY`` (not from this module's ZAP handler):
refused by every role check."""
_Z85_KEY_LEN = 40


def role_of_name(name: str) -> str:
    """The role of the key called ``name`` (its file name without ``.public``): names
    starting with ``coordinator``, ``node`` or ``admin`` have that role, any other name is a
    client (least privilege)."""
    for role in (ROLE_COORDINATOR, ROLE_NODE, ROLE_ADMIN):
        if name.startswith(role):
            return role
    return ROLE_CLIENT


def check_role(role: str | None, allowed: Iterable[str], method: str) -> None:
    """Raise PermissionError unless a caller of role ``role`` may call ``method``.

    ``role`` None is a connection without CURVE (ipc or a keyless loopback listener): it is
    trusted as the same host's own processes, as before roles existed."""
    allowed = tuple(allowed)
    if role is None or role in allowed:
        return
    names = " or ".join(f"{r!r}" for r in allowed)
    raise PermissionError(
        f"{method} may only be called with a key of role {names}; the calling key has role "
        f"{role!r}. A key's role comes from its file name in the keys directory "
        "(coordinator*, node*, admin*, anything else: client); use the key meant for this "
        "(e.g. `actorrl keys generate DIR --role admin --names NAME` for an admin key)")


def user_id(role: str, key: bytes) -> bytes:
    """The ZAP user id of an admitted peer: ``ROLE:KEY`` (KEY z85)."""
    return role.encode() + b":" + key


def parse_user_id(text: str | None) -> tuple[str | None, str | None]:
    """``(role, key)`` from a message's ``User-Id`` property; ``(None, None)`` for peers
    admitted without CURVE (no or an empty user id). A user id this module did not make
    gets role :data:`ROLE_UNKNOWN`, which every role check refuses."""
    if not text:
        return None, None
    role, _, key = text.partition(":")
    if role not in ROLES or not key:
        return ROLE_UNKNOWN, None
    return role, key


class KeyFileError(ValueError):
    """A key file is missing, malformed or unsafe (the message says which and why)."""


class InsecureBindError(ValueError):
    """A tcp bind was asked for without CURVE keys (and, on loopback, without the
    explicit insecure flag)."""


@dataclass(frozen=True)
class KeyPair:
    """A CURVE key pair, both halves z85-encoded (40 ASCII bytes each)."""

    public: bytes
    secret: bytes = field(repr=False)

    @classmethod
    def generate(cls) -> KeyPair:
        """A fresh random key pair."""
        public, secret = zmq.curve_keypair()
        return cls(public, secret)


@dataclass(frozen=True)
class Security:
    """What a process needs for CURVE: its identity and the allow-list of peer keys."""

    identity: KeyPair
    allowed: frozenset[bytes]
    name: str = ""
    roles: dict[bytes, str] = field(default_factory=dict, hash=False, compare=False)
    """Allowed key -> its role (:func:`role_of_name`); a key missing here is a client."""

    @classmethod
    def from_dir(cls, keys_dir: str, identity: str) -> Security:
        """Load identity ``identity`` and the allow-list (every ``*.public``, with the role
        of each) from ``keys_dir``."""
        pair = load_keypair(keys_dir, identity)
        roles = load_key_roles(keys_dir)
        roles.setdefault(pair.public, role_of_name(identity))
        return cls(pair, frozenset(roles), identity, roles)

    @property
    def has_admin(self) -> bool:
        """Whether an admin key is on the allow-list."""
        return ROLE_ADMIN in self.roles.values()

    def client_keys(self, server_public: bytes) -> tuple[bytes, bytes, bytes]:
        """``(server_public, public, secret)`` for :class:`transport.rpc.RpcClient`."""
        return server_public, self.identity.public, self.identity.secret


def _check_key(text: bytes, path: str) -> bytes:
    key = text.strip()
    if len(key) != _Z85_KEY_LEN:
        raise KeyFileError(f"{path} does not hold a z85 CURVE key (expected {_Z85_KEY_LEN} "
                        f"characters, found {len(key)})")
    try:
        zmq.utils.z85.decode(key)
    except ValueError as exc:
        raise KeyFileError(f"{path} does not hold a z85 CURVE key: {exc}") from None
    return key


def _write(path: str, data: bytes, mode: int) -> None:
    """Write a key file afresh: an existing file (or a symlink planted in its place) is
    unlinked first and the new one created exclusively, never followed."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        os.fchmod(fd, mode)
        os.write(fd, data + b"\n")
    finally:
        os.close(fd)


def check_private_dir(path: str) -> None:
    """KeyFileError unless ``path`` is a real directory (not a symlink) of this user that
    no one else may write (a keys directory others can write lets them plant keys)."""
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode):
        raise KeyFileError(f"{path} is not a directory (a symlink or file); keys need a "
                           "real directory")
    if info.st_uid != os.getuid():
        raise KeyFileError(f"{path} belongs to uid {info.st_uid}, not this user; use a "
                           "keys directory of your own")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise KeyFileError(f"{path} is writable by others (mode "
                           f"{stat.S_IMODE(info.st_mode):o}); run `chmod 700 {path}`")


def generate_keys(keys_dir: str, names: Iterable[str] = DEFAULT_IDENTITIES,
                  overwrite: bool = False) -> dict[str, KeyPair]:
    """Write a fresh key pair per name into ``keys_dir`` (created with mode 0700).

    Refuses to replace existing files unless ``overwrite``: regenerating keys locks out
    every host that still has the old ones.
    """
    os.makedirs(keys_dir, mode=0o700, exist_ok=True)
    check_private_dir(keys_dir)
    names = list(names)
    if not overwrite:
        existing = [n for n in names if os.path.exists(os.path.join(keys_dir, f"{n}.secret"))
                    or os.path.exists(os.path.join(keys_dir, f"{n}.public"))]
        if existing:
            raise KeyFileError(f"keys for {', '.join(existing)} already exist in {keys_dir}; "
                            "pass overwrite=True (--force) to replace them")
    pairs = {}
    for name in names:
        if not name or "/" in name or name.startswith("."):
            raise KeyFileError(f"bad key name {name!r}")
        pair = KeyPair.generate()
        _write(os.path.join(keys_dir, f"{name}.secret"), pair.secret, 0o600)
        _write(os.path.join(keys_dir, f"{name}.public"), pair.public, 0o644)
        pairs[name] = pair
    return pairs


def load_public_key(keys_dir: str, name: str) -> bytes:
    """The z85 public key in ``keys_dir/name.public``."""
    path = os.path.join(keys_dir, f"{name}.public")
    try:
        with open(path, "rb") as f:
            return _check_key(f.read(), path)
    except FileNotFoundError:
        raise KeyFileError(f"no public key {path}; run `actorrl keys generate {keys_dir}` and "
                        "copy the directory to this host") from None


def load_keypair(keys_dir: str, name: str) -> KeyPair:
    """The key pair ``name`` from ``keys_dir`` (the secret must be a regular file of mode
    0600 or stricter, in a directory only this user may write)."""
    path = os.path.join(keys_dir, f"{name}.secret")
    if os.path.isdir(keys_dir):
        check_private_dir(keys_dir)
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        raise KeyFileError(f"no secret key {path}; this host needs the {name!r} identity "
                        f"(run `actorrl keys generate {keys_dir}` and copy it here)") from None
    if not stat.S_ISREG(info.st_mode):
        raise KeyFileError(f"{path} is not a regular file (a symlink?); regenerate it with "
                           "`actorrl keys generate --force`")
    if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise KeyFileError(f"{path} is readable by others (mode {stat.S_IMODE(info.st_mode):o}); "
                        f"run `chmod 600 {path}`")
    with open(path, "rb") as f:
        secret = _check_key(f.read(), path)
    public = zmq.curve_public(secret)
    pub_path = os.path.join(keys_dir, f"{name}.public")
    if os.path.exists(pub_path) and load_public_key(keys_dir, name) != public:
        raise KeyFileError(f"{pub_path} does not match {path}")
    return KeyPair(public, secret)


def load_allowed_keys(keys_dir: str) -> frozenset[bytes]:
    """Every public key (``*.public``) in ``keys_dir``: the peers allowed to connect."""
    if not os.path.isdir(keys_dir):
        raise KeyFileError(f"keys directory {keys_dir} does not exist")
    check_private_dir(keys_dir)
    keys = set()
    for entry in sorted(os.listdir(keys_dir)):
        if entry.endswith(".public"):
            keys.add(load_public_key(keys_dir, entry[: -len(".public")]))
    if not keys:
        raise KeyFileError(f"{keys_dir} holds no *.public keys")
    return frozenset(keys)


def load_key_roles(keys_dir: str) -> dict[bytes, str]:
    """Every public key in ``keys_dir`` with its role (from its file name). One key under
    names of different roles is refused: which role it has would be ambiguous."""
    roles: dict[bytes, str] = {}
    names: dict[bytes, str] = {}
    load_allowed_keys(keys_dir)  # checks the directory (and that it holds keys) first
    for entry in sorted(os.listdir(keys_dir)):
        if not entry.endswith(".public"):
            continue
        name = entry[: -len(".public")]
        key, role = load_public_key(keys_dir, name), role_of_name(name)
        if roles.get(key, role) != role:
            raise KeyFileError(
                f"{keys_dir}: the same public key is in {names[key]}.public (role "
                f"{roles[key]}) and {entry} (role {role}); a key has one role: remove one "
                "of the files")
        roles[key], names[key] = role, name
    return roles


def check_bind(address: str, security: Security | None, insecure_loopback: bool = False
               ) -> None:
    """Raise :class:`InsecureBindError` for a tcp bind without CURVE keys.

    ipc (a socket file in a private directory) needs no keys. tcp without keys is refused
    everywhere: on a non-loopback address always, on loopback unless ``insecure_loopback``
    (then any local user may connect, and what it may call is code execution)."""
    if security is not None or address.startswith(("ipc://", "inproc://")):
        return
    if not is_loopback_address(address):
        raise InsecureBindError(
            f"refusing to bind {address} without encryption: anything bound on a "
            "non-loopback address needs CURVE keys (run `actorrl keys generate DIR` and "
            "pass --keys DIR)")
    if not insecure_loopback:
        raise InsecureBindError(
            f"refusing to bind {address} without keys: any local user could connect and "
            "run code as you. Generate keys with `actorrl keys generate DIR` and pass "
            "--keys DIR (keys_dir=...), or pass --insecure-loopback "
            "(insecure_loopback=True) to accept that risk; without keys a coordinator "
            "started without --bind listens on a private ipc socket instead")


class PeerGate:
    """A server's peer cap as the ZAP handler sees it: ``peers()`` counts its open
    connections (read from the handler's thread), ``max_peers`` the most it takes. Past
    the cap, handshakes are refused and a warning names the server, the count and the
    setting, at most once per ``log_window_s`` (with the number refused meanwhile)."""

    def __init__(self, name: str, peers: Callable[[], int], max_peers: int,
                 setting: str = "max_peers", log_window_s: float = 60.0) -> None:
        """``name``: the server (its endpoints) for the log; ``setting``: what to raise."""
        self.name = name
        self.peers = peers
        self.max_peers = max_peers
        self.setting = setting
        self.log_window_s = log_window_s
        self.refusals = 0
        self._unlogged = 0
        self._logged_at: float | None = None

    def full(self) -> bool:
        """Whether a new connection would pass the cap (the one being handshaken is
        already counted once its accept was seen)."""
        return self.peers() > self.max_peers

    def refused(self) -> None:
        """Count a refusal; log at most once per window."""
        self.refusals += 1
        self._unlogged += 1
        now = time.monotonic()
        if self._logged_at is not None and now - self._logged_at < self.log_window_s:
            return
        self._logged_at = now
        log.warning("%s has %d connections, more than its cap of %d (%s): refused %d new "
                    "connection(s) in the handshake (libzmq closes them); check for a "
                    "connection flood, or raise %s if this many peers are expected; further "
                    "refusals are logged at most every %g s", self.name, self.peers(),
                    self.max_peers, self.setting, self._unlogged, self.setting,
                    self.log_window_s)
        self._unlogged = 0


class ZapAuthenticator:
    """The process's ZAP handler: admits CURVE clients whose public key is allowed.

    ZeroMQ asks it (over ``inproc://zeromq.zap.01`` in this process's context) about every
    CURVE handshake on every socket of the process (and admits the NULL handshakes of
    plain ipc/loopback listeners sharing a socket with a CURVE one). It answers from its
    own thread (handshakes only, a set lookup each), so it serves every runtime of the
    process whatever event loop they run on, and keeps serving while a loop is busy.
    A refusal is logged once per peer (address and key) as a warning naming the address,
    the key and why; that peer's further refusals (a node retrying) are counted in
    :attr:`refused` and logged at debug level only. At most ``MAX_LOGGED_PEERS`` peers
    are remembered (the oldest forgotten first), so a flood of keys costs bounded memory.

    CURVE binds set a ZAP domain and ``ZMQ_ZAP_ENFORCE_DOMAIN``
    (:meth:`transport.rpc.RpcServer.bind`): should this handler be missing, ZeroMQ refuses
    the handshake instead of admitting any client.
    """

    MAX_LOGGED_PEERS = 1024

    def __init__(self, allowed: Iterable[bytes],
                 roles: Mapping[bytes, str] | None = None) -> None:
        """``roles``: allowed key -> role, sent back as the peer's user id (a key with no
        role here is a client)."""
        self.allowed: frozenset[bytes] = frozenset(allowed)
        self.roles: dict[bytes, str] = dict(roles or {})
        self.accepted = 0
        self.refused = 0
        self._logged: dict[tuple[bytes, bytes, bytes], None] = {}
        self._gates: dict[bytes, PeerGate] = {}
        self.refused_full = 0
        """Handshakes refused because their server had too many peers."""
        self._control_address = f"inproc://actorrl-zap-control-{id(self):x}"
        ctx = context()
        self._sock = ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.bind(ZAP_ENDPOINT)
        self._control = ctx.socket(zmq.PAIR)
        self._control.setsockopt(zmq.LINGER, 0)
        self._control.bind(self._control_address)
        self._stopper = ctx.socket(zmq.PAIR)
        self._stopper.setsockopt(zmq.LINGER, 0)
        self._stopper.connect(self._control_address)
        self._thread = threading.Thread(target=self._serve, name="actorrl-zap", daemon=True)
        self._thread.start()

    def allow(self, keys: Iterable[bytes], roles: Mapping[bytes, str] | None = None) -> None:
        """Add keys (and their roles) to the allow-list."""
        self.allowed = self.allowed | frozenset(keys)
        if roles:
            self.roles = {**self.roles, **roles}

    def add_gate(self, domain: bytes, gate: PeerGate) -> None:
        """Consult ``gate`` for every handshake on sockets whose ZAP domain is ``domain``
        (one per server socket): past its cap the handshake is refused (ZAP status 500,
        "too many peers"), which makes libzmq close that connection. (400 would tell the
        client its key is unknown, and 300 closes the connection silently, which a CURVE
        client reads as a wrong server key; 500 reaches the client as its own status.)"""
        self._gates = {**self._gates, domain: gate}

    def remove_gate(self, domain: bytes) -> None:
        """Stop consulting the gate of ``domain`` (its server closed)."""
        self._gates = {d: g for d, g in self._gates.items() if d != domain}

    @property
    def running(self) -> bool:
        """Whether the handler thread serves."""
        return self._thread.is_alive()

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._control, zmq.POLLIN)
        try:
            while True:
                events = dict(poller.poll())
                if self._control in events:
                    return
                if self._sock in events:
                    try:
                        self._answer(self._sock.recv_multipart(zmq.NOBLOCK))
                    except zmq.Again:
                        continue
        finally:
            self._sock.unbind(ZAP_ENDPOINT)  # frees the name at once for a later handler
            self._sock.close(linger=0)
            self._control.close(linger=0)

    def _answer(self, parts: list[bytes]) -> None:
        # [routing id, empty delimiter, version, request id, domain, address, identity,
        #  mechanism, credentials...]
        if len(parts) < 8 or parts[1] != b"":
            log.warning("dropped a malformed ZAP request (%d frames)", len(parts))
            return
        peer, _, version, request_id, domain, address, _identity, mechanism = parts[:8]
        credentials = parts[8:]
        status, text, user, role = b"400", b"denied", b"", b""
        gate = self._gates.get(domain)
        if version != b"1.0":
            text = b"unsupported ZAP version"
        elif gate is not None and gate.full():
            # Before any key check: a flood costs a dict lookup and a comparison each.
            self.refused_full += 1
            gate.refused()
            self._sock.send_multipart([peer, b"", b"1.0", request_id, b"500",
                                       b"too many peers", b"", b""])
            return
        elif mechanism == b"NULL":
            # Only a plain (ipc / keyless loopback) listener produces NULL handshakes: a
            # CURVE listener refuses other mechanisms before asking ZAP.
            status, text = b"200", b"OK"
        elif mechanism != b"CURVE" or len(credentials) != 1 or len(credentials[0]) != 32:
            text = b"CURVE required"
        else:
            key = zmq.utils.z85.encode(credentials[0])
            if key in self.allowed:
                status, text, user = b"200", b"OK", key
                role = user_id(self.roles.get(key, ROLE_CLIENT), key)
            else:
                text = b"unknown key"
                user = key  # for the log line only; not sent back
        if mechanism == b"NULL":
            pass
        elif status == b"200":
            self.accepted += 1
            user = role  # libzmq attaches it to every message of this peer ("User-Id")
        else:
            self.refused += 1
            self._log_refusal(mechanism, address, user, text)
            user = b""
        self._sock.send_multipart([peer, b"", b"1.0", request_id, status, text, user, b""])

    def _log_refusal(self, mechanism: bytes, address: bytes, key: bytes, why: bytes) -> None:
        """A warning the first time this peer (address, key) is refused; debug after."""
        peer = (mechanism, address, key)
        who = address.decode(errors="replace")[:64].encode("unicode_escape").decode()
        what = f" with key {key.decode()}" if key else ""
        if peer in self._logged:
            log.debug("refused a %s connection from %s%s again: %s",
                      mechanism.decode(errors="replace")[:16], who, what, why.decode())
            return
        if len(self._logged) >= self.MAX_LOGGED_PEERS:
            del self._logged[next(iter(self._logged))]
        self._logged[peer] = None
        if why == b"unknown key":
            hint = ("unknown key (not on this host's allow-list, the *.public files of its "
                    "keys directory: add it there and restart to admit that peer)")
        else:
            hint = why.decode()
        log.warning("refused a %s connection from %s%s: %s; further refusals of this peer "
                    "are not logged", mechanism.decode(errors="replace")[:16].encode(
                        "unicode_escape").decode(), who, what, hint)

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop answering (CURVE handshakes are then refused) and join the thread."""
        if self._thread.is_alive():
            self._stopper.send(b"stop")
            self._thread.join(timeout_s)
        self._stopper.close(linger=0)


_authenticator: ZapAuthenticator | None = None
_authenticator_pid: int | None = None
_authenticator_lock = threading.Lock()


def ensure_authenticator(allowed: Iterable[bytes],
                         roles: Mapping[bytes, str] | None = None) -> ZapAuthenticator:
    """Start this process's ZAP handler (once; it lives as long as the process) and add
    ``allowed`` (with their ``roles``) to its allow-list. Call before binding any CURVE
    server socket."""
    global _authenticator, _authenticator_pid
    with _authenticator_lock:
        current = _authenticator
        if current is None or _authenticator_pid != os.getpid() or not current.running:
            _authenticator = ZapAuthenticator(allowed, roles)
            _authenticator_pid = os.getpid()
        else:
            current.allow(allowed, roles)
        return _authenticator


def current_authenticator() -> ZapAuthenticator | None:
    """This process's running ZAP handler, if any."""
    current = _authenticator
    if current is None or _authenticator_pid != os.getpid() or not current.running:
        return None
    return current


def stop_authenticator() -> None:
    """Stop the process's ZAP handler, if one runs (CURVE servers then refuse everyone)."""
    global _authenticator
    with _authenticator_lock:
        if _authenticator is not None and _authenticator_pid == os.getpid():
            _authenticator.close()
        _authenticator = None
