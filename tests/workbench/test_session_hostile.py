"""Issue 25: session files against hostile paths, special files and hostile fields.

Each repro of the issue is here: loading ``/dev/zero`` (a MemoryError), ``/dev/urandom``
or a FIFO (a hang), a NUL in the path (ValueError), ``None`` (TypeError), the dashboard's
file box with a NUL (no message), a killed save's temporary file left behind, a save
that replaced a symbolic link or a device file, ``10**400`` in a topology field
(OverflowError), a 5,000-digit ``device_map`` key (ValueError), ``dp=10**400`` in the
history accepted until ``undo()``, and ``Strategy.parse("dp=2,dp=4")`` keeping the last."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ir import models
from ir.device import Device, Topology
from ir.sharding import Mesh, S, ShardingSpec
from workbench import Session, Strategy
from workbench.files import STALE_AFTER_S, remove_stale_temporaries, write_atomic
from workbench.session import SessionError
from workbench.session_file import SessionFileError

ROOT = Path(__file__).resolve().parents[2]
MLP = models.mlp(8, 16, 32, 4)


def _within(seconds: float, call):
    """``call()``, failing the test (not hanging it) past ``seconds``."""

    def alarm(_signum, _frame):
        raise AssertionError(f"no answer within {seconds} s")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        return call()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _session() -> Session:
    s = Session(MLP, Topology.preset("a100-hgx", 4))
    assert s.set_strategy(dp=2)
    return s


# -- special files and odd paths ---------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "words"),
    [
        ("/dev/zero", "a character device, not a file"),
        ("/dev/urandom", "a character device, not a file"),
        ("/dev/null", "a character device, not a file"),
    ],
)
def test_loading_a_device_file_is_refused_at_once(path, words):
    with pytest.raises(SessionFileError, match=words) as e:
        _within(10, lambda: Session.load(path))
    assert e.value.file == path


def test_loading_a_fifo_a_directory_or_a_socket_is_refused_without_waiting(tmp_path):
    import socket

    os.mkfifo(tmp_path / "fifo")  # opening it to read would wait for a writer
    (tmp_path / "folder").mkdir()
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(tmp_path / "sock"))
        for name, words in [
            ("fifo", "a FIFO"),
            ("folder", "a directory"),
            ("sock", "cannot read it"),
        ]:
            with pytest.raises(SessionFileError, match=words):
                _within(10, lambda name=name: Session.load(tmp_path / name))


def test_a_file_over_the_size_limit_is_refused_before_it_is_read(tmp_path):
    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate(256 * 2**20 + 1)  # sparse: no disk, and no memory if never read
    with pytest.raises(SessionFileError, match=r"268435457 bytes, more than 268435456"):
        _within(5, lambda: Session.load(big))


@pytest.mark.parametrize(
    ("path", "words"),
    [
        (None, "a file path must be a string or an os.PathLike, got NoneType"),
        (7, "got int"),
        ("", "the file path is empty"),
        ("a\x00b.json", r"holds a NUL character"),
        (Path("a\x00b.json"), r"holds a NUL character"),
    ],
)
def test_a_path_of_the_wrong_kind_is_a_project_error_on_load_and_save(path, words):
    with pytest.raises(SessionFileError, match=words):
        Session.load(path)
    with pytest.raises(SessionFileError, match=words):
        _session().save(path)


def test_bytes_paths_work_as_os_paths_do(tmp_path):
    path = bytes(tmp_path / "s.json")
    _session().save(path)
    assert Session.load(path).strategy == Strategy(dp=2)


def test_the_dashboards_file_box_shows_a_nul_path_refused():
    pytest.importorskip("ipywidgets")
    from workbench.dashboard import Workbench

    wb = Workbench(MLP, Topology.preset("a100-hgx", 4))
    wb.file_path.value = "a\x00b.json"
    wb.save_button.click()
    assert "NUL character" in wb.editor.status.value
    wb.session.error = None
    wb.load_button.click()
    assert "NUL character" in wb.editor.status.value


# -- saving without side effects ----------------------------------------------------------


def test_saving_through_a_symbolic_link_keeps_the_link(tmp_path):
    s = Session(MLP, Topology.preset("a100-hgx", 4))
    real = s.save(tmp_path / "real.json")
    os.symlink("real.json", tmp_path / "link.json")
    assert s.set_strategy(dp=2)
    s.save(tmp_path / "link.json")
    assert os.path.islink(tmp_path / "link.json")
    assert Session.load(real).strategy == Strategy(dp=2)
    os.symlink("made.json", tmp_path / "dangling.json")  # a link to nothing yet
    s.save(tmp_path / "dangling.json")
    assert os.path.islink(tmp_path / "dangling.json")
    assert Session.load(tmp_path / "made.json").strategy == Strategy(dp=2)
    assert sorted(os.listdir(tmp_path)) == ["dangling.json", "link.json", "made.json", "real.json"]


def test_saving_over_a_device_file_a_fifo_a_directory_or_a_link_loop_is_refused(tmp_path):
    """Never /dev/null itself: run as root, a save that replaced device files (the bug)
    would replace the machine's."""
    s = _session()
    try:  # a null device of the test's own
        os.mknod(tmp_path / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("making a device file needs root (mknod); the FIFO case is in the fuzz test")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "folder").mkdir()
    os.symlink("loop-b", tmp_path / "loop-a")
    os.symlink("loop-a", tmp_path / "loop-b")
    os.symlink("fifo", tmp_path / "to-fifo")
    cases = [
        (tmp_path / "null", "a character device"),
        (tmp_path / "fifo", "a FIFO"),
        (tmp_path / "to-fifo", "a FIFO"),
        (tmp_path / "folder", "a directory"),
        (tmp_path / "loop-a", "symbolic links form a loop"),
    ]
    for path, words in cases:
        with pytest.raises(SessionFileError, match=f"cannot write it: .*{words}"):
            s.save(path)
    assert stat.S_ISCHR(os.lstat(tmp_path / "null").st_mode)
    assert stat.S_ISFIFO(os.lstat(tmp_path / "fifo").st_mode)
    assert os.path.islink(tmp_path / "to-fifo") and os.path.islink(tmp_path / "loop-a")
    assert sorted(os.listdir(tmp_path)) == ["fifo", "folder", "loop-a", "loop-b", "null", "to-fifo"]


def test_a_save_keeps_the_files_permissions(tmp_path):
    s = _session()
    path = s.save(tmp_path / "s.json")
    os.chmod(path, 0o600)
    s.save(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    os.chmod(path, 0o640)
    s.save(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o640


_KILLED_SAVE = """
import sys, time
from workbench.files import write_atomic

def write(f):
    f.write("x" * 1_000_000)
    f.flush()
    print("writing", flush=True)
    time.sleep(600)

write_atomic(sys.argv[1], write)
"""


def test_a_save_killed_outright_leaves_a_temporary_file_the_next_save_removes(tmp_path):
    target = tmp_path / "s.json"
    saver = subprocess.Popen(
        [sys.executable, "-c", _KILLED_SAVE, str(target)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert saver.stdout.readline().strip() == "writing"
    finally:
        saver.send_signal(signal.SIGKILL)  # no handler runs: the temporary file stays
        saver.wait()
    (left,) = [p for p in tmp_path.iterdir() if p.name.startswith(".s.json.")]
    assert left.name.endswith(".tmp") and left.stat().st_size == 1_000_000
    # a save of another process still writing (it holds the lock) is not touched
    live = tmp_path / ".s.json.abcdefgh.tmp"
    live.write_text("{}")
    old = time.time() - 10 * STALE_AFTER_S
    for p in (left, live):
        os.utime(p, (old, old))
    with open(live) as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        _session().save(target)
        assert sorted(p.name for p in tmp_path.iterdir()) == [live.name, "s.json"]
    assert remove_stale_temporaries(target) == [live]  # once its save is gone
    assert Session.load(target).strategy == Strategy(dp=2)


def test_a_recent_unlocked_temporary_file_is_left_for_its_save_to_lock():
    """A save makes its file and then locks it: a sweep in between must not take it."""
    import tempfile

    folder = Path(tempfile.mkdtemp())
    fresh = folder / ".s.json.abcdefgh.tmp"
    fresh.write_text("{}")
    assert remove_stale_temporaries(folder / "s.json") == []
    assert fresh.exists()


def test_a_write_that_fails_or_is_interrupted_leaves_no_temporary_file(tmp_path):
    target = tmp_path / "s.json"
    target.write_text("old")

    def interrupted(f):
        f.write("new, half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_atomic(target, interrupted)
    assert os.listdir(tmp_path) == ["s.json"] and target.read_text() == "old"


# -- hostile fields -------------------------------------------------------------------------


def _document(tmp_path: Path) -> tuple[Path, dict]:
    dense = Topology(
        tuple(Device(i, "toy", 2e12, 3e11, 8e9, 1e-6, {"float32": 2e12}) for i in range(4)),
        tuple(tuple(0.0 if i == j else 1e10 for j in range(4)) for i in range(4)),
        tuple(tuple(0.0 if i == j else 1e-6 for j in range(4)) for i in range(4)),
        name="toy",
        nodes=((0, 1), (2, 3)),
    )
    s = Session(MLP, dense)
    assert s.annotate("h", ShardingSpec([0, 1], [(1, 2)], {0: [0, 2], 1: [1, 3]}))
    assert s.set_strategy(dp=2)
    assert s.annotate("wA", (Mesh((4,)), [S(1)]))
    path = s.save(tmp_path / "s.json")
    return path, json.loads(path.read_text())


def _write(path: Path, doc: dict, raw: dict[str, str] | None = None) -> None:
    """``doc`` as JSON, with each placeholder string of ``raw`` written as raw text."""
    text = json.dumps(doc)
    for placeholder, value in (raw or {}).items():
        text = text.replace(f'"{placeholder}"', value)
    path.write_text(text)


@pytest.mark.parametrize(
    ("edit", "raw", "field", "words"),
    [
        (
            lambda d: d["topology"]["devices"][1].update(peak_flops="@big@"),
            {"@big@": str(10**400)},
            "$.topology.devices[1].peak_flops",
            "must be a finite number",
        ),
        (
            lambda d: d["topology"]["devices"][2]["matrix_peak_flops"].update(float32="@big@"),
            {"@big@": "1e400"},
            "$.topology.devices[2].matrix_peak_flops.float32",
            "must be a finite number",
        ),
        (
            lambda d: d["topology"]["bandwidth_bytes_per_s"][0].__setitem__(1, "@big@"),
            {"@big@": "9" * 5000},
            "$.topology.bandwidth_bytes_per_s[0][1]",
            "must be a finite number",
        ),
        (
            lambda d: d["topology"]["devices"][0].update(device_id="@big@"),
            {"@big@": str(10**400)},
            "$.topology.devices[0].device_id",
            "from 0 to 65535, got a 401-digit integer",
        ),
        (
            lambda d: d["topology"]["nodes"][0].__setitem__(0, 2**63),
            None,
            "$.topology.nodes[0][0]",
            "from 0 to 65535",
        ),
        (
            lambda d: d["history"]["undo"][1]["annotations"][0]["spec"]["device_map"].update(
                {"9" * 5000: [0, 2]}
            ),
            None,
            "$.history.undo[1].annotations[0].spec.device_map.99999999999999999...",
            "keys must be device numbers from 0 to 65535",
        ),
        (
            lambda d: d["history"]["undo"][1]["annotations"][0]["spec"]["device_map"]["0"].append(
                2**64
            ),
            None,
            "$.history.undo[1].annotations[0].spec.device_map.0[2]",
            "from 0 to 65535",
        ),
        (
            lambda d: d["annotations"][0]["mesh"].update(shape=[10**400]),
            None,
            "$.annotations[0].mesh.shape[0]",
            "from 1 to 65536",
        ),
        (
            lambda d: d["strategy"].update(microbatches=10**400),
            None,
            "$.strategy.microbatches",
            "a 401-digit integer",
        ),
        (
            lambda d: d.update(version="@big@"),
            {"@big@": "9" * 5000},
            "$.version",
            "a 5000-digit integer",
        ),
    ],
)
def test_an_out_of_range_number_names_its_field(tmp_path, edit, raw, field, words):
    path, doc = _document(tmp_path)
    edit(doc)
    _write(path, doc, raw)
    with pytest.raises(SessionFileError) as e:
        Session.load(path)
    assert e.value.field == field and words in str(e.value), str(e.value)


@pytest.mark.parametrize(
    ("strategy", "words"),
    [
        ({"dp": 10**400}, "from 1 to 65536, got a 401-digit integer"),
        ({"dp": 8}, "dp=8 needs 8 devices, but topology 'toy' has 4"),
        ({"hp": 256, "pp": 256}, "needs 65536 devices"),
        ({"pp": 0}, "from 1 to 65536, got 0"),
    ],
)
def test_history_states_are_checked_at_load_not_at_undo(tmp_path, strategy, words):
    path, doc = _document(tmp_path)
    state = {"dp": 1, "hp": 1, "pp": 1, "microbatches": 1, "schedule": "gpipe", **strategy}
    doc["history"]["redo"].append({"strategy": state, "annotations": []})
    _write(path, doc)
    with pytest.raises(SessionFileError) as e:
        Session.load(path)
    assert e.value.field.startswith("$.history.redo[0].strategy") and words in str(e.value)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("dp=2,dp=4", "dp is given twice (dp=2 and dp=4); give each key once"),
        ("schedule=1f1b; schedule=gpipe", "schedule is given twice"),
        ("dp=" + "9" * 5000, "dp must be a positive integer"),
        ("dp=٣", "dp must be a positive integer"),
        ("dp=-2", "dp must be a positive integer"),
        ("dp=70000", "at most 65536"),
        ("dp=256,hp=256,pp=2", "more than 65536"),
    ],
)
def test_strategy_text_with_a_key_twice_or_a_number_out_of_range_is_refused(text, words):
    with pytest.raises(SessionError) as e:
        Strategy.parse(text)
    assert words in str(e.value)


@pytest.mark.parametrize("text", [None, 2, b"dp=2", ["dp=2"]])
def test_strategy_parse_takes_text_only(text):
    with pytest.raises(SessionError, match="strategy must be text"):
        Strategy.parse(text)
