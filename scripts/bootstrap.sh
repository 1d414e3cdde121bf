#!/usr/bin/env bash
# Creates .venv (once) and installs sluice with pinned dependencies into it.
# Re-running is cheap: the install is skipped while pyproject, setup.py, constraints and the C source are unchanged.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
py="${PYTHON:-python3}"
if [ ! -x "$venv/bin/python" ]; then
  "$py" -m venv "$venv"
fi
stamp="$venv/.sluice-installed"
# The C extension (src/csrc/speedups) is built by the install: its sources are part of the stamp.
want="$(cat "$root/pyproject.toml" "$root/setup.py" "$root/constraints.txt" "$root"/src/csrc/speedups/* \
  | sha256sum | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  # pip runs quietly: say what the wait is for (the first install downloads PySpark, about 460 MB).
  echo "Installing sluice and its pinned dependencies into $venv (the first time takes a minute or more)..." >&2
  "$venv/bin/python" -m pip install -q --disable-pip-version-check -c "$root/constraints.txt" -e "$root[test,spark,plot]"
  echo "$want" > "$stamp"
  echo "Installed." >&2
fi
