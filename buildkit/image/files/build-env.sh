# shellcheck shell=bash
# ascendkit: sourced by every pip layer of the image; holds no secrets. It reads build ARGs the
# Dockerfile declares from the matrix: ASCENDKIT_ARCHES (what the image supports) and, per arch,
# ASCENDKIT_EXTRA_INDEXES_<arch> (the names of the index ARGs pip gets as extra indexes).
ascendkit_xtrace=0
case "$-" in *x*) ascendkit_xtrace=1; set +x ;; esac

# The same bytes from the same inputs (docs/architecture.md, "Reproducible images"). The Dockerfile's
# SOURCE_DATE_EPOCH (a fixed point, never the clock) makes the bytecode pip and uv compile checked-hash:
# it holds its source's hash, where a timestamp pyc holds the source's mtime (the moment of the
# install). Nothing else Python runs here writes bytecode. C and C++ built from an sdist carry no
# debug info: it names the random directory the build ran in. Publishing clamps file times to the epoch.
if [ -n "${SOURCE_DATE_EPOCH:-}" ]; then
  export SOURCE_DATE_EPOCH PYTHONDONTWRITEBYTECODE=1
  export CFLAGS="${CFLAGS:+${CFLAGS} }-g0" CXXFLAGS="${CXXFLAGS:+${CXXFLAGS} }-g0"
fi

# A CA bundle and index credentials, when ascendkit gives them to this build. With BuildKit they
# are secret mounts (/run/secrets/ascendkit-ca and -env: tmpfs, for this RUN only). With the
# classic builder ascendkit serves them on a loopback URL passed in ftp_proxy (a predefined ARG the
# classic builder keeps out of `docker history` and the cache key): fetched to memory-backed
# /dev/shm and removed when the RUN ends. Either way no layer ever contains them. The env file may
# re-export index ARGs with their credentials.
ascendkit_ca="" ascendkit_env=""
if [ -e /run/secrets/ascendkit-ca ] || [ -e /run/secrets/ascendkit-env ]; then
  ascendkit_ca=/run/secrets/ascendkit-ca ascendkit_env=/run/secrets/ascendkit-env
elif [ -n "${ftp_proxy:-}" ]; then
  ascendkit_secrets="$(mktemp -d /dev/shm/ascendkit.XXXXXX 2>/dev/null || mktemp -d)"
  trap 'rm -rf "${ascendkit_secrets}"' EXIT
  python3 - "${ftp_proxy}" "${ascendkit_secrets}" <<'PY'
import sys
import urllib.request

url, out = sys.argv[1], sys.argv[2]
for name in ("ca.pem", "env"):
    with open(f"{out}/{name}", "wb") as handle:
        handle.write(urllib.request.urlopen(f"{url}/{name}", timeout=30).read())
PY
  ascendkit_ca="${ascendkit_secrets}/ca.pem" ascendkit_env="${ascendkit_secrets}/env"
  unset ftp_proxy
fi
if [ -s "${ascendkit_ca}" ]; then
  export PIP_CERT="${ascendkit_ca}" SSL_CERT_FILE="${ascendkit_ca}" REQUESTS_CA_BUNDLE="${ascendkit_ca}"
fi
if [ -s "${ascendkit_env}" ]; then
  # shellcheck source=/dev/null
  . "${ascendkit_env}"
fi

# pip's and uv's download cache: BuildKit mounts one per arch at /var/cache/ascendkit (never part
# of a layer); with the classic builder nothing is mounted there and they install without a cache.
ascendkit_cache=""
# An offline build takes nothing from it: every package must come from the wheelhouse it was given,
# not from what an online build left in the cache.
if [ -z "${PIP_NO_INDEX:-}" ] && grep -q " /var/cache/ascendkit " /proc/self/mountinfo 2>/dev/null; then
  ascendkit_cache=/var/cache/ascendkit
  echo "ascendkit: pip and uv keep their downloads in BuildKit's cache mount ${ascendkit_cache} (no layer holds them)" >&2
fi

# This arch's extra indexes, expanded after the served env so credentials reach pip. BuildKit
# names the arch it builds for (TARGETARCH): a machine that runs another (a missing or wrong qemu
# emulation) would install the wrong wheels, so it stops here.
ascendkit_arch="$(uname -m)"
case "${TARGETARCH:-}:${ascendkit_arch}" in
  :* | amd64:x86_64 | arm64:aarch64) ;;
  *)
    echo "ascendkit: BuildKit builds for ${TARGETARCH}, but this step runs on ${ascendkit_arch}: check the builder's emulation (qemu binfmt)" >&2
    exit 1
    ;;
esac
case " ${ASCENDKIT_ARCHES:?the Dockerfile declares ASCENDKIT_ARCHES} " in
  *" ${ascendkit_arch} "*) ;;
  *)
    echo "ascendkit: this image supports ${ASCENDKIT_ARCHES// /, }, not ${ascendkit_arch}" >&2
    exit 1
    ;;
esac
ascendkit_names="ASCENDKIT_EXTRA_INDEXES_${ascendkit_arch}"
ascendkit_urls=""
for ascendkit_name in ${!ascendkit_names:-}; do
  ascendkit_urls="${ascendkit_urls:+${ascendkit_urls} }${!ascendkit_name}"
done
if [ -n "${ascendkit_urls}" ]; then
  export PIP_EXTRA_INDEX_URL="${ascendkit_urls}${PIP_EXTRA_INDEX_URL:+ ${PIP_EXTRA_INDEX_URL}}"
fi

# pip ignores an index on plain http (an internal mirror) unless its host is trusted; a mirror the
# build was pointed at is. uv takes it as it is. Credentials never reach the list.
for ascendkit_url in ${PIP_INDEX_URL:-} ${PIP_EXTRA_INDEX_URL:-}; do
  case "${ascendkit_url}" in
    http://*)
      ascendkit_host="${ascendkit_url#http://}"
      ascendkit_host="${ascendkit_host%%/*}"
      export PIP_TRUSTED_HOST="${PIP_TRUSTED_HOST:+${PIP_TRUSTED_HOST} }${ascendkit_host##*@}"
      ;;
  esac
done

# uv reads its own variables, not pip's: the same indexes (credentials included, set here where
# xtrace is off so no command line shows them) and an offline build's wheelhouse (pip separates
# find-links with spaces, uv with commas). A served CA bundle reaches uv as SSL_CERT_FILE (above).
export UV_INDEX_URL="${PIP_INDEX_URL:-https://pypi.org/simple}"
if [ -n "${PIP_EXTRA_INDEX_URL:-}" ]; then export UV_EXTRA_INDEX_URL="${PIP_EXTRA_INDEX_URL}"; fi
if [ -n "${PIP_FIND_LINKS:-}" ]; then export UV_FIND_LINKS="${PIP_FIND_LINKS// /,}"; fi
# uv gives each bytecode-compiling Python 60 s to start, then fails the step: an aarch64 image built
# under qemu on a busy x86_64 machine takes longer than that (seen in CI). Bounded still, at 10 min.
export UV_COMPILE_BYTECODE_TIMEOUT="${UV_COMPILE_BYTECODE_TIMEOUT:-600}"

# What the locks installed so far, for later pip steps to keep (plan.CONSTRAINTS_FILE); where an
# installer's output is kept while a step runs (memory: no layer holds it).
ascendkit_constraints=/etc/ascendkit/constraints.txt
ascendkit_scratch=/dev/shm

# ascendkit_install LAYER PIN...: what each pip layer runs. With this arch's lock resolved, it
# installs the layer's section of the lock (COPYed right before the step) with every hash enforced
# and no build isolation (the build requirements are locked too); the locked versions join the
# constraints file. The installer is uv, or pip with ASCENDKIT_INSTALLER=pip: the same section,
# the same packages, bytecode compiled (ASCENDKIT_COMPILE_BYTECODE=0 skips that, for tests under
# emulation, where compiling is most of the time and bytecode is only a cache). uv, unlike pip,
# wants a trusted hash for every requirement, also one an earlier layer installed: every other
# section of this arch is given as a constraint, hashes and all. A lock marked unresolved (its
# index was unreachable when it was made) falls back to pip and the version pins, loudly.
ascendkit_install() {
  # No xtrace of the bookkeeping below: the log shows each installer command, as it runs.
  { local trace="$-"; set +x; } 2>/dev/null
  local layer="$1" arch flags=() launcher=() section other
  shift
  if [ -n "${ASCENDKIT_LAUNCHER:-}" ]; then launcher=("${ASCENDKIT_LAUNCHER}"); fi
  arch="$(uname -m)"
  section="${ASCENDKIT_SECTION:-/etc/ascendkit/locks/${layer}-${arch}.txt}"
  if [ -n "${ASCENDKIT_NO_BINARY:-}" ]; then flags+=(--no-binary "${ASCENDKIT_NO_BINARY}"); fi
  local compile=(--compile-bytecode) no_compile=() uv_cache=(--no-cache) pip_cache=(--no-cache-dir) pip_env=()
  if [ -n "${ascendkit_cache}" ]; then  # the image's PIP_NO_CACHE_DIR would turn pip's cache off
    uv_cache=(--cache-dir "${ascendkit_cache}/uv") pip_cache=(--cache-dir "${ascendkit_cache}/pip") pip_env=(env -u PIP_NO_CACHE_DIR)
  fi
  if [ "${ASCENDKIT_COMPILE_BYTECODE:-1}" = 0 ]; then compile=() no_compile=(--no-compile); fi
  if grep -qx "# status: resolved" "${section}"; then
    if grep -q "^[A-Za-z0-9]" "${section}"; then
      case "${ASCENDKIT_INSTALLER:-uv}" in
        uv)
          if [ -n "${PIP_NO_INDEX:-}" ]; then flags=(--no-index "${flags[@]}"); fi
          for other in /etc/ascendkit/locks/*-"${arch}".txt; do
            if [ "${other}" != "${section}" ] && grep -q "^[A-Za-z0-9]" "${other}"; then flags+=(--constraint "${other}"); fi
          done
          ascendkit_uv_install "${section}" "${#compile[@]}" "${launcher[@]}" python3 -m uv pip install "${flags[@]}" \
            --python "$(command -v python3)" --no-config "${uv_cache[@]}" --link-mode=copy "${compile[@]}" --require-hashes \
            --no-build-isolation -r "${section}" || return
          ;;
        pip)
          ascendkit_run "${pip_env[@]}" "${launcher[@]}" python3 -m pip install "${pip_cache[@]}" "${no_compile[@]}" --require-hashes \
            --no-build-isolation "${flags[@]}" -r "${section}"
          ;;
        *)
          echo "ascendkit: ASCENDKIT_INSTALLER=${ASCENDKIT_INSTALLER}: choose uv or pip" >&2
          return 2
          ;;
      esac
      grep -o "^[A-Za-z0-9][^ ]*==[^ ]*" "${section}" >> "${ascendkit_constraints}"
    else
      echo "ascendkit: lock layer ${layer}: nothing new, earlier layers installed all of it"
    fi
  elif [ "$#" -gt 0 ]; then
    echo "ascendkit: WARNING: the ${arch} lock is unresolved; installing $* by version pins, hashes NOT enforced" >&2
    ascendkit_run "${pip_env[@]}" "${launcher[@]}" python3 -m pip install "${pip_cache[@]}" "${no_compile[@]}" -c "${ascendkit_constraints}" \
      "${flags[@]}" "$@"
  fi
  case "${trace}" in *x*) set -x ;; esac
}

# ascendkit_uv_install SECTION COMPILING COMMAND...: uv's install of one lock section, again with
# --reinstall (at most twice more) when only its bytecode compile failed. Under qemu, uv's compiling
# Pythons now and then stop answering (astral-sh/uv#6105, #11699) and uv gives up on them after
# UV_COMPILE_BYTECODE_TIMEOUT; the packages are in place by then, but a plain second run would find
# them installed and compile nothing, so the section installs again and uv compiles it all. Any other
# failure stops the step at once. uv's output is kept in ascendkit_scratch, which no layer holds.
ascendkit_uv_install() {
  local - section="$1" compiling="$2" attempt=1 status output
  shift 2
  set +e -o pipefail  # uv's status through tee; `local -` restores the caller's options
  output="$(mktemp -p "${ascendkit_scratch}" ascendkit-uv.XXXXXX 2>/dev/null || mktemp)"
  while :; do
    ascendkit_run "$@" 2>&1 | tee "${output}"
    status=$?
    if [ "${status}" = 0 ]; then break; fi
    if [ "${compiling}" = 0 ] || [ "${attempt}" -ge 3 ] || ! grep -q "Failed to bytecode-compile" "${output}"; then
      rm -f "${output}"
      return "${status}"
    fi
    echo "ascendkit: uv's bytecode compile of ${section##*/} failed (attempt ${attempt} of 3): installing it again, compiling all of it" >&2
    attempt=$((attempt + 1))
    if [ "${attempt}" = 2 ]; then set -- "$@" --reinstall; fi
  done
  rm -f "${output}"
}

# ascendkit_install_checkout LAYER DIR: the framework's git checkout, after ascendkit_install LAYER
# put what its requirements need beyond the earlier layers in place. With this arch's lock
# resolved, the checkout itself installs with no dependencies and no build isolation, so nothing
# unlocked comes in; with it unresolved, pip resolves its requirements under the constraints file.
# The variables of its build (TARGET_DEVICE=NPU) come from the caller's environment.
ascendkit_install_checkout() {
  { local trace="$-"; set +x; } 2>/dev/null
  local layer="$1" dir="$2" section
  section="/etc/ascendkit/locks/${layer}-$(uname -m).txt"
  if grep -qx "# status: resolved" "${section}"; then
    ascendkit_run python3 -m pip install --no-cache-dir --no-deps --no-build-isolation "${dir}"
  else
    echo "ascendkit: WARNING: the $(uname -m) lock is unresolved; ${dir}'s requirements are resolved by pip, hashes NOT enforced" >&2
    ascendkit_run python3 -m pip install --no-cache-dir -c "${ascendkit_constraints}" "${dir}"
  fi
  case "${trace}" in *x*) set -x ;; esac
}

# ascendkit_install_project LAYER DIST==VERSION FILE [EXTRAS]: a pin built from its sdist with the
# sdist's FILE as its pyproject.toml (SGLang's NPU project, pyproject_npu.toml). With this arch's lock
# resolved, the layer's section less the pin installs first (what the lock resolved from FILE and
# EXTRAS), the sdist comes by the lock's hash, and it builds with no deps and no build isolation; with
# the lock unresolved, pip resolves FILE's requirements (with EXTRAS) under the constraints file.
ascendkit_install_project() {
  { local trace="$-"; set +x; } 2>/dev/null
  local layer="$1" pin="$2" file="$3" extras="${4:-}" section work tree
  section="/etc/ascendkit/locks/${layer}-$(uname -m).txt"
  # a fixed directory, not mktemp's: pip records the path it installed from (direct_url.json)
  work="/tmp/ascendkit-project-${layer}"
  rm -rf "${work}" && mkdir -p "${work}"
  if grep -qx "# status: resolved" "${section}"; then
    awk -v pin="${pin%%==*}==" -v one="${work}/pin.txt" -v rest="${work}/rest.txt" '
      BEGIN { pin = tolower(pin); gsub(/[_.]+/, "-", pin) }  # the lock spells names canonically
      /^[A-Za-z0-9]/ { mine = (index(tolower($0), pin) == 1) }
      { print > (mine ? one : rest) }' "${section}"
    ASCENDKIT_SECTION="${work}/rest.txt" ascendkit_install "${layer}"
    ascendkit_run python3 -m pip download --no-cache-dir --no-deps --no-build-isolation --no-binary :all: \
      --require-hashes -d "${work}/src" -r "${work}/pin.txt"
  else
    echo "ascendkit: WARNING: the $(uname -m) lock is unresolved; ${pin} and ${file}'s requirements come unhashed" >&2
    ascendkit_run python3 -m pip download --no-cache-dir --no-deps --no-binary :all: -d "${work}/src" "${pin}"
  fi
  tar -xzf "${work}/src/"*.tar.gz -C "${work}/src"
  tree="$(find "${work}/src" -mindepth 1 -maxdepth 1 -type d)"
  test -f "${tree}/${file}" || { echo "ascendkit: ${pin}'s sdist has no ${file}" >&2; return 1; }
  mv "${tree}/${file}" "${tree}/pyproject.toml"
  if grep -qx "# status: resolved" "${section}"; then
    ascendkit_run python3 -m pip install --no-cache-dir --no-deps --no-build-isolation "${tree}"
  else
    ascendkit_run python3 -m pip install --no-cache-dir -c "${ascendkit_constraints}" "${tree}${extras:+[${extras}]}"
  fi
  rm -rf "${work}"
  case "${trace}" in *x*) set -x ;; esac
}

# ascendkit_public URL: the URL without any user:password@ (what a log may show).
ascendkit_public() {
  printf '%s' "$1" | sed -E 's#://[^/@]*@#://#'
}

# ascendkit_git_clone ARG PATH DIR: clone PATH from the git host the build ARG named ARG holds (a
# mirror, perhaps with credentials served for this build) with xtrace off: the log shows the URL
# without them. The checkout's .git, which keeps the URL, never reaches a layer.
ascendkit_git_clone() {
  { local trace="$-"; set +x; } 2>/dev/null
  local url="${!1}/$2"
  echo "+ git clone $(ascendkit_public "${url}") $3" >&2
  git clone --quiet --filter=blob:none --no-checkout "${url}" "$3"
  case "${trace}" in *x*) set -x ;; esac
}

# ascendkit_install_archive LAYER ARG PATH ARCH=FILE=SHA256... -- WHEEL...: wheels published only
# inside a release archive (sgl-kernel-npu's zips, one per chip and arch). This arch's archive is
# fetched from PATH/FILE on the git host the build ARG named ARG holds (a mirror; credentials it
# carries are never shown), checked against its sha256 when the matrix knows it (the lock is
# unresolved when it does not), unpacked, and the wheels installed in order: with no deps when the
# lock is resolved (the archive's own requirements are not in the lock; verification checks each
# wheel is installed and its modules are found), else under the constraints file.
ascendkit_install_archive() {
  { local trace="$-"; set +x; } 2>/dev/null
  local layer="$1" url="${!2}/$3" arch entry file="" sum="" work wheel found flags=() wheels=()
  shift 3
  arch="$(uname -m)"
  while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do
    entry="$1"
    shift
    if [ "${entry%%=*}" = "${arch}" ]; then file="${entry#*=}" sum="${file#*=}" file="${file%%=*}"; fi
  done
  shift
  test -n "${file}" || { echo "ascendkit: no ${layer} archive for ${arch}" >&2; return 1; }
  work="/tmp/ascendkit-archive-${layer}"  # fixed, as in ascendkit_install_project: pip records the wheels' paths
  rm -rf "${work}" && mkdir -p "${work}"
  echo "+ fetch $(ascendkit_public "${url}/${file}")" >&2
  python3 - "${url}/${file}" "${work}/${file}" "$(ascendkit_public "${url}/${file}")" <<'PY'
import base64
import sys
import time
import urllib.parse
import urllib.request

# a mirror's user:password@ becomes basic auth (urllib would take it for part of the host)
parts = urllib.parse.urlsplit(sys.argv[1])
headers = {}
if parts.username is not None:
    pair = f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}"
    headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
    parts = parts._replace(netloc=parts.netloc.rsplit("@", 1)[1])
request = urllib.request.Request(urllib.parse.urlunsplit(parts), headers=headers)
for attempt in range(1, 6):
    try:
        with urllib.request.urlopen(request, timeout=120) as answer, open(sys.argv[2], "wb") as out:
            while chunk := answer.read(1 << 20):
                out.write(chunk)
        break
    except OSError as exc:
        print(f"ascendkit: fetching {sys.argv[3]} failed ({exc.__class__.__name__}); attempt {attempt} of 5", file=sys.stderr)
        if attempt == 5:
            sys.exit(1)
        time.sleep(2 * attempt)
PY
  if [ -n "${sum}" ]; then
    echo "${sum}  ${work}/${file}" | sha256sum -c - >&2
  else
    echo "ascendkit: WARNING: no sha256 is known for ${file}; installed as fetched, NOT verified" >&2
  fi
  python3 -m zipfile -e "${work}/${file}" "${work}/wheels"
  for wheel in "$@"; do
    found="$(find "${work}/wheels" -name "${wheel//-/_}-*.whl" | sort | tail -n 1)"
    test -n "${found}" || { echo "ascendkit: ${file} holds no ${wheel} wheel" >&2; return 1; }
    wheels+=("${found}")
  done
  if grep -qx "# status: resolved" "/etc/ascendkit/locks/${layer}-${arch}.txt"; then flags=(--no-deps); else flags=(-c "${ascendkit_constraints}"); fi
  ascendkit_run python3 -m pip install --no-cache-dir "${flags[@]}" "${wheels[@]}"
  rm -rf "${work}"
  case "${trace}" in *x*) set -x ;; esac
}

# ascendkit_run COMMAND...: print the command (it holds no secret: those travel in the environment), run it.
# uv leaves a lock file of its build backend in the temporary directory, named at random
# (uv-setuptools-<hex>.lock): removed, so the layer holds the same files at every build.
ascendkit_run() {
  echo "+ $*" >&2
  "$@" || { local status=$?; rm -f "${TMPDIR:-/tmp}"/uv-*.lock; return "${status}"; }
  rm -f "${TMPDIR:-/tmp}"/uv-*.lock
}

if [ "${ascendkit_xtrace}" = 1 ]; then set -x; fi
