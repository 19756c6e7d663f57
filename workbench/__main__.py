"""The command line: ``python -m workbench lab`` and ``python -m workbench report``.

``lab`` starts JupyterLab on copies of the tutorial notebooks (``build/workbench/``, so that
the committed ones stay clean) with the workbench importable from the kernel, the
dashboard notebook as its start page,
and no news or update pop-ups (settings overrides of its own, not the user's
configuration), and prints the address to open.
``report`` simulates a model under one or more strategies and writes the
static, self-contained HTML report; every option has a default, so
``python -m workbench report --out report.html`` works as is; ``--measure`` adds
small strategies run on gloo processes of this CPU against the simulator.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
DASHBOARD = "00_workbench.ipynb"
# Where `lab` serves by default: copies of the tutorials, so that JupyterLab's autosave
# (outputs, widget state) never writes into the committed notebooks. build/ is ignored by git.
WORKSPACE = ROOT / "build" / "workbench"
# JupyterLab's announcements: "Would you like to get notified about official Jupyter
# news?" over the dashboard at first start, and a check for updates; both go online.
LAB_OVERRIDES = {
    "@jupyterlab/apputils-extension:notification": {
        "fetchNews": "false",
        "checkForUpdates": False,
    }
}

from .example import EXAMPLE  # noqa: E402  (light: no Jupyter, no numpy work)
from .report_config import DEFAULT_STRATEGIES, OPTIMIZERS  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def lab_settings(folder: Path, defaults: Path | None = None) -> Path:
    """An application settings folder for JupyterLab in ``folder``: the one JupyterLab
    would use (``defaults``: its ``overrides.json`` and ``page_config.json``), with
    :data:`LAB_OVERRIDES` on top. Returns the folder to pass as ``LabApp.app_settings_dir``.

    Only this lab process reads it: the user's settings and configuration are untouched
    (and a setting the user chose still wins over an override).
    """
    settings = folder / "settings"
    settings.mkdir(parents=True, exist_ok=True)
    overrides: dict[str, dict] = {}
    if defaults is not None and (defaults / "overrides.json").is_file():
        try:
            overrides = json.loads((defaults / "overrides.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            overrides = {}  # JupyterLab would have ignored it too
    for plugin, values in LAB_OVERRIDES.items():
        overrides[plugin] = {**overrides.get(plugin, {}), **values}
    (settings / "overrides.json").write_text(json.dumps(overrides, indent=2), encoding="utf-8")
    if defaults is not None:
        if (defaults / "page_config.json").is_file():  # extensions the installation disables
            (settings / "page_config.json").write_bytes(
                (defaults / "page_config.json").read_bytes()
            )
        static = defaults.parent / "static"  # JupyterLab reads its package.json next door
        if static.is_dir() and not (folder / "static").exists():
            # only extension metadata is read there: JupyterLab does without if this fails
            with contextlib.suppress(OSError):
                (folder / "static").symlink_to(static, target_is_directory=True)
    return settings


def default_lab_settings() -> Path | None:
    """The application settings folder JupyterLab uses when told none (None if unknown)."""
    try:
        from jupyterlab.commands import get_app_dir
    except ImportError:
        return None
    return Path(get_app_dir()) / "settings"


def workspace(folder: Path = WORKSPACE, *, fresh: bool = False) -> Path:
    """The folder ``lab`` serves: ``notebooks/`` holds a copy of each tutorial (made when
    missing, or again with ``fresh``: what the user ran and saved stays otherwise) and
    ``docs/glossary.md`` the glossary the tutorials link to. Returns ``folder``.

    The repository's notebooks are never opened, so running the workbench leaves the
    checkout as it was (``git status`` clean).
    """
    notebooks = folder / "notebooks"
    notebooks.mkdir(parents=True, exist_ok=True)
    for source in sorted(NOTEBOOKS.glob("*.ipynb")):
        copy = notebooks / source.name
        if fresh or not copy.exists():
            shutil.copyfile(source, copy)
    (folder / "docs").mkdir(exist_ok=True)
    glossary = ROOT / "docs" / "glossary.md"
    if glossary.is_file():
        shutil.copyfile(glossary, folder / "docs" / "glossary.md")
    return folder


def dashboard_path(notebook_dir: Path) -> str | None:
    """The dashboard notebook's path within ``notebook_dir`` (``00_workbench.ipynb`` or
    ``notebooks/00_workbench.ipynb``), or None."""
    for relative in (DASHBOARD, f"notebooks/{DASHBOARD}"):
        if (notebook_dir / relative).is_file():
            return relative
    return None


def lab_command(
    *,
    port: int,
    token: str,
    notebook_dir: Path = WORKSPACE,
    open_browser: bool = False,
    ip: str = "localhost",
    as_root: bool | None = None,
    app_settings_dir: Path | None = None,
) -> list[str]:
    """The ``jupyter lab`` command line ``python -m workbench lab`` runs.

    The start page (``/``, and the browser ``open_browser`` opens) is the dashboard
    notebook when ``notebook_dir`` has it; ``app_settings_dir`` (see
    :func:`lab_settings`) carries the settings overrides.

    >>> cmd = lab_command(port=8899, token="", notebook_dir=Path("nb"), as_root=True)
    >>> cmd[1:3], "--allow-root" in cmd, "--IdentityProvider.token=" in cmd
    (['-m', 'jupyterlab'], True, True)
    """
    if as_root is None:
        as_root = hasattr(os, "geteuid") and os.geteuid() == 0
    # `python -m jupyterlab`, not `jupyter lab`: the latter runs whichever `jupyter-lab`
    # comes first on PATH, which need not belong to this interpreter's environment.
    cmd = [
        sys.executable,
        "-m",
        "jupyterlab",
        f"--notebook-dir={notebook_dir}",
        f"--ServerApp.ip={ip}",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",  # the printed address must be the one served
        f"--IdentityProvider.token={token}",
    ]
    dashboard = dashboard_path(notebook_dir)
    if dashboard is not None:
        cmd.append(f"--LabApp.default_url=/lab/tree/{dashboard}")
    if app_settings_dir is not None:
        cmd.append(f"--LabApp.app_settings_dir={app_settings_dir}")
    if not open_browser:
        cmd.append("--no-browser")
    if as_root:
        cmd.append("--allow-root")  # JupyterLab refuses to run as root without it
    return cmd


def run_lab(args: argparse.Namespace) -> int:
    """Start JupyterLab on the workspace (copies of ``notebooks/``) or ``--notebook-dir`` and
    wait for it (Ctrl-C stops it)."""
    if args.notebook_dir is None:
        notebook_dir = workspace(Path(args.workspace), fresh=args.fresh)
    else:
        notebook_dir = Path(args.notebook_dir)
    if not notebook_dir.is_dir():
        print(f"error: no notebook folder at {notebook_dir}; pass --notebook-dir", file=sys.stderr)
        return 2
    port = args.port or _free_port()
    token = "" if args.no_token else secrets.token_hex(16)
    with tempfile.TemporaryDirectory(prefix="distir-lab-") as folder:
        settings = lab_settings(Path(folder), default_lab_settings())
        cmd = lab_command(
            port=port,
            token=token,
            notebook_dir=notebook_dir,
            open_browser=args.browser,
            ip=args.ip,
            app_settings_dir=settings,
        )
        return _serve(cmd, notebook_dir, port, token, args.ip)


def _serve(cmd: list[str], notebook_dir: Path, port: int, token: str, ip: str) -> int:
    """Run JupyterLab's command line until it stops (Ctrl-C or SIGTERM stop it)."""
    # The kernels JupyterLab starts inherit this environment: make `import ir, workbench` work
    # from a fresh clone even when the project is not pip-installed.
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    host = "localhost" if ip in ("localhost", "127.0.0.1", "0.0.0.0") else ip
    page = dashboard_path(notebook_dir) or ""
    url = f"http://{host}:{port}/lab/tree/{page}" + (f"?token={token}" if token else "")
    print(f"DistIR Workbench: JupyterLab on {notebook_dir}\n  open {url}\n  (Ctrl-C to stop)")
    if (notebook_dir / "notebooks").is_dir() and dashboard_path(notebook_dir) != DASHBOARD:
        print(
            f"  (copies of the notebooks in {notebook_dir}: the repository's stay as committed;"
            " --fresh copies them again)"
        )
    sys.stdout.flush()
    proc = subprocess.Popen(cmd, env=env)
    # Stopped by a service manager (SIGTERM) or Ctrl-C: stop JupyterLab and its kernels too.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        try:
            return proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait()


def _interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def run_report(args: argparse.Namespace) -> int:
    """Simulate the model under each strategy and write the HTML report."""
    from ir.errors import DistIRError

    from .report import ReportConfig, build_model, write_report

    config = ReportConfig(
        model=args.model,
        batch=args.batch,
        seq=args.seq,
        hidden=args.hidden,
        heads=args.heads,
        vocab=args.vocab,
        layers=args.layers,
        features=args.features,
        classes=args.classes,
        training=args.training,
        optimizer=args.optimizer,
        preset=args.preset,
        devices=args.devices,
        strategies=tuple(args.strategy or DEFAULT_STRATEGIES),
        search=args.search,
        measure=args.measure,
    )
    out = Path(args.out)
    problem = _unwritable(out)
    if problem:  # said before minutes of simulation, not after
        print(f"error: --out {out}: {problem}", file=sys.stderr)
        return 1
    try:
        function = build_model(config)
        path = write_report(out, function, config, progress=not args.quiet)
    except DistIRError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"error: --out {out}: cannot write it: {e.strerror or e}", file=sys.stderr)
        return 1
    size_mb = path.stat().st_size / 1e6
    print(f"wrote {path} ({size_mb:.1f} MB, self-contained: open it in any browser, offline)")
    return 0


def _unwritable(path: Path) -> str:
    """Why a file cannot be written at ``path`` ("" when it looks writable)."""
    if path.is_dir():
        return "is a folder; give a file name, e.g. report.html"
    folder = path.parent
    if not folder.is_dir():
        return f"the folder {folder} does not exist; create it or choose another"
    if not os.access(folder, os.W_OK):
        return f"the folder {folder} is not writable"
    return ""


DESCRIPTION = (
    "DistIR Workbench: design, teach and check how a neural network is split over devices. "
    "'lab' opens JupyterLab on the workbench's built-in example and the tutorials; 'report' "
    "writes a model's strategies as one self-contained HTML page."
)


def program_name(argv0: str | None = None) -> str:
    """How the user ran the command line, for its usage lines: ``distir-workbench`` (the
    installed script) or ``python -m workbench``."""
    name = Path(argv0 if argv0 is not None else sys.argv[0]).name
    return "python -m workbench" if name in ("__main__.py", "") else name


def parser(prog: str | None = None) -> argparse.ArgumentParser:
    """The argument parser of ``python -m workbench`` and ``distir-workbench``."""
    from . import __version__

    top = argparse.ArgumentParser(prog=prog or program_name(), description=DESCRIPTION)
    top.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = top.add_subparsers(dest="command", required=True)

    lab = sub.add_parser("lab", help="start JupyterLab on the tutorial notebooks")
    lab.add_argument("--port", type=int, default=0, help="port (default: a free one)")
    lab.add_argument("--ip", default="localhost", help="address to listen on (default localhost)")
    lab.add_argument(
        "--notebook-dir",
        default=None,
        help=f"folder to serve (default: copies of the tutorials in {WORKSPACE.relative_to(ROOT)})",
    )
    lab.add_argument(
        "--workspace",
        default=str(WORKSPACE),
        help=f"where the copies go (default {WORKSPACE.relative_to(ROOT)}, ignored by git)",
    )
    lab.add_argument(
        "--fresh",
        action="store_true",
        help="copy the tutorials into the default folder again, replacing what was saved there",
    )
    lab.add_argument("--browser", action="store_true", help="also open a web browser")
    lab.add_argument(
        "--no-token",
        action="store_true",
        help="serve without a token (anyone who can reach the port gets a Python kernel)",
    )
    lab.set_defaults(run=run_lab)

    rep = sub.add_parser("report", help="write the static HTML report (no browser needed)")
    rep.add_argument(
        "--model",
        default="gpt",
        help="gpt, mlp or an ONNX file (model.onnx: its program as written; default gpt)",
    )
    ex = EXAMPLE  # the built-in example's sizes: the dashboard's subject
    rep.add_argument("--layers", type=int, default=ex.layers, help=f"layers (default {ex.layers})")
    rep.add_argument("--batch", type=int, default=ex.batch, help=f"batch size (default {ex.batch})")
    rep.add_argument("--seq", type=int, default=ex.seq, help=f"GPT sequence (default {ex.seq})")
    rep.add_argument("--hidden", type=int, default=ex.hidden, help=f"hidden (default {ex.hidden})")
    rep.add_argument("--heads", type=int, default=ex.heads, help=f"GPT heads (default {ex.heads})")
    rep.add_argument("--vocab", type=int, default=ex.vocab, help=f"GPT vocab (default {ex.vocab})")
    rep.add_argument("--features", type=int, default=512, help="MLP input features (default 512)")
    rep.add_argument("--classes", type=int, default=64, help="MLP classes (default 64)")
    rep.add_argument(
        "--training",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="simulate a training step (forward, backward, optimizer); --no-training: forward only",
    )
    rep.add_argument(
        "--optimizer",
        default=ex.optimizer,
        choices=OPTIMIZERS,
        help=f"the training step's optimizer (default {ex.optimizer})",
    )
    rep.add_argument("--preset", default=ex.preset, help=f"hardware preset (default {ex.preset})")
    rep.add_argument(
        "--devices", type=int, default=ex.devices, help=f"devices (default {ex.devices})"
    )
    rep.add_argument(
        "--strategy",
        action="append",
        help="a strategy such as 'dp=2,hp=2,pp=2,microbatches=4,schedule=1f1b'; repeat to "
        f"compare several (default: {' and '.join(DEFAULT_STRATEGIES)})",
    )
    rep.add_argument(
        "--search",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also search every dp x tp x pp of the devices and show the Pareto front of "
        "step time against peak memory (default; a few seconds on the default model)",
    )
    rep.add_argument(
        "--measure",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="also run each strategy over at most 4 devices on gloo processes of this CPU "
        "and show its measured timeline over the simulated one, with the errors (small "
        "models only, e.g. --model mlp --devices 2 --strategy dp=2; calibrates this machine "
        "first, about 10 s; default off)",
    )
    rep.add_argument("--out", default="report.html", help="output file (default report.html)")
    rep.add_argument("--quiet", action="store_true", help="no progress bar")
    rep.set_defaults(run=run_report)
    return top


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """Entry point of ``python -m workbench`` and of the ``distir-workbench`` script."""
    args = parser(prog).parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
