"""``migctl apply``'s account beyond its table: a refusal written as the document ``-o json|yaml`` asked
for, and what a local apply made while migd is stopped does to a manual apply kept on disk."""

from __future__ import annotations

import argparse
import sys
from datetime import datetime, timezone
from pathlib import Path

from migd.apply.executor import Applier
from migd.apply.planning import touched
from migd.apply.relabel import owners_only
from migd.apply.result import ApplyResult
from migd.ctl.remote import control_socket, out
from migd.hardware.ports import GpuBackend
from migd.paths import StateFile, listening
from migd.printable import shown
from migd.profiles.loader import load_profile
from migd.profiles.model import Profile
from migd.report import refused_doc
from migd.state.override import OverrideStore, supersede


def refused_out(args: argparse.Namespace, backend: GpuBackend, state_dir: Path, profile: Profile | None,
                why: str) -> None:
    """An apply refused before it began (busy instances), with ``-o json|yaml``: a ``migd.apply/v1`` that
    says so (``error``; ``results`` empty), with the plan it refused; the table's account is the one
    line on stderr.  ``profile``: None when migd refused it (read here again from the text sent)."""
    if args.output == "table":
        return
    if profile is None:
        profile = load_profile("<stdin>" if args.file == "-" else args.file, args.config, text=args.profile_text)
    applier = Applier(backend, state_dir)
    plans, lost = applier.plan_each(profile, args.mode_only)
    out(args, refused_doc(profile.name, plans, touched(profile, lost), args.dry_run, why,
                          owners_only(plans, applier.owners.load())), "")


def kept_hold(args: argparse.Namespace, state_dir: Path, profile: Profile, result: ApplyResult) -> None:
    """A local apply while migd is stopped, and a manual apply kept on disk: migd's next start would put the
    older one back over this one.  Done, this apply takes its place, until the same transition; not done
    (failed, or ``--mode-only``, which leaves the instances to it), the kept one is said to stay.  Either
    way one line says how to lift it.  Nothing is kept for a running migd (``--force-local``): its hold
    is in its memory, and it reconciles."""
    store = OverrideStore(StateFile.OVERRIDE.at(state_dir))
    if args.dry_run or not store.path.exists() or listening(control_socket(args)):
        return
    kept = store.load()  # (a damaged one is said and set aside by the load)
    if kept is None:
        return
    if result.ok and not args.mode_only:
        path = "<stdin>" if args.file == "-" else str(Path(args.file).resolve())
        held = supersede(store, kept, load_profile(path, args.config, text=profile.text), datetime.now(timezone.utc))
        line = (f"{profile.name} holds in place of the kept manual apply of {kept.profile.name} until "
                f"{_until(held.until)}: migd takes it up at its next start; `migctl resume` drops it")
    else:
        line = (f"the kept manual apply of {kept.profile.name} ({store.path}) still holds: migd puts it back at its "
                f"next start, until {_until(kept.until)}; `migctl resume` drops it")
    table = args.output == "table"  # (stdout holds the document otherwise)
    print(shown(line if table else f"note: {line}"), file=sys.stdout if table else sys.stderr)


def _until(when: datetime | None) -> str:
    return when.isoformat() if when else "the schedule has no further transition"
