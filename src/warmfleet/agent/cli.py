"""``warmfleet cache ...``: prefetch, ls, verify, pin, unpin, gc, agent."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from pydantic import ValidationError
from rich.console import Console

from warmfleet.cache.config import (
    CapacitySpec,
    DownloadSpec,
    NodeCacheConfig,
    NodeCacheSpec,
    load_node_config,
    parse_size,
)
from warmfleet.cache.uri import parse_uri
from warmfleet.core.errors import CacheError, NotFoundError, WarmfleetError
from warmfleet.core.failures import EXPECTED_EXIT, one_line
from warmfleet.display import (
    Column,
    CommandGroup,
    FormatOpt,
    Grid,
    LogLevel,
    OutputFormat,
    WideOpt,
    emit,
    output_console,
    short_ids,
    size,
)
from warmfleet.edge import read_text_file

if TYPE_CHECKING:
    from warmfleet.agent.manager import CacheManager
    from warmfleet.cache.index import CacheIndex

cache_app = typer.Typer(
    cls=CommandGroup, no_args_is_help=True, help="Node-local model and image cache."
)
T = TypeVar("T")

# readable=False: the commands read these themselves, so a refused read is one line, not
# click's box (click checks readability before the command runs)
DestOpt = Annotated[
    Path | None,
    typer.Option("--dest", help="Cache root (default $WARMFLEET_CACHE_ROOT)", readable=False),
]
ConfigOpt = Annotated[
    Path | None, typer.Option("--config", help="node.yaml (NodeCacheConfig)", readable=False)
]
BudgetOpt = Annotated[str | None, typer.Option("--budget", help="Cache budget, e.g. 200GiB")]
ReserveOpt = Annotated[
    str | None,
    typer.Option(
        "--reserve", help="Disk space always left free, e.g. 2GiB (default: 5 %, <= 10GiB)"
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable output")]


def default_root() -> Path:
    env = os.environ.get("WARMFLEET_CACHE_ROOT")
    return Path(env) if env else Path.home() / ".cache" / "warmfleet"


def build_spec(
    dest: Path | None,
    config: Path | None,
    budget: str | None = None,
    reserve: str | None = None,
    *,
    create: bool = True,
    **download: Any,
) -> NodeCacheSpec:
    """From node.yaml if given, else defaults: budget = file system size, reserve = 5 % of it
    (at most 10 GiB). What the command line gives (``--dest``, ``--budget``, ``--reserve``, the
    download options) wins over either. ``create=False`` (the commands that only look at a
    cache: ls, verify, pin, unpin, gc): a missing cache root the user named (``--dest``, or
    node.yaml's) is a NotFoundError (one line, exit 2), never created (a mistyped --dest would
    become an empty cache); the default root is made, empty, as a fresh machine has none."""
    if config is not None:
        spec = load_node_config(read_text_file(config), str(config)).spec
        root = dest if dest is not None else Path(spec.root)
        capacity: dict[str, Any] = spec.capacity.model_dump()
        dl: dict[str, Any] = spec.download.model_dump()
    else:
        spec = None
        root = dest or default_root()
    if not create and (dest is not None or config is not None) and not root.is_dir():
        what = "not a directory" if root.exists() else "no such directory"
        raise NotFoundError(f"no cache at {root} ({what}; `warmfleet cache prefetch` makes one)")
    if spec is None:
        root.mkdir(parents=True, exist_ok=True)
        st = os.statvfs(root)
        total = st.f_blocks * st.f_frsize
        capacity = {"budget": total, "reserve": min(total // 20, 10 * 2**30)}
        dl = {}
    if budget:
        capacity["budget"] = _size_option(budget, "--budget")
    if reserve:
        capacity["reserve"] = _size_option(reserve, "--reserve")
    dl.update({k: v for k, v in download.items() if v is not None})
    try:
        parts = {"capacity": CapacitySpec(**capacity), "download": DownloadSpec(**dl)}
    except ValidationError as err:  # e.g. --chunk 0 / abc, --concurrency 0: a usage error
        first = err.errors()[0]
        flag = "--" + str(first["loc"][0]).replace("_", "-") if first["loc"] else None
        raise typer.BadParameter(first["msg"], param_hint=flag) from None
    if spec is not None:
        return spec.model_copy(update={"root": str(root), **parts})
    return NodeCacheSpec(root=str(root), **parts)


def _size_option(value: str, flag: str) -> int:
    try:
        return parse_size(value)
    except ValueError as err:  # a usage error (exit 2), not a traceback
        raise typer.BadParameter(str(err), param_hint=flag) from err


def _run(fn: Callable[[], Awaitable[T]]) -> T:
    try:
        return asyncio.run(fn())  # type: ignore[arg-type]
    except WarmfleetError as err:
        # one line, never wrapped, and the message is not read as rich markup (a path or URL
        # with "[...]" in it is printed as it is)
        typer.echo(f"error: {one_line(str(err))}", err=True)
        raise typer.Exit(1) from None


async def _with_manager(spec: NodeCacheSpec, fn: Callable[[CacheManager], Awaitable[T]]) -> T:
    from warmfleet.agent.manager import CacheManager  # noqa: PLC0415 (keeps the CLI fast)
    from warmfleet.agent.sourceset import SourceSet  # noqa: PLC0415
    from warmfleet.agent.store import Store  # noqa: PLC0415

    async with SourceSet(spec.sources, spec.download) as sources:
        manager = CacheManager(Store(Path(spec.root)), spec, sources)
        return await fn(manager)


@cache_app.command()
def prefetch(  # noqa: PLR0917 (typer maps parameters to options)
    uri: Annotated[str, typer.Argument(help="path, http(s)://, s3://, hf://org/model, oci://")],
    revision: Annotated[str | None, typer.Option(help="HF revision (pinned to a commit)")] = None,
    dest: DestOpt = None,
    config: ConfigOpt = None,
    budget: BudgetOpt = None,
    reserve: ReserveOpt = None,
    name: Annotated[str | None, typer.Option(help="Artifact name")] = None,
    ref: Annotated[str | None, typer.Option(help="Holder that references it")] = None,
    pin: Annotated[bool, typer.Option(help="Pin it (never evicted)")] = False,
    concurrency: Annotated[int | None, typer.Option(help="Parallel ranged requests")] = None,
    chunk: Annotated[str | None, typer.Option(help="Chunk size, e.g. 8MiB")] = None,
    bandwidth_limit: Annotated[str | None, typer.Option(help="Bytes/s cap, e.g. 200MB")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Resolve, admit, download, verify and publish one artifact."""
    spec = build_spec(
        dest,
        config,
        budget,
        reserve,
        concurrency=concurrency,
        chunk=chunk,
        bandwidth_limit=bandwidth_limit,
    )

    if "://" not in uri and Path(uri).exists():
        uri = str(Path(uri).resolve())  # a relative path (parse_uri takes absolute ones)
    kind = parse_uri(uri).kind  # a bad URI: one line (warmfleet.cli), before any task starts

    async def go(manager: CacheManager) -> dict[str, Any]:
        from warmfleet.agent.prefetch_progress import show_progress  # noqa: PLC0415

        task = asyncio.create_task(
            manager.prefetch(uri, revision=revision, name=name, holder=ref, pin=pin)
        )
        if not as_json:
            await show_progress(manager, task, kind)
        rec = await task
        return rec.to_json()

    _print_ready(_run(lambda: _with_manager(spec, go)), Path(spec.root), as_json)


def _print_ready(doc: dict[str, Any], root: Path, as_json: bool) -> None:
    """The prefetched artifact's record: as JSON, or one line naming where it is."""
    if as_json:
        typer.echo(json.dumps(doc))
        return
    Console().print(
        f"[green]ready[/green] {doc['name']} {doc['key'][:16]} -> {root / 'objects' / doc['key']}",
        soft_wrap=True,  # one line (a path cut in two cannot be copied)
    )


LS_COLUMNS = (
    Column("key", left=True),
    Column("name", left=True, wrap=True),
    Column("state", left=True),
    Column("size"),
    Column("done", drop=3),
    Column("pinned", left=True, drop=1),
    Column("refs", left=True, wrap=True, drop=2),
    Column("revision/reason", left=True, wrap=True, drop=4),
)


@cache_app.command("ls")
def list_artifacts(
    dest: DestOpt = None,
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
    fmt: FormatOpt = OutputFormat.table,
    wide: WideOpt = False,
) -> None:
    """List cached artifacts with state, size, refs and pins; the key column is a short prefix
    that pin, unpin and verify accept."""
    spec = build_spec(dest, config, create=False)

    async def go(manager: CacheManager) -> list[dict[str, Any]]:
        recs = {r.key: r for r in manager.records()}
        out = []
        for st in manager.statuses():
            doc = {**recs[st.key].to_json(), **st.to_json()}
            out.append(doc)
        return out

    docs = _run(lambda: _with_manager(spec, go))
    short = short_ids(d["key"] for d in docs)
    grid = Grid("", LS_COLUMNS)
    for d in docs:
        grid.add(
            short[d["key"]],
            d["name"],
            d["state"],
            size(d["size_bytes"]),
            size(d["bytes_done"]),
            "yes" if d["pinned"] else "",
            ", ".join(d["refs"]),
            d["reason"] or d["extra"].get("revision", "") or d["extra"].get("digest", ""),
        )
    emit(grid, OutputFormat.json if as_json else fmt, wide=wide, document=docs)


def _index(spec: NodeCacheSpec) -> CacheIndex:
    from warmfleet.agent.store import Store  # noqa: PLC0415 (keeps the CLI fast)

    return Store(Path(spec.root)).read_index()


def resolve_keys(index: CacheIndex, keys: list[str], command: str) -> list[str]:
    """The full keys of ``keys`` (a key, a unique prefix of at least 6 characters, or a name
    with one version); an unknown or ambiguous one is one line on stderr and exit 2."""
    out = []
    for key in keys:
        try:
            out.append(index.resolve(key).key)
        except (NotFoundError, CacheError) as err:
            hint = " (a key prefix needs at least 6 characters)" if len(key) < 6 else ""
            typer.echo(f"warmfleet cache {command}: {one_line(str(err))}{hint}", err=True)
            raise typer.Exit(EXPECTED_EXIT) from None
    return out


@cache_app.command()
def verify(
    keys: Annotated[
        list[str] | None, typer.Argument(help="Keys, key prefixes or names (default: all ready)")
    ] = None,
    full: Annotated[bool, typer.Option("--full", help="Re-hash every file")] = False,
    dest: DestOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Check published artifacts (sizes + markers, or full re-hash); bad ones are unpublished."""
    spec = build_spec(dest, config, create=False)
    index = _index(spec)
    resolved = resolve_keys(index, keys or [], "verify")
    short = short_ids(r.key for r in index)

    async def go(manager: CacheManager) -> list[Any]:
        return await manager.verify(full=full, keys=resolved or None)

    results = _run(lambda: _with_manager(spec, go))
    console = output_console()
    for res in results:
        mark = "[green]ok[/green]" if res.ok else f"[red]FAILED[/red] {res.reason}"
        console.print(f"{short.get(res.key, res.key[:8])} {mark}")
    if not all(r.ok for r in results):
        raise typer.Exit(1)


def _set_pin(key: str, pinned: bool, dest: Path | None, config: Path | None) -> None:
    spec = build_spec(dest, config, create=False)
    index = _index(spec)
    (full_key,) = resolve_keys(index, [key], "pin" if pinned else "unpin")

    async def go(manager: CacheManager) -> str:
        return manager.set_pinned(full_key, pinned).key

    done = _run(lambda: _with_manager(spec, go))
    short = short_ids(r.key for r in index)
    output_console().print(f"{'pinned' if pinned else 'unpinned'} {short.get(done, done)}")


@cache_app.command()
def pin(key: str, dest: DestOpt = None, config: ConfigOpt = None) -> None:
    """Pin an artifact (key, key prefix or name): it is never evicted."""
    _set_pin(key, True, dest, config)


@cache_app.command()
def unpin(key: str, dest: DestOpt = None, config: ConfigOpt = None) -> None:
    """Remove a pin (key, key prefix or name)."""
    _set_pin(key, False, dest, config)


@cache_app.command()
def gc(
    evict_all: Annotated[bool, typer.Option("--all", help="Evict every unreferenced")] = False,
    dest: DestOpt = None,
    config: ConfigOpt = None,
    budget: BudgetOpt = None,
    reserve: ReserveOpt = None,
) -> None:
    """Evict unreferenced, unpinned artifacts (LRU, down to the low watermark)."""
    spec = build_spec(dest, config, budget, reserve, create=False)

    async def go(manager: CacheManager) -> Any:
        return manager.gc(evict_all_unreferenced=evict_all)

    plan = _run(lambda: _with_manager(spec, go))
    Console().print(
        f"evicted {len(plan.evict)} artifacts, dropped {len(plan.discard)} failed downloads, "
        f"freed {size(plan.freed_bytes)}"
    )


@cache_app.command()
def agent(
    config: Annotated[Path, typer.Option("--config", help="node.yaml", readable=False)],
    log_level: Annotated[
        LogLevel,
        typer.Option(
            "--log-level",
            case_sensitive=False,
            help="info: what it fetches and serves; on stderr",
        ),
    ] = LogLevel.info,
) -> None:
    """Run the node agent until SIGTERM / SIGINT, logging what it fetches and serves."""
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    cfg: NodeCacheConfig = load_node_config(read_text_file(config), str(config))

    async def go() -> None:
        from warmfleet.agent.node_agent import NodeAgent  # noqa: PLC0415

        node = NodeAgent(cfg)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, node.stop_event.set)
        await node.run()

    _run(go)
