#!/usr/bin/env bash
# One entry point for the README's quick start and for CI.
#   scripts/dev.sh workbench   set up everything, then open JupyterLab on notebooks/
#   scripts/dev.sh report      set up everything, then write report.html headlessly
#   scripts/dev.sh test        set up everything, then run lint and the whole test suite
#   scripts/dev.sh course      set up everything, then build the HTML course in build/course/
#   scripts/dev.sh setup       only set up (system packages + .venv)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV="$ROOT/.venv"


setup_system() {
    local missing=()
    command -v dot >/dev/null 2>&1 || missing+=(graphviz)
    command -v chromium >/dev/null 2>&1 || missing+=(chromium)
    python3 -c "import venv, ensurepip" >/dev/null 2>&1 || missing+=(python3-venv)
    if [ ${#missing[@]} -gt 0 ]; then
        echo "==> installing Debian packages: ${missing[*]}"
        local sudo=""
        [ "$(id -u)" -eq 0 ] || sudo="sudo"
        $sudo apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
}

setup_python() {
    if [ ! -x "$VENV/bin/python" ]; then
        echo "==> creating $VENV"
        python3 -m venv "$VENV"
    fi
    echo "==> installing the project and its tools into .venv"
    # The machine's pip configuration may list local wheel folders that do not all exist;
    # pip warns about each on every lookup, which drowns real messages.
    "$VENV/bin/python" -m pip install -q -e ".[all]" 2> >(grep -v "is ignored: it is neither" >&2)
}

setup() {
    setup_system
    setup_python
    # Tools that look up commands on PATH (jupyter, nbval's kernels) find the venv's first.
    export PATH="$VENV/bin:$PATH"
    export VIRTUAL_ENV="$VENV"
}

case "${1:-}" in
    setup)
        setup
        ;;
    workbench)
        setup
        shift
        exec "$VENV/bin/python" -m workbench lab "$@"
        ;;
    report)
        setup
        shift
        exec "$VENV/bin/python" -m workbench report "$@"
        ;;
    course)
        setup
        shift
        exec "$VENV/bin/python" scripts/build_course.py "$@"
        ;;
    test)
        setup
        shift
        "$VENV/bin/ruff" check .
        "$VENV/bin/ruff" format --check .
        exec "$VENV/bin/python" -m pytest "$@"
        ;;
    *)
        echo "usage: scripts/dev.sh {workbench|report|course|test|setup} [args]" >&2
        exit 2
        ;;
esac
