# shellcheck shell=bash
# Helpers shared by scripts/test, scripts/demo, scripts/pg and .ci/run.
# Source it; it defines functions only (plus JOBSTATE_ROOT) and runs nothing.
#
# Every function checks its own errors and returns non-zero, instead of relying
# on `set -e`: bash ignores errexit inside functions called from `if`, `||`
# or `&&`, which is exactly how the callers use them.

JOBSTATE_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

_log() { printf '%s\n' "$*" >&2; }
_err() { printf 'error: %s\n' "$*" >&2; }

# Sort paths so the highest version comes first. Plain `sort -r` where
# `sort -V` is missing (macOS): that only misorders patch releases; without
# sort at all, reverse glob order (same caveat).
_sort_versions_desc() {
    local -a lines=()
    local i
    if sort -V </dev/null >/dev/null 2>&1; then
        sort -r -V
    elif command -v sort >/dev/null 2>&1; then
        sort -r
    else
        while IFS= read -r i; do lines+=("$i"); done
        for ((i = ${#lines[@]} - 1; i >= 0; i--)); do echo "${lines[i]}"; done
    fi
}

_sha256() {
    if command -v sha256sum >/dev/null 2>&1; then
        sha256sum | cut -d' ' -f1
    else
        shasum -a 256 | cut -d' ' -f1
    fi
}

_python_ok() {
    "$1" -c 'import sys; sys.exit(sys.version_info < (3, 12))' >/dev/null 2>&1
}

_python_version() {
    "$1" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])' 2>/dev/null ||
        echo "not runnable"
}

# _python_is PYTHON X.Y: PYTHON runs and is Python X.Y.
_python_is() {
    [[ $("$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) == "$2" ]]
}

# The Python versions django-jobstate supports (pyproject's classifiers, the README's
# Requirements), preferred first: find_python picks the newest of these it finds.
JOBSTATE_SUPPORTED_PYTHONS=(3.13 3.12)

# find_python [X.Y]: print the path of a Python for .venv: the newest supported one found
# (JOBSTATE_SUPPORTED_PYTHONS), else, with a warning, any newer Python >= 3.12 (Django 6
# needs 3.12); JOBSTATE_PYTHON, when set, as asked. With X.Y, of a Python X.Y (a pair of
# the test matrix), found the same ways.
find_python() {
    local want=${1:-} p v name root seen=$'\n' found="" tried="" supported
    local -a candidates=() versions=() names=(python3.13 python3.12 python3.14 python3)
    if [[ -n $want ]]; then names=("python$want" "${names[@]}"); fi
    supported=${JOBSTATE_SUPPORTED_PYTHONS[*]}
    supported=${supported// /, }

    if [[ -n ${JOBSTATE_PYTHON:-} ]]; then
        candidates+=("$JOBSTATE_PYTHON")
    fi
    for name in "${names[@]}"; do
        if p=$(command -v "$name" 2>/dev/null); then
            candidates+=("$p")
        fi
    done
    # pyenv installs work even when pyenv is not on PATH or its shims point
    # at an older global version; newest first.
    local -a roots=()
    if command -v pyenv >/dev/null 2>&1 && root=$(pyenv root 2>/dev/null); then
        roots+=("$root")
    fi
    roots+=("${PYENV_ROOT:-$HOME/.pyenv}")
    if [[ ${PYENV_ROOT:-$HOME/.pyenv} != "$HOME/.pyenv" ]]; then roots+=("$HOME/.pyenv"); fi
    for root in "${roots[@]}"; do
        while IFS= read -r p; do
            [[ -n $p ]] && candidates+=("$p")
        done < <(compgen -G "$root/versions/3.1[2-9]*/bin/python" | _sort_versions_desc)
    done
    while IFS= read -r p; do
        [[ $p =~ /python3(\.[0-9]+)?$ ]] && candidates+=("$p")
    done < <(compgen -G '/usr/bin/python3*' | _sort_versions_desc)

    # Each candidate once, with its X.Y ("" when it does not run).
    local -a unique=()
    for p in ${candidates[@]+"${candidates[@]}"}; do
        case $seen in *$'\n'"$p"$'\n'*) continue ;; esac
        seen+="$p"$'\n'
        unique+=("$p")
        versions+=("$("$p" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)")
    done

    local i
    if [[ -n $want ]]; then
        for ((i = 0; i < ${#unique[@]}; i++)); do
            if [[ ${versions[i]} == "$want" ]]; then found=${unique[i]} && break; fi
        done
    else
        if [[ -n ${JOBSTATE_PYTHON:-} ]]; then
            if _python_ok "$JOBSTATE_PYTHON"; then
                found=$JOBSTATE_PYTHON
                v=$(_python_version "$found")
                if [[ " ${JOBSTATE_SUPPORTED_PYTHONS[*]} " != *" ${v%.*} "* ]]; then
                    _log "warning: JOBSTATE_PYTHON=$found is Python $v, which django-jobstate" \
                        "is not tested on (supported: $supported); using it, as asked."
                fi
            else
                _log "warning: JOBSTATE_PYTHON=$JOBSTATE_PYTHON is not Python >= 3.12;" \
                    "looking elsewhere."
            fi
        fi
        for v in "${JOBSTATE_SUPPORTED_PYTHONS[@]}"; do
            [[ -z $found ]] || break
            for ((i = 0; i < ${#unique[@]}; i++)); do
                if [[ ${versions[i]} == "$v" ]]; then found=${unique[i]} && break; fi
            done
        done
        if [[ -z $found ]]; then # only newer ones (3.14): better than none, but say so
            for ((i = 0; i < ${#unique[@]}; i++)); do
                if [[ -n ${versions[i]} ]] && _python_ok "${unique[i]}"; then
                    found=${unique[i]}
                    _log "warning: no supported Python found ($supported); using $found" \
                        "(Python ${versions[i]}), which django-jobstate is not tested on." \
                        "Install 3.13 (e.g. \`pyenv install 3.13\`) or set JOBSTATE_PYTHON."
                    break
                fi
            done
        fi
    fi
    for ((i = 0; i < ${#unique[@]}; i++)); do
        tried+="    ${unique[i]} (${versions[i]:-not runnable})"$'\n'
    done

    if [[ -n $found ]]; then
        # The real interpreter, not a pyenv shim that may change meaning later.
        "$found" -c 'import sys; print(sys.executable or sys.argv[0])' 2>/dev/null || echo "$found"
        return 0
    fi

    {
        if [[ -n $want ]]; then
            echo "No Python $want found: tried"
            if [[ -n $tried ]]; then printf '%s' "$tried"; else echo "    (no python found at all)"; fi
            echo "Install it (e.g. \`pyenv install $want\`, \`apt-get install python$want\`)."
            return 1
        fi
        echo "django-jobstate supports Python $supported (Django 6 needs 3.12 or newer)."
        echo "Found none: tried"
        if [[ -n $tried ]]; then printf '%s' "$tried"; else echo "    (no python found at all)"; fi
        echo "  (looked for \$JOBSTATE_PYTHON, ${names[*]} on PATH,"
        echo "   pyenv versions 3.12+ under ${roots[*]}, and /usr/bin/python3*)"
        echo "Install one (e.g. \`pyenv install 3.13\`, \`apt-get install python3.13\`)" \
            "or set JOBSTATE_PYTHON=/path/to/python3.13."
    } >&2
    return 1
}

# ensure_venv [GROUP...]: make $JOBSTATE_ROOT/.venv with the package installed
# editable plus the given PEP 735 dependency groups, then activate it (PATH).
# Re-runs are fast: a stamp records which groups were installed for the
# current pyproject.toml, so nothing is reinstalled until pyproject changes.
# Delete .venv/.jobstate-stamp to force a reinstall.
ensure_venv() {
    local venv="$JOBSTATE_ROOT/.venv" py pyhash g missing="" stamp
    stamp="$venv/.jobstate-stamp"

    if [[ ! -f $JOBSTATE_ROOT/pyproject.toml ]]; then
        _err "$JOBSTATE_ROOT/pyproject.toml not found"
        return 1
    fi
    if [[ ! -x $venv/bin/python ]] || ! _python_ok "$venv/bin/python"; then
        py=$(find_python) || return 1
        if [[ -e $venv ]]; then
            _log "Recreating $venv: its Python is missing or older than 3.12."
            rm -rf "$venv" || return 1
        fi
        _log "Creating $venv with $py ($(_python_version "$py"))"
        "$py" -m venv "$venv" || return 1
    fi

    pyhash=$(_sha256 <"$JOBSTATE_ROOT/pyproject.toml") || return 1
    # Stamp format: line 1 = "pyproject <sha256>", then one "group <name>" line
    # per installed group ("group" alone = just the package).
    if [[ -f $stamp && $(head -n1 "$stamp") == "pyproject $pyhash" ]]; then
        for g in "" "$@"; do
            grep -qxF "group${g:+ $g}" "$stamp" || missing+=" $g"
        done
    else
        missing="all"
    fi

    if [[ -n $missing ]]; then
        local -a args=(-e "$JOBSTATE_ROOT")
        for g in "$@"; do args+=(--group "$g"); done
        _log "Installing django-jobstate (editable)${*:+ with groups: $*} into .venv"
        # --group (PEP 735) needs pip >= 25.1. --no-compile: Python compiles what a run
        # imports as it imports it (scripts/test and scripts/demo unset
        # PYTHONDONTWRITEBYTECODE, so it does once); pip would compile every module first.
        "$venv/bin/python" -m pip install -q -U pip || return 1
        (cd "$JOBSTATE_ROOT" && "$venv/bin/python" -m pip install -q --no-compile "${args[@]}") ||
            return 1
        if [[ $missing == all ]]; then
            echo "pyproject $pyhash" >"$stamp" || return 1
        fi
        for g in "" "$@"; do
            grep -qxF "group${g:+ $g}" "$stamp" || echo "group${g:+ $g}" >>"$stamp" || return 1
        done
    fi

    export VIRTUAL_ENV="$venv"
    export PATH="$venv/bin:$PATH"
    unset PYTHONHOME
    hash -r
}

# ensure_matrix_venv X.Y A.B [backport]: make $JOBSTATE_ROOT/.venv-matrix/pyX.Y-djangoA.B
# (suffixed -backport with the third argument), a Python X.Y environment with the package
# (editable; with its [backport] extra, the django-tasks backport, given "backport"), the
# test dependency group and Django A.B.x, and print its path. Like ensure_venv, it installs
# again only when pyproject.toml changed (a stamp records it).
ensure_matrix_venv() {
    local pyver=$1 series=$2 extra=${3:-} venv spec want pkg=.
    if [[ -n $extra && $extra != backport ]]; then
        _err "ensure_matrix_venv: the third argument can only be 'backport', got '$extra'"
        return 1
    fi
    venv="$JOBSTATE_ROOT/.venv-matrix/py$pyver-django$series${extra:+-$extra}"
    if [[ -n $extra ]]; then pkg=".[$extra]"; fi
    if [[ ! $pyver =~ ^3\.[0-9]+$ || ! $series =~ ^[0-9]+\.[0-9]+$ ]]; then
        _err "ensure_matrix_venv: want a Python and a Django version as X.Y, got '$pyver' '$series'"
        return 1
    fi
    spec="Django>=$series,<${series%.*}.$((${series#*.} + 1))"
    want="pyproject $(_sha256 <"$JOBSTATE_ROOT/pyproject.toml") $spec $pkg" || return 1
    _stamped_venv "$venv" "$pyver" "$want" "$pkg" "$spec"
}

# _stamped_venv VENV X.Y WANT PKG SPEC: print VENV, a Python X.Y environment with PKG
# (editable), the matrix group (pyproject.toml: what the subset and Wagtail's tests need) and
# SPEC, installed unless its stamp says WANT already.
_stamped_venv() {
    local venv=$1 pyver=$2 want=$3 pkg=$4 spec=$5 stamp=$1/.jobstate-stamp py
    if [[ -x $venv/bin/python ]] && _python_is "$venv/bin/python" "$pyver"; then
        if [[ -f $stamp && $(<"$stamp") == "$want" ]]; then
            echo "$venv"
            return 0
        fi
    else
        py=$(find_python "$pyver") || return 1
        rm -rf "$venv" || return 1
        _log "Creating $venv with $py ($(_python_version "$py"))"
        "$py" -m venv "$venv" || return 1
    fi
    _log "Installing django-jobstate (editable, $pkg), the matrix group and $spec into $venv"
    rm -f "$stamp"
    # --group (PEP 735) needs pip >= 25.1; --no-compile as in ensure_venv: the matrix's and
    # Wagtail's venvs are built beside the first stages, and compiling all of Django and
    # Wagtail up front took most of their 10 minutes of CPU there.
    "$venv/bin/python" -m pip install -q -U pip >&2 || return 1
    (cd "$JOBSTATE_ROOT" && "$venv/bin/python" -m pip install -q --no-compile -e "$pkg" \
        --group matrix "$spec") >&2 || return 1
    echo "$want" >"$stamp" || return 1
    echo "$venv"
}

# ensure_wagtail_venv: make $JOBSTATE_ROOT/.venv-matrix/wagtail, the Wagtail stage's
# environment (scripts/test-wagtail): Python 3.13, the package (editable), the matrix group and
# Wagtail 8.0.x, and print its path. Django is the one pip resolves for Wagtail and the package
# together (6.1 today: the stage prints it); Wagtail brings the django-tasks backport. A stamp
# records pyproject.toml, the Python and the pin: it installs again only when one changes.
ensure_wagtail_venv() {
    local pyver=3.13 spec="wagtail==8.0.*" venv="$JOBSTATE_ROOT/.venv-matrix/wagtail" want
    want="pyproject $(_sha256 <"$JOBSTATE_ROOT/pyproject.toml") python$pyver $spec" || return 1
    _stamped_venv "$venv" "$pyver" "$want" . "$spec"
}

# ---------------------------------------------------------------- PostgreSQL

# Print the bin dir of a PostgreSQL server install (initdb, pg_ctl, postgres).
pg_bindir() {
    local p d
    if p=$(command -v pg_ctl 2>/dev/null) &&
        command -v initdb >/dev/null 2>&1 && command -v postgres >/dev/null 2>&1; then
        # Resolve symlinks (/usr/local/bin/pg_ctl -> /usr/lib/postgresql/15/bin)
        # so we also find pg_isready/createdb of the same version next to it.
        d=$(dirname "$(readlink -f "$p" 2>/dev/null || echo "$p")")
        echo "$d"
        return 0
    fi
    while IFS= read -r d; do
        if [[ -x $d/initdb && -x $d/pg_ctl && -x $d/postgres ]]; then
            echo "$d"
            return 0
        fi
    done < <(compgen -G '/usr/lib/postgresql/*/bin' | _sort_versions_desc)
    return 1
}

# apt_install PKG...: non-interactive apt-get install (root only), running
# `apt-get update` at most once per process. apt's output goes to stderr: scripts/pg
# and scripts/mysql print shell code on stdout for eval, and may install on the way.
apt_install() {
    local rc=0 conf=/etc/postgresql-common/createcluster.d/zz-jobstate-no-main-cluster.conf
    if [[ $EUID -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
        _err "cannot install $* (need root and apt-get)"
        return 1
    fi
    # Wait for another apt/dpkg (e.g. unattended-upgrades) instead of failing.
    local -a apt=(apt-get -o DPkg::Lock::Timeout=300)
    if [[ -z ${_JOBSTATE_APT_UPDATED:-} ]]; then
        "${apt[@]}" update -qq >&2 || return 1
        _JOBSTATE_APT_UPDATED=1
    fi
    # The postgresql package would otherwise create (and in containers start)
    # a "main" cluster on port 5432; we only want the binaries. Removed again
    # right after, so later installs on this machine behave normally.
    if [[ " $* " == *" postgresql"* ]]; then
        mkdir -p "${conf%/*}" && echo 'create_main_cluster = false' >"$conf"
    fi
    # Likewise the pgbouncer and mariadb-server packages start system services (ports 6432
    # and 3306): a policy-rc.d that refuses service starts (unless one is there) stops them.
    local policy=/usr/sbin/policy-rc.d made_policy=""
    if [[ " $* " == *" pgbouncer "* || " $* " == *" mariadb-server "* ]] && [[ ! -e $policy ]]; then
        printf '#!/bin/sh\n# Added by django-jobstate scripts/lib.sh apt_install\nexit 101\n' \
            >"$policy" && chmod 755 "$policy" && made_policy=1
    fi
    DEBIAN_FRONTEND=noninteractive "${apt[@]}" install -y -qq --no-install-recommends "$@" >&2 ||
        rc=$?
    rm -f "$conf"
    if [[ -n $made_policy ]]; then rm -f "$policy"; fi
    return "$rc"
}

# pgbouncer_bin: print the path of pgbouncer (tests/test_pgbouncer.py runs a
# throwaway one), which Debian installs in /usr/sbin, off a user's PATH.
pgbouncer_bin() {
    local p
    for p in "$(command -v pgbouncer 2>/dev/null)" /usr/sbin/pgbouncer /usr/bin/pgbouncer; do
        if [[ -n $p && -x $p ]]; then
            echo "$p"
            return 0
        fi
    done
    return 1
}

# ensure_pgbouncer: install pgbouncer with apt-get when it is missing and we
# can (root); otherwise say that its test will be skipped. Never fails.
ensure_pgbouncer() {
    pgbouncer_bin >/dev/null && return 0
    if [[ $EUID -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
        _log "pgbouncer not found; installing it with apt-get."
        if apt_install pgbouncer && pgbouncer_bin >/dev/null; then
            return 0
        fi
    fi
    _log "warning: pgbouncer not found and not installable here (needs root and apt-get):" \
        "tests/test_pgbouncer.py will be skipped. Install it with \`apt-get install pgbouncer\`."
    return 0
}

_port_in_use() {
    if command -v ss >/dev/null 2>&1; then
        ss -ltn "sport = :$1" 2>/dev/null | tail -n +2 | grep -q .
    else
        (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
    fi
}

# _free_port FROM TO: sets `port` to the first TCP port from FROM (or `port`, when it is
# higher) to TO that nothing listens on at 127.0.0.1.
_free_port() {
    if [[ -z ${port:-} ]] || ((port < $1)); then port=$1; fi
    while _port_in_use "$port"; do
        port=$((port + 1))
        if ((port > $2)); then
            _err "no free TCP port in $1-$2 on 127.0.0.1"
            return 1
        fi
    done
}

# _start_on_free_port FROM TO LOG START...: `START... PORT` on the first free port from FROM
# to TO; when the server could not bind it (LOG says so: a parallel run, scripts/test's
# parts, took it meanwhile), again on the next free one, up to five tries. Sets `port`.
_start_on_free_port() {
    local from=$1 to=$2 log=$3 attempt
    shift 3
    port=$from
    for attempt in 1 2 3 4 5; do
        _free_port "$from" "$to" || return 1
        if [[ -f $log ]]; then : >"$log"; fi # this attempt's messages (keeps the owner's file)
        if "$@" "$port"; then return 0; fi
        if ((attempt < 5)) && grep -qE 'could not bind|Address already in use' "$log" 2>/dev/null; then
            _log "Port $port was taken meanwhile; retrying on the next one."
            port=$((port + 1))
            continue
        fi
        return 1
    done
}

# _pg_as_owner OWNER CMD...: run CMD as the cluster owner ("" = ourselves),
# from the cluster dir (the owner can't necessarily read our cwd, and
# postgres tools fail when they can't resolve it).
_pg_as_owner() {
    _as_owner "$JOBSTATE_PG_DIR" "$@"
}

# _as_owner DIR OWNER CMD...: run CMD from DIR as OWNER ("" = ourselves).
_as_owner() {
    local dir=$1 owner=$2
    shift 2
    (
        cd "$dir" || exit 1
        if [[ -z $owner ]]; then
            "$@"
        elif command -v runuser >/dev/null 2>&1; then
            runuser -u "$owner" -- "$@"
        else
            su -s /bin/bash "$owner" -c "$(printf '%q ' "$@")"
        fi
    )
}

# pg_start: start a throwaway PostgreSQL cluster in a temp dir and export
# PGHOST PGPORT PGUSER PGDATABASE JOBSTATE_PG_DIR JOBSTATE_PG_CTL JOBSTATE_PG_LOG.
# Callers must `trap pg_stop EXIT` *before* calling it, so a half-started
# cluster is cleaned up too.
# It listens on 127.0.0.1 only, unless JOBSTATE_PG_EXTRA_LISTEN names one more
# address (and JOBSTATE_PG_EXTRA_HBA the network trusted to connect there): the
# partition test runs it inside a network namespace whose veth has that address.

# _pg_start_on PORT: start the cluster of pg_start on PORT (a bind failure: stopped again).
_pg_start_on() {
    echo "port = $1" >>"$JOBSTATE_PG_DIR/data/postgresql.conf" || return 1
    if "$JOBSTATE_PG_CTL" start -w -t 30 >"$JOBSTATE_PG_DIR/pg_ctl.out" 2>&1; then return 0; fi
    "$JOBSTATE_PG_CTL" stop -m immediate >/dev/null 2>&1 || true
    return 1
}
pg_start() {
    local bindir owner="" tmp port locale_opt=(--no-locale) i
    if ! bindir=$(pg_bindir); then
        if [[ $EUID -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
            _log "PostgreSQL server not found; installing it with apt-get."
            apt_install postgresql || return 1
        fi
        if ! bindir=$(pg_bindir); then
            _err "PostgreSQL server binaries (initdb, pg_ctl, postgres) not found on PATH" \
                "or in /usr/lib/postgresql/*/bin. Install PostgreSQL (e.g." \
                "\`sudo apt-get install postgresql\`, \`brew install postgresql@15\`)" \
                "and/or put its bin directory on PATH."
            return 1
        fi
    fi

    # postgres refuses to run as root.
    if [[ $EUID -eq 0 ]]; then
        if id -u postgres >/dev/null 2>&1; then owner=postgres; else owner=nobody; fi
    fi

    tmp=$(mktemp -d /tmp/jobstate-pg.XXXXXX) || return 1
    # Marker: pg_stop only ever deletes directories that have it.
    : >"$tmp/.jobstate-pg" || return 1
    export JOBSTATE_PG_DIR="$tmp"
    if [[ -n $owner ]]; then
        chown "$owner:" "$tmp" || return 1
    fi

    # UTF-8 ctype where available (upper()/ILIKE on non-ASCII text), else C.
    if locale -a 2>/dev/null | grep -qixE 'c\.utf-?8'; then
        locale_opt=(--locale=C.UTF-8)
    fi
    _log "Starting throwaway PostgreSQL ($("$bindir/postgres" --version 2>/dev/null)) in $tmp${owner:+ as user $owner}"
    if ! _pg_as_owner "$owner" "$bindir/initdb" -D "$tmp/data" --auth=trust \
        --username=jobstate --encoding=UTF8 "${locale_opt[@]}" --no-sync \
        >"$tmp/initdb.log" 2>&1; then
        _err "initdb failed:"
        cat "$tmp/initdb.log" >&2
        return 1
    fi

    local extra_listen=${JOBSTATE_PG_EXTRA_LISTEN:-} extra_hba=${JOBSTATE_PG_EXTRA_HBA:-}
    if [[ -n $extra_listen$extra_hba && (-z $extra_listen || -z $extra_hba) ]]; then
        _err "set both JOBSTATE_PG_EXTRA_LISTEN (an address) and JOBSTATE_PG_EXTRA_HBA (a CIDR)"
        return 1
    fi
    if [[ -n $extra_hba ]]; then
        echo "host all all $extra_hba trust" >>"$tmp/data/pg_hba.conf" || return 1
    fi
    {
        echo "# Added by scripts/lib.sh pg_start"
        echo "listen_addresses = '127.0.0.1${extra_listen:+,$extra_listen}'"
        echo "unix_socket_directories = '$tmp'"
        echo "max_connections = 200"
        if [[ ${PG_DURABLE:-} != 1 ]]; then
            # A throwaway test database needs no crash safety; this is much faster.
            echo "fsync = off"
            echo "synchronous_commit = off"
            echo "full_page_writes = off"
        fi
    } >>"$tmp/data/postgresql.conf" || return 1

    # Wrapper so tests can stop/start/restart the server as the right user:
    #   "$JOBSTATE_PG_CTL" restart -m fast -w
    cat >"$tmp/pg_ctl.sh" <<EOF || return 1
#!/usr/bin/env bash
# Generated by scripts/lib.sh pg_start: runs pg_ctl on the throwaway cluster
# in $tmp as its owner. Usage: "\$JOBSTATE_PG_CTL" restart -m fast -w | stop | start -w
set -euo pipefail
cd $(printf '%q' "$tmp")
cmd=($(printf '%q' "$bindir/pg_ctl") -D $(printf '%q' "$tmp/data") -l $(printf '%q' "$tmp/server.log") "\$@")
owner=$(printf '%q' "$owner")
if [[ -z \$owner || \$EUID -ne 0 ]]; then
    exec "\${cmd[@]}"
elif command -v runuser >/dev/null 2>&1; then
    exec runuser -u "\$owner" -- "\${cmd[@]}"
else
    exec su -s /bin/bash "\$owner" -c "\$(printf '%q ' "\${cmd[@]}")"
fi
EOF
    chmod 755 "$tmp/pg_ctl.sh" || return 1
    export JOBSTATE_PG_CTL="$tmp/pg_ctl.sh"
    export JOBSTATE_PG_LOG="$tmp/server.log"

    if ! _start_on_free_port 55432 55632 "$tmp/server.log" _pg_start_on; then
        _err "PostgreSQL did not start. pg_ctl said:"
        cat "$tmp/pg_ctl.out" >&2 2>/dev/null || true
        _log "Server log ($tmp/server.log):"
        cat "$tmp/server.log" >&2 2>/dev/null || true
        return 1
    fi

    export PGHOST=127.0.0.1 PGPORT="$port" PGUSER=jobstate PGDATABASE=jobstate
    # pg_ctl -w has already waited; this double-checks that TCP connections work.
    for ((i = 0; i < 60; i++)); do
        if "$bindir/pg_isready" -q -h "$PGHOST" -p "$PGPORT" 2>/dev/null; then
            break
        fi
        if ((i == 59)); then
            _err "PostgreSQL not accepting connections on $PGHOST:$PGPORT after 30 s. Server log:"
            cat "$tmp/server.log" >&2 2>/dev/null || true
            return 1
        fi
        sleep 0.5
    done

    if ! "$bindir/createdb" -h "$PGHOST" -p "$PGPORT" -U jobstate jobstate; then
        _err "createdb jobstate failed. Server log:"
        cat "$tmp/server.log" >&2 2>/dev/null || true
        return 1
    fi
    _log "PostgreSQL ready: PGHOST=$PGHOST PGPORT=$PGPORT PGUSER=$PGUSER PGDATABASE=$PGDATABASE"
}

# pg_stop: stop the cluster in $JOBSTATE_PG_DIR and delete it. Safe to call
# twice and when pg_start failed half-way or never ran.
pg_stop() {
    local dir=${JOBSTATE_PG_DIR:-} pid i
    [[ -n $dir ]] || return 0
    if [[ ! -e $dir/.jobstate-pg ]]; then
        if [[ -e $dir ]]; then
            _err "not removing $dir: it was not created by pg_start"
        fi
        unset JOBSTATE_PG_DIR JOBSTATE_PG_CTL JOBSTATE_PG_LOG
        return 0
    fi
    if [[ -f $dir/data/postmaster.pid ]]; then
        "$dir/pg_ctl.sh" stop -m immediate >/dev/null 2>&1 || true
        # If pg_ctl could not stop it, SIGQUIT the postmaster (= immediate
        # shutdown), making sure the pid really is a postgres process.
        pid=$(head -n1 "$dir/data/postmaster.pid" 2>/dev/null || true)
        if [[ $pid =~ ^[0-9]+$ ]] && [[ $(ps -o comm= -p "$pid" 2>/dev/null) == postgres* ]]; then
            kill -QUIT "$pid" 2>/dev/null || true
            for ((i = 0; i < 50; i++)); do
                kill -0 "$pid" 2>/dev/null || break
                sleep 0.1
            done
            if kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid" 2>/dev/null || true; fi
        fi
    fi
    rm -rf "$dir"
    unset JOBSTATE_PG_DIR JOBSTATE_PG_CTL JOBSTATE_PG_LOG
    return 0
}

# ---------------------------------------------------------------- MariaDB / MySQL

# mysql_bin NAME...: print the path of the first of NAME... found on PATH or in /usr/sbin.
mysql_bin() {
    local n p
    for n in "$@"; do
        for p in "$(command -v "$n" 2>/dev/null)" "/usr/sbin/$n" "/usr/bin/$n"; do
            if [[ -n $p && -x $p ]]; then
                echo "$p"
                return 0
            fi
        done
    done
    return 1
}

# mysql_start: start a throwaway MariaDB (or MySQL) server in a temp dir, as an unprivileged
# user when we are root, on a free loopback port, and export JOBSTATE_MYSQL_HOST
# JOBSTATE_MYSQL_PORT JOBSTATE_MYSQL_USER JOBSTATE_MYSQL_PASSWORD JOBSTATE_MYSQL_DIR
# JOBSTATE_MYSQL_CTL (start|stop|kill|restart the server: the fault tests use it) and
# JOBSTATE_MYSQL_LOG. Installs mariadb-server with apt-get when no server is found (root
# only). Callers must `trap mysql_stop EXIT` first, so that a half-started server goes too.
# _mysql_start_on TMP SERVER OWNER PORT: write the config of mysql_start's server for PORT, and
# start it.
_mysql_start_on() {
    local tmp=$1 server=$2 owner=$3 port=$4
    {
        echo "[mariadbd]"
        echo "datadir = $tmp/data"
        echo "socket = $tmp/mysql.sock"
        echo "tmpdir = $tmp/tmp"
        echo "pid-file = $tmp/mysqld.pid"
        echo "log-error = $tmp/server.log"
        echo "bind-address = ${JOBSTATE_MYSQL_BIND:-127.0.0.1}"
        echo "port = $port"
        echo "character-set-server = utf8mb4"
        echo "collation-server = utf8mb4_unicode_ci"
        echo "max_connections = 400"
        echo "skip-log-bin"
        echo "skip-name-resolve"
        echo "innodb_buffer_pool_size = 512M"
        if [[ ${MYSQL_DURABLE:-} != 1 ]]; then
            # A throwaway test database needs no crash safety (PG_DURABLE's twin).
            echo "innodb_flush_log_at_trx_commit = 2"
            echo "innodb_doublewrite = 0"
        fi
    } >"$tmp/my.cnf" || return 1
    _mysql_ctl_script "$tmp" "$server" "$owner" "$port" >"$tmp/ctl.sh" || return 1
    chmod 755 "$tmp/ctl.sh" || return 1
    export JOBSTATE_MYSQL_CTL="$tmp/ctl.sh" JOBSTATE_MYSQL_LOG="$tmp/server.log"
    "$JOBSTATE_MYSQL_CTL" start
}
mysql_start() {
    local server installer client owner="" tmp port
    if ! server=$(mysql_bin mariadbd mysqld); then
        if [[ $EUID -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
            _log "MariaDB server not found; installing mariadb-server with apt-get."
            apt_install mariadb-server || return 1
        fi
        if ! server=$(mysql_bin mariadbd mysqld); then
            _err "MariaDB/MySQL server (mariadbd or mysqld) not found. Install it (e.g." \
                "\`sudo apt-get install mariadb-server\`) and try again."
            return 1
        fi
    fi
    if ! installer=$(mysql_bin mariadb-install-db mysql_install_db) ||
        ! client=$(mysql_bin mariadb mysql); then
        _err "mariadb-install-db or the mariadb client not found beside $server"
        return 1
    fi
    if [[ $EUID -eq 0 ]]; then
        if id -u mysql >/dev/null 2>&1; then owner=mysql; else owner=nobody; fi
    fi
    tmp=$(mktemp -d /tmp/jobstate-mysql.XXXXXX) || return 1
    : >"$tmp/.jobstate-mysql" || return 1 # mysql_stop deletes only directories with it
    export JOBSTATE_MYSQL_DIR="$tmp"
    if [[ -n $owner ]]; then chown "$owner:" "$tmp" || return 1; fi

    _log "Starting throwaway MariaDB ($("$server" --version 2>/dev/null | head -n1)) in $tmp${owner:+ as user $owner}"
    # --no-defaults: the machine's /etc/mysql must not leak into the test server.
    # Its own tmpdir: a MariaDB server deletes every #sql* file in its tmpdir as it starts,
    # another server's temporary tables too (two parts of scripts/test start side by side).
    mkdir "$tmp/tmp" || return 1
    if [[ -n $owner ]]; then chown "$owner:" "$tmp/tmp" || return 1; fi
    if ! _as_owner "$tmp" "$owner" "$installer" --no-defaults --datadir="$tmp/data" \
        --tmpdir="$tmp/tmp" \
        --auth-root-authentication-method=normal --skip-test-db \
        ${owner:+--user="$owner"} >"$tmp/install.log" 2>&1; then
        _err "mariadb-install-db failed:"
        cat "$tmp/install.log" >&2
        return 1
    fi
    if ! _start_on_free_port 53306 53506 "$tmp/server.log" \
        _mysql_start_on "$tmp" "$server" "$owner"; then
        cat "$tmp/server.log" >&2 2>/dev/null || true
        return 1
    fi
    # The test user has every privilege: Django's test runner creates test_* databases.
    if ! "$client" --no-defaults --socket="$tmp/mysql.sock" -uroot -e "
        CREATE USER 'jobstate'@'%' IDENTIFIED BY 'jobstate';
        GRANT ALL PRIVILEGES ON *.* TO 'jobstate'@'%' WITH GRANT OPTION;
        CREATE DATABASE jobstate CHARACTER SET utf8mb4;" 2>"$tmp/client.err"; then
        _err "could not create the test user:"
        cat "$tmp/client.err" >&2
        return 1
    fi
    export JOBSTATE_MYSQL_HOST=127.0.0.1 JOBSTATE_MYSQL_PORT="$port" \
        JOBSTATE_MYSQL_USER=jobstate JOBSTATE_MYSQL_PASSWORD=jobstate
    _log "MariaDB ready on 127.0.0.1:$port (user jobstate, password jobstate)"
}

# ensure_mysqlclient_build_deps: the C library and tools mysqlclient (Django's recommended
# MySQL driver, built from source on Linux) needs, installed with apt-get when missing.
ensure_mysqlclient_build_deps() {
    if pkg-config --exists mysqlclient 2>/dev/null || pkg-config --exists libmariadb 2>/dev/null; then
        if command -v gcc >/dev/null 2>&1; then return 0; fi
    fi
    if [[ $EUID -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
        _log "Installing mysqlclient's build dependencies with apt-get (libmariadb-dev, pkg-config, gcc)."
        apt_install libmariadb-dev pkg-config gcc libc6-dev || return 1
        return 0
    fi
    _err "mysqlclient needs pkg-config, a C compiler and libmariadb (or libmysqlclient) headers:" \
        "install them (e.g. \`sudo apt-get install libmariadb-dev pkg-config gcc\`) and try again."
    return 1
}

# _mysql_ctl_script DIR SERVER OWNER PORT: print the server's control script (what
# pg_ctl.sh is to PostgreSQL): start | stop | kill | restart.
_mysql_ctl_script() {
    local dir owner
    dir=$(printf '%q' "$1") owner=$(printf '%q' "$3")
    cat <<SCRIPT
#!/usr/bin/env bash
# Generated by scripts/lib.sh mysql_start: start | stop | kill | restart the server in $dir.
set -euo pipefail
dir=$dir
running() { [[ -f \$dir/mysqld.pid ]] && kill -0 "\$(cat "\$dir/mysqld.pid")" 2>/dev/null; }
start() {
    local i
    if [[ -n "$owner" && \$EUID -eq 0 ]]; then
        runuser -u $owner -- $(printf '%q' "$2") --defaults-file="\$dir/my.cnf" --user=$owner >>"\$dir/server.log" 2>&1 &
    else
        $(printf '%q' "$2") --defaults-file="\$dir/my.cnf" >>"\$dir/server.log" 2>&1 &
    fi
    local launched=\$!
    for ((i = 0; i < 600; i++)); do
        if running && (exec 3<>/dev/tcp/127.0.0.1/$4) 2>/dev/null; then return 0; fi
        if ! kill -0 "\$launched" 2>/dev/null; then # it gave up (a port taken meanwhile...)
            echo "MariaDB exited while starting; see \$dir/server.log" >&2
            return 1
        fi
        sleep 0.1
    done
    echo "MariaDB did not start in 60 s; see \$dir/server.log" >&2
    return 1
}
stop() { # stop [SIGNAL]
    local pid i
    running || return 0
    pid=\$(cat "\$dir/mysqld.pid")
    kill "-\${1:-TERM}" "\$pid" 2>/dev/null || true
    for ((i = 0; i < 600; i++)); do
        kill -0 "\$pid" 2>/dev/null || return 0
        sleep 0.1
    done
    kill -KILL "\$pid" 2>/dev/null || true
}
case \${1:-} in
start) start ;;
stop) stop ;;
kill) stop KILL ;;
restart) stop && start ;;
*)
    echo "usage: \$0 start|stop|kill|restart" >&2
    exit 2
    ;;
esac
SCRIPT
}

# mysql_stop: stop the server in $JOBSTATE_MYSQL_DIR and delete it. Safe to call twice
# and when mysql_start failed half-way or never ran.
mysql_stop() {
    local dir=${JOBSTATE_MYSQL_DIR:-}
    [[ -n $dir ]] || return 0
    if [[ -e $dir/.jobstate-mysql ]]; then
        if [[ -x $dir/ctl.sh ]]; then "$dir/ctl.sh" kill >/dev/null 2>&1 || true; fi
        rm -rf "$dir"
    elif [[ -e $dir ]]; then
        _err "not removing $dir: it was not created by mysql_start"
    fi
    unset JOBSTATE_MYSQL_DIR JOBSTATE_MYSQL_CTL JOBSTATE_MYSQL_LOG JOBSTATE_MYSQL_HOST \
        JOBSTATE_MYSQL_PORT JOBSTATE_MYSQL_USER JOBSTATE_MYSQL_PASSWORD
    return 0
}

# ---------------------------------------------------------------- Benchmark peers

# ensure_peer_venv NAME REQUIREMENT...: make $JOBSTATE_ROOT/.venv-peers/NAME, a venv of its
# own (same Python as .venv) holding only REQUIREMENT... (pinned specs), and print its python.
# The benchmark runs Celery and Procrastinate there, apart from django-jobstate's environment.
# A stamp records the specs: it installs again only when they change.
ensure_peer_venv() {
    local name=$1 venv stamp want py
    shift
    venv="$JOBSTATE_ROOT/.venv-peers/$name"
    stamp="$venv/.jobstate-stamp"
    want="$*"
    if [[ -x $venv/bin/python ]] && _python_ok "$venv/bin/python"; then
        if [[ -f $stamp && $(<"$stamp") == "$want" ]]; then
            echo "$venv/bin/python"
            return 0
        fi
    else
        py=$(find_python) || return 1
        rm -rf "$venv" || return 1
        _log "Creating $venv with $py ($(_python_version "$py"))"
        "$py" -m venv "$venv" || return 1
    fi
    _log "Installing $* into $venv"
    rm -f "$stamp"
    "$venv/bin/python" -m pip install -q -U pip >&2 || return 1
    "$venv/bin/python" -m pip install -q "$@" >&2 || return 1
    echo "$want" >"$stamp" || return 1
    echo "$venv/bin/python"
}

# redis_start: start a throwaway redis-server (installed with apt-get if missing) as an
# unprivileged user, in a temp dir, on a free loopback port, with Redis's default
# persistence (RDB snapshots, no AOF: what a stock install runs). Exports
# BENCH_REDIS_URL and JOBSTATE_REDIS_DIR. Callers `trap redis_stop EXIT` first.
redis_start() {
    local server owner="" tmp port i
    if ! server=$(command -v redis-server); then
        if [[ $EUID -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
            _log "redis-server not found; installing it with apt-get."
            apt_install redis-server || return 1
        fi
        if ! server=$(command -v redis-server); then
            _err "redis-server not found: install Redis (e.g. \`sudo apt-get install redis-server\`)."
            return 1
        fi
    fi
    if [[ $EUID -eq 0 ]]; then owner=nobody; fi
    tmp=$(mktemp -d /tmp/jobstate-redis.XXXXXX) || return 1
    : >"$tmp/.jobstate-redis" || return 1
    export JOBSTATE_REDIS_DIR="$tmp"
    if [[ -n $owner ]]; then chown "$owner:" "$tmp" || return 1; fi
    port=""
    _free_port 56379 56579 || return 1
    # Only what differs from a stock redis.conf's effect: where it lives and listens.
    cat >"$tmp/redis.conf" <<CONF || return 1
bind 127.0.0.1
port $port
dir $tmp
pidfile $tmp/redis.pid
logfile $tmp/redis.log
daemonize yes
save 3600 1 300 100 60 10000
appendonly no
CONF
    if [[ -n $owner ]]; then chown "$owner:" "$tmp/redis.conf" || return 1; fi
    _log "Starting throwaway Redis ($("$server" --version | cut -d' ' -f3)) in $tmp${owner:+ as user $owner}"
    if ! (cd "$tmp" && if [[ -n $owner ]]; then runuser -u "$owner" -- "$server" "$tmp/redis.conf"; else "$server" "$tmp/redis.conf"; fi); then
        _err "redis-server did not start"
        cat "$tmp/redis.log" >&2 2>/dev/null || true
        return 1
    fi
    for ((i = 0; i < 100; i++)); do
        if redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null | grep -q PONG; then
            export BENCH_REDIS_URL="redis://127.0.0.1:$port/0"
            _log "Redis ready: BENCH_REDIS_URL=$BENCH_REDIS_URL"
            return 0
        fi
        sleep 0.1
    done
    _err "Redis not answering on 127.0.0.1:$port. Its log:"
    cat "$tmp/redis.log" >&2 2>/dev/null || true
    return 1
}

# redis_stop: stop the server in $JOBSTATE_REDIS_DIR and delete the dir. Safe to call twice.
redis_stop() {
    local dir=${JOBSTATE_REDIS_DIR:-} pid i
    [[ -n $dir && -e $dir/.jobstate-redis ]] || return 0
    pid=$(cat "$dir/redis.pid" 2>/dev/null || true)
    if [[ $pid =~ ^[0-9]+$ ]] && [[ $(ps -o comm= -p "$pid" 2>/dev/null) == redis-server* ]]; then
        kill -TERM "$pid" 2>/dev/null || true
        for ((i = 0; i < 50; i++)); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        if kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid" 2>/dev/null || true; fi
    fi
    rm -rf "$dir"
    unset JOBSTATE_REDIS_DIR BENCH_REDIS_URL
    return 0
}
