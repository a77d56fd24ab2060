"""The HTTP pull API: pull-and-ack and publish rates against the ceiling of the HTTP stack, same run.

    python bench/rest.py [--quick] [--json] [--runs N]

A fast client (Node's http with keep-alive, `bench/node/rest_clients.mjs`) drives ours
(`streaming-server --http_api_port`, LMDB, fsync per commit):
- publish: one 128-byte POST at a time to `/channels/{c}/messages` (each answered once stored);
- pull+ack, one consumer: POST `next/{n}` then POST the acknowledgement with `If-Match`, one at a
  time (each ack answered once stored): two requests per message;
- pull+ack, a queue group of 4 consumers, each pulling and acking one at a time, side by side.
The ceiling: in the same run, sequential POSTs to a trivial Starlette endpoint served by the same
hypercorn Trio worker (`streaming.http_listener.serve_asgi`) in a process of its own. Each figure is
the median of `--runs` (default 3; quick: 1). Full: 5,000 messages; quick: 1,000.

JSON keys: `ceiling_requests_per_s`, `publish_msgs_per_s`, `pull_ack_msgs_per_s`,
`pull_ack_requests_per_s`, `queue4_msgs_per_s`, `queue4_requests_per_s`, `*_server_us_per_request`
(the server process's CPU over the timed part, per request), and `pull_ack_fraction_of_ceiling` =
pull+ack requests/s over the ceiling's (target >= 0.4).
"""

from __future__ import annotations

import statistics
import sys
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402

from bench import peers  # noqa: E402
from bench.node_clients import NODE_DIR, ServerCpu, drive  # noqa: E402
from bench.report import arguments, machine, print_report, progress  # noqa: E402

CLIENTS = NODE_DIR / "rest_clients.mjs"


def serve_bare(port: int) -> None:
    """The ceiling's server: one Starlette route answering 204, on the same hypercorn Trio worker."""
    from functools import partial

    import trio
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    from streaming.http_listener import serve_asgi

    async def endpoint(request: Request) -> Response:
        await request.body()
        return Response(status_code=204)

    app = Starlette(routes=[Route("/", endpoint, methods=["POST"])])
    trio.run(partial(serve_asgi, app, "127.0.0.1", port, log_name="bench.bare"))


def server(bare: bool) -> AbstractContextManager[peers.Server]:
    """A fresh server: ours with its HTTP client port, or the ceiling's trivial endpoint."""
    if bare:
        return peers.http_server("rest-bare", [sys.executable, __file__, "--serve-bare", "{port}"])
    return peers.http_server("rest")


def run(argv: list[str], pid: int) -> dict[str, Any]:
    cpu = ServerCpu(pid)
    result = drive(["node", str(CLIENTS), *argv], cpu, "start")
    if not result.get("ok"):
        raise SystemExit(f"{argv[0]}: {result.get('error')}")
    result["server_us_per_request"] = cpu.seconds / result["requests"] * 1e6
    return result


def one_round(count: int) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    with server(bare=True) as srv:
        out["ceiling"] = run(["bare", f"http://127.0.0.1:{srv.port}/", str(count)], srv.pid)
    with server(bare=False) as srv:
        url, pid = f"http://127.0.0.1:{srv.port}", srv.pid
        out["publish"] = run(["publish", url, "one", str(count)], pid)
        out["pull_ack"] = run(["pull", url, "one", str(count), "1"], pid)
        run(["publish", url, "four", str(count)], pid)
        out["queue4"] = run(["pull", url, "four", str(count), "4"], pid)
    return out


def main() -> None:
    if sys.argv[1:2] == ["--serve-bare"]:
        serve_bare(int(sys.argv[2]))
        return
    parser = arguments(__doc__, quick="1,000 messages, one run (under a minute)")
    parser.add_argument("--runs", type=int, help="rounds (default 3, quick 1)")
    args = parser.parse_args()
    if not CLIENTS.exists() or not (NODE_DIR / "node_modules").exists():
        raise SystemExit("the Node clients are not installed: npm ci --prefix bench/node")
    console = Console(stderr=args.json)
    count = 1_000 if args.quick else 5_000
    runs = args.runs or (1 if args.quick else 3)
    rounds = []
    with progress(console) as bar:
        task = bar.add_task("rounds", total=runs)
        for _ in range(runs):
            rounds.append(one_round(count))
            bar.advance(task)
    result: dict[str, Any] = {"scale": "quick" if args.quick else "full", "machine": machine(), "messages": count}
    result["runs"] = runs

    def median(name: str, key: str) -> float:
        values = []
        for r in rounds:
            figure = r[name]
            values.append(float(figure[key] / figure["seconds"] if key in ("requests", "messages") else figure[key]))
        return statistics.median(values)

    result["ceiling_requests_per_s"] = round(median("ceiling", "requests"))
    result["publish_msgs_per_s"] = round(median("publish", "messages"))
    result["pull_ack_msgs_per_s"] = round(median("pull_ack", "messages"))
    result["pull_ack_requests_per_s"] = round(median("pull_ack", "requests"))
    result["queue4_msgs_per_s"] = round(median("queue4", "messages"))
    result["queue4_requests_per_s"] = round(median("queue4", "requests"))
    for name in ("ceiling", "publish", "pull_ack", "queue4"):
        result[f"{name}_server_us_per_request"] = round(median(name, "server_us_per_request"), 1)
    result["pull_ack_fraction_of_ceiling"] = round(
        result["pull_ack_requests_per_s"] / result["ceiling_requests_per_s"], 3
    )
    rows = [
        (k, f"{v:,}" if isinstance(v, int) else f"{v}", "") for k, v in result.items() if k.endswith(("_s", "request"))
    ]
    rows.append(("pull_ack_fraction_of_ceiling", f"{result['pull_ack_fraction_of_ceiling']}", ">= 0.4"))
    print_report(console, f"HTTP pull API, {count:,} messages ({result['scale']})", rows, result, args.json)


if __name__ == "__main__":
    main()
