"""``migctl what-if --sacct`` on records no sacct prints: each is refused in one line naming the file,
line and field (exit 2, nothing printed on standard output), in a second, never a traceback or a
replay that runs for ever.  Each case is the good row beside one bad one, as a user's file would be."""

from __future__ import annotations

import io
import os
import threading
import time
from pathlib import Path

import pytest

from migd import trust
from migd.ctl.migctl import main as migctl
from migd.whatif import sacct
from migd.whatif.jobs import MAX_NODES
from migd.whatif.sacct import SacctError, read_sacct

REPO = Path(__file__).resolve().parents[1]
HEADER = "JobID|Submit|Start|End|Account|Partition|Timelimit|AllocTRES|ReqTRES|NNodes|NodeList|State"
GOOD = ("1|2026-11-28T03:00:00|2026-11-28T03:01:00|2026-11-28T04:00:00|a|gpu|01:00:00|gres/gpu:1g.10gb=2|"
        "gres/gpu:1g.10gb=2|1|n1|COMPLETED")
FIELDS = HEADER.split("|")


def row(**fields: str) -> str:
    """The good row as job 2, with ``fields`` (by header name) replaced."""
    values = dict(zip(FIELDS, GOOD.split("|"), strict=True)) | {"JobID": "2"} | fields
    return "|".join(values[f] for f in FIELDS)


@pytest.fixture
def config(tmp_path: Path) -> Path:
    cfg = tmp_path / "migd.yaml"
    cfg.write_text((REPO / "bench" / "demand.yaml").read_text().replace(
        "profiles_dir: ../profiles", f"profiles_dir: {REPO / 'profiles'}"))
    return cfg


def what_if(tmp_path: Path, config: Path, line: str, capsys: pytest.CaptureFixture[str],
            *options: str) -> tuple[int, str, str]:
    path = tmp_path / "jobs.sacct"
    path.write_text(f"{HEADER}\n{GOOD}\n{line}\n")
    code = migctl(["what-if", "--sacct", str(path), "--config", str(config), "--search", "2", *options])
    got = capsys.readouterr()
    return code, got.out, got.err


def refused(tmp_path: Path, config: Path, line: str, capsys: pytest.CaptureFixture[str], said: str) -> None:
    code, out, err = what_if(tmp_path, config, line, capsys, "--nodes", "1")
    assert (code, out) == (2, "")
    assert err.startswith(f"error: {tmp_path / 'jobs.sacct'}:3: ") and said in err, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err


@pytest.mark.parametrize("field", ["Submit", "Start", "End"])
def test_a_time_with_a_utc_offset_is_refused_where_it_is(tmp_path: Path, config: Path, field: str,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """sacct prints slurmctld's local time without an offset; one with an offset beside those could be
    compared with none of them."""
    aware = dict(zip(FIELDS, GOOD.split("|"), strict=True))[field] + "+05:00"
    refused(tmp_path, config, row(**{field: aware}), capsys, f"{field}: '{aware}' has a UTC offset")


def test_what_a_row_check_misses_is_still_named_by_its_line(tmp_path: Path, config: Path,
                                                             monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """The net under the checks: a row that fails in a way no check foresaw is its file and line."""
    def unforeseen(_row: object) -> set[str]:
        raise TypeError("something no check foresaw")
    monkeypatch.setattr("migd.whatif.sacct._nodes", unforeseen)
    path = tmp_path / "jobs.sacct"
    path.write_text(f"{HEADER}\n{GOOD}\n")
    assert migctl(["what-if", "--sacct", str(path), "--config", str(config), "--nodes", "1"]) == 2
    assert capsys.readouterr().err == f"error: {path}:2: something no check foresaw\n"


MANY = "9" * 5000  # int() refuses 4,300 digits or more


@pytest.mark.parametrize("fields,said", [
    ({"NNodes": "\u00b2"}, "NNodes: '\u00b2' is not a count of nodes"),  # str.isdigit takes it, int does not
    ({"NNodes": MANY}, f"NNodes: '{MANY[:20]}... (5000 characters)' is not a count of nodes"),
    ({"AllocTRES": f"gres/gpu:1g.10gb={MANY}"}, "AllocTRES: '99999999999999999999... (5000 characters)' is not a "
     "count (gres/gpu:TYPE=N)"),
    ({"AllocTRES": "gres/gpu:1g.10gb=\u0663"}, "AllocTRES: '\u0663' is not a count"),  # int reads it as 3
    ({"AllocTRES": "gres/gpu:1g.10gb="}, "AllocTRES: '' is not a count"),
    ({"Start": "Unknown", "End": "Unknown", "AllocTRES": "", "ReqTRES": f"gres/gpu={MANY}"},
     "ReqTRES: '99999999999999999999... (5000 characters)' is not a count (gres/gpu=N)"),
])
def test_a_count_is_ascii_digits_and_few_of_them(tmp_path: Path, config: Path, fields: dict[str, str], said: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    refused(tmp_path, config, row(**fields), capsys, said)


@pytest.mark.parametrize("fields,said", [
    ({"NNodes": "99999999"}, "NNodes: 99999999 nodes: a what-if replays at most 4096"),  # a job per node
    ({"NNodes": "4097"}, "NNodes: 4097 nodes: a what-if replays at most 4096"),
    ({"NodeList": "n[1-99999999]"}, "NodeList: names more than 4096 nodes"),  # counted, never spelled out
    ({"NodeList": "m[1-4096]"}, "NodeList: the record names more than 4096 nodes"),  # with line 2's n1
])
def test_a_row_names_no_more_nodes_than_a_what_if_replays(tmp_path: Path, config: Path, fields: dict[str, str],
                                                          said: str, capsys: pytest.CaptureFixture[str]) -> None:
    refused(tmp_path, config, row(**fields), capsys, said)


def test_the_most_nodes_a_what_if_replays_are_read(tmp_path: Path, config: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """At the bound itself the record is read: a job over 4,096 nodes is one job of its share on each, and
    on one node it can never start, which the what-if says beside its figures."""
    code, out, err = what_if(tmp_path, config, row(NNodes="4096", NodeList="n[1-4096]"), capsys, "--nodes", "1")
    assert (code, err) == (0, "") and "2 jobs replayed" in out
    assert "note: 1 jobs ask more nodes (up to 4096) than the 1 node replayed: they start in no replay\n" in out
    code, out, err = what_if(tmp_path, config, row(NNodes="2", NodeList="n[1-2]"), capsys)  # (on n1 and n2)
    assert (code, err) == (0, "") and "2 nodes of" in out and "ask more nodes" not in out


PENDING = {"Start": "Unknown", "End": "Unknown", "AllocTRES": "", "State": "PENDING"}


@pytest.mark.parametrize("fields,said", [
    ({"Submit": "0001-01-01T00:00:00"}, "Submit: '0001-01-01T00:00:00' is no time a cluster ran at"),
    ({"Submit": "9999-12-31T23:00:00", **PENDING}, "Submit: '9999-12-31T23:00:00' is no time a cluster ran at"),
    ({"Submit": "1990-01-01T00:00:00", **PENDING}, "Submit: 1990-01-01T00:00:00: the record would span 13480 days, "
     "1990-01-01T00:00:00 to 2026-11-28T04:00:00; a what-if replays at most 366"),
    ({"Submit": "2027-11-29T03:00:01", **PENDING}, "Submit: 2027-11-29T03:00:01: the record would span 366 days"),
    ({"End": "2126-11-28T04:00:00", "Timelimit": "UNLIMITED"}, "End: 2126-11-28T04:00:00: a run of 36524 days, "
     "longer than a what-if replays (366 days)"),
])
def test_a_what_if_replays_at_most_a_year(tmp_path: Path, config: Path, fields: dict[str, str], said: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """A record's first time to its last, and a job's run time (or the limit a job not ended is replayed
    to), are at most 366 days: longer would replay for years, or millennia, before printing anything."""
    refused(tmp_path, config, row(**fields), capsys, said)


@pytest.mark.parametrize("fields, why", [
    ({"Timelimit": "99999999-00:00:00", **PENDING}, "a time limit past 366 days"),
    ({"End": "Unknown", "Timelimit": "367-00:00:00", "State": "RUNNING"}, "a time limit past 366 days"),
    ({"Submit": "1990-01-01T00:00:00", **PENDING, "Timelimit": "UNLIMITED"}, "still pending with no time limit")])
def test_a_job_not_replayed_neither_stops_nor_stretches_the_record(tmp_path: Path, fields: dict[str, str], why: str
                                                                   ) -> None:
    """A limit past what a what-if replays (a partition's MaxTime may allow one) is skipped and counted, as no
    limit at all is; and a held job submitted long ago, which ``sacct -S`` lists however old, stretches
    nothing: each refused the whole record."""
    path = tmp_path / "jobs.sacct"
    path.write_text(f"{HEADER}\n{GOOD}\n{row(**fields)}\n")
    record = read_sacct(path)
    assert record.skipped == {why: 1} and len(record.trace.jobs) == 1, record.skipped


@pytest.mark.parametrize("start,end", [("2026-10-25T02:50:00", "2026-10-25T02:10:00"),  # into the repeated hour
                                       ("2026-03-29T01:50:00", "2026-03-29T03:10:00")],  # across the skipped one
                         ids=["fall-back", "spring-forward"])
def test_a_run_across_a_dst_change_is_its_real_length(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, start: str,
                                                      end: str) -> None:
    """sacct prints local times with no offset: 20 minutes that end in the repeated hour of a fall-back print
    an End before the Start (the whole record was refused), and 20 minutes across a spring-forward read as
    80.  Read in this machine's zone, as sacct printed them, each is 20 minutes."""
    monkeypatch.setenv("TZ", "Europe/Berlin")
    time.tzset()
    try:
        path = tmp_path / "jobs.sacct"
        path.write_text(f"{HEADER}\n{GOOD}\n{row(Submit=start, Start=start, End=end)}\n")
        assert read_sacct(path).trace.jobs[0].duration_s == 20 * 60  # (the first submitted)
    finally:
        monkeypatch.undo()
        time.tzset()


@pytest.mark.parametrize("job,ids", [("7_[0-9%3]", [f"7_{i}" for i in range(10)]), ("7_[1,4-5]", ["7_1", "7_4", "7_5"]),
                                     ("7_[0-9%3", ["7_[0-9%3"]), ("7", ["7"])])
def test_a_pending_arrays_row_is_each_of_its_tasks(tmp_path: Path, job: str, ids: list[str]) -> None:
    """sacct prints a pending array as one row (``ArrayJobID_[expression]``): it was replayed as one job.
    Each task keeps its id, so that past the array's first 20 they reserve nothing (backfill.py)."""
    path = tmp_path / "jobs.sacct"
    path.write_text(f"{HEADER}\n{GOOD}\n{row(JobID=job, Start='Unknown', End='Unknown', AllocTRES='')}\n")
    assert [j.job for j in read_sacct(path).trace.jobs[1:]] == ids


def test_a_year_of_record_is_read(tmp_path: Path) -> None:
    """At the bound itself: 366 days from the first time to the last, and a run of 366 days, are read."""
    path = tmp_path / "jobs.sacct"
    path.write_text(f"{HEADER}\n{GOOD}\n{row(Submit='2027-11-29T03:00:00', **PENDING, Timelimit='366-00:00:00')}\n")
    record = read_sacct(path)
    assert record.trace.jobs[-1].duration_s == 366 * 86400
    assert record.end_s == 2 * 366 * 86400  # to the last submission, then its run


@pytest.mark.parametrize("when", ["0001-01-01T00:00:00", "9999-12-31T20:00:00"])
def test_a_lone_job_at_the_ends_of_the_calendar_is_refused(tmp_path: Path, config: Path, when: str,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """Slurm records Unix times; the replay's schedule reaches days before the record, and on past it,
    which the ends of the calendar do not hold."""
    path = tmp_path / "jobs.sacct"
    path.write_text(f"{HEADER}\n{row(Submit=when, **PENDING)}\n")
    assert migctl(["what-if", "--sacct", str(path), "--config", str(config), "--nodes", "1"]) == 2
    assert capsys.readouterr().err == (f"error: {path}:2: Submit: '{when}' is no time a cluster ran at (Slurm "
                                       "records Unix times: years 1970 to 9000 are read)\n")


@pytest.mark.parametrize("option,value,said", [
    ("--nodes", "99999999", "argument --nodes: must be at most 4096 (the most nodes a what-if replays)"),
    ("--nodes", "4097", "argument --nodes: must be at most 4096"),
    ("--gpus", "1000", "argument --gpus: must be at most 10 (no server carries more MIG GPUs)"),
    ("--gpus", "11", "argument --gpus: must be at most 10"),
    ("--gpus", "\u00b2", "argument --gpus: must be a whole number above 0 of at most 18 digits, not '\u00b2'"),
    ("--nodes", MANY, f"argument --nodes: must be a whole number above 0 of at most 18 digits, not '{MANY[:37]}...'"),
])
def test_the_options_ask_no_more_than_a_what_if_replays(tmp_path: Path, config: Path, option: str, value: str,
                                                         said: str, capsys: pytest.CaptureFixture[str]) -> None:
    """More nodes than a what-if replays, or more GPUs per node than any server has, is the option's one
    line, exit 2, before anything is read."""
    with pytest.raises(SystemExit) as e:
        what_if(tmp_path, config, GOOD, capsys, option, value)
    err = capsys.readouterr().err
    assert e.value.code == 2 and said in err and len(err.splitlines()) == 1, err


def test_a_pcie_server_of_ten_gpus_is_replayed(tmp_path: Path, config: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """Ten GPUs a node (a PCIe server) was refused: the bound was HGX's eight."""
    code, out, err = what_if(tmp_path, config, GOOD, capsys, "--nodes", "1", "--gpus", "10")
    assert code == 0, err
    assert ", 1 node of 10 x H100-SXM5-80GB, " in out, out


def test_the_help_names_the_bounds_the_types_hold(capsys: pytest.CaptureFixture[str]) -> None:
    """--nodes's help says its bound without importing the what-if (migctl starts without it): kept equal."""
    with pytest.raises(SystemExit):
        migctl(["what-if", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert f"nodes replayed, at most {MAX_NODES} " in help_text and "GPUs per node, at most 10 " in help_text


def test_a_pending_array_over_many_nodes_is_replayed_up_to_4096_jobs_and_the_rest_counted(tmp_path: Path) -> None:
    """4,096 tasks over 4,096 nodes were 16.7 million jobs (each node a job), a what-if that ate memory
    until it died.  A job over N nodes is one job; one row gives at most 4,096 of them (as the planner
    reads one pending record, queue.MAX_REQUESTS): here 4,096 tasks, each one job over 4,096 nodes, and
    the other 5,904 tasks counted."""
    path = tmp_path / "jobs.sacct"
    wide = row(JobID="1_[0-9999]", NNodes="4096", NodeList="None assigned", **PENDING)
    path.write_text(f"{HEADER}\n{GOOD}\n{wide}\n")
    record = read_sacct(path)
    assert len(record.trace.jobs) == 1 + 4096 and {j.nodes for j in record.trace.jobs[1:]} == {4096}
    assert record.trace.jobs[1].job == "1_0" and record.trace.jobs[-1].job == "1_4095"
    assert record.skipped == {"array tasks past 4096 jobs of one row (tasks times MIG types)": 10_000 - 4096}


def test_a_record_past_the_jobs_a_what_if_replays_is_refused_at_the_row(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sacct, "MAX_JOBS", 5)
    path = tmp_path / "jobs.sacct"
    path.write_text(f"{HEADER}\n{GOOD}\n{row(JobID='1_[0-3]', **PENDING)}\n{row(JobID='3')}\n")
    with pytest.raises(SacctError, match=r"jobs.sacct:4: JobID: the record gives more than 5 jobs to replay"):
        read_sacct(path)


@pytest.mark.parametrize("which", ["--sacct", "--config"])
@pytest.mark.parametrize("kind", ["/dev/zero", "directory"])
def test_a_file_that_is_not_a_regular_one_is_one_line_not_a_read_for_ever(
        tmp_path: Path, config: Path, capsys: pytest.CaptureFixture[str], which: str, kind: str) -> None:
    """Read whole, /dev/zero ended in MemoryError (as plan and validate refuse it)."""
    path = tmp_path / "jobs.sacct"
    path.write_text(f"{HEADER}\n{GOOD}\n")
    odd = {"/dev/zero": Path("/dev/zero"), "directory": tmp_path}[kind]
    given = {"--sacct": str(path), "--config": str(config), which: str(odd)}
    assert migctl(["what-if", *(x for kv in given.items() for x in kv)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{odd}: cannot read" in err and "not a regular file" in err, err


@pytest.mark.parametrize("which", ["--sacct", "--config"])
def test_a_pipe_is_read_as_a_shell_hands_it_over_and_one_with_no_writer_never_blocks(
        tmp_path: Path, config: Path, capsys: pytest.CaptureFixture[str], which: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``--sacct <(sacct ...)`` is a FIFO with a writer: read whole (refused as no regular file, it was
    the operator's own command line that failed), even when the writer opens it a moment after migctl
    (read at once, that was an empty record).  A FIFO nobody writes is an empty file after a short wait
    (read whole, one blocked what-if for ever)."""
    path = tmp_path / "jobs.sacct"
    path.write_text(f"{HEADER}\n{GOOD}\n")
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    given = {"--sacct": str(path), "--config": str(config)}
    text = (path if which == "--sacct" else config).read_bytes()

    def write() -> None:
        time.sleep(0.3)  # (a writer slower to open than migctl to read: `sacct ... > pipe &` starting up)
        with open(pipe, "wb") as w:
            w.write(text)
    writer = threading.Thread(target=write)
    writer.start()
    try:
        assert migctl(["what-if", *(x for kv in {**given, which: str(pipe)}.items() for x in kv), "--search", "1"]) == 0
    finally:
        writer.join(timeout=30)
    assert "1 jobs replayed" in capsys.readouterr().out
    monkeypatch.setattr(trust, "PIPE_WRITER_S", 0.2)
    assert migctl(["what-if", *(x for kv in {**given, which: str(pipe)}.items() for x in kv)]) == 2  # (no writer)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(pipe) in err, err


def test_a_configuration_that_is_not_utf8_is_named(tmp_path: Path, config: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "jobs.sacct"
    path.write_text(f"{HEADER}\n{GOOD}\n")
    config.write_bytes(b"a: \xff\n")
    assert migctl(["what-if", "--sacct", str(path), "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert err == f"error: {config}: cannot read file: not UTF-8 text (invalid start byte at byte 3)\n", err


def test_standard_input_past_what_a_what_if_reads_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sacct, "MAX_BYTES", 100)
    with pytest.raises(SacctError, match=r"^<stdin>: over 0 MiB, more than a what-if reads"):
        sacct.read_bounded("<stdin>", io.BytesIO(b"x" * 101))
    assert sacct.read_bounded("<stdin>", io.BytesIO(b"x" * 100)) == "x" * 100


@pytest.mark.parametrize("tres, nodes, jobs, past", [
    ("gres/gpu:1g.10gb=1", "1", 4096, 10_000 - 4096),  # (past 4,096 tasks the row's tasks vanished uncounted)
    ("gres/gpu:1g.10gb=1", "2", 4096, 10_000 - 4096),  # (each task one job over both nodes)
    ("gres/gpu:1g.10gb=1,gres/gpu:2g.20gb=1", "1", 4096, 10_000 - 2048)])  # (two types: a job each)
def test_every_task_of_a_wide_array_is_replayed_or_counted(tmp_path: Path, tres: str, nodes: str, jobs: int,
                                                          past: int) -> None:
    path = tmp_path / "jobs.sacct"
    wide = row(JobID="1_[0-9999]", NNodes=nodes, ReqTRES=tres, NodeList="None assigned", **PENDING)
    path.write_text(f"{HEADER}\n{GOOD}\n{wide}\n")
    record = read_sacct(path)
    assert len(record.trace.jobs) == 1 + jobs
    assert record.skipped == {"array tasks past 4096 jobs of one row (tasks times MIG types)": past}
