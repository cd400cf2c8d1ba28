#!/usr/bin/env bash
# Install or remove the gantry containerd shim v2 runtime handler.
#
# Installs:
#   $DESTDIR$PREFIX/bin/containerd-shim-gantry-v2             (the shim binary)
#   $DESTDIR$SYSCONFDIR/gantry/config.toml                      (from runtime-conf/gantry.toml)
#   $DESTDIR$SYSCONFDIR/crio/crio.conf.d/99-gantry.conf         (CRI-O only)
# For containerd it prints the configuration snippet to add instead.
# Run with --help for the options.
set -euo pipefail

readonly SHIM_NAME=containerd-shim-gantry-v2
readonly PROG=${0##*/}

SCRIPT_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd -- "$SCRIPT_DIR/.." && pwd)
readonly SCRIPT_DIR REPO_ROOT

readonly DROPIN_SRC=$REPO_ROOT/runtime-conf/crio/99-gantry.conf
readonly CONTAINERD_SRC=$REPO_ROOT/runtime-conf/containerd/config.toml

PREFIX=/usr/local
SYSCONFDIR=/etc
# .cargo/config.toml names the target: release artifacts live under target/<host triple>/.
BINARY=$REPO_ROOT/target/$( (rustc -vV 2>/dev/null || true) | sed -n "s/^host: //p")/release/$SHIM_NAME
CONFIG_SRC=$REPO_ROOT/runtime-conf/gantry.toml
ENGINE=auto
FORCE=0
KEEP_CONFIG=0
ACTION=install
DESTDIR=${DESTDIR:-}

WORKDIR=
TMP_FILES=()

usage() {
    cat <<EOF
Usage: $PROG [OPTIONS]

Install (default) or remove (--uninstall) the gantry runtime handler.

Options:
  --binary PATH      shim binary to install
                     (default: <repo>/target/<host triple>/release/$SHIM_NAME)
  --config PATH      gantry config file to install
                     (default: <repo>/runtime-conf/gantry.toml)
  --prefix DIR       installation prefix; the binary goes to DIR/bin
                     (default: /usr/local)
  --sysconfdir DIR   configuration root; config goes to DIR/gantry/config.toml,
                     the CRI-O drop-in to DIR/crio/crio.conf.d/99-gantry.conf
                     (default: /etc)
  --engine ENGINE    crio: install the CRI-O drop-in;
                     containerd: print the containerd snippet and where it goes;
                     auto (default): drop-in if CRI-O is found ('crio' in PATH or
                     /etc/crio exists), snippet if containerd is found
  --force            replace (or on --uninstall remove) config files whose content
                     differs from what this script ships
  --keep-config      keep an existing, different $SYSCONFDIR/gantry/config.toml
                     (it is validated with the new binary) instead of refusing
  --uninstall        remove what install put there: the binary, the drop-in, the
                     config (only if unchanged from the shipped one, or --force),
                     and the directories left empty (see below)
  -h, --help         show this help

Environment:
  DESTDIR            staging root prepended to every installed path. The installed
                     files still refer to the final paths (without DESTDIR).

Re-running with identical files changes nothing ("unchanged"). Before installing, the
config is validated with '<binary> check-config <file>', so the binary must run here.
On --uninstall, directories left empty are removed up to (not including) DESTDIR when
DESTDIR is set; without DESTDIR only \$SYSCONFDIR/gantry is removed when empty.
EOF
}

say() { printf '%s\n' "$*"; }
warn() { printf '%s: warning: %s\n' "$PROG" "$*" >&2; }
die() {
    printf '%s: error: %s\n' "$PROG" "$*" >&2
    exit 1
}
usage_error() {
    printf '%s: %s\n' "$PROG" "$*" >&2
    printf "Try '%s --help'.\n" "$PROG" >&2
    exit 2
}

cleanup() {
    local f
    for f in ${TMP_FILES[@]+"${TMP_FILES[@]}"}; do
        rm -f -- "$f"
    done
    if [[ -n $WORKDIR ]]; then
        rm -rf -- "$WORKDIR"
    fi
}
trap cleanup EXIT

# strip_slashes PATH: PATH without trailing slashes ("/" becomes "").
strip_slashes() {
    local p=$1
    while [[ $p == */ ]]; do
        p=${p%/}
    done
    printf '%s' "$p"
}

# check_path NAME VALUE: VALUE must be absolute and safe to put in a TOML string.
check_path() {
    local name=$1 value=$2
    [[ $value == /* ]] || usage_error "$name must be an absolute path: '$value'"
    case $value in
    *'"'* | *\\* | *$'\n'*)
        usage_error "$name must not contain quotes, backslashes or newlines: '$value'"
        ;;
    esac
}

# need_arg OPTION ARGC: the option needs a value.
need_arg() {
    [[ $2 -ge 2 ]] || usage_error "option $1 needs a value"
}

while [[ $# -gt 0 ]]; do
    case $1 in
    --binary) need_arg "$1" $#; BINARY=$2; shift 2 ;;
    --binary=*) BINARY=${1#*=}; shift ;;
    --config) need_arg "$1" $#; CONFIG_SRC=$2; shift 2 ;;
    --config=*) CONFIG_SRC=${1#*=}; shift ;;
    --prefix) need_arg "$1" $#; PREFIX=$2; shift 2 ;;
    --prefix=*) PREFIX=${1#*=}; shift ;;
    --sysconfdir) need_arg "$1" $#; SYSCONFDIR=$2; shift 2 ;;
    --sysconfdir=*) SYSCONFDIR=${1#*=}; shift ;;
    --engine) need_arg "$1" $#; ENGINE=$2; shift 2 ;;
    --engine=*) ENGINE=${1#*=}; shift ;;
    --force) FORCE=1; shift ;;
    --keep-config) KEEP_CONFIG=1; shift ;;
    --uninstall) ACTION=uninstall; shift ;;
    -h | --help) usage; exit 0 ;;
    *) usage_error "unknown argument: $1" ;;
    esac
done

case $ENGINE in
crio | containerd | auto) ;;
*) usage_error "--engine must be crio, containerd or auto, not '$ENGINE'" ;;
esac
if [[ $FORCE -eq 1 && $KEEP_CONFIG -eq 1 ]]; then
    usage_error "--force and --keep-config exclude each other"
fi

check_path --prefix "$PREFIX"
check_path --sysconfdir "$SYSCONFDIR"
PREFIX=$(strip_slashes "$PREFIX")
SYSCONFDIR=$(strip_slashes "$SYSCONFDIR")
DESTDIR=$(strip_slashes "$DESTDIR")
# A bare name would be looked up in PATH when it is run: anchor relative paths here.
[[ $BINARY == /* ]] || BINARY=$PWD/$BINARY
[[ $CONFIG_SRC == /* ]] || CONFIG_SRC=$PWD/$CONFIG_SRC

# Final locations on the node (what the installed files refer to).
readonly RT_BIN=$PREFIX/bin/$SHIM_NAME
readonly RT_CONF=$SYSCONFDIR/gantry/config.toml
# Where the files are written (under DESTDIR).
readonly BIN_DIR=$DESTDIR$PREFIX/bin
readonly BIN_DST=$BIN_DIR/$SHIM_NAME
readonly CONF_DIR=$DESTDIR$SYSCONFDIR/gantry
readonly CONF_DST=$CONF_DIR/config.toml
readonly DROPIN_DIR=$DESTDIR$SYSCONFDIR/crio/crio.conf.d
readonly DROPIN_DST=$DROPIN_DIR/99-gantry.conf

crio_detected() {
    command -v crio >/dev/null 2>&1 || [[ -d /etc/crio || -d $DESTDIR$SYSCONFDIR/crio ]]
}

containerd_detected() {
    command -v containerd >/dev/null 2>&1
}

# containerd_major: major version of the local containerd, or nothing.
containerd_major() {
    local out ver
    out=$(containerd --version 2>/dev/null) || return 0
    # "containerd github.com/containerd/containerd 1.6.20~ds1 <commit>" or "... v2.0.0 ..."
    ver=$(printf '%s\n' "$out" | awk '{print $3}')
    ver=${ver#v}
    printf '%s' "${ver%%.*}"
}

# not_dir PATH: PATH must not be a directory (it is about to be replaced by a file).
not_dir() {
    if [[ -d $1 && ! -L $1 ]]; then
        die "$1 is a directory; expected a file there"
    fi
}

sed_escape() {
    printf '%s' "$1" | sed -e 's/[\\|&]/\\&/g'
}

# ensure_dir DIR: create DIR and its missing parents, one line per directory created.
ensure_dir() {
    local d=$1 i
    local -a missing=()
    while [[ -n $d && ! -d $d ]]; do
        [[ -e $d ]] && die "$d exists and is not a directory"
        missing+=("$d")
        d=$(dirname -- "$d")
    done
    for ((i = ${#missing[@]} - 1; i >= 0; i--)); do
        mkdir -m 0755 -- "${missing[i]}"
        say "created directory ${missing[i]}"
    done
}

# put_file MODE SRC DST: copy SRC to DST atomically (temporary file + rename), so a
# shim started meanwhile runs either the old or the new binary, never half of one.
put_file() {
    local mode=$1 src=$2 dst=$3 tmp
    tmp=$(dirname -- "$dst")/.${dst##*/}.gantry-install.$$
    TMP_FILES+=("$tmp")
    cp -- "$src" "$tmp"
    chmod "$mode" -- "$tmp"
    mv -f -- "$tmp" "$dst"
}

# show_diff A B: the first lines of a unified diff, indented.
show_diff() {
    if command -v diff >/dev/null 2>&1; then
        { diff -u -- "$1" "$2" || true; } | head -n 40 | sed -e 's/^/    /' >&2
    fi
}

# refuse FILE NEW WHAT COMPARE HINT: FILE differs from NEW (the content this script would
# install, described by WHAT) and may not be replaced; COMPARE: arguments for a diff command,
# HINT: extra advice appended to the last line.
refuse() {
    printf '%s: error: refusing to overwrite %s: its content differs from %s\n' \
        "$PROG" "$1" "$3" >&2
    show_diff "$1" "$2"
    printf '  compare: diff -u %s\n' "$4" >&2
    printf '  re-run with --force to replace it%s\n' "$5" >&2
    exit 1
}

render_dropin() {
    local out=$1 rp cp
    rp=$(sed_escape "$RT_BIN")
    cp=$(sed_escape "$RT_CONF")
    sed -e 's|^\([[:space:]]*runtime_path[[:space:]]*=[[:space:]]*\)"[^"]*"|\1"'"$rp"'"|' \
        -e 's|^\([[:space:]]*runtime_config_path[[:space:]]*=[[:space:]]*\)"[^"]*"|\1"'"$cp"'"|' \
        "$DROPIN_SRC" >"$out"
    if ! grep -Fqx "runtime_path = \"$RT_BIN\"" "$out" ||
        ! grep -Fqx "runtime_config_path = \"$RT_CONF\"" "$out"; then
        die "$DROPIN_SRC: cannot rewrite runtime_path/runtime_config_path (unexpected layout)"
    fi
}

render_containerd() {
    local rp cp
    rp=$(sed_escape "$RT_BIN")
    cp=$(sed_escape "$RT_CONF")
    sed -e 's|^\([#[:space:]]*runtime_path[[:space:]]*=[[:space:]]*\)"[^"]*"|\1"'"$rp"'"|' \
        -e 's|^\([#[:space:]]*ConfigPath[[:space:]]*=[[:space:]]*\)"[^"]*"|\1"'"$cp"'"|' \
        -e 's|--runtime-config-path [^ ]*|--runtime-config-path '"$cp"'|' \
        "$CONTAINERD_SRC"
}

print_containerd_snippet() {
    local major
    [[ -f $CONTAINERD_SRC ]] || die "containerd snippet not found: $CONTAINERD_SRC"
    major=$(containerd_major)
    say "containerd: not changing containerd's configuration; add the snippet below:"
    say "  either save it as /etc/containerd/conf.d/gantry.toml and list that directory in"
    say "  the imports of /etc/containerd/config.toml (imports = [\"/etc/containerd/conf.d/*.toml\"]),"
    say "  or copy its [plugins...] tables (not the 'version' line) into /etc/containerd/config.toml;"
    say "  then restart containerd (systemctl restart containerd)."
    case $major in
    '' | *[!0-9]*) ;;
    0 | 1) say "  containerd $major.x found: use section 1 (config version 2) as it is." ;;
    *) say "  containerd $major.x found: section 1 also loads (migrated), or switch to section 2 (config version 3)." ;;
    esac
    say "----- 8< ----- gantry.toml for containerd -----"
    render_containerd
    say "----- >8 -----"
}

do_install() {
    local use_crio=0 use_containerd=0 conf_state dropin_state bin_state
    local validate_file out rc

    case $ENGINE in
    crio) use_crio=1 ;;
    containerd) use_containerd=1 ;;
    auto)
        if crio_detected; then use_crio=1; fi
        if containerd_detected; then use_containerd=1; fi
        ;;
    esac

    # --- checks: nothing is written before all of them pass ---------------------
    [[ -e $BINARY ]] || die "shim binary not found: $BINARY (build it with 'cargo build --release' or pass --binary PATH)"
    [[ -f $BINARY && -x $BINARY ]] || die "shim binary is not an executable file: $BINARY"
    [[ -f $CONFIG_SRC ]] || die "config file not found: $CONFIG_SRC (pass --config PATH)"
    if [[ $use_crio -eq 1 ]]; then
        [[ -f $DROPIN_SRC ]] || die "CRI-O drop-in not found: $DROPIN_SRC"
        not_dir "$DROPIN_DST"
    fi
    not_dir "$BIN_DST"
    not_dir "$CONF_DST"

    WORKDIR=$(mktemp -d "${TMPDIR:-/tmp}/gantry-install.XXXXXX")

    # The config: new, unchanged, different (refuse / --force / --keep-config).
    validate_file=$CONFIG_SRC
    if [[ ! -e $CONF_DST ]]; then
        conf_state=new
    elif cmp -s -- "$CONFIG_SRC" "$CONF_DST"; then
        conf_state=same
    elif [[ $FORCE -eq 1 ]]; then
        conf_state=replace
    elif [[ $KEEP_CONFIG -eq 1 ]]; then
        conf_state=keep
        validate_file=$CONF_DST
    else
        refuse "$CONF_DST" "$CONFIG_SRC" "$CONFIG_SRC" "$CONF_DST $CONFIG_SRC" \
            ", or with --keep-config to keep it"
    fi

    # Validate the config that will be in effect with the binary being installed.
    rc=0
    out=$("$BINARY" check-config "$validate_file" 2>&1) || rc=$?
    if [[ $rc -eq 126 || $rc -eq 127 ]]; then
        printf '%s\n' "$out" | sed -e 's/^/    /' >&2
        die "cannot run $BINARY on this machine (exit $rc): it is needed to validate the config; build it for this machine or install from a machine where it runs"
    elif [[ $rc -ne 0 ]]; then
        printf '%s: error: %s check-config rejected %s (exit %d):\n' \
            "$PROG" "$BINARY" "$validate_file" "$rc" >&2
        printf '%s\n' "$out" | sed -e 's/^/    /' >&2
        exit 1
    fi

    # The CRI-O drop-in, with the final paths.
    if [[ $use_crio -eq 1 ]]; then
        render_dropin "$WORKDIR/99-gantry.conf"
        if [[ ! -e $DROPIN_DST ]]; then
            dropin_state=new
        elif cmp -s -- "$WORKDIR/99-gantry.conf" "$DROPIN_DST"; then
            dropin_state=same
        elif [[ $FORCE -eq 1 ]]; then
            dropin_state=replace
        else
            refuse "$DROPIN_DST" "$WORKDIR/99-gantry.conf" \
                "what this script installs (from $DROPIN_SRC with runtime_path=$RT_BIN, runtime_config_path=$RT_CONF)" \
                "$DROPIN_SRC $DROPIN_DST" ""
        fi
    fi

    # The build keeps its symbol table (scripts/symbol-order.sh reads it); the installed copy
    # goes without. Not loaded at run time either way, but there is no use for it on a node.
    local bin_src=$WORKDIR/$SHIM_NAME
    cp -- "$BINARY" "$bin_src"
    if command -v strip >/dev/null 2>&1; then strip --strip-all -- "$bin_src" 2>/dev/null || cp -- "$BINARY" "$bin_src"; fi

    if [[ ! -e $BIN_DST ]]; then
        bin_state=new
    elif [[ -x $BIN_DST ]] && cmp -s -- "$bin_src" "$BIN_DST"; then
        bin_state=same
    else
        bin_state=replace
    fi

    # --- changes -----------------------------------------------------------------
    say "validated $validate_file ($BINARY check-config)"

    case $bin_state in
    same) say "unchanged $BIN_DST" ;;
    *)
        ensure_dir "$BIN_DIR"
        put_file 0755 "$bin_src" "$BIN_DST"
        if [[ $bin_state == new ]]; then say "installed $BIN_DST"; else say "updated $BIN_DST"; fi
        ;;
    esac

    case $conf_state in
    same) say "unchanged $CONF_DST" ;;
    keep) say "kept $CONF_DST (differs from $CONFIG_SRC; --keep-config)" ;;
    *)
        ensure_dir "$CONF_DIR"
        put_file 0644 "$CONFIG_SRC" "$CONF_DST"
        if [[ $conf_state == new ]]; then
            say "installed $CONF_DST"
        else
            say "replaced $CONF_DST (its previous content differed; --force)"
        fi
        ;;
    esac

    if [[ $use_crio -eq 1 ]]; then
        case $dropin_state in
        same) say "unchanged $DROPIN_DST" ;;
        *)
            ensure_dir "$DROPIN_DIR"
            put_file 0644 "$WORKDIR/99-gantry.conf" "$DROPIN_DST"
            if [[ $dropin_state == new ]]; then
                say "installed $DROPIN_DST"
            else
                say "replaced $DROPIN_DST (its previous content differed; --force)"
            fi
            ;;
        esac
        if [[ -z $DESTDIR && $dropin_state != same ]]; then
            say "next: restart CRI-O to load the handler: systemctl restart crio"
        fi
    fi

    if [[ $use_containerd -eq 1 ]]; then
        print_containerd_snippet
    fi

    if [[ $use_crio -eq 0 && $use_containerd -eq 0 ]]; then
        say "no engine configured: neither CRI-O nor containerd found (use --engine crio or --engine containerd)"
    fi
}

# prune_dirs DIR STOP: remove DIR and its parents while they are empty, never STOP or /.
prune_dirs() {
    local d=$1 stop=$2
    while [[ -n $d && $d != "$stop" && $d != / && $d != . && -d $d ]]; do
        rmdir -- "$d" 2>/dev/null || break
        say "removed empty directory $d"
        d=$(dirname -- "$d")
    done
}

do_uninstall() {
    if [[ -e $BIN_DST || -L $BIN_DST ]]; then
        rm -f -- "$BIN_DST"
        say "removed $BIN_DST"
    else
        say "absent $BIN_DST"
    fi

    # Removed whatever its content: CRI-O refuses to start when a handler's binary is missing.
    if [[ -e $DROPIN_DST || -L $DROPIN_DST ]]; then
        rm -f -- "$DROPIN_DST"
        say "removed $DROPIN_DST"
        if [[ -z $DESTDIR ]]; then
            say "next: restart CRI-O to drop the handler: systemctl restart crio"
        fi
    else
        say "absent $DROPIN_DST"
    fi

    if [[ -e $CONF_DST || -L $CONF_DST ]]; then
        if [[ -f $CONFIG_SRC ]] && cmp -s -- "$CONFIG_SRC" "$CONF_DST"; then
            rm -f -- "$CONF_DST"
            say "removed $CONF_DST"
        elif [[ $FORCE -eq 1 ]]; then
            rm -f -- "$CONF_DST"
            say "removed $CONF_DST (differed from the shipped config; --force)"
        elif [[ -f $CONFIG_SRC ]]; then
            say "kept $CONF_DST: it differs from $CONFIG_SRC (diff -u $CONFIG_SRC $CONF_DST); --force removes it"
        else
            say "kept $CONF_DST: cannot compare, $CONFIG_SRC not found; --force removes it"
        fi
    else
        say "absent $CONF_DST"
    fi

    if [[ -n $DESTDIR ]]; then
        prune_dirs "$BIN_DIR" "$DESTDIR"
        prune_dirs "$DROPIN_DIR" "$DESTDIR"
        prune_dirs "$CONF_DIR" "$DESTDIR"
    else
        prune_dirs "$CONF_DIR" "$SYSCONFDIR"
    fi

    if containerd_detected; then
        say "containerd: remove the runtimes.gantry tables from its configuration if you added them"
    fi
}

case $ACTION in
install) do_install ;;
uninstall) do_uninstall ;;
esac
