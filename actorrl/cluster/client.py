"""The Python client of a cluster.

::

    from actorrl.cluster.client import Client

    with Client("tcp://10.0.0.1:7450", keys_dir="~/.actorrl/keys") as client:
        job = client.submit({"algorithm": "apex", "env": "CartPole-v1",
                             "stop": {"episode_reward_mean": 450}})
        for result in job.results():
            print(result["training_iteration"], result["episode_reward_mean"])

    with Client.local() as client:          # coordinator + node in this process
        counter = client.create_actor("mypkg.mod:Counter", args=(0,))
        print(client.get(counter.add.remote(5)))

The client runs its own runtime (one event loop in a background thread), so the raw actor
API works as in a single-host run: ``handle.method.remote(...)`` returns refs, and
``client.get`` / ``client.wait`` / ``client.put`` resolve and create them. Its runtime binds
tcp (CURVE with keys) on the interface that routes to the coordinator, so refs it ``put``s
can be fetched by actors on other hosts. A handle calls through the runtime of the client
that created it (or that received it), so several clients can be open in one process.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from actorrl.cluster import TERMINAL_STATES, JobError
from actorrl.config.sections import ConfigError
from actorrl.runtime.cluster.coordinator import Coordinator
from actorrl.runtime.cluster.node_agent import coordinator_endpoint, route_host
from actorrl.runtime.errors import ActorCreationError
from actorrl.runtime.network import Network
from actorrl.runtime.node.node import LocalNode
from actorrl.runtime.process.handles import ActorHandle, ActorSpec
from actorrl.runtime.process.refs import ObjectRef
from actorrl.runtime.process.runtime import Runtime
from actorrl.runtime.process.wire import spec_to_wire
from actorrl.runtime.sessions import make_session_dir
from actorrl.runtime.wire_version import WIRE_VERSION, WireVersionError, old_coordinator_message
from transport.errors import RemoteError, TransportError
from transport.sockets import is_loopback_address, new_event_loop

T = TypeVar("T")
SESSION_PING_S = 3.0
CLOSE_TIMEOUT_S = 5.0
"""How long :meth:`Client.close` waits for the coordinator to stop the session's actors
(the coordinator also stops them itself once the session's pings stop)."""


RECONNECT_TIMEOUT_S = 120.0
"""How long :meth:`Job.results` keeps trying a coordinator that went away (killed,
restarting) before it gives up."""
RECONNECT_RETRY_S = 1.0
"""The pause between two tries of a coordinator that refused at once."""


class ClusterConnectionError(ConnectionError):
    """The coordinator could not be reached, refused this client's key, or runs another
    actorrl version (the message says which, and what to do)."""


class JobFailedError(RuntimeError):
    """A job ended in the ``failed`` state; the message carries its last error."""


class Job:
    """A submitted job. Cheap to create from an id (``client.job(job_id)``)."""

    def __init__(self, client: Client, job_id: str) -> None:
        self.client = client
        self.id = job_id

    def __repr__(self) -> str:
        return f"Job({self.id})"

    def results(self, after: int = 0, timeout_s: float | None = None,
                poll_s: float = 10.0, *,
                reconnect_timeout_s: float | None = RECONNECT_TIMEOUT_S,
                on_connection: Callable[[str], None] | None = None
                ) -> Iterator[dict[str, Any]]:
        """Every result from index ``after`` on, as they are produced, until the job ends
        (raises :class:`JobFailedError` after the last result of a failed job, and
        TimeoutError when ``timeout_s`` passes first).

        A lost coordinator (killed, restarting) does not end the stream: the same address
        is tried again (a restarted coordinator resumes the job from its checkpoint, and
        the stream goes on from the next result it has) until ``reconnect_timeout_s``
        seconds pass without an answer, then :class:`ClusterConnectionError` says so
        (None: the first lost call raises). ``on_connection`` (default: the client's
        :attr:`Client.on_connection`) receives one line when the coordinator is lost and
        one when it answers again. While it waits, the client's other calls fail at once
        with :class:`ClusterConnectionError` rather than each wait out a connect timeout.
        ``actorrl jobs follow`` and ``actorrl train --address`` follow jobs through this."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        lost_since: float | None = None
        if on_connection is None:
            on_connection = self.client.on_connection
        client = self.client

        def lost(reason: str) -> float:
            client._unreachable = reason
            if on_connection is not None:
                on_connection(f"lost the coordinator at {client.address} ({reason}) "
                              f"while following job {self.id}; reconnecting for "
                              f"up to {reconnect_timeout_s:g} s")
            return time.monotonic()

        try:
            while True:
                wait_s = poll_s
                if deadline is not None:
                    wait_s = min(wait_s, max(deadline - time.monotonic(), 0.0))
                # Lost between two calls: the next call opens a fresh connection, which a
                # coordinator restarted meanwhile answers; still a loss to report.
                if lost_since is None and reconnect_timeout_s is not None \
                        and client._connection_lost():
                    lost_since = lost("the connection dropped")
                try:
                    reply = client._call("job.results", [self.id, after, wait_s],
                                         timeout_s=wait_s + 15)
                except (ConnectionError, TransportError) as exc:
                    if reconnect_timeout_s is None:
                        raise
                    now = time.monotonic()
                    if lost_since is None:
                        lost_since = lost(str(exc))
                    elif now - lost_since > reconnect_timeout_s:
                        raise ClusterConnectionError(
                            f"the coordinator at {client.address} did not come back within "
                            f"{reconnect_timeout_s:g} s; the job resumes when it restarts: "
                            f"follow job {self.id} again then (`actorrl jobs follow "
                            f"{self.id}`; from Python, Job.results(reconnect_timeout_s=...) "
                            "waits longer)") from None
                    if now - lost_since < RECONNECT_RETRY_S or \
                            not isinstance(exc, TimeoutError):
                        time.sleep(RECONNECT_RETRY_S)  # a retry pause (a refusal is at once)
                    continue
                if lost_since is not None:
                    client._unreachable = None
                    if on_connection is not None:
                        on_connection(f"reconnected to the coordinator at {client.address} "
                                      f"after {time.monotonic() - lost_since:.0f} s; "
                                      f"following job {self.id} again")
                    lost_since = None
                yield from reply["results"]
                after = reply["next"]
                if reply["state"] in TERMINAL_STATES and not reply["results"]:
                    if reply["state"] == "failed":
                        raise JobFailedError(f"job {self.id} failed: {reply['error']}")
                    return
                if deadline is not None and time.monotonic() >= deadline and \
                        not reply["results"]:
                    raise TimeoutError(f"job {self.id}: no result within {timeout_s:g} s")
        finally:
            if lost_since is not None:  # given up (or closed) while the coordinator was away
                client._unreachable = None

    def status(self) -> dict[str, Any]:
        """The job's record: state, error, counters, last checkpoint, submission."""
        return self.client.call("job.status", [self.id])

    def stop(self) -> dict[str, Any]:
        """Stop the job and its actors; returns its final record."""
        return self.client.call("job.stop", [self.id], timeout_s=120)

    def checkpoint(self) -> dict[str, Any]:
        """Checkpoint now; returns ``{"path", "iteration", "timesteps_total", ...}`` (the
        path is on the coordinator's host)."""
        return self.client.call("job.checkpoint", [self.id], timeout_s=180)

    def logs(self, offset: int = 0) -> str:
        """The job log (coordinator-side events) from byte ``offset``."""
        return self.client.call("job.logs", [self.id, offset])["text"]

    def actors(self) -> list[dict[str, Any]]:
        """The job's live actors with their nodes, endpoints and pids."""
        return self.client.call("job.actors", [self.id])

    def actor_logs(self, max_bytes: int = 20_000) -> dict[str, str]:
        """Actor name -> the end of that live actor's output, fetched from its node."""
        out = {}
        for actor in self.actors():
            try:
                out[actor["name"]] = self.client.actor_log(actor["actor_id"], max_bytes)
            except ValueError:  # it exited meanwhile
                continue
        return out


@dataclass(frozen=True)
class LocalCluster:
    """What :class:`Client` connects to instead of an address: a coordinator and a node
    started in this process (single host, ipc only)."""

    num_cpus: float | None = None
    num_gpus: float | None = None
    state_dir: str | None = None
    """Where jobs keep their state (a temporary folder, removed at close, by default)."""


class Client:
    """A connection to a coordinator (see the module docstring).

    ``address``: the coordinator's, or a :class:`LocalCluster` to start one in this process
    (what :meth:`local` does). ``keys_dir`` (default ``$ACTORRL_KEYS_DIR``): the CURVE keys
    directory, needed when the coordinator uses keys; ``identity`` names the key pair used
    (``client``). ``bind_host``: where this client's own objects are served to other
    hosts (``"auto"``: the interface routing to the coordinator; None: connect out only).
    Without keys a client binds no tcp at all unless ``insecure_loopback`` allows it on
    loopback (:func:`transport.auth.check_bind`).
    """

    def __init__(self, address: str | LocalCluster, keys_dir: str | None = None, *,
                 identity: str = "client", bind_host: str | None = "auto",
                 connect_timeout_s: float = 10.0, insecure_loopback: bool = False) -> None:
        self.on_connection: Callable[[str], None] | None = None
        """Where this client's :meth:`Job.results` streams report losing the coordinator
        and reconnecting (one line each) when their caller passes no ``on_connection``:
        ``actorrl train --address`` prints them. None: nowhere."""
        self._unreachable: str | None = None
        """What a :meth:`Job.results` stream of this client saw when it lost the
        coordinator, while it waits for it to come back (None otherwise): :meth:`call`
        then fails at once. (``actorrl train --address`` stopped by Ctrl-C during the wait
        asked for a checkpoint, the job's record and a stop: 90 s of connect timeouts.)"""
        self._closed = True
        self._runtime: Runtime | None = None
        self._local: tuple[Coordinator, LocalNode, Any] | None = None
        self._pinger: asyncio.Task | None = None
        self._max_frame_bytes: int | None = None
        """The largest request the coordinator reads (from its ``coord.hello``)."""
        self._session = uuid.uuid4().hex
        local = address if isinstance(address, LocalCluster) else None
        self.address = "local" if local is not None else str(address)
        self._session_dir = make_session_dir("local" if local is not None else "client")
        self._start_loop()
        try:
            if local is not None:
                self._runtime, self._local = self._run(self._start_local(local))
                self._coordinator = self._runtime.address
            else:
                self._connect(self.address, keys_dir, identity, bind_host, connect_timeout_s,
                              insecure_loopback)
        except BaseException:
            self._local = None
            self._teardown()
            raise

    def _connect(self, address: str, keys_dir: str | None, identity: str,
                 bind_host: str | None, connect_timeout_s: float,
                 insecure_loopback: bool = False) -> None:
        keys_dir = keys_dir or os.environ.get("ACTORRL_KEYS_DIR") or None
        keys_dir = os.path.expanduser(keys_dir) if keys_dir else None
        if bind_host == "auto":
            if address.startswith("ipc://"):
                bind_host = None  # a coordinator on this host: ipc is enough
            else:
                bind_host = route_host(address)
                if keys_dir is None and not (insecure_loopback and is_loopback_address(
                        f"tcp://{bind_host}:0")):
                    bind_host = None  # no keys: connect out only, never bind in the clear

        async def start() -> Runtime:
            network = Network.create(bind_host, None, keys_dir, identity,
                                     insecure_loopback=insecure_loopback)
            return Runtime.start(self._session_dir, f"client-{self._session[:8]}",
                                 network=network)

        self._runtime = self._run(start())
        self._coordinator = coordinator_endpoint(address, keys_dir)
        try:
            # With this release's wire version: a coordinator of another one refuses it.
            hello = self.call("coord.hello", [WIRE_VERSION], timeout_s=connect_timeout_s)
        except WireVersionError as exc:
            raise ClusterConnectionError(f"cannot use the coordinator at {address}: "
                                         f"{getattr(exc, 'message', exc)}") from None
        except Exception as exc:
            raise ClusterConnectionError(
                f"cannot reach the coordinator at {address}: {exc}"
                + ("" if keys_dir else " (if it uses CURVE, pass keys_dir)")) from None
        hello = hello if isinstance(hello, dict) else {}
        if "wire_version" not in hello:  # a release from before versions ignores ours
            raise ClusterConnectionError(old_coordinator_message(address))
        limit = hello.get("max_frame_bytes")
        self._max_frame_bytes = limit if isinstance(limit, int) and limit > 0 else None

    async def _start_local(self, local: LocalCluster
                           ) -> tuple[Runtime, tuple[Coordinator, LocalNode, Any]]:
        from actorrl.cluster.jobs import JobManager  # imports the algorithms (torch)

        state_dir = local.state_dir or os.path.join(self._session_dir, "state")
        runtime = Runtime.start(self._session_dir, "local")
        coordinator = Coordinator(runtime)
        node = LocalNode(runtime, self._session_dir, local.num_cpus, local.num_gpus)
        coordinator.add_local_node(node)
        jobs = JobManager(coordinator, state_dir)
        coordinator.serve()
        jobs.serve()
        coordinator.start()
        return runtime, (coordinator, node, jobs)

    @classmethod
    def local(cls, num_cpus: float | None = None, num_gpus: float | None = None,
              state_dir: str | None = None) -> Client:
        """A coordinator and a node running in this process (single host, ipc only)."""
        return cls(LocalCluster(num_cpus, num_gpus, state_dir))

    @property
    def runtime(self) -> Runtime:
        """This client's runtime (its own event loop thread)."""
        if self._runtime is None:
            raise RuntimeError("this client has no runtime (it failed to start)")
        return self._runtime

    # ---- plumbing -----------------------------------------------------------------------
    def _start_loop(self) -> None:
        self._loop = new_event_loop()
        started = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(self._loop)
            started.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name="actorrl-client", daemon=True)
        self._thread.start()
        started.wait()
        self._closed = False
        self._shut_down = False

    def _run(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(timeout_s)
        except TimeoutError:
            future.cancel()
            raise

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        """Run a coroutine on the client's event loop and return its result: the native
        async API (``await client.runtime.get_async(handle.m.remote())``) without a thread
        hop per call."""
        return self._run(coro, timeout_s)

    def _check_size(self, method: str, frames: Sequence[Any]) -> None:
        """ValueError, naming the coordinator's setting, for a request larger than the
        coordinator reads (it would drop the connection without a reply)."""
        limit = self._max_frame_bytes
        if limit is None:
            return
        size = sum(memoryview(f).nbytes for f in frames)
        if size > limit:
            raise ValueError(
                f"{method} request of {size} bytes is larger than the coordinator at "
                f"{self.address} accepts ({limit} bytes: its --max-frame-mb setting, "
                f"max_frame_mb in serve_coordinator); pass large data through an actor or "
                "a ref instead, or start the coordinator with a larger --max-frame-mb")

    def call(self, method: str, args: Sequence[Any] = (), timeout_s: float = 60.0) -> Any:
        """Call a coordinator method (``coord.*``, ``job.*``) and return its reply.

        While a :meth:`Job.results` stream of this client waits for a lost coordinator,
        this raises :class:`ClusterConnectionError` at once (saying so) instead of waiting
        out a connect timeout."""
        unreachable = self._unreachable
        if unreachable is not None and not self._closed:
            raise ClusterConnectionError(
                f"the coordinator at {self.address} is unreachable ({unreachable}); this "
                "client's results stream is waiting for it to come back (a restarted "
                "coordinator resumes its jobs): try again then")
        return self._call(method, args, timeout_s)

    def _call(self, method: str, args: Sequence[Any], timeout_s: float) -> Any:
        """:meth:`call`, whatever a results stream saw (the stream's own calls)."""
        if self._closed:
            raise RuntimeError("this client is closed")

        async def go() -> Any:
            client = self.runtime.client(self._coordinator)
            frames = client.codec.encode([method, list(args), {}])
            self._check_size(method, frames)
            return await client.call_encoded(frames, timeout_s=timeout_s)

        try:
            result = self._run(go(), timeout_s + 5)
        except RemoteError as exc:
            raise _local_error(exc) from None
        if method == "coord.shutdown":
            self._shut_down = True  # nothing to close there any more
        return result

    def _connection_lost(self) -> bool:
        """Whether this client's connection to the coordinator saw it go (or never reached
        it); False while it holds or before one was opened."""

        async def go() -> bool:
            return self.runtime.connection_lost(self._coordinator)

        return self._run(go(), 10)

    def _close_session(self) -> None:
        """Tell the coordinator this client's session ended, unless it is known to be gone
        (shut down through this client, or its connection lost): then nothing is sent rather
        than wait on it. The check and the send run in one step of the loop, so a loss the
        connection's monitor reports in between cannot make the send open a fresh
        connection to the gone coordinator (which waits out a connect timeout); a loss
        reported after the send fails the call at once."""
        if self._shut_down:
            return

        async def go() -> None:
            if self.runtime.connection_lost(self._coordinator):
                return
            client = self.runtime.client(self._coordinator)
            frames = client.codec.encode(["coord.close_session", [self._session], {}])
            await client.call_encoded(frames, timeout_s=CLOSE_TIMEOUT_S)

        self._run(go(), CLOSE_TIMEOUT_S + 5)

    # ---- cluster ------------------------------------------------------------------------
    def nodes(self) -> list[dict[str, Any]]:
        """The live nodes with their resources and usage."""
        return self.call("coord.nodes")

    def wait_for_nodes(self, count: int, timeout_s: float = 60.0) -> int:
        """Block until ``count`` nodes have joined (or ``timeout_s``); returns how many."""
        return self.call("coord.wait_nodes", [count, timeout_s], timeout_s=timeout_s + 5)

    def status(self) -> dict[str, Any]:
        """Coordinator status: nodes, jobs, recently lost nodes."""
        return self.call("coord.status")

    def actors(self) -> list[dict[str, Any]]:
        """Every live actor of the cluster."""
        return self.call("coord.actors")

    def wait_for_actor(self, name: str, exclude: Sequence[str] = (), owner: str | None = None,
                       timeout_s: float = 60.0) -> dict[str, Any] | None:
        """Block until a live actor called ``name`` whose id is not in ``exclude`` exists
        (e.g. the replacement of a killed worker); its description, or None on timeout."""
        return self.call("coord.wait_actor", [name, owner, list(exclude), timeout_s],
                         timeout_s=timeout_s + 5)

    # ---- jobs ---------------------------------------------------------------------------
    def submit(self, config: dict[str, Any]) -> Job:
        """Start a job: ``{"algorithm": ..., <config keys>, "stop": {...}, "job": {...}}``
        (see :mod:`actorrl.cluster.jobs`); a bad config raises ValueError at once."""
        return Job(self, self.call("job.submit", [config, WIRE_VERSION]))

    def jobs(self) -> list[dict[str, Any]]:
        """A summary of every job the coordinator knows."""
        return self.call("job.list")

    def job(self, job_id: str) -> Job:
        """The job ``job_id`` (a unique prefix is enough)."""
        return Job(self, self.call("job.status", [job_id])["job_id"])

    # ---- raw actor API ------------------------------------------------------------------
    def create_actor(self, class_path: str, args: Sequence[Any] = (),
                     kwargs: dict[str, Any] | None = None, *, num_cpus: float = 1.0,
                     num_gpus: float = 0.0, name: str = "", env: dict[str, str] | None = None,
                     node: str | None = None, colocate_with: ActorHandle | None = None,
                     timeout_s: float = 120.0) -> ActorHandle:
        """Start an actor in the cluster (on ``node`` when given, or next to
        ``colocate_with``); it lives until :meth:`kill_actor` or :meth:`close`."""
        spec = ActorSpec(class_path, tuple(args), dict(kwargs or {}), float(num_cpus),
                         float(num_gpus), name, dict(env or {}))
        actor_id, endpoint, path, label = self.call(
            "coord.create_actor",
            [self._session, spec_to_wire(spec), node,
             colocate_with.actor_id if colocate_with is not None else None, timeout_s,
             WIRE_VERSION],
            timeout_s=timeout_s + 10)
        self._start_session_pings()
        return ActorHandle(actor_id, endpoint, path, label, spec, self.runtime)

    def _start_session_pings(self) -> None:
        """Keep this client's actors alive: the coordinator stops the actors of a session
        that stays silent (a client that died without closing) for 20 s."""
        if self._pinger is not None:
            return

        async def ping_forever() -> None:
            while True:
                await asyncio.sleep(SESSION_PING_S)
                try:
                    await self.runtime.client(self._coordinator).call(
                        "coord.session_ping", [self._session], timeout_s=SESSION_PING_S)
                except Exception:  # the coordinator is away; keep trying
                    continue

        async def start() -> asyncio.Task:
            return asyncio.get_running_loop().create_task(ping_forever())

        self._pinger = self._run(start())

    def actor_log(self, actor_id: str, max_bytes: int = 20_000) -> str:
        """The end of a live actor's output (stdout + stderr), fetched from its node."""
        return self.call("coord.actor_log", [actor_id, max_bytes])

    def kill_actor(self, handle: ActorHandle, sigkill: bool = False) -> None:
        """Stop an actor (exit request then SIGKILL); ``sigkill`` kills it like a crash."""
        self.call("coord.kill_actor", [self._session, handle.actor_id, sigkill])

    def get(self, refs: ObjectRef | Sequence[ObjectRef], timeout: float | None = None) -> Any:
        """Resolve a ref or a list of refs (raises the remote error or ActorDiedError)."""
        return self._run(self.runtime.get_async(refs, timeout),
                         None if timeout is None else timeout + 5)

    def wait(self, refs: Sequence[ObjectRef], num_returns: int = 1,
             timeout: float | None = None) -> tuple[list[ObjectRef], list[ObjectRef]]:
        """``(ready, not_ready)`` once ``num_returns`` refs are ready, first-ready order."""
        return self._run(self.runtime.wait_async(refs, num_returns, timeout),
                         None if timeout is None else timeout + 5)

    def put(self, value: Any) -> ObjectRef:
        """Store ``value`` in this process; actors fetch it from here."""
        return self.runtime.put(value)

    def free(self, refs: ObjectRef | Sequence[ObjectRef]) -> None:
        """Release objects at their owners."""
        self.runtime.free(refs)

    # ---- lifecycle ----------------------------------------------------------------------
    def close(self) -> None:
        """Stop this client's actors and close the connection (``Client.local()``: also
        stop its jobs, coordinator and node)."""
        if self._closed:
            return
        pinger = self._pinger
        if pinger is not None:
            self._loop.call_soon_threadsafe(pinger.cancel)
        try:
            if self._local is not None:
                coordinator, node, jobs = self._local

                async def stop_local() -> None:
                    await jobs.shutdown(checkpoint=False)
                    await coordinator.shutdown(release_nodes=True)
                    await node.shutdown()

                self._run(stop_local(), 120)
            elif self._runtime is not None:
                try:
                    self._close_session()
                except Exception:  # the coordinator may be gone; nothing to clean there
                    pass
        finally:
            self._teardown()

    def _teardown(self) -> None:
        runtime = self._runtime
        if runtime is not None:
            async def close() -> None:
                runtime.close()

            try:
                self._run(close(), 10)
            except Exception:
                pass
        self._closed = True
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        if not self._loop.is_running():
            self._loop.close()
        shutil.rmtree(self._session_dir, ignore_errors=True)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


_REFUSALS = (ConfigError, JobError, ValueError, ActorCreationError)
"""Remote errors that mean the coordinator refused bad input (importing the classes here
also registers them, so they arrive typed)."""


def _local_error(exc: RemoteError) -> Exception:
    """A coordinator's refusal of bad input keeps its type but drops the coordinator's
    traceback, which only shows where it checked; other failures keep it."""
    if isinstance(exc, _REFUSALS):
        return RemoteError(exc.type_name, exc.message).typed()
    return exc
