"""The demand mode (docs/demand.md) on the real one-node Slurm 22.05 cluster: the planner reads the
queue, records the wanted layout in the node's Extra, the node's migd follows it through the usual
Slurm switch; dry-run changes nothing; an ended lease, another planner and an unreachable slurmctld
each leave the node on its schedule or as it is."""

from __future__ import annotations

import re
import time
from datetime import timedelta

import pytest

from migd.api.demand import Source
from migd.ctl.text import daemon_table
from migd.daemon.clock import Clock
from migd.metrics.daemonstate import demand_families
from migd.slurm.want import Want
from tests.slurm_node import DAY_LAYOUT, NIGHT, NIGHT_LAYOUT, Node, pair_node  # noqa: F401  (a fixture)

pytestmark = pytest.mark.integration  # a real Slurm cluster


def demand(mode: str = "on", planner: str = "gpu1", interval: str = "1s", lease: str = "1h",
           candidates: str = "day, night", mixes: str | None = None) -> str:
    return (f"  demand:\n    mode: {mode}\n    planner: {planner}\n    candidates: [{candidates}]\n"
            f"    interval: {interval}\n    lease: {lease}\n" + (f"    mixes: {mixes}\n" if mixes else ""))


def notebooks(node: Node, n: int) -> list[str]:
    """``n`` notebook jobs: a 1g instance each, an hour's limit (queued: no node offers 1g now)."""
    return [node.cluster.submit("gpu:1g.10gb:1", "sleep 2", "-t", "60", "-A", "teaching") for _ in range(n)]


def test_notebooks_pending_at_night_switch_the_node_and_start(night_node: Node) -> None:
    c = night_node.cluster
    jobs = notebooks(night_node, 10)
    assert all(c.job_state(j) == "PENDING" for j in jobs)
    d = night_node.daemon(Clock(NIGHT), settings=demand())  # the schedule says night
    d.reconcile("demand")
    assert d.slurm is not None and d.slurm.demand is not None
    plan = d.slurm.demand.last_plan
    assert plan is not None and plan.error is None and len(plan.changes) == 1, plan
    # 10 jobs of 1 h just submitted: 10 slice-hours, and as many again each hour of the 4 h lookahead: 50,
    # under what the partition offers in the 8 h horizon (7 slices: 56); the day layout serves all 50
    assert plan.changes[0].startswith("gpu1: night -> day: gains 50.0 slice-hours"), plan.changes
    want = Want.parse(c.show()["Extra"])
    assert want is not None and want.layout == "day" and want.planner == "gpu1"
    assert night_node.layout() == DAY_LAYOUT and c.show()["Gres"] == "gpu:1g.10gb:7"
    doc = d.status.to_json()
    assert doc["active"]["reason"] == "demand" and doc["active"]["profile"] == "day"
    assert doc["demand"]["source"] == "planner" and doc["demand"]["plan"]["wanted_slice_h"] == {"1g.10gb": 50.0}
    table = daemon_table(d.status.view())
    assert "demand (on, planner gpu1): planner: planner gpu1 wants day" in table
    # (this cluster keeps no accounting, and the planner has seen no job end: limits are taken as they are)
    assert "  run times: every account runs to its limits (fewer than 10 ended jobs seen)\n" in table
    metrics = {f.name: {tuple(smp.labels.values()): smp.value for smp in f.samples}
               for f in demand_families(d.status.demand)}  # type: ignore[arg-type]
    assert metrics["migd_demand_following"] == {("planner",): 1, ("schedule",): 0, ("held",): 0}
    assert metrics["migd_demand_decision_changes"] == {("on",): 1} and metrics["migd_demand_run_time_share"] == {}
    c.wait(lambda: all(c.job_state(j) in ("GONE", "COMPLETING") for j in jobs), "the notebooks to run", 90)
    time.sleep(1.1)  # (the planner's interval)
    d.reconcile("reconcile")  # the queue is empty now: the node keeps day (hysteresis, no demand to move)
    assert night_node.layout() == DAY_LAYOUT
    plan = d.slurm.demand.last_plan  # the planner saw the node serve day: time to capacity observed
    assert plan is not None and plan.capacity_count == 1 and plan.capacity_last_s is not None
    assert 0 < plan.capacity_last_s < 300 and plan.changes == ()


def test_work_no_candidate_offers_is_named_and_the_planner_goes_on(shared_partition_node: Node) -> None:
    """A job of the partition asking a whole GPU's type (``--gres=gpu:a100:1``) raised ValueError in the
    planner's decision: every pass of the planner node's migd stopped there.  Now it, and a MIG type no
    candidate offers (3g: the candidates are day and night), are named, and the notebooks' work decided."""
    node = shared_partition_node
    c = node.cluster
    c.submit("gpu:a100:1", "sleep 2", "-t", "60")
    c.submit("gpu:3g.40gb:1", "sleep 2", "-t", "60")
    notebooks(node, 2)
    d = node.daemon(Clock(NIGHT), settings=demand(mode="dry-run"))
    d.reconcile("demand")
    assert d.slurm is not None and d.slurm.demand is not None
    plan = d.slurm.demand.last_plan
    assert plan is not None and plan.error is None and plan.unoffered == {"3g.40gb": 1, "a100": 1}, plan
    assert plan.changes and plan.changes[0].startswith("gpu1: night -> day"), plan.changes
    table = daemon_table(d.status.view())
    assert "  not offered by any candidate layout: a100 (1 pending job(s))\n" in table, table
    metrics = {f.name: {tuple(smp.labels.values()): smp.value for smp in f.samples}
               for f in demand_families(d.status.demand)}  # type: ignore[arg-type]
    assert metrics["migd_demand_unoffered_jobs"] == {("3g.40gb",): 1, ("a100",): 1}
    assert metrics["migd_demand_untyped_requests"] == {(): 0}


def test_dry_run_decides_and_changes_nothing(night_node: Node) -> None:
    c = night_node.cluster
    notebooks(night_node, 20)
    d = night_node.daemon(Clock(NIGHT), settings=demand(mode="dry-run"))
    d.reconcile("demand")
    assert d.slurm is not None and d.slurm.demand is not None
    plan = d.slurm.demand.last_plan
    assert plan is not None and plan.mode == "dry-run" and plan.writes == 0
    assert plan.changes and plan.changes[0].startswith("gpu1: night -> day")
    assert c.show().get("Extra", "") in ("", "(null)") and night_node.layout() == NIGHT_LAYOUT
    assert d.status.demand is not None and d.status.demand.source is Source.SCHEDULE


def test_an_ended_lease_or_another_planner_hands_the_node_to_its_schedule(night_node: Node) -> None:
    c = night_node.cluster
    now = int(time.time())
    d = night_node.daemon(Clock(NIGHT), settings=demand(planner="ctl9"))  # this node only follows
    for extra, why in ((f"migd:want=day,by=ctl9,at={now - 7200},until={now - 3600}", "lease ended"),
                       (f"migd:want=day,by=rogue,at={now},until={now + 3600}", "names planner rogue")):
        c.cmd("scontrol", "update", f"nodename={c.node}", f"extra={extra}")
        d.reconcile("reconcile")
        assert night_node.layout() == NIGHT_LAYOUT  # the schedule's night, not the want's day
        assert d.status.demand is not None and d.status.demand.source is Source.SCHEDULE
        assert why in d.status.demand.why, d.status.demand.why
    c.cmd("scontrol", "update", f"nodename={c.node}", f"extra=migd:want=day,by=ctl9,at={now},until={now + 3600}")
    d.reconcile("reconcile")
    assert night_node.layout() == DAY_LAYOUT  # the live want of its planner is followed


def test_a_planner_leaves_another_planners_live_wants_alone(night_node: Node) -> None:
    c = night_node.cluster
    now = int(time.time())
    theirs = f"migd:want=night,by=ctl9,at={now},until={now + 3600}"
    c.cmd("scontrol", "update", f"nodename={c.node}", f"extra={theirs}")
    notebooks(night_node, 20)
    d = night_node.daemon(Clock(NIGHT), settings=demand())
    d.reconcile("demand")
    assert d.slurm is not None and d.slurm.demand is not None and d.slurm.demand.last_plan is not None
    assert d.slurm.demand.last_plan.changes == () and c.show()["Extra"] == theirs
    assert any("follows planner ctl9" in s for s in d.slurm.demand.last_plan.skipped)


def test_an_unreachable_slurmctld_means_no_change(night_node: Node) -> None:
    c = night_node.cluster
    notebooks(night_node, 20)
    d = night_node.daemon(Clock(NIGHT - timedelta(hours=9)), settings=demand(), days="*")  # the schedule: day
    c.cmd("kill", c.dir.joinpath("run", "slurmctld.pid").read_text().strip())
    c.wait(lambda: not c.ok("scontrol", "ping"), "slurmctld to stop")
    d.reconcile("reconcile")
    assert night_node.layout() == NIGHT_LAYOUT  # neither the schedule's day nor a guess
    assert d.status.demand is not None and d.status.demand.source is Source.HELD
    assert d.slurm is not None and d.slurm.demand is not None and d.slurm.demand.last_plan is not None
    assert d.slurm.demand.last_plan.error is not None and d.slurm.demand.last_plan.changes == ()


def test_the_load_on_slurmctld_per_planner_decision_and_node_pass(night_node: Node) -> None:
    """What docs/demand.md states, measured with sdiag: a decision reads the partition's nodes and every
    job in one call each, whatever the queue's length; a node's pass reads its own record once (Slurm 22.05
    answers ``scontrol show node`` with a node and a partition RPC)."""
    c = night_node.cluster
    notebooks(night_node, 30)
    d = night_node.daemon(Clock(NIGHT), settings=demand(mode="dry-run"))
    assert d.slurm is not None and d.slurm.demand is not None
    c.cmd("sdiag", "-r")
    d.slurm.demand.plan(d.config.profiles, night_node.backend)
    planner = rpcs(c.cmd("sdiag"))  # scontrol show node asks for the partitions too (to print Partitions=)
    assert planner == {"REQUEST_NODE_INFO": 1, "REQUEST_PARTITION_INFO": 1, "REQUEST_JOB_INFO": 1}, planner
    follows = night_node.daemon(Clock(NIGHT), settings=demand(planner="ctl9"))  # a node that only follows
    assert follows.slurm is not None and follows.slurm.demand is not None
    c.cmd("sdiag", "-r")
    follows.slurm.demand.follow("night")
    assert rpcs(c.cmd("sdiag")) == {"REQUEST_NODE_INFO": 1, "REQUEST_PARTITION_INFO": 1}


def rpcs(sdiag: str) -> dict[str, int]:
    """The RPC counts by message type in sdiag's output (sdiag -r resets them), less sdiag's own."""
    part = sdiag.split("Remote Procedure Call statistics by message type")[1].split("Remote Procedure Call "
                                                                                      "statistics by user")[0]
    counts = {m.group(1): int(m.group(2)) for m in re.finditer(r"(\w+)\s+\(\s*\d+\)\s+count:(\d+)", part)}
    counts.pop("REQUEST_STATS_INFO", None)
    return counts


def test_demand_that_turns_around_does_not_flip_the_node_back(night_node: Node) -> None:
    """Notebooks switch the node to day; then they are cancelled and a 7g job waits: the node holds day
    for its minimum dwell (an hour), the decision saying so, instead of flapping back."""
    c = night_node.cluster
    jobs = notebooks(night_node, 20)
    d = night_node.daemon(Clock(NIGHT), settings=demand())
    d.reconcile("demand")
    assert night_node.layout() == DAY_LAYOUT
    for j in jobs:
        c.cmd("scancel", j)
    c.submit("gpu:7g.80gb:1", "sleep 1", "-t", "120", "-A", "nlp")
    time.sleep(1.1)
    d.reconcile("demand")
    assert night_node.layout() == DAY_LAYOUT
    assert d.slurm is not None and d.slurm.demand is not None and d.slurm.demand.last_plan is not None
    plan = d.slurm.demand.last_plan
    assert plan.changes == () and any("held: in day for 0 min of the 60 min minimum" in h for h in plan.held), plan


def test_a_per_gpu_mix_is_wanted_applied_published_and_served(pair_node: Node) -> None:  # noqa: F811
    """Two H100 NVL, both whole (night); a 7g job runs and a 2g job queues.  No candidate serves both
    on one node, a mix does (``mixes: true``; the default keeps nodes whole on Slurm, and its dry-run
    wants balanced: a type waiting with no place outranks 7g's last place, though 7g runs now and
    ``keep_place`` keeps a type seen within a day its place): the planner wants night/balanced
    (GPU 0 whole, GPU 1 balanced), the node drains
    until the 7g job ends, applies the candidates' own sections per GPU, Slurm gets the GRES of both,
    and the 2g job runs."""
    c = pair_node.cluster
    train = c.submit("gpu:7g.94gb:1", "sleep 8", "-t", "60", "-A", "nlp")
    c.wait(lambda: c.job_state(train) == "RUNNING", "the 7g job to start on the night layout", 60)
    serve = c.submit("gpu:2g.24gb:1", "sleep 1", "-t", "60", "-A", "serving")
    whole = pair_node.daemon(Clock(NIGHT), settings=demand("dry-run", candidates="day, night, balanced"))
    whole.reconcile("demand")
    assert whole.slurm is not None and whole.slurm.demand is not None and whole.slurm.demand.last_plan is not None
    assert [c.split(":")[1] for c in whole.slurm.demand.last_plan.changes] == [" night -> balanced"]
    d = pair_node.daemon(Clock(NIGHT), settings=demand(candidates="day, night, balanced", mixes="true"))
    d.reconcile("demand")
    assert d.slurm is not None and d.slurm.demand is not None and d.slurm.demand.last_plan is not None
    plan = d.slurm.demand.last_plan
    assert len(plan.changes) == 1 and plan.changes[0].startswith("gpu1: night -> night/balanced"), plan
    assert plan.changes[0].endswith("gives 2g.24gb a place to run")
    want = Want.parse(c.show()["Extra"])
    assert want is not None and want.layout == "night/balanced"

    def switched() -> bool:
        d.reconcile("reconcile")
        return [sorted(g[0] for g in gpu) for gpu in pair_node.migctl.layout()] == [
            ["7g.94gb"], ["1g.12gb", "1g.12gb", "2g.24gb", "3g.47gb"]]
    c.wait(switched, "the node to drain, then take the mix", 90)
    assert c.job_state(train) in ("GONE", "COMPLETING")  # (the 7g job ran to its end first)
    gres = c.show()["Gres"]
    assert all(f"gpu:{t}:1" in gres for t in ("7g.94gb", "2g.24gb", "3g.47gb")) and "gpu:1g.12gb:2" in gres, gres
    assert d.status.to_json()["active"]["profile"] == "night/balanced"
    c.wait(lambda: c.job_state(serve) in ("GONE", "COMPLETING"), "the 2g job to run on the carved GPU", 90)
