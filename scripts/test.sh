#!/usr/bin/env bash
# The one test command of distlock: installs the servers the tests need, then runs
# format check, clippy and every test of the workspace.
#
#   scripts/test.sh          fmt, clippy, tests
#   scripts/test.sh --quick  tests only
#
# Works on a fresh Debian machine with only the Rust toolchain: missing server binaries are
# installed with apt-get. The tests start their own servers on free loopback ports, so a Redis
# (or anything else) already running on its default port is neither needed nor touched.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

quick=0
for arg in "$@"; do
    case "$arg" in
        --quick) quick=1 ;;
        -h | --help)
            awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
            exit 0
            ;;
        *)
            echo "scripts/test.sh: unknown argument '$arg' (try --help)" >&2
            exit 2
            ;;
    esac
done

step() {
    echo
    echo "==> $*"
}

run() {
    echo "+ $*"
    "$@"
}

# Binaries the tests need, and the Debian package of each. `need_pkg BIN PKG` queues PKG when
# BIN is not on PATH (BIN may also be an absolute path, of a program or of any file such as a
# jar); `install_missing` installs the queue.
missing_bins=()
missing_pkgs=()
have() {
    command -v "$1" >/dev/null 2>&1 || [[ $1 == /* && -e $1 ]]
}
need_pkg() {
    local bin=$1 pkg=$2
    if ! have "$bin"; then
        missing_bins+=("$bin")
        case " ${missing_pkgs[*]-} " in
            *" $pkg "*) ;;
            *) missing_pkgs+=("$pkg") ;;
        esac
    fi
}

install_missing() {
    if [[ ${#missing_pkgs[@]} -eq 0 ]]; then
        echo "all test servers present"
        return 0
    fi
    echo "missing: ${missing_bins[*]} -> installing: ${missing_pkgs[*]}"
    local sudo=()
    if [[ $(id -u) -ne 0 ]]; then
        if command -v sudo >/dev/null 2>&1; then
            sudo=(sudo)
        else
            echo "error: need root or sudo to install ${missing_pkgs[*]}" >&2
            exit 1
        fi
    fi
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "error: apt-get not found; install ${missing_pkgs[*]} by hand" >&2
        exit 1
    fi
    run "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q ||
        { echo "error: apt-get update failed" >&2; exit 1; }
    run "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -q --no-install-recommends "${missing_pkgs[@]}" ||
        { echo "error: apt-get install ${missing_pkgs[*]} failed" >&2; exit 1; }
    local bin still=()
    for bin in "${missing_bins[@]}"; do
        have "$bin" || still+=("$bin")
    done
    if [[ ${#still[@]} -gt 0 ]]; then
        echo "error: still not on PATH after installing: ${still[*]}" >&2
        exit 1
    fi
}

step "checking test servers"
need_pkg redis-server redis-server
need_pkg redis-cli redis-tools
# The SQL tests use the machine's PostgreSQL and MariaDB when they run, else start throwaway
# servers from these packages. PostgreSQL's server binaries live off PATH, in
# /usr/lib/postgresql/<version>/bin; its package also brings pg_ctlcluster, which is on PATH.
if ! compgen -G '/usr/lib/postgresql/*/bin/postgres' >/dev/null; then
    need_pkg pg_ctlcluster postgresql
fi
need_pkg mariadbd mariadb-server
need_pkg mariadb-install-db mariadb-server
# The PostgreSQL TLS test makes its certificates with openssl.
need_pkg openssl openssl
# etcd: the server, etcdctl (interop tests) and protoc (etcd-client compiles its protobufs).
need_pkg etcd etcd-server
need_pkg etcdctl etcd-client
need_pkg protoc protobuf-compiler
# ZooKeeper runs from its jar (its manifest lists the dependency jars) on the package's Java.
need_pkg /usr/share/java/zookeeper.jar zookeeper
need_pkg java zookeeper
install_missing

step "toolchain"
run cargo --version
run rustc --version

if [[ $quick -eq 0 ]]; then
    cargo fmt --version >/dev/null 2>&1 ||
        { echo "error: rustfmt missing: rustup component add rustfmt" >&2; exit 1; }
    cargo clippy --version >/dev/null 2>&1 ||
        { echo "error: clippy missing: rustup component add clippy" >&2; exit 1; }

    step "format"
    run cargo fmt --all -- --check

    step "clippy"
    run cargo clippy --workspace --all-targets --all-features -- -D warnings
fi

step "tests"
if cargo nextest --version >/dev/null 2>&1; then
    run cargo nextest run --workspace --all-features --no-fail-fast
    step "doc tests"
    run cargo test --workspace --all-features --doc
else
    run cargo test --workspace --all-features --no-fail-fast
fi

step "examples"
# The articles' business case must keep working end to end (it asserts its own outcome).
run cargo run --quiet -p distlock --example voucher
run cargo run --quiet -p distlock --example scheduled_job

step "all checks passed"
