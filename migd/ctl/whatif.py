"""``migctl what-if``: the cluster's own accounting in, a recommendation out (docs/demand.md, "What-if").

Reads ``sacct --parsable2`` (migd/whatif/sacct.py), replays it on ``--nodes`` nodes of the
configuration's candidates (the same model and policies as bench/demand.py: migd/whatif/), and
prints side by side what migd's demand mode, the current layout (the configuration's schedule, by the
clock) and the best fixed mix found in hindsight would have given.  ``--suggest DIR`` writes that mix
as profiles and a schedule migd loads.  Nothing on the node is read or changed: it runs anywhere, as
any user who may read the files.

migd.yaml is read by migd's own loader (migd.config.migdyaml), so what is weighed is what migd would
run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from migd.catalog.models import MODELS
from migd.config.migdyaml import Config, load_config
from migd.errors import ValidationError
from migd.exits import Exit
from migd.printable import shown
from migd.whatif.figures import table
from migd.whatif.policies import Setup
from migd.whatif.sacct import Record, SacctError, days_of, read_bounded, read_sacct
from migd.whatif.suggest import write_mig_parted, write_suggestion
from migd.whatif.weigh import BEST, Weighed, weigh
from migd.yamlsrc import read


def cmd_whatif(args: argparse.Namespace) -> int:
    try:
        record = _record(args)
        cfg = _config(Path(args.config))
        nodes = args.nodes or len(record.nodes)
        if nodes < 1:
            raise ValueError(f"{args.sacct}: names no node (no NodeList field): give --nodes N")
        waves = cfg.slurm.max_in_maintenance if cfg.slurm and cfg.slurm.max_in_maintenance else max(1, nodes // 8)
        setup = Setup.of(cfg, [MODELS[args.gpu]] * args.gpus, record.trace.start, waves, where=args.config)
    except (SacctError, ValidationError, ValueError, ArithmeticError, OSError) as e:
        print(shown(f"error: {e}"), file=sys.stderr)
        return Exit.INVALID
    weighed = weigh(setup, record.trace.jobs, nodes, waves, record.end_s, days_of(record), args.search,
                    reserve=args.slurm_backfill)
    written = []
    if args.suggest is not None:
        said = f"migctl what-if --sacct {args.sacct}: best fixed mix on {_nodes(nodes)} of {args.gpus} x {args.gpu}"
        try:
            written = write_suggestion(args.suggest, weighed.best_nodes, cfg.profiles, setup.candidates.names,
                                       cfg.timezone.key, said)
            write_mig_parted(args.suggest / "mig-parted.yaml", written, setup.candidates, said)
        except OSError as e:
            print(shown(f"error: --suggest {args.suggest}: {e.strerror or e}"), file=sys.stderr)
            return Exit.INVALID
    if args.output == "json":
        doc = _doc(args, record, setup, nodes, weighed)
        doc["suggested"] = [{"profile": w.profile, "layout": w.layout, "nodes": w.nodes,
                             "profile_file": str(w.profile_file), "config_file": str(w.config_file)} for w in written]
        print(json.dumps(doc, indent=1))
        return Exit.OK
    for line in _head(args, record, setup, nodes, waves):
        print(shown(line))
    for line in table(weighed.results).splitlines():
        print(shown(line))
    print(shown(_best_line(setup, weighed)))
    for w in written:
        print(shown(f"wrote {w.profile_file} ({w.nodes} of {nodes} nodes: {w.layout}) and {w.config_file} "
                    f"(migd --check --config {w.config_file})"))
    if written:
        print(shown(f"wrote {args.suggest / 'mig-parted.yaml'}: the same layouts as mig-parted configs (no owners)"))
    return Exit.OK


def _record(args: argparse.Namespace) -> Record:
    if args.sacct == "-":
        return read_sacct("<stdin>", read_bounded("<stdin>", sys.stdin.buffer), args.partition)
    return read_sacct(args.sacct, partition=args.partition)


def _config(path: Path) -> Config:
    """migd's configuration, as migd loads it; its text read here, so any user who may read it can
    weigh it (nothing is applied from it)."""
    return load_config(path, read(path, pipes=True))  # (a file or a pipe, at most yamlsrc.MAX_BYTES, UTF-8)


def _nodes(n: int) -> str:
    return f"{n} node" if n == 1 else f"{n} nodes"


def _head(args: argparse.Namespace, record: Record, setup: Setup, nodes: int, waves: int) -> list[str]:
    t = record.trace
    skipped = "".join(f"; not replayed: {n} {why}" for why, n in sorted(record.skipped.items()))
    out = [f"what-if: {args.sacct}: {len(t.jobs)} jobs replayed{skipped}",
           f"from {t.start:%a %Y-%m-%d %H:%M} for {record.end_s / 3600:.1f} h, {_nodes(nodes)} of {args.gpus} x "
           f"{args.gpu}, waves of {waves}; candidates {', '.join(setup.candidates.names)} ({args.config})"
           + ("; Slurm's backfill with reservations" if args.slurm_backfill else "")]
    offered = {k for lay in setup.layouts.values() for k, _ in lay.capacity}
    for mig_type in sorted({j.gres for j in t.jobs} - offered):
        n = sum(1 for j in t.jobs if j.gres == mig_type)
        out.append(f"note: {n} jobs ask {mig_type}, which no candidate offers on {args.gpu}: they start in no replay")
    wide = [j.nodes for j in t.jobs if j.nodes > nodes]
    if wide:
        out.append(f"note: {len(wide)} jobs ask more nodes (up to {max(wide)}) than the {_nodes(nodes)} replayed: "
                   "they start in no replay")
    return out


def _best_line(setup: Setup, w: Weighed) -> str:
    gpus = ", ".join(f"{n} {c}" for n, c in zip(w.best, setup.candidates.names, strict=True) if n)
    layouts = ", ".join(f"{n} x {lay}" for lay, n in _counted(w.best_nodes))
    return (f"{BEST}: {layouts} (GPUs: {gpus}), after {w.replays} replays from the mix sized by slice-hours; "
            "best found, not proven best")


def _counted(items: tuple[str, ...]) -> list[tuple[str, int]]:
    out: dict[str, int] = {}
    for i in items:
        out[i] = out.get(i, 0) + 1
    return sorted(out.items(), key=lambda kv: -kv[1])


def _doc(args: argparse.Namespace, record: Record, setup: Setup, nodes: int, w: Weighed) -> dict[str, Any]:
    return {"sacct": args.sacct, "config": args.config, "start": record.trace.start.isoformat(),
            "hours": round(record.end_s / 3600, 2), "jobs": len(record.trace.jobs), "skipped": dict(record.skipped),
            "nodes": nodes, "gpu": args.gpu, "gpus": args.gpus, "candidates": list(setup.candidates.names),
            "slurm_backfill": args.slurm_backfill,
            "policies": w.results, "best_fixed_gpus": dict(zip(setup.candidates.names, w.best, strict=True)),
            "best_fixed_nodes": list(w.best_nodes), "replays": w.replays}
