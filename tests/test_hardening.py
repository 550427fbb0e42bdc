"""Hardening against hostile input (issue: no message, peer or local user can stall, leak
or take over a node): crafted names, dtype strings and tensor messages."""

from __future__ import annotations

import asyncio
import os
import re
import struct
import subprocess
import sys

import msgpack
import pytest

from actorrl.runtime import Driver
from actorrl.runtime.node.node import log_label
from transport.codec import EXT_ARRAY, DecodeError, decode
from transport.rpc import RpcClient

pytestmark = pytest.mark.usefixtures("light_fork_server")  # test actors need no torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("name", ["../../escaped", "/etc/evil", "a/../../b", "..", "x\ny"])
def test_log_labels_never_leave_the_log_folder(name: str) -> None:
    """A name becomes one safe path component: no separators, no leading dots."""
    label = log_label(name)
    assert "/" not in label and "\n" not in label and not label.startswith(".")
    assert os.path.basename(label) == label and label


async def test_an_actor_named_with_dots_logs_inside_the_session(tmp_path) -> None:
    """An actor named ``../../escaped`` writes its log inside ``session/logs``."""
    session = tmp_path / "s"
    async with Driver.start(str(session)) as driver:
        actor = await driver.create_actor("tests.actors.basic:Counter",
                                          name="../../escaped")
        assert await driver.get(actor.add.remote(1), timeout_s=30) == 1
    logs = os.listdir(session / "logs")
    assert any("escaped" in f and "/" not in f for f in logs), logs
    assert not list(tmp_path.glob("escaped*")) and not (tmp_path.parent / "escaped").exists()


def test_a_forged_dtype_cannot_write_a_log_line() -> None:
    """A dtype string with a newline is refused with the string escaped."""
    dtype = b"<f4\nERROR forged log line"
    head = struct.pack("<BBBi", len(dtype), 1, 0, -1) + dtype + struct.pack("<q", 1)
    header = msgpack.packb(msgpack.ExtType(EXT_ARRAY, head + b"\0" * 4))
    with pytest.raises(DecodeError) as info:
        decode([header])
    assert "\n" not in str(info.value) and "forged" in str(info.value)


def _python_words(code: str) -> list[str]:
    """The words ``code`` prints, run in a fresh interpreter (nothing preloaded)."""
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=60, check=True).stdout.split()


def test_a_tensor_message_does_not_import_torch() -> None:
    """A 40-byte message with the tensor extension decodes to a numpy array in a process
    that never imported torch (the coordinator), and torch stays unloaded."""
    code = (
        "import sys, numpy as np\n"
        "from transport.codec import EXT_TENSOR, Codec, decode\n"
        "import msgpack, struct\n"
        "head = struct.pack('<BBBi', 3, 1, 0, -1) + b'<f4' + struct.pack('<q', 2)\n"
        "msg = msgpack.packb(msgpack.ExtType(EXT_TENSOR, head + b'\\0' * 8))\n"
        "value = decode([msg])\n"
        "print(len(msg), type(value).__name__, 'torch' in sys.modules)\n")
    out = _python_words(code)
    assert int(out[0]) <= 40 and out[1:] == ["ndarray", "False"]


@pytest.mark.parametrize(("method", "args"), [
    ("__call__", [b"\x01" * 16, 7, [], {}]),            # a non-string method name
    ("__call__", [b"\x02" * 16, "add", [1], {1: 2}]),    # a non-string keyword
    ("__call__", [b"\x03" * 16, "add"]),                  # too few fields
    ("__fetch__", [b"\x04" * 16, "yes"]),                 # a non-bool free
    ("__wait__", [[1, 2]]),                               # an unhashable waiter id
    ("__free__", [[None]]),                               # a bad id to free
])
async def test_malformed_runtime_requests_get_an_error_reply(tmp_path, method, args) -> None:
    """Every malformed field of the runtime protocol is answered with an error at once
    (it used to raise inside a loop callback: no reply, the object left pending), and the
    actor serves the next legitimate call."""
    from transport.errors import RemoteError
    from transport.rpc import RpcClient

    async with Driver.start(str(tmp_path / "s")) as driver:
        actor = await driver.create_actor("tests.actors.basic:Counter")
        client = RpcClient(actor.endpoint, connect_timeout_s=10)
        try:
            with pytest.raises(RemoteError, match="malformed"):
                await client.call(method, args, timeout_s=1.0)
        finally:
            client.close()
        assert await driver.get(actor.add.remote(2), timeout_s=5) == 2


async def test_death_reports_are_checked_and_bounded(tmp_path) -> None:
    """``coord.actor_died`` keeps nothing for unknown nodes, for actors of another node or
    for actors no node is starting; reasons are truncated; malformed fields are refused.
    300 reports with 1 MB reasons used to keep +308 MB for good."""
    from actorrl.runtime.cluster.coordinator import MAX_REASON_CHARS, Coordinator

    async with Driver.start(str(tmp_path / "s")) as driver:
        coordinator = Coordinator(driver.runtime)
        coordinator.serve()
        node = coordinator.add_node("n1", "a", "ipc://nowhere", "127.0.0.1", 2, 0,
                                    conn=None)  # type: ignore[arg-type]
        reporter = RpcClient(driver.runtime.local_address, connect_timeout_s=30)

        async def died(*fields) -> bool:
            return await reporter.call("coord.actor_died", fields, timeout_s=30)

        try:
            huge = "x" * ((1 << 20) - 4096)  # under the 1 MB header cap
            for i in range(300):
                assert await died("no-such-node", f"a{i}", huge) is False
                assert await died(node.node_id, f"b{i}", huge) is False
            assert coordinator.early_deaths == {}
            node.starting = 1  # a start in flight: an early death is kept, truncated
            assert await died(node.node_id, "c", huge) is True
            assert len(coordinator.early_deaths["c"]) == MAX_REASON_CHARS
            with pytest.raises(ValueError, match="actor_died takes"):
                await died(node.node_id, ["c"], 3)
        finally:
            reporter.close()


def _long_dir(tmp_path) -> str:
    path = tmp_path / ("d" * 90)
    path.mkdir()
    return str(path)


async def test_socket_fallback_folders_are_private_and_removed(tmp_path) -> None:
    """A session directory too long for ipc paths puts its sockets in a per-user folder
    of mode 0700, removed when the session ends (they used to pile up, mode 0755)."""
    from actorrl.runtime.process.peers import ipc_fallback_dir

    session = _long_dir(tmp_path)
    async with Driver.start(session) as driver:
        actor = await driver.create_actor("tests.actors.basic:Counter")
        assert await driver.get(actor.add.remote(3), timeout_s=30) == 3
        folder = ipc_fallback_dir(session, create=False)
        assert actor.endpoint.startswith(f"ipc://{folder}/")
        info = os.stat(folder)
        assert info.st_uid == os.getuid() and info.st_mode & 0o777 == 0o700
    assert not os.path.exists(folder)


def test_a_socket_folder_others_can_enter_is_refused(tmp_path) -> None:
    """A fallback folder planted with mode 0777 (or owned by someone else) is refused
    with a message naming it; a stale one whose session is gone is cleaned up."""
    from actorrl.runtime.process.peers import ipc_fallback_dir, remove_ipc_fallback

    session = _long_dir(tmp_path)
    planted = ipc_fallback_dir(session, create=False)
    os.mkdir(planted)
    os.chmod(planted, 0o777)
    try:
        with pytest.raises(PermissionError, match="not a private folder"):
            ipc_fallback_dir(session)
    finally:
        os.rmdir(planted)
    gone = str(tmp_path / "gone")
    os.mkdir(gone)
    stale = ipc_fallback_dir(gone)
    os.rmdir(gone)  # its session ended without cleaning up (a SIGKILL, say)
    remove_ipc_fallback(session)
    assert not os.path.exists(stale)


def test_key_generation_never_follows_a_planted_symlink(tmp_path) -> None:
    """``keys generate --force`` replaces a symlink planted at a secret's path instead of
    writing the secret through it; a secret that is a symlink is refused when loading."""
    from transport.auth import KeyFileError, generate_keys, load_keypair

    keys = str(tmp_path / "keys")
    generate_keys(keys, ["client"])
    victim = tmp_path / "victim"
    victim.write_text("precious")
    secret = os.path.join(keys, "client.secret")
    os.unlink(secret)
    os.symlink(victim, secret)
    with pytest.raises(KeyFileError, match="not a regular file"):
        load_keypair(keys, "client")
    generate_keys(keys, ["client"], overwrite=True)
    assert victim.read_text() == "precious"
    assert not os.path.islink(secret) and os.stat(secret).st_mode & 0o777 == 0o600
    assert load_keypair(keys, "client").public


def test_keys_in_a_directory_others_can_write_are_refused(tmp_path) -> None:
    """A 0777 keys directory (anyone could plant an allowed key) is not trusted."""
    from transport.auth import KeyFileError, generate_keys, load_allowed_keys, load_keypair

    keys = str(tmp_path / "keys")
    generate_keys(keys, ["client"])
    os.chmod(keys, 0o777)
    for load in (lambda: load_allowed_keys(keys), lambda: load_keypair(keys, "client"),
                 lambda: generate_keys(keys, ["node"])):
        with pytest.raises(KeyFileError, match="writable by others"):
            load()


def test_state_directories_are_private(tmp_path) -> None:
    """The coordinator's state directory and its jobs/ are created (or tightened) 0700."""
    from actorrl.cluster.service import make_private_dir

    fresh, loose = str(tmp_path / "fresh" / "state"), str(tmp_path / "loose")
    os.makedirs(loose, mode=0o755)
    for path in (fresh, loose):
        make_private_dir(path)
        assert os.stat(path).st_mode & 0o777 == 0o700


async def test_a_call_waiting_on_its_ref_arguments_blocks_only_its_caller(tmp_path) -> None:
    """The driver's call whose ref argument is not ready holds back the driver's later
    calls (its order is kept) but not another caller's: a relay actor's call on the same
    actor answers at once (it used to wait behind the held call)."""
    async with Driver.start(str(tmp_path / "s")) as driver:
        gate = await driver.create_actor("tests.actors.basic:Gate", num_cpus=0)
        counter = await driver.create_actor("tests.actors.basic:Counter", num_cpus=0)
        relay = await driver.create_actor("tests.actors.basic:Relay", num_cpus=0)
        held = gate.wait_for.remote("k", 7)  # not ready until the gate opens
        echoed = counter.echo.remote(held)
        after = counter.add.remote(1)  # the driver's next call: waits behind `echoed`
        other = relay.call.remote(counter, "add", [10])
        assert await driver.get(other, timeout_s=10) == 10  # `after` (+1) has not run
        # The counter keeps serving the relay while `after` waits: had the driver's order
        # been broken, `after` would have run by this second call and the sum be 11.
        again = relay.call.remote(counter, "add", [0])
        assert await driver.get(again, timeout_s=10) == 10, "the driver's order was broken"
        await driver.get(gate.open.remote("k"), timeout_s=10)
        assert await driver.get(echoed, timeout_s=10) == 7
        assert await driver.get(after, timeout_s=10) == 11


async def test_failed_actors_are_replaced_concurrently() -> None:
    """Two failures at once start both replacements before either finishes (one at a time,
    recovery took twice a start time); an actor failing twice is replaced once."""
    from actorrl.pipelines.pieces import Fleet

    started: list[str] = []
    release, both = asyncio.Event(), asyncio.Event()

    async def replace(actor):
        started.append(actor)
        if len(started) == 2:
            both.set()
        await release.wait()
        return f"new-{actor}"

    fleet = Fleet(["a", "b", "c"], replace, "rollout worker")  # type: ignore[arg-type]
    failures = [("a", RuntimeError("x")), ("c", RuntimeError("y")), ("a", RuntimeError("z"))]
    task = asyncio.ensure_future(fleet.failed_all(failures, lambda _a: None))
    await asyncio.wait_for(both.wait(), 30)
    assert not task.done()
    release.set()
    assert sorted(await task) == ["new-a", "new-c"]
    assert fleet.actors == ["new-a", "b", "new-c"] and fleet.num_failures == 2


async def test_placement_avoids_a_node_that_missed_its_heartbeats(tmp_path) -> None:
    """Of two equal nodes, the one whose heartbeats stopped (dying with its actors) is
    picked last, so a replacement does not try it first."""
    import time as _time

    from actorrl.runtime.cluster.coordinator import Coordinator
    from actorrl.runtime.process.handles import ActorSpec

    async with Driver.start(str(tmp_path / "s")) as driver:
        coordinator = Coordinator(driver.runtime, heartbeat_s=1.0)
        dying = coordinator.add_node("n1", "dying", "ipc://a", "127.0.0.1", 4, 0,
                                     conn=None)  # type: ignore[arg-type]
        alive = coordinator.add_node("n2", "alive", "ipc://b", "127.0.0.1", 2, 0,
                                     conn=None)  # type: ignore[arg-type]
        spec = ActorSpec("tests.actors.basic:Counter", (), {}, 1.0, 0.0, "w", {})
        assert coordinator.choose_node(spec) is dying  # more free CPUs
        dying.last_heartbeat = _time.monotonic() - 5.0
        assert coordinator.choose_node(spec) is alive


async def test_waits_for_unannounced_objects_are_bounded() -> None:
    """Waits for ids nobody announced expire, and beyond MAX_UNKNOWN_WAITS such ids a new
    one is answered "missing" at once (any peer could otherwise park unbounded waits)."""
    from actorrl.runtime.process.store import MAX_UNKNOWN_WAITS, STATUS_MISSING, ObjectStore

    store = ObjectStore(asyncio.get_running_loop(), unknown_wait_s=60.0)
    answers: list[int] = []
    for i in range(MAX_UNKNOWN_WAITS):
        store.when_ready(i.to_bytes(16, "big"), lambda status, _v: answers.append(status))
    assert answers == []
    store.when_ready(b"\xff" * 16, lambda status, _v: answers.append(status))
    assert answers == [STATUS_MISSING]
    store.add_pending(b"\xfe" * 16)  # an announced object still waits as long as it takes
    store.when_ready(b"\xfe" * 16, lambda status, _v: answers.append(status))
    assert answers == [STATUS_MISSING]


def test_validating_a_job_submission_does_not_import_torch() -> None:
    """The coordinator checks a submission's config (model options included) without
    loading torch (+185 MB and a 1 s stall in the coordinator)."""
    code = (
        "import sys\n"
        "from actorrl.cluster.jobs import Submission\n"
        "Submission.parse({'algorithm': 'apex', 'model': {'fcnet_hiddens': [16]},\n"
        "                  'buffer_size': 1000, 'stop': {'training_iteration': 1}})\n"
        "try:\n"
        "    Submission.parse({'algorithm': 'impala', 'model': {'fcnet_hidden': [1]}})\n"
        "except ValueError as exc:\n"
        "    print('refused', 'fcnet_hiddens' in str(exc))\n"
        "print('torch' in sys.modules)\n")
    out = _python_words(code)
    assert out == ["refused", "True", "False"], out


def test_a_sigkilled_drivers_session_folder_is_removed(tmp_path) -> None:
    """A driver killed by SIGKILL cannot remove its temp session folder; the next session
    started on the host removes it (its owner is gone), and leaves live ones alone."""
    import glob
    import signal
    import tempfile

    from actorrl.runtime.sessions import make_session_dir, remove_stale_session_dirs

    script = ("import sys, actorrl.runtime as rt\n"
              "rt.init()\n"
              "print('ready', flush=True)\n"
              "sys.stdin.read()\n")
    parent = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, text=True,
                              stdout=subprocess.PIPE, stdin=subprocess.PIPE)
    try:
        assert parent.stdout.readline().strip() == "ready"
        owned = [d for d in glob.glob(os.path.join(tempfile.gettempdir(), "actorrl-*"))
                 if _owner(d) == parent.pid]
        assert len(owned) == 1, owned
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        assert os.path.isdir(owned[0])  # nobody could remove it
        mine = make_session_dir("test")  # a new session cleans up after the dead one
        try:
            assert not os.path.exists(owned[0])
            assert mine not in remove_stale_session_dirs() and os.path.isdir(mine)
        finally:
            import shutil
            shutil.rmtree(mine)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(timeout=10)


def _owner(path: str) -> int:
    try:
        with open(os.path.join(path, "owner.pid")) as f:
            return int(f.read())
    except (OSError, ValueError):
        return -1


async def test_a_curve_server_refuses_handshakes_past_its_peer_cap(tmp_path, caplog) -> None:
    """Past ``max_peers`` open connections a CURVE server's handshakes are refused in ZAP
    (libzmq closes those connections): the client gets ServerFullError, which says so,
    the server logs it once per window, and once peers leave a new one is admitted."""
    from transport.auth import Security, ensure_authenticator, generate_keys
    from transport.errors import ServerFullError
    from transport.rpc import RpcClient, RpcServer

    generate_keys(str(tmp_path / "k"))
    security = Security.from_dir(str(tmp_path / "k"), "coordinator")
    auth = ensure_authenticator(security.allowed, security.roles)
    server = RpcServer(lambda request: request.reply("ok"), max_peers=3)
    tcp = server.bind("tcp://127.0.0.1:0", security.identity.secret)
    server.start()
    keys = security.client_keys(security.identity.public)
    admitted: list[RpcClient] = []
    refused: list[BaseException] = []
    clients: list[RpcClient] = []
    full_before = auth.refused_full
    try:
        with caplog.at_level("WARNING", logger="transport.auth"):
            for _ in range(8):  # one at a time: the server has seen each accept before ZAP
                client = RpcClient(tcp, curve_keys=keys, connect_timeout_s=5)
                clients.append(client)
                try:
                    assert await client.call("ping", timeout_s=5) == "ok"
                    admitted.append(client)
                except ServerFullError as exc:
                    refused.append(exc)
        # The count is the socket monitor's, read on the loop: the connection being
        # handshaken may not be counted yet, so the cap can be passed by one here.
        assert 3 <= len(admitted) <= 4, (len(admitted), refused)
        assert len(refused) == 8 - len(admitted) and "max_peers" in str(refused[0])
        assert auth.refused_full - full_before == len(refused)
        warnings = [r.getMessage() for r in caplog.records if "cap of 3" in r.getMessage()]
        assert len(warnings) == 1 and tcp in warnings[0], warnings
        for client in admitted:
            client.close()
        deadline = asyncio.get_running_loop().time() + 10
        while server.peers > 1 and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.02)  # libzmq's own threads close them: nothing to await
        late = RpcClient(tcp, curve_keys=keys, connect_timeout_s=5)
        clients.append(late)
        assert await late.call("ping", timeout_s=5) == "ok"
    finally:
        for client in clients:
            client.close()
        server.close()


def _lower_fd_limit() -> None:
    """In a child: a soft fd limit of 1024 under the inherited hard limit."""
    import resource

    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(1024, hard), hard))


@pytest.mark.timeout(120)
def test_the_coordinator_caps_frames_and_raises_its_fd_limit(tmp_path) -> None:
    """The coordinator raises its soft fd limit to the hard one at start (so libzmq's
    accept loop does not reach it), and its server reads no frame over --max-frame-mb: a
    Client refuses to send a larger request with an error naming the setting, a raw
    larger request is dropped with its connection, and the coordinator still answers."""
    import resource

    import numpy as np

    from actorrl.cluster.client import Client
    from tests.helpers.procs import ready_line, start_python, terminate
    from transport.errors import CallTimeoutError, PeerLostError
    from transport.rpc import RpcClient

    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    read_fd, write_fd = os.pipe()
    state = tmp_path / "state"
    proc = start_python(
        ["-m", "actorrl.cli.cluster", "coordinator", "start", "--state-dir", str(state),
         "--ready-fd", str(write_fd), "--max-frame-mb", "1"], tmp_path / "coordinator.log",
        stdin=subprocess.DEVNULL, stdout=None, pass_fds=(write_fd,),
        preexec_fn=_lower_fd_limit)
    os.close(write_fd)
    try:
        line = ready_line(proc, read_fd, "READY ", 60, tmp_path / "coordinator.log")
        address = line.split()[1]
        with open(f"/proc/{proc.pid}/limits") as f:
            row = next(r for r in f if r.startswith("Max open files")).split()
        assert int(row[3]) == hard, row  # soft limit raised from 1024
        with Client(address) as client:
            with pytest.raises(ValueError, match="--max-frame-mb"):
                client.call("coord.hello", [np.zeros(2 << 20, np.uint8)])

            async def raw() -> None:
                raw = RpcClient(address, connect_timeout_s=5)
                try:
                    with pytest.raises((PeerLostError, CallTimeoutError), match=re.escape(address)):
                        await raw.call("coord.hello", [np.zeros(2 << 20, np.uint8)],
                                       timeout_s=5)
                finally:
                    raw.close()

            client.run(raw(), 30)
            assert client.call("coord.hello", timeout_s=30)["max_frame_bytes"] == 1 << 20
    finally:
        os.close(read_fd)
        terminate(proc)
