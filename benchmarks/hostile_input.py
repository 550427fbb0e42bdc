"""Decode cost of hostile headers: how long the codec takes to refuse a hash-flooding map
(20,000 colliding tuple keys) and to decode the costliest header just under the 1 MB cap
(nested empty lists). The unit tests check that these are refused or decoded; how fast is
measured here (the old in-test thresholds were 0.5 s and 0.25 s on the 2-core dev machine).

Prints one JSON object with the best of ``--repeat`` runs, in seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import msgpack  # noqa: E402

from tests.helpers.wire import colliding_key_map  # noqa: E402
from transport.codec import Codec, DecodeError  # noqa: E402


def best_of(repeat: int, fn: Callable[[], object]) -> float:
    """The fastest of ``repeat`` timed calls of ``fn``, in seconds."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> None:
    """Time both hostile decodes and print them."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    codec = Codec()
    flood = colliding_key_map(20_000)
    nested = msgpack.packb([[[]]] * ((codec.max_header_bytes - 16) // 3))

    def refuse_flood() -> None:
        try:
            codec.decode([flood])
        except DecodeError:
            return
        raise AssertionError("the hash-flooding map was not refused")

    print(json.dumps({
        "colliding_map_refusal_s": round(best_of(args.repeat, refuse_flood), 4),
        "nested_header_decode_s": round(best_of(args.repeat,
                                                lambda: codec.decode([nested])), 4),
    }))


if __name__ == "__main__":
    main()
