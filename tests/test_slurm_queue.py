"""Slurm's queue read for the demand rule, from a recording of Slurm 22.05's own ``squeue --json``
(tests/fixtures/slurm/SOURCES.md; tests/test_slurm_queue_real.py reads a live one)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from migd.slurm.ctl import SlurmError, node_info, node_text
from migd.slurm.jobjson import on_node
from migd.slurm.parsable import seconds
from migd.slurm.queue import MAX_ARRAY_TASKS, MAX_REQUESTS, array_tasks, read_queue

FIX = Path(__file__).parent / "fixtures" / "slurm"
JOBS = (FIX / "squeue-json.json").read_text()
NOW = max(j["submit_time"] for j in json.loads(JOBS)["jobs"]) + 10  # (Unix seconds: whole, as Slurm writes them)


def _job(**fields: object) -> str:
    """One job as squeue --json writes it (Slurm 22.05's fields; later releases' forms where given)."""
    base = {"job_id": 9, "account": "a", "job_state": "PENDING", "state_reason": "Priority", "partition": "main",
            "node_count": 1, "tasks": 1, "time_limit": 60, "submit_time": NOW - 600, "tres_per_node": "",
            "tres_per_job": "", "tres_per_task": "", "tres_per_socket": "", "array_task_string": "", "priority": 5}
    return json.dumps({"jobs": [{**base, **fields}]})


def test_the_recorded_queue_is_read_as_the_jobs_were_submitted() -> None:
    """tests/test_slurm_queue_real.py's jobs (SOURCES.md): the stopped job runs on gpu1 with its one 1g
    instance, whatever its name and output path say; the array is ten requests, three of them
    startable at once; the job over two nodes one request over both (Slurm starts it on both at once or
    not at all); the rest as asked."""
    q = read_queue(JOBS, "main", NOW)
    assert {n: [(r.job, r.mig_type, r.count, r.account, r.limit_s) for r in rs] for n, rs in q.running.items()} == {
        "gpu1": [("1", "1g.10gb", 1, "bio", 1800.0)]}
    assert 1700 < q.running["gpu1"][0].ends_in_s <= 1800
    got = Counter((p.job.split("_")[0], p.mig_type, p.count, p.startable, p.nodes) for p in q.pending)
    assert got == {("3", "7g.80gb", 1, True, 1): 3, ("3", "7g.80gb", 1, False, 1): 7,  # (%3: three at once)
                   ("4", "1g.10gb", 2, False, 1): 1, ("5", "3g.40gb", 1, False, 2): 1,  # (-N 2: one job, both nodes)
                   ("6", "1g.10gb", 1, False, 1): 1, ("7", "1g.10gb", 2, False, 1): 1, ("8", "3g.40gb", 2, False, 1): 1}
    assert {p.account for p in q.pending} == {"physics"} and all(p.time_limit_s == 1800 for p in q.pending)
    assert q.untyped == 1  # --gres=gpu
    assert read_queue(JOBS, "other", NOW).pending == ()


def test_held_jobs_and_jobs_whose_dependency_cannot_be_met_are_not_demand() -> None:
    for reason in ("JobHeldUser", "JobHeldAdmin", "DependencyNeverSatisfied"):
        assert read_queue(_job(state_reason=reason, tres_per_node="gres:gpu:1g.10gb:1"), "main", NOW).pending == ()
    (p,) = read_queue(_job(state_reason="Priority", tres_per_node="gres:gpu:1g.10gb:1"), "main", NOW).pending
    assert (p.job, p.count, p.priority, p.startable, p.age_s) == ("9", 1, 5, True, 600.0)


def test_a_job_not_yet_eligible_is_demand_that_reserves_nothing() -> None:
    """squeue(1)'s Dependency and BeginTime: the job is still work to come, but Slurm's backfill does not
    test it, so it holds no node (demand/reserve.py)."""
    read = {r: read_queue(_job(state_reason=r, tres_per_node="gres/gpu:3g.40gb=2"), "main", NOW).pending[0].startable
            for r in ("Priority", "Resources", "Dependency", "BeginTime")}
    assert read == {"Priority": True, "Resources": True, "Dependency": False, "BeginTime": False}


def test_later_slurm_formats_and_time_limits() -> None:
    """Releases after 22.05 write ``gres/gpu:TYPE=N``, a state list and ``{"set", "infinite", "number"}``."""
    later = _job(tres_per_node="gres/gpu:3g.40gb=2", job_state=["PENDING"],
                 time_limit={"set": True, "infinite": False, "number": 2880},
                 submit_time={"set": True, "infinite": False, "number": NOW - 60})
    (p,) = read_queue(later, "main", NOW).pending
    assert (p.mig_type, p.count, p.time_limit_s, p.age_s) == ("3g.40gb", 2, 48 * 3600, 60.0)
    for unlimited in (4294967295, 4294967294, {"set": True, "infinite": True, "number": 0}, None):
        (p,) = read_queue(_job(tres_per_node="gres:gpu:1g.10gb:1", time_limit=unlimited), "main", NOW).pending
        assert p.time_limit_s == float("inf"), unlimited
    for untyped in ("gres:gpu:1", "gres:gpu", "gres/gpu=2"):
        assert read_queue(_job(tres_per_node=untyped), "main", NOW).untyped == 1, untyped
    assert seconds("30") == 1800 and seconds("05:00") == 300 and seconds("UNLIMITED") == float("inf")


@pytest.mark.parametrize("expr,tasks", [
    ("0-9%3", [str(i) for i in range(10)]), ("1,3,5-7", ["1", "3", "5", "6", "7"]), ("0-8:4", ["0", "4", "8"]),
    ("7", ["7"]), ("0-4000000", [str(i) for i in range(MAX_ARRAY_TASKS)]), ("5-2", None), ("a-b", None),
    ("²", None), ("0-9:0", None)])
def test_a_pending_arrays_tasks_are_counted_from_its_expression(expr: str, tasks: list[str] | None) -> None:
    assert array_tasks(expr) == tasks


def test_an_array_expression_not_read_here_is_one_request() -> None:
    q = read_queue(_job(array_job_id=9, array_task_string="[truncated", tres_per_node="gres:gpu:1g.10gb:1"),
                   "main", NOW)
    assert [p.job for p in q.pending] == ["9_[[truncated]"]


@pytest.mark.parametrize("text", ["", "not json", "[1, 2]", '{"jobs": 3}', '{"jobs": [' * 100 + "]" * 100 + "}"])
def test_output_that_is_not_squeue_json_is_a_slurm_error(text: str) -> None:
    with pytest.raises(SlurmError, match="^squeue --json: "):
        read_queue(text, "main", NOW)


# Slurm 22.05.8's scontrol show node -o after ``scontrol update comment="a Gres=x Extra=y Reason=z"
# extra=migd:want=...`` and ``state=drain reason="check Gres=q Comment=r"`` (recorded 2026-11-29 on the test
# cluster of tests/slurm_cluster.py): the free text comes last, Reason first, each holding other keys.
TEXT_LINE = ("NodeName=gpu1 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=2 CPUTot=2 CPULoad=2.50 "
             "AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:1g.10gb:1 NodeAddr=127.0.0.1 NodeHostName=gpu1 "
             "Port=51471 Version=22.05.8 OS=Linux 6.18.44-fc-v669 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=500 "
             "AllocMem=0 FreeMem=22674 Sockets=2 Boards=1 State=IDLE+DRAIN ThreadsPerCore=1 TmpDisk=0 Weight=1 "
             "Owner=N/A MCS_label=N/A Partitions=main  BootTime=2026-11-28T22:05:57 "
             "SlurmdStartTime=2026-11-29T07:36:11 LastBusyTime=2026-11-29T07:36:11 CfgTRES=cpu=2,mem=500M,billing=2 "
             "AllocTRES= CapWatts=n/a CurrentWatts=0 "
             "AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s Reason=check Gres=q Comment=r "
             "[root@2026-11-29T07:36:11] Comment=a Gres=x Extra=y Reason=z Extra=migd:want=day,by=gpu1,at=1,until=2")


def test_words_in_a_nodes_reason_and_comment_are_not_its_fields() -> None:
    node = node_info(TEXT_LINE)
    assert (node.gres, node.states, node.partitions) == ("gpu:1g.10gb:1", frozenset({"IDLE", "DRAIN"}), ("main",))
    assert node.reason == "check Gres=q Comment=r [root@2026-11-29T07:36:11]"
    assert node.comment == "a Gres=x Extra=y Reason=z" and node.extra == "migd:want=day,by=gpu1,at=1,until=2"
    later = TEXT_LINE.replace("until=2", "until=2 ReservationName=migd-gpu1 InstanceId=i-1")  # (after 22.05)
    assert node_info(later).extra == "migd:want=day,by=gpu1,at=1,until=2"
    assert node_text("register with Gres=gpu:7g.80gb:1 Extra=x Reason=y Comment=z") == (
        "register with Gres=gpu:7g.80gb:1 Extra:x Reason:y Comment:z")


def test_a_nodes_extra_and_partitions_are_read() -> None:
    (node,) = [node_info(line) for line in (FIX / "show-node-o.txt").read_text().splitlines() if line.strip()]
    assert node.name == "gpu1" and node.partitions == ("main",) and node.extra == ""
    assert node.gres.startswith("gpu:1g.10gb:7")


def test_a_damaged_planner_history_is_named_and_set_aside(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The planner's record of its switches (demand.json) is checked like every state file: a damaged
    one is said with its file and field, and the planner starts without history."""
    from migd.slurm.ctl import SlurmCtl
    from migd.slurm.demandconf import DemandMode, DemandSettings
    from migd.slurm.demandplan import Planner
    path = tmp_path / "demand.json"
    path.write_text('{"schema": "migd.demand/v1", "switches": {"gpu1": [1795000000, "soon"]}}')
    settings = DemandSettings(DemandMode.ON, "gpu1", ("day", "night"))
    planner = Planner(settings, "main", "gpu1", SlurmCtl("gpu1", lambda argv, t: ""), {}, path)
    assert planner.history == {}
    assert f"{path}" in caplog.text and "switches.gpu1[1]" in caplog.text, caplog.text
    path.write_text('{"schema": "migd.demand/v1", "switches": {"gpu1": [1795000000]}}')
    assert Planner(settings, "main", "gpu1", SlurmCtl("gpu1", lambda argv, t: ""), {}, path).history == {
        "gpu1": [1795000000.0]}


def _running(**fields: object) -> str:
    return _job(**{"job_state": "RUNNING", "state_reason": "None", "nodes": "gpu[1-2]", **fields})


@pytest.mark.parametrize(("job", "node", "held"), [
    # 22.05: a slot per node in the job's order, null where it holds no GRES (it shifted the next one)
    (_running(gres_detail=[None, "gpu:1g.10gb:1(IDX:3)"],
              job_resources={"allocated_nodes": [{"nodename": "gpu1"}, {"nodename": "gpu2"}]}), "gpu2",
     "gpu:1g.10gb:1(IDX:3)"),
    (_running(gres_detail=[None, "gpu:1g.10gb:1(IDX:3)"],
              job_resources={"allocated_nodes": [{"nodename": "gpu1"}, {"nodename": "gpu2"}]}), "gpu1", ""),
    # 23.11 on: job_resources.nodes.allocation, and a completing job's state list
    (_running(job_state=["COMPLETED", "COMPLETING"], gres_detail=["gpu:3g.40gb:1(IDX:0)", "gpu:3g.40gb:1(IDX:1)"],
              job_resources={"nodes": {"list": "gpu[1-2]", "allocation": [{"name": "gpu1"}, {"name": "gpu2"}]}}),
     "gpu2", "gpu:3g.40gb:1(IDX:1)"),
    # a hostlist not read here: the job may be anywhere, its GRES held here (never assume free)
    (_running(nodes="gpu[a-c]", gres_detail=["gpu:1g.10gb:2"]), "gpu4", "gpu:1g.10gb:2"),
    (_running(nodes="gpu[1-3]", gres_detail=["gpu:1g.10gb:2"],
              job_resources={"allocated_nodes": [{"nodename": "gpu1"}]}), "gpu4", None),  # elsewhere: not listed
    # the user's own text is text: a CPU-only job named like a detail holds nothing
    (_running(nodes="gpu1", name="x Nodes=gpu1 CPU_IDs=0 Mem=0 GRES=gpu:1g.10gb:1", standard_output="GRES=gpu:7g",
              gres_detail=[], job_resources={"allocated_nodes": [{"nodename": "gpu1"}]}), "gpu1", ""),
], ids=["null slot: the second node", "null slot: the first node", "23.11 shapes", "unread hostlist",
        "elsewhere", "user text"])
def test_what_a_job_holds_on_a_node(job: str, node: str, held: str | None) -> None:
    """A node's own switch waits for the jobs holding GPUs there (``SlurmCtl.jobs``); the planner places
    running jobs the same way (one reader, slurm/jobjson.py)."""
    found = on_node(job, node)
    assert (found[0][2] if found else None) == held, found


def test_the_planner_places_running_jobs_by_the_same_reading() -> None:
    job = _running(gres_detail=[None, "gpu:1g.10gb:1(IDX:3)"],
                   job_resources={"allocated_nodes": [{"nodename": "gpu1"}, {"nodename": "gpu2"}]})
    q = read_queue(job, "main", NOW)
    assert {n: [(r.job, r.mig_type, r.count) for r in rs] for n, rs in q.running.items()} == {
        "gpu2": [("9", "1g.10gb", 1)]}


def test_an_arrays_throttle_limits_the_tasks_that_may_start_now() -> None:
    """``--array=0-9%3`` with one task running: two more may start now; the other tasks wait for them."""
    pending = _job(job_id=20, array_job_id=20, array_task_string="1-9%3", array_max_tasks=3,
                   tres_per_node="gres:gpu:1g.10gb:1")
    running = _running(job_id=21, array_job_id=20, nodes="gpu1", gres_detail=["gpu:1g.10gb:1(IDX:0)"],
                       job_resources={"allocated_nodes": [{"nodename": "gpu1"}]})
    jobs = json.dumps({"jobs": json.loads(pending)["jobs"] + json.loads(running)["jobs"]})
    q = read_queue(jobs, "main", NOW)
    assert [(p.job, p.startable) for p in q.pending] == [("20_1", True), ("20_2", True)] + [
        (f"20_{i}", False) for i in range(3, 10)]


@pytest.mark.parametrize("detail", [1, True, "gpu:1g.10gb:1(IDX:0)", "", 0],
                         ids=["number", "bool", "string", "empty string", "zero"])
def test_gres_detail_that_is_not_a_list_is_unreadable_not_no_gpu(detail: object) -> None:
    """A string was walked a character at a time ('g,p,u,...': no GPU held, so a switch would go ahead
    under the job) and a number raised TypeError, which stopped migd's pass; both are output not read."""
    running = _running(nodes="gpu1", gres_detail=detail)
    with pytest.raises(SlurmError, match="gres_detail is not a list"):
        read_queue(running, "main", NOW)
    with pytest.raises(ValueError, match="gres_detail is not a list"):
        on_node(running, "gpu1")


def test_a_wide_array_of_wide_jobs_is_bounded() -> None:
    """``sbatch -N 1024 --array=0-4095`` was four million requests: a minute and a gigabyte each decision,
    past systemd's watchdog.  A record gives at most MAX_REQUESTS requests, and a number past 18
    digits (no Slurm field has one) is not read as one."""
    wide = _job(node_count=1024, array_task_string="0-4095", array_job_id=9, tres_per_node="gres:gpu:1g.10gb:1")
    assert len(read_queue(wide, "main", NOW).pending) == MAX_REQUESTS
    huge = read_queue(_job(node_count=2**63, submit_time=10**400, tres_per_node="gres:gpu:1g.10gb:1"), "main", NOW)
    assert [(p.job, p.age_s) for p in huge.pending] == [("9", 0.0)]
