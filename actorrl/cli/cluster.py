"""Cluster commands of the ``actorrl`` CLI (``register(subparsers)`` adds them).

::

    actorrl keys generate DIR [--force] [--role client|node|admin] [--names NAME ...]
    actorrl coordinator start [--bind tcp://HOST:PORT] [--daemon] [--keys DIR]
                              [--state-dir DIR] [--advertise HOST] [--insecure-loopback]
    actorrl coordinator status [--json]
    actorrl coordinator stop [--with-nodes]
    actorrl node join ADDRESS [--cpus N] [--gpus N] [--keys DIR] [--name NAME] [--host IP]
                              [--insecure-loopback] [--start-method fork|spawn]
    actorrl nodes [--wait N [--wait-timeout S]]
    actorrl submit CONFIG [--set KEY=VALUE ...] [--follow]
    actorrl jobs
    actorrl jobs follow JOB [--all] [--reconnect-timeout S]
    actorrl logs JOB [--actors]
    actorrl stop JOB

Every address and key path can also come from the environment, so the same command line
runs unchanged under Slurm or Kubernetes (docs/deploy.md): a flag wins over its variable.

=================== =============================================================
``ACTORRL_ADDRESS``  the coordinator (``node join ADDRESS``, ``--address``)
``ACTORRL_KEYS_DIR`` the CURVE keys directory (``--keys``)
``ACTORRL_BIND``     ``coordinator start --bind``
``ACTORRL_ADVERTISE`` ``coordinator start --advertise``
``ACTORRL_NODE_NAME`` ``node join --name``
``ACTORRL_NODE_HOST`` ``node join --host`` (the IP this node's actors are reached at)
``ACTORRL_CPUS`` / ``ACTORRL_GPUS`` ``node join --cpus`` / ``--gpus``
``ACTORRL_STATE_DIR`` ``--state-dir``
=================== =============================================================

Commands that talk to a coordinator find it through ``--address`` or the state file of a
coordinator started on this host (``--state-dir``, ``$ACTORRL_STATE_DIR``, ``~/.actorrl``),
which also names its keys directory; ``--keys`` overrides; ``--identity`` picks the key pair
(default ``client``; an admin key for another client's jobs or ``coordinator stop``).
``python -m actorrl.cli.cluster`` runs these commands alone.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

EXIT_USAGE = 2


ENV_ADDRESS = "ACTORRL_ADDRESS"
ENV_KEYS_DIR = "ACTORRL_KEYS_DIR"
ENV_BIND = "ACTORRL_BIND"
ENV_ADVERTISE = "ACTORRL_ADVERTISE"
ENV_NODE_NAME = "ACTORRL_NODE_NAME"
ENV_NODE_HOST = "ACTORRL_NODE_HOST"
ENV_CPUS = "ACTORRL_CPUS"
ENV_GPUS = "ACTORRL_GPUS"


def _env(name: str) -> str | None:
    """The value of environment variable ``name``; None when unset or empty."""
    return os.environ.get(name) or None


class CommandError(Exception):
    """A command cannot run (the message says why and what to do)."""


# ---------------------------------------------------------------------------- helpers
def _state_dir(args: argparse.Namespace) -> str:
    from actorrl.cluster.service import default_state_dir

    return os.path.abspath(os.path.expanduser(args.state_dir or default_state_dir()))


def _target(args: argparse.Namespace) -> tuple[str, str | None]:
    """``(address, keys_dir)`` of the coordinator to talk to."""
    from actorrl.cluster.service import pid_alive, read_state

    keys = os.path.expanduser(args.keys) if getattr(args, "keys", None) else None
    if getattr(args, "address", None):
        return args.address, keys or _env(ENV_KEYS_DIR)
    state_dir = _state_dir(args)
    state = read_state(state_dir)
    if state is None:
        raise CommandError(f"no coordinator is recorded in {state_dir}; start one with "
                           "`actorrl coordinator start` or pass --address")
    if not pid_alive(int(state.get("pid", 0))):
        raise CommandError(f"the coordinator recorded in {state_dir} (pid {state.get('pid')}) "
                           "is not running; start it again with `actorrl coordinator start`")
    return state["address"], keys or state.get("keys_dir")


def _client(args: argparse.Namespace) -> Any:
    from actorrl.cluster.client import Client

    address, keys = _target(args)
    return Client(address, keys_dir=keys, identity=getattr(args, "identity", None) or "client",
                  bind_host=None, connect_timeout_s=getattr(args, "timeout", 10.0))


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=True, default=str))


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "-" if value is None or value == "" else str(value)


def _table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    cells = [[_fmt(r.get(c)) for c in columns] for r in rows]
    widths = [max([len(c), *(len(row[i]) for row in cells)]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)


def _add_target(p: argparse.ArgumentParser) -> None:
    p.add_argument("--address", default=_env(ENV_ADDRESS), help="coordinator address "
                   "(default: $ACTORRL_ADDRESS, else the one recorded in the state directory)")
    p.add_argument("--keys", metavar="DIR", default=_env(ENV_KEYS_DIR), help="CURVE keys "
                   "directory (default: $ACTORRL_KEYS_DIR, else the coordinator's, from the "
                   "state file)")
    p.add_argument("--state-dir", metavar="DIR", help="coordinator state directory (default: "
                   "$ACTORRL_STATE_DIR or ~/.actorrl)")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the "
                   "coordinator to answer (default: 10)")
    p.add_argument("--identity", metavar="NAME", help="key pair of the keys directory to "
                   "use (default: client; e.g. admin-NAME to act on every job)")


def _add_insecure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--insecure-loopback", action="store_true",
                   help="allow listening on loopback tcp without --keys: any local user "
                   "can then connect and run code as you (default: refused)")


# ---------------------------------------------------------------------------- commands
def key_names(names: Sequence[str] | None, role: str | None) -> list[str]:
    """The key names ``keys generate`` writes: a key's role comes from its name
    (:func:`transport.auth.role_of_name`), so with ``role`` each name gets the role as a
    prefix (``--role admin --names alice`` writes ``admin-alice``) unless it has it."""
    from transport.auth import ROLE_CLIENT, role_of_name

    if role is None:
        return list(names or ["coordinator", "node", "client"])
    out = []
    for name in names or [role]:
        if role_of_name(name) != role:
            if role == ROLE_CLIENT:
                raise CommandError(f"a client key cannot be called {name!r}: names starting "
                                   "with coordinator, node or admin have those roles; pick "
                                   "another name")
            name = f"{role}-{name}"
        out.append(name)
    return out


def _cmd_keys_generate(args: argparse.Namespace) -> int:
    from transport.auth import generate_keys, role_of_name

    names = key_names(args.names, args.role)
    generate_keys(os.path.expanduser(args.dir), names, overwrite=args.force)
    roles = ", ".join(f"{n} ({role_of_name(n)})" for n in names)
    print(f"wrote key pairs {roles} to {args.dir} (secrets mode 0600).\n"
          f"Every host needs all the *.public files (the allow-list; a key's role comes "
          f"from its file name) and only its own secret: the coordinator "
          f"coordinator.secret, nodes node.secret, each client its own.")
    return 0


def _refuse_foreign_address(host: str, setting: str, fix: str) -> None:
    """A :class:`CommandError` naming ``setting`` and ``fix`` when ``host`` (an IP
    literal; names and wildcards are not checked) is not an address of this host, before
    anything tries to listen there. The check binds a plain socket and closes it: nothing
    is sent anywhere."""
    from transport.sockets import local_bind_problem

    problem = local_bind_problem(host)
    if problem is not None:
        raise CommandError(f"{setting}: {host} is not an address of this host ({problem}); "
                           f"{fix}")


def _refuse_foreign_coordinator_addresses(bind: str | None, advertise: str | None) -> None:
    """``coordinator start``: the ``--bind`` host, and the ``--advertise`` host (the
    coordinator listens there too), must be addresses of this host."""
    from urllib.parse import urlparse

    if bind is not None and bind.startswith("tcp://"):
        parsed = urlparse(bind)
        port = parsed.port if parsed.port is not None else 7450
        _refuse_foreign_address(
            parsed.hostname or "", f"--bind {bind} (or ${ENV_BIND})",
            f"the coordinator listens on an address of this host: pass e.g. --bind "
            f"tcp://127.0.0.1:{port} (this host only) or --bind tcp://0.0.0.0:{port} (every "
            "interface; --advertise HOST then names the address nodes reach it at)")
    if advertise:
        _refuse_foreign_address(
            advertise, f"--advertise {advertise} (or ${ENV_ADVERTISE})",
            "the coordinator also listens on the host it advertises: pass an address of "
            "this host that the nodes and clients can reach, or leave --advertise out to "
            "advertise the --bind host")


def _cmd_coordinator_start(args: argparse.Namespace) -> int:
    from actorrl.cluster.service import DEFAULT_BIND, run_coordinator, start_daemon
    from transport.auth import Security, check_bind

    keys = os.path.abspath(os.path.expanduser(args.keys)) if args.keys else None
    _refuse_foreign_coordinator_addresses(args.bind, args.advertise)
    if args.bind is not None or keys:
        check_bind(args.bind or DEFAULT_BIND,
                   Security.from_dir(keys, "coordinator") if keys else None,
                   args.insecure_loopback)
    state_dir = _state_dir(args)
    if args.daemon:
        argv = ["--heartbeat-timeout", str(args.heartbeat_timeout),
                "--session-timeout", str(args.session_timeout)]
        if args.bind is not None:
            argv += ["--bind", args.bind]
        if args.insecure_loopback:
            argv += ["--insecure-loopback"]
        argv += ["--max-frame-mb", str(args.max_frame_mb), "--max-peers", str(args.max_peers)]
        if keys:
            argv += ["--keys", keys]
        if args.advertise:
            argv += ["--advertise", args.advertise]
        address = start_daemon(argv, state_dir)
        print(f"coordinator started in the background at {address} (state and log in "
              f"{state_dir})")
        return 0
    return run_coordinator(args.bind, keys_dir=keys, state_dir=state_dir,
                           advertise=args.advertise,
                           heartbeat_timeout_s=args.heartbeat_timeout,
                           session_timeout_s=args.session_timeout, ready_fd=args.ready_fd,
                           insecure_loopback=args.insecure_loopback,
                           max_frame_mb=args.max_frame_mb, max_peers=args.max_peers)


def _cmd_coordinator_status(args: argparse.Namespace) -> int:
    try:
        client = _client(args)
    except CommandError as exc:
        print(f"not running: {exc}")
        return 1
    with client:
        status = client.status()
    if args.json:
        _print_json(status)
        return 0
    where = status.get("listen") or status["address"].split("|", 1)[0]
    print(f"coordinator at {where}: {len(status['nodes'])} node(s), "
          f"{status['num_actors']} actor(s), {len(status.get('jobs', []))} job(s)")
    if status["nodes"]:
        print(_table(status["nodes"], ["name", "host", "num_cpus", "used_cpus", "num_gpus",
                                       "used_gpus", "num_actors"]))
    if status.get("jobs"):
        print(_table(status["jobs"], ["job_id", "algorithm", "state", "num_results",
                                      "episode_reward_mean", "num_failures"]))
    return 0


def _cmd_coordinator_stop(args: argparse.Namespace) -> int:
    from actorrl.cluster.service import read_state, wait_pid_exit

    state = read_state(_state_dir(args)) if not args.address else None
    with _client(args) as client:
        client.call("coord.shutdown", [args.with_nodes])
    if state is not None:
        pid = int(state["pid"])
        if not wait_pid_exit(pid, args.wait):
            print(f"the coordinator (pid {pid}) did not exit within {args.wait:g} s; "
                  "sending SIGKILL", file=sys.stderr)
            os.kill(pid, 9)
            wait_pid_exit(pid, 10)
    print("coordinator stopped")
    return 0


def _cmd_node_join(args: argparse.Namespace) -> int:
    from actorrl.cluster.service import run_node

    if not args.address:
        raise CommandError("node join needs the coordinator's address: pass it as ADDRESS "
                           "(tcp://HOST:PORT) or set $ACTORRL_ADDRESS")
    if args.host:
        _refuse_foreign_address(
            args.host, f"--host {args.host} (or ${ENV_NODE_HOST})",
            "a node's actors listen on that address and are reached there: pass an IP of "
            "this host that the coordinator and the other nodes can reach (127.0.0.1 when "
            "they all run on this host), or leave --host out to use this host's interface "
            "on the route to the coordinator")
    keys = os.path.abspath(os.path.expanduser(args.keys)) if args.keys else None
    return run_node(args.address, name=args.name, host=args.host, num_cpus=args.cpus,
                    num_gpus=args.gpus, keys_dir=keys, session_dir=args.session_dir,
                    insecure_loopback=args.insecure_loopback,
                    start_method=args.start_method)


def _cmd_nodes(args: argparse.Namespace) -> int:
    with _client(args) as client:
        if args.wait:
            joined = client.wait_for_nodes(args.wait, args.wait_timeout)
            if joined < args.wait:
                print(f"actorrl: error: {joined} of {args.wait} nodes joined within "
                      f"{args.wait_timeout:g} s; see the node agents' output (or raise "
                      "--wait-timeout)", file=sys.stderr)
                return 1
        nodes = client.nodes()
    if args.json:
        _print_json(nodes)
    else:
        print(_table(nodes, ["name", "host", "num_cpus", "used_cpus", "num_gpus", "used_gpus",
                             "num_actors"]))
    return 0


def _read_submission(args: argparse.Namespace) -> dict[str, Any]:
    from actorrl.config.files import parse_override, read_config_file

    config = read_config_file(args.config)
    for text in args.set or []:
        key, value = parse_override(text)
        target = config
        parts = key.split(".")
        if parts[0] in ("stop", "job") and len(parts) == 2:
            target = config.setdefault(parts[0], {})
        target[parts[-1]] = value
    if args.algorithm:
        config["algorithm"] = args.algorithm
    if "algorithm" not in config:
        raise CommandError(f"{args.config} has no 'algorithm' key; add one or pass "
                           "--algorithm NAME")
    if "logger_config" in config:
        raise CommandError(f"{args.config} has logger_config (W&B / MLflow): a submitted "
                           "job is not tracked; remove it, or train with `actorrl train "
                           f"--config {args.config} --address ADDRESS`, which tracks from "
                           "its own process")
    return config


def _print_result(result: dict[str, Any]) -> None:
    print(f"iter {result.get('training_iteration')}  "
          f"steps {result.get('timesteps_total')}  "
          f"reward {_fmt(result.get('episode_reward_mean'))}", flush=True)


def _follow(args: argparse.Namespace, job_id: str, after: int, client: Any = None) -> int:
    """Print job ``job_id``'s results from index ``after`` until it ends; exit 0 when it
    finished, 1 otherwise (130 on Ctrl-C, the job keeps running).

    A lost coordinator (killed, restarting) does not end it: :meth:`Job.results
    <actorrl.cluster.client.Job.results>` tries the same address again and goes on from
    the next result the restarted coordinator has (jobs resume from their checkpoints),
    giving up after ``--reconnect-timeout`` seconds without an answer. ``client``: one
    already open (closed by the caller)."""
    from actorrl.cluster.client import Client, ClusterConnectionError, JobFailedError

    address, keys = _target(args)
    identity = getattr(args, "identity", None) or "client"
    own = None

    def note(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    try:
        if client is None:
            client = own = Client(address, keys_dir=keys, identity=identity,
                                  bind_host=None, connect_timeout_s=args.timeout)
        job = client.job(job_id)
        job_id = job.id
        try:
            for result in job.results(after=after,
                                      reconnect_timeout_s=args.reconnect_timeout,
                                      on_connection=note):
                _print_result(result)
        except JobFailedError:
            pass
        except ClusterConnectionError as exc:
            raise CommandError(f"{exc} (`actorrl jobs follow {job_id}`; or raise "
                               "--reconnect-timeout)") from None
        status = job.status()
        print(f"job {job.id} {status['state']}"
              + (f": {status['error']}" if status.get("error") else ""), flush=True)
        return 0 if status["state"] == "finished" else 1
    except KeyboardInterrupt:
        print(f"stopped following; the job keeps running (actorrl stop {job_id})")
        return 130
    finally:
        if own is not None:
            own.close()


def _cmd_submit(args: argparse.Namespace) -> int:
    submission = _read_submission(args)
    with _client(args) as client:
        job = client.submit(submission)
        print(job.id, flush=True)
        if not args.follow:
            return 0
        return _follow(args, job.id, 0, client)


def _cmd_jobs_follow(args: argparse.Namespace) -> int:
    with _client(args) as client:
        status = client.job(args.job).status()
        after = 0 if args.all else max(int(status["num_results"]) - 1, 0)
        print(f"following job {status['job_id']} ({status['state']}, "
              f"{status['num_results']} result(s) so far)", flush=True)
        return _follow(args, status["job_id"], after, client)


def _cmd_jobs(args: argparse.Namespace) -> int:
    with _client(args) as client:
        jobs = client.jobs()
    if args.json:
        _print_json(jobs)
    elif not jobs:
        print("no jobs")
    else:
        for job in jobs:
            job["iteration"] = (job.get("last_counters") or {}).get("training_iteration")
        print(_table(jobs, ["job_id", "name", "algorithm", "state", "iteration",
                            "episode_reward_mean", "num_failures"]))
    return 0


def _cmd_logs(args: argparse.Namespace) -> int:
    with _client(args) as client:
        job = client.job(args.job)
        sys.stdout.write(job.logs())
        if args.actors:
            for name, text in sorted(job.actor_logs(args.bytes).items()):
                print(f"\n===== {name} =====")
                sys.stdout.write(text)
    return 0


def _cmd_stop_job(args: argparse.Namespace) -> int:
    with _client(args) as client:
        record = client.job(args.job).stop()
    print(f"job {record['job_id']} {record['state']}")
    return 0


# ---------------------------------------------------------------------------- parser
def register(subparsers: Any) -> None:
    """Add the cluster commands to the ``actorrl`` parser's subparsers."""
    _add_keys_commands(subparsers)
    _add_coordinator_commands(subparsers)
    _add_node_commands(subparsers)
    _add_job_commands(subparsers)


def _add_keys_commands(subparsers: Any) -> None:
    """The ``keys`` command: CURVE key pairs for a cluster."""
    keys = subparsers.add_parser("keys", help="CURVE key pairs for a cluster")
    keys_sub = keys.add_subparsers(dest="keys_command", metavar="ACTION", required=True)
    p = keys_sub.add_parser("generate", help="write coordinator, node and client key pairs")
    p.add_argument("dir", metavar="DIR")
    p.add_argument("--force", action="store_true", help="replace existing keys")
    p.add_argument("--names", nargs="+", metavar="NAME",
                   help="identities to create (default: coordinator node client)")
    p.add_argument("--role", choices=["client", "node", "admin"],
                   help="role of the keys created: prefixes each name with the role "
                   "(--role admin --names alice writes admin-alice); default: from the names")
    p.set_defaults(func=_guarded(_cmd_keys_generate))


def _add_coordinator_commands(subparsers: Any) -> None:
    """The ``coordinator start|status|stop`` commands."""
    coord = subparsers.add_parser("coordinator", help="start, inspect or stop the coordinator")
    coord_sub = coord.add_subparsers(dest="coordinator_command", metavar="ACTION",
                                     required=True)
    p = coord_sub.add_parser("start", help="run the coordinator")
    p.add_argument("--bind", default=_env(ENV_BIND), help="address to listen on (default: "
                   "$ACTORRL_BIND, else with --keys tcp://127.0.0.1:7450, without an ipc "
                   "socket in the private state directory); tcp needs --keys (or, on "
                   "loopback, --insecure-loopback)")
    _add_insecure(p)
    p.add_argument("--daemon", action="store_true", help="detach and run in the background")
    p.add_argument("--keys", metavar="DIR", default=_env(ENV_KEYS_DIR), help="CURVE keys "
                   "directory (encrypts and authenticates every tcp connection; default: "
                   "$ACTORRL_KEYS_DIR)")
    p.add_argument("--state-dir", metavar="DIR", help="state, job records, checkpoints "
                   "(default: $ACTORRL_STATE_DIR or ~/.actorrl)")
    p.add_argument("--advertise", metavar="HOST", default=_env(ENV_ADVERTISE),
                   help="host other nodes reach this one at (default: $ACTORRL_ADVERTISE, "
                   "else the --bind host)")
    p.add_argument("--heartbeat-timeout", type=float, default=3.0, metavar="S",
                   help="seconds without a heartbeat before a node is lost (default: 3)")
    p.add_argument("--session-timeout", type=float, default=20.0, metavar="S",
                   help="seconds a client may stay silent before the actors it created are "
                   "stopped (default: 20)")
    p.add_argument("--max-frame-mb", type=float, default=64.0, metavar="MB",
                   help="largest message the coordinator reads, in MiB (default: 64); larger "
                   "ones are dropped with their connection before they are buffered")
    p.add_argument("--max-peers", type=int, default=1000, metavar="N",
                   help="open connections past which new CURVE handshakes are refused "
                   "(default: 1000; lowered to fit the fd limit)")
    p.add_argument("--ready-fd", type=int, help=argparse.SUPPRESS)
    p.set_defaults(func=_guarded(_cmd_coordinator_start))
    p = coord_sub.add_parser("status", help="nodes and jobs of the running coordinator")
    _add_target(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_guarded(_cmd_coordinator_status))
    p = coord_sub.add_parser("stop", help="stop the coordinator (jobs resume when it "
                             "restarts)")
    _add_target(p)
    p.add_argument("--with-nodes", action="store_true", help="also make the nodes exit")
    p.add_argument("--wait", type=float, default=60.0, help="seconds to wait for it to exit")
    p.set_defaults(func=_guarded(_cmd_coordinator_stop))


def _add_node_commands(subparsers: Any) -> None:
    """``node join`` (run a node agent here) and ``nodes`` (list them)."""
    node = subparsers.add_parser("node", help="run a node agent on this host")
    node_sub = node.add_subparsers(dest="node_command", metavar="ACTION", required=True)
    p = node_sub.add_parser("join", help="join a coordinator and run actors for it")
    p.add_argument("address", metavar="ADDRESS", nargs="?", default=_env(ENV_ADDRESS),
                   help="the coordinator, tcp://HOST:PORT (default: $ACTORRL_ADDRESS)")
    p.add_argument("--cpus", type=float, default=_env(ENV_CPUS),
                   help="CPUs to offer (default: $ACTORRL_CPUS, else all)")
    p.add_argument("--gpus", type=float, default=_env(ENV_GPUS),
                   help="GPUs to offer (default: $ACTORRL_GPUS, else all visible)")
    p.add_argument("--keys", metavar="DIR", default=_env(ENV_KEYS_DIR),
                   help="CURVE keys directory (default: $ACTORRL_KEYS_DIR)")
    p.add_argument("--name", default=_env(ENV_NODE_NAME), help="node name (default: "
                   "$ACTORRL_NODE_NAME, else hostname + random suffix)")
    p.add_argument("--host", default=_env(ENV_NODE_HOST), help="IP this node's actors bind "
                   "and are reached at (default: $ACTORRL_NODE_HOST, else the interface that "
                   "routes to the coordinator)")
    p.add_argument("--session-dir", metavar="DIR", help="sockets and actor logs (default: a "
                   "fresh temporary directory, removed when the node exits)")
    _add_insecure(p)
    p.add_argument("--start-method", choices=("fork", "spawn"), default=None,
                   help="how actor processes start: forked from this node's fork server "
                        "(default where available) or each a fresh interpreter (default: "
                        "$ACTORRL_START_METHOD, else fork)")
    p.set_defaults(func=_guarded(_cmd_node_join))

    p = subparsers.add_parser("nodes", help="list the cluster's nodes")
    _add_target(p)
    p.add_argument("--json", action="store_true")
    p.add_argument("--wait", type=int, default=0, metavar="N", help="first wait until at "
                   "least N nodes have joined (exit 1 if they have not within "
                   "--wait-timeout)")
    p.add_argument("--wait-timeout", type=float, default=120.0, metavar="S",
                   help="seconds --wait waits at most (default: 120; the coordinator "
                   "caps one wait at 300)")
    p.set_defaults(func=_guarded(_cmd_nodes))


def _add_job_commands(subparsers: Any) -> None:
    """``submit``, ``jobs [follow]``, ``logs`` and ``stop``: a cluster's jobs."""
    p = subparsers.add_parser("submit", help="submit a job from a YAML/JSON config")
    p.add_argument("config", metavar="CONFIG", help="config file with 'algorithm', config "
                   "keys, optional 'stop' and 'job' mappings")
    p.add_argument("--algorithm", "-a", help="algorithm (overrides the file's)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a config key (stop.KEY / job.KEY for those sections)")
    p.add_argument("--follow", "-f", action="store_true", help="print results until the job "
                   "ends")
    _add_target(p)
    p.set_defaults(func=_guarded(_cmd_submit))

    p.add_argument("--reconnect-timeout", type=float, default=120.0, metavar="S",
                   help="with --follow: seconds to keep reconnecting to a lost coordinator "
                   "(default: 120)")

    p = subparsers.add_parser("jobs", help="list jobs, or follow one (jobs follow JOB)")
    _add_target(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_guarded(_cmd_jobs))
    jobs_sub = p.add_subparsers(dest="jobs_command", metavar="ACTION")
    f = jobs_sub.add_parser("follow", help="re-attach to a running job: print its results "
                            "until it ends (exit 0 if it finished), across coordinator "
                            "restarts")
    f.add_argument("job", metavar="JOB", help="job id (a unique prefix is enough)")
    f.add_argument("--all", action="store_true", help="print every result from the first "
                   "(default: from the latest one)")
    f.add_argument("--reconnect-timeout", type=float, default=120.0, metavar="S",
                   help="seconds to keep reconnecting to a lost coordinator (default: 120)")
    _add_target(f)
    f.set_defaults(func=_guarded(_cmd_jobs_follow))

    p = subparsers.add_parser("logs", help="print a job's log")
    p.add_argument("job", metavar="JOB", help="job id (a unique prefix is enough)")
    p.add_argument("--actors", action="store_true", help="also print the end of every live "
                   "actor's output, fetched from its node")
    p.add_argument("--bytes", type=int, default=20_000, help="bytes per actor (default 20000)")
    _add_target(p)
    p.set_defaults(func=_guarded(_cmd_logs))

    p = subparsers.add_parser("stop", help="stop a job")
    p.add_argument("job", metavar="JOB", help="job id (a unique prefix is enough)")
    _add_target(p)
    p.set_defaults(func=_guarded(_cmd_stop_job))


def _guarded(handler: Any) -> Any:
    """``handler`` with expected errors printed as one clear line (exit 2 for usage)."""

    def run(args: argparse.Namespace) -> int:
        from actorrl.config.sections import ConfigError
        from transport.auth import InsecureBindError, KeyFileError

        try:
            return int(handler(args) or 0)
        except (CommandError, ConfigError, InsecureBindError, KeyFileError, ValueError,
                ConnectionError, TimeoutError, RuntimeError) as exc:
            print(f"actorrl: error: {exc}", file=sys.stderr)
            usage = (CommandError, ConfigError, InsecureBindError, KeyFileError, ValueError)
            return EXIT_USAGE if isinstance(exc, usage) else 1
        except PermissionError as exc:  # the coordinator refused this key's role
            print(f"actorrl: error: {getattr(exc, 'message', None) or exc}", file=sys.stderr)
            return 1

    run.__doc__ = handler.__doc__
    return run


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m actorrl.cli.cluster COMMAND ...``."""
    parser = argparse.ArgumentParser(prog="actorrl", description="actorrl cluster commands")
    register(parser.add_subparsers(dest="command", metavar="COMMAND", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
