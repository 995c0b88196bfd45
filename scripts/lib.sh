# Shared by the scripts: make sure redis-server (and, for the client round trip, python3 with
# venv) is installed.
# On Debian/Ubuntu it is installed with apt-get (as root, or through sudo); elsewhere the
# message says what to do.

ensure_redis() {
  if command -v redis-server >/dev/null 2>&1; then
    return 0
  fi
  echo "redis-server not found; installing it with apt-get..." >&2
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
      sudo="sudo"
    else
      echo "error: not root and no sudo: install redis-server yourself (apt-get install redis-server)" >&2
      return 1
    fi
  fi
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "error: no apt-get here: install redis-server (Redis 7.0 or newer) with your package manager" >&2
    return 1
  fi
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
  command -v redis-server >/dev/null 2>&1 || { echo "error: redis-server still missing" >&2; return 1; }
}

# Python 3 with venv (for the generated-client round trip); installed with apt-get when missing.
ensure_python_venv() {
  if command -v python3 >/dev/null 2>&1 && python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
    return 0
  fi
  echo "python3 with venv not found; installing it with apt-get..." >&2
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 && sudo="sudo" || {
      echo "error: not root and no sudo: install python3 and python3-venv yourself" >&2
      return 1
    }
  fi
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 python3-venv >/dev/null
}

# A virtualenv at $1 with the PyPI package $2 pinned at version $3, whose command $4 reports
# that version; made (or remade) only when it does not, so later runs reuse it.
ensure_pinned_venv() {
  local venv="$1" package="$2" version="$3" command="$4"
  if ! "$venv/bin/$command" --version 2>/dev/null | grep -q "$version"; then
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "$package==$version"
  fi
}

# Node.js with npm (for the benchmark's BullMQ peer); installed with apt-get when missing.
ensure_node() {
  if command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1; then
    return 0
  fi
  echo "node/npm not found; installing them with apt-get..." >&2
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 && sudo="sudo" || {
      echo "error: not root and no sudo: install nodejs and npm yourself" >&2
      return 1
    }
  fi
  command -v apt-get >/dev/null 2>&1 || {
    echo "error: no apt-get here: install Node.js (18 or newer) and npm yourself" >&2
    return 1
  }
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null &&
    command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1
}

# The npm project in folder $1 (package.json + package-lock.json + its program and config
# files) installed with `npm ci` into folder $2, redone only when the lock changed; its other
# files are copied on every call (cheap) so an edit is run at once.
ensure_npm_project() {
  local src="$1" dest="$2"
  mkdir -p "$dest"
  if [ ! -d "$dest/node_modules" ] || ! cmp -s "$src/package-lock.json" "$dest/package-lock.json"; then
    rm -rf "$dest/node_modules"
    cp "$src/package.json" "$src/package-lock.json" "$dest/"
    (cd "$dest" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
  fi
  find "$src" -maxdepth 1 -type f ! -name 'package*.json' -exec cp {} "$dest/" \;
}

# Debian's chromium and chromium-driver (for the console's browser test); installed with
# apt-get when missing. Nothing else ever fetches a browser: the test drives /usr/bin/chromium
# through /usr/bin/chromedriver.
ensure_chromium() {
  if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
    return 0
  fi
  echo "chromium/chromedriver not found; installing them with apt-get..." >&2
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 && sudo="sudo" || {
      echo "error: not root and no sudo: install chromium and chromium-driver yourself" >&2
      return 1
    }
  fi
  command -v apt-get >/dev/null 2>&1 || {
    echo "error: no apt-get here: install Chromium and its chromedriver yourself" >&2
    return 1
  }
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null &&
    command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1
}
