"""Entry point of an actor process: ``python -m actorrl.runtime.node.actor_main PARENT ID DIR FD``
(spawned), or :func:`run` in a child of the fork server (forked).

Says hello to the parent node (receiving the class path and arguments), builds the actor
off the event loop, reports ready, then serves calls until told to exit or until the
parent's lifeline pipe closes.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys

from actorrl.runtime.network import Network
from actorrl.runtime.node.process import watch_lifeline
from actorrl.runtime.process.hosting import import_class
from actorrl.runtime.process.runtime import Runtime
from actorrl.runtime.process.scope import enter_scope
from transport.errors import RemoteError
from transport.sockets import new_event_loop

log = logging.getLogger("actorrl.actor")


async def serve_actor(parent: str, actor_id: str, session_dir: str, lifeline_fd: int) -> int:
    """Run one actor until exit; returns the process exit code."""
    # A cluster node passes its network down (tcp host, node tag, keys directory).
    runtime = Runtime.start(session_dir, f"actor-{actor_id}", network=Network.from_env())
    enter_scope(runtime.actor_scope())  # the constructor (run in a thread) is actor code
    loop = asyncio.get_running_loop()

    def parent_died() -> None:
        log.warning("parent process is gone; exiting")
        os._exit(3)

    watch_lifeline(loop, lifeline_fd, parent_died)
    node = runtime.client(parent)
    class_path, args, kwargs = await node.call("__actor_hello__", [actor_id], timeout_s=60)
    try:
        cls = import_class(class_path)
        instance = await asyncio.to_thread(cls, *args, **kwargs)
    except BaseException as exc:
        log.exception("could not build %s", class_path)
        await node.call("__actor_ready__", [actor_id, runtime.address,
                                            RemoteError.from_exception(exc)], timeout_s=30)
        runtime.close()
        return 1
    runtime.host_actor(instance)
    await node.call("__actor_ready__", [actor_id, runtime.address, None], timeout_s=30)
    await runtime.exit_event.wait()
    runtime.close()
    return 0


def run(argv: list[str]) -> int:
    """Run the actor described by ``argv`` (``PARENT ID DIR FD``) on a fresh event loop;
    returns its exit code. Used by spawned interpreters and by forked ones alike."""
    logging.basicConfig(level=os.environ.get("ACTORRL_LOG_LEVEL", "INFO"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    parent, actor_id, session_dir, fd = argv[:4]
    loop = new_event_loop()
    asyncio.set_event_loop(loop)
    return loop.run_until_complete(serve_actor(parent, actor_id, session_dir, int(fd)))


def main() -> None:
    """Parse argv and run the actor."""
    code = run(sys.argv[1:5])
    # Worker threads (torch, the actor executor) must not keep a finished actor alive.
    os._exit(code)


if __name__ == "__main__":
    main()
