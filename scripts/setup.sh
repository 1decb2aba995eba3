#!/usr/bin/env bash
# One-time set-up of the course environment; called by `make setup` (and `make lab/test`).
#
#   .venv/            virtual environment with torch (CPU), syncedu (editable) and dev tools
#   Jupyter kernel    "Python (syncedu)", registered inside .venv
#   byte-code         compileall on both cores, in the background under `make lab`
#   Horovod 0.28.1    built from source against that torch (scripts/build-horovod.sh);
#                     SYNCEDU_HOROVOD=background (what `make lab` sets) starts the build in the
#                     background and returns at once (only lesson 08 needs it, and waits for it);
#                     =now (the default, `make test`) builds, or waits for a running build
#   chromium          Debian's, for the browser test (only when run as root with apt-get)
#
# Idempotent: a stamp file named after a hash of this script and the files it installs
# from makes a second run instant. FORCE=1 redoes every step (e.g. to retry Horovod).
set -euo pipefail

cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
FORCE=${FORCE:-0}
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1   # never let playwright fetch its own browser

step() { printf '\n==> [setup] %s\n' "$*"; }
note() { printf '    %s\n' "$*"; }

inputs=(pyproject.toml requirements-ci.txt scripts/setup.sh scripts/build-horovod.sh
        scripts/cxx17-launcher.sh jupyter/overrides.json)
sha256() { if command -v sha256sum >/dev/null; then sha256sum; else shasum -a 256; fi; }
hash=$(cat "${inputs[@]}" | sha256 | cut -c1-16)
stamp="$VENV/.syncedu-setup-$hash"
horovod_failed="$VENV/.syncedu-horovod-failed"
horovod_building="$VENV/.syncedu-horovod-building"   # "<pid>" of a background build
HOROVOD_MODE=${SYNCEDU_HOROVOD:-now}
case "$HOROVOD_MODE" in now|background) ;; *)
    echo "[setup] SYNCEDU_HOROVOD=$HOROVOD_MODE: allowed values are 'now' and 'background'" >&2
    exit 2;; esac

# A background Horovod build (SYNCEDU_HOROVOD=background) that is still running.
building_pid() { [[ -f "$horovod_building" ]] && kill -0 "$(cat "$horovod_building")" 2>/dev/null \
                 && cat "$horovod_building"; }
wait_for_horovod() {  # `now` waits for it, with a status line every 30 s
    local pid waited=0
    pid=$(building_pid) || return 0
    echo "[setup] waiting for the background Horovod build (pid $pid; log: $VENV/horovod-build.log)"
    while kill -0 "$pid" 2>/dev/null; do
        sleep 5; waited=$((waited + 5))
        if (( waited % 30 == 0 )); then echo "[setup]   still building Horovod (${waited} s)"; fi
    done
    rm -f "$horovod_building"
}
if [[ "$HOROVOD_MODE" == now ]]; then wait_for_horovod; fi

# Step 0: steps 1-4 are done for these inputs -> skip to the quick checks of steps 5-7.
base_done=0
if [[ "$FORCE" != 1 && -f "$stamp" && -x "$VENV/bin/python" ]]; then
    base_done=1
    echo "[setup] up to date ($stamp)"
fi
start=$SECONDS
PY="$VENV/bin/python"
if [[ "$base_done" == 0 ]]; then
# Step 1: the virtual environment.
if [[ ! -x "$VENV/bin/python" ]]; then
    step "creating $VENV with $($PYTHON --version 2>&1)"
    "$PYTHON" -c 'import sys; assert sys.version_info >= (3, 10), "need Python >= 3.10"'
    "$PYTHON" -m venv "$VENV"
else
    step "using existing $VENV ($("$VENV/bin/python" --version 2>&1))"
fi
PY="$VENV/bin/python"
export PATH="$PWD/$VENV/bin:$PATH"
# --no-compile: pip byte-compiles on one core, a third of the set-up (torch: 28 of 38 s);
# step 5 compiles on every core instead, in the background under `make lab`.
pip_install() { "$PY" -m pip install -q --no-compile --disable-pip-version-check "$@"; }

# Step 2: torch first, pinned, so nothing later resolves a different (CUDA) build.
step "installing torch (requirements-ci.txt)"
torch_index=()
if [[ -n "${SYNCEDU_TORCH_INDEX:-}" ]]; then torch_index=(--index-url "$SYNCEDU_TORCH_INDEX"); fi
pip_install "${torch_index[@]}" -r requirements-ci.txt
note "$("$PY" -W ignore -c 'import torch; print("torch", torch.__version__)')"

# Step 3: the package (editable) with the dev/test tools, and Horovod's build tools.
step "installing syncedu (editable) with the [dev] extra"
pip_install -e ".[dev]" "setuptools>=64" wheel "cmake<4"

# Step 4: the Jupyter kernel and JupyterLab settings (no news / update checks).
step "registering the Jupyter kernel 'Python (syncedu)' inside $VENV"
"$PY" -m ipykernel install --sys-prefix --name syncedu --display-name "Python (syncedu)" \
    >/dev/null
mkdir -p "$VENV/share/jupyter/lab/settings"
cp jupyter/overrides.json "$VENV/share/jupyter/lab/settings/overrides.json"
note "kernel 'syncedu' and lab settings overrides installed"
rm -f "$VENV"/.syncedu-setup-*
touch "$stamp"
fi

# Step 5: byte-code for the venv's packages (pip skipped it). Without it every import
# compiles from source where PYTHONDONTWRITEBYTECODE is set: a rank process starts seconds
# slower. `make lab` compiles in the background, so the course opens first.
step "byte-compiling the installed packages"
compiled="$VENV/.syncedu-compiled-$hash"
compile_site() {  # exit 1 is expected: a few library files are for newer Pythons
    local site
    site=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    "$PY" -m compileall -q -j 0 "$site" >/dev/null 2>&1 || true
}
if [[ -f "$compiled" && "$FORCE" != 1 ]]; then
    note "done"
elif [[ "$HOROVOD_MODE" == background ]]; then
    setsid nohup bash -c "$(declare -f compile_site); PY='$PY'; compile_site && touch '$compiled'" \
        >/dev/null 2>&1 </dev/null &
    note "in the background (pid $!)"
else
    t=$SECONDS; compile_site; touch "$compiled"; note "in $((SECONDS - t)) s"
fi

# Step 6: Horovod, built from source (about 2.5 minutes on 2 cores): in the foreground, or
# (SYNCEDU_HOROVOD=background) detached, so that `make lab` opens the course at once.
step "Horovod"
build_horovod() {  # the build, its log, and on failure the stamp that names the log
    local log="$VENV/horovod-build.log"
    if bash scripts/build-horovod.sh "$PY" >"$log" 2>&1; then
        echo "    horovod built in $(grep -o 'took [0-9]* s' "$log" | tail -1 | cut -d' ' -f2) s"
    else
        echo "$log" >"$horovod_failed"
        tail -n 25 "$log" | sed 's/^/    | /'
        echo "[setup] WARNING: the Horovod build failed (full log: $log)."
        echo "[setup] Everything else works; the Horovod test will skip."
        echo "[setup] Retry after fixing the cause with: make setup FORCE=1"
    fi
}
if compgen -G "$VENV/lib/python*/site-packages/horovod-*.dist-info" >/dev/null \
   && { [[ "$FORCE" != 1 ]] || "$PY" -c 'import horovod.torch' 2>/dev/null; }; then
    note "installed"
elif [[ -f "$horovod_failed" && "$FORCE" != 1 ]]; then
    note "the build failed earlier; see $(cat "$horovod_failed"). Retry with: make setup FORCE=1"
elif pid=$(building_pid); then
    note "already building in the background (pid $pid; log: $VENV/horovod-build.log)"
elif [[ "$HOROVOD_MODE" == background ]]; then
    rm -f "$horovod_failed"
    # setsid + nohup: the build survives the end of `make` and Ctrl-C in JupyterLab's terminal.
    setsid nohup bash -c "$(declare -f build_horovod); VENV='$VENV' PY='$PY' \
        horovod_failed='$horovod_failed'; build_horovod; rm -f '$horovod_building'" \
        >"$VENV/horovod-build.status" 2>&1 </dev/null &
    echo $! >"$horovod_building"
    note "building horovod 0.28.1 in the background (pid $!; log: $VENV/horovod-build.log);"
    note "only lesson 08 needs it and waits for it; \`make setup\` waits for it too"
else
    rm -f "$horovod_failed"
    note "building horovod 0.28.1 from source; log: $VENV/horovod-build.log"
    build_horovod
fi

# Step 7: a browser for the JupyterLab test (Debian's chromium; never playwright's).
step "chromium (for the browser test)"
if [[ "$HOROVOD_MODE" == background && ! -x /usr/bin/chromium ]]; then
    note "skipped by \`make lab\` (only the browser test needs it; \`make test\` installs it)"
elif [[ -x /usr/bin/chromium ]]; then
    note "found /usr/bin/chromium"
elif [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    note "installing Debian's chromium with apt-get"
    if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; }; then
        echo "[setup] WARNING: apt-get install chromium failed; the browser test will skip."
    fi
else
    note "not installed; the browser test will skip. To enable it: sudo apt-get install chromium"
fi

step "done in $((SECONDS - start)) s. Next: make lab   (or: make test)"
