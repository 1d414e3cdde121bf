#!/usr/bin/env bash
# Installs the real RocketMQ clients the acceptance tests drive (tests/realclients/):
#   .venv-cpp                     the `rocketmq` 0.4.4 wheel (bundles librocketmq 1.0.1, the C++ 4.x client).
#                                 Its own venv: another PyPI package also installs a module named `rocketmq`.
#   tests/realclients/node_modules  ali-ons (pure-JS 4.x client), pinned by package-lock.json.
# Re-running is cheap: each step is skipped while its stamp matches its inputs.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="${PYTHON:-python3}"

cpp_venv="$root/.venv-cpp"
cpp_pin="rocketmq==0.4.4"
if [ ! -x "$cpp_venv/bin/python" ]; then
  "$py" -m venv "$cpp_venv"
fi
cpp_stamp="$cpp_venv/.sluice-clients-installed"
if [ ! -f "$cpp_stamp" ] || [ "$(cat "$cpp_stamp")" != "$cpp_pin" ]; then
  "$cpp_venv/bin/python" -m pip install -q --disable-pip-version-check "$cpp_pin"
  # Loading the bundled .so proves the wheel works on this machine (libstdc++, zlib, pthread).
  "$cpp_venv/bin/python" -c "import rocketmq.client"
  echo "$cpp_pin" > "$cpp_stamp"
fi

js_dir="$root/tests/realclients"
js_stamp="$js_dir/node_modules/.sluice-clients-installed"
if [ -f "$js_dir/package-lock.json" ]; then
  js_want="$(cat "$js_dir/package.json" "$js_dir/package-lock.json" | sha256sum | cut -d' ' -f1)"
else
  js_want="no-lock"
fi
if [ ! -f "$js_stamp" ] || [ "$(cat "$js_stamp")" != "$js_want" ]; then
  if [ -f "$js_dir/package-lock.json" ]; then
    (cd "$js_dir" && npm ci --no-audit --no-fund --loglevel=error)
  else
    (cd "$js_dir" && npm install --no-audit --no-fund --loglevel=error)
    js_want="$(cat "$js_dir/package.json" "$js_dir/package-lock.json" | sha256sum | cut -d' ' -f1)"
  fi
  echo "$js_want" > "$js_stamp"
fi
