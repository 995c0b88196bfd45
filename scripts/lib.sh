# Shared by the scripts: make sure what they run is installed (redis-server; python3 with venv,
# node with npm, chromium for the test and benchmark scripts). On Debian/Ubuntu it is
# installed with apt-get (as root, or through sudo), by `apt_install`; elsewhere the message
# says what to do.

# Installs the Debian packages $2... with apt-get (as root, or through sudo); $1 names what
# they provide, for the messages. `apt-get update` runs once per script.
apt_install() {
  local what="$1"
  shift
  echo "$what not found; installing it with apt-get..." >&2
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 && sudo="sudo" || {
      echo "error: not root and no sudo: install $what yourself (apt-get install $*)" >&2
      return 1
    }
  fi
  command -v apt-get >/dev/null 2>&1 || {
    echo "error: no apt-get here: install $what with your package manager" >&2
    return 1
  }
  if [ -z "${SLUICE_APT_UPDATED:-}" ]; then
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq || return 1
    SLUICE_APT_UPDATED=1
  fi
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

# Makes sure the shell condition $2 holds, installing the Debian packages $3... with
# apt_install when it does not; $1 names what they provide, for the messages.
ensure_installed() {
  local what="$1" ok="$2"
  shift 2
  eval "$ok" && return 0
  apt_install "$what" "$@" || return 1
  eval "$ok" || { echo "error: $what still missing after apt-get install $*" >&2; return 1; }
}

ensure_redis() {
  ensure_installed "redis-server (Redis 7.0 or newer)" \
    'command -v redis-server >/dev/null 2>&1' redis-server
}

# Python 3 with venv (for the generated-client round trip and the fuzz).
ensure_python_venv() {
  ensure_installed "python3 with venv" \
    'command -v python3 >/dev/null 2>&1 && python3 -c "import venv, ensurepip" >/dev/null 2>&1' \
    python3 python3-venv
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

# Node.js with npm (for the benchmark's BullMQ peer and the TypeScript client check).
ensure_node() {
  ensure_installed "Node.js (18 or newer) with npm" \
    'command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1' nodejs npm
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
  ensure_installed "Chromium with its chromedriver" \
    'command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1' \
    chromium chromium-driver
}
