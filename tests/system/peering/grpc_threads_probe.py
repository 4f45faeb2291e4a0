"""Run 400 gRPC stream round trips on loopback and print how often gRPC's threads woke.

Run as a script by test_grpc_tuning.py. With ``--tuned`` it imports the sidecar package first
(which applies sidecar.grpc_tuning), otherwise gRPC runs with its defaults. Prints one JSON
object: voluntary context switches per round trip of the threads named ``event_engine``.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

if "--tuned" in sys.argv:
    import sidecar  # noqa: F401  (applies the gRPC settings before grpc loads)

import grpc
import grpc.aio

ROUND_TRIPS = 400


def event_engine_wakeups() -> int:
    total = 0
    for task in Path("/proc/self/task").iterdir():
        try:
            if (task / "comm").read_text().strip() != "event_engine":
                continue
            for line in (task / "status").read_text().splitlines():
                if line.startswith("voluntary_ctxt_switches"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total


async def echo(requests, context):  # noqa: ARG001
    async for request in requests:
        yield request


async def main() -> None:
    handler = grpc.method_handlers_generic_handler(
        "probe.Echo", {"Stream": grpc.stream_stream_rpc_method_handler(echo)}
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.stream_stream("/probe.Echo/Stream")()
        await call.write(b"warm-up")
        await call.read()
        before = event_engine_wakeups()
        for i in range(ROUND_TRIPS):
            await call.write(b"x%d" % i)
            await call.read()
        after = event_engine_wakeups()
        await call.done_writing()
    await server.stop(None)
    print(json.dumps({"per_round_trip": (after - before) / ROUND_TRIPS}))


if __name__ == "__main__":
    asyncio.run(main())
