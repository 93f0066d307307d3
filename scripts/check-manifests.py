#!/usr/bin/env python3
"""Checks on `cargo metadata` output (read from stdin) for scripts/test.sh.

  check-manifests.py --published NAME...  the named crates carry what crates.io and docs.rs
                                          need; every other workspace member has publish = false
  check-manifests.py --msrv               no resolved package declares a newer rust-version
                                          than the workspace's own crates

Exits 1 with one line per problem.
"""
import json
import sys

REQUIRED = ("description", "license", "repository", "readme", "keywords", "categories", "rust_version")


def version(text):
    # Padded to three parts: "1.88" and "1.88.0" are the same version.
    parts = [int(part) for part in text.split(".")]
    return tuple(parts + [0] * (3 - len(parts)))


def published(meta, names):
    problems = []
    members = set(meta["workspace_members"])
    for package in meta["packages"]:
        if package["id"] not in members:
            continue
        name = package["name"]
        if name not in names:
            # publish = false is an empty list of registries
            if package.get("publish") != []:
                problems.append(f"{name}: not meant for crates.io, so it needs publish = false")
            continue
        for field in REQUIRED:
            if not package.get(field):
                problems.append(f"{name}: [package] has no {field.replace('_', '-')}")
        has_lib = any("lib" in target["kind"] for target in package["targets"])
        docs_rs = (package.get("metadata") or {}).get("docs", {}).get("rs", {})
        # Every feature's items on docs.rs, each with its feature badge (lib.rs reads `docsrs`).
        if has_lib and not (docs_rs.get("all-features") and "docsrs" in docs_rs.get("rustdoc-args", [])):
            problems.append(f"{name}: [package.metadata.docs.rs] needs all-features = true and "
                            'rustdoc-args = ["--cfg", "docsrs"]')
    missing = set(names) - {p["name"] for p in meta["packages"] if p["id"] in members}
    problems += [f"{name}: not a workspace member" for name in sorted(missing)]
    return problems


def msrv(meta):
    members = set(meta["workspace_members"])
    ours = [p["rust_version"] for p in meta["packages"] if p["id"] in members and p.get("rust_version")]
    if not ours:
        return ["the workspace's crates declare no rust-version"]
    limit = max(ours, key=version)
    resolved = {node["id"] for node in meta["resolve"]["nodes"]}
    return [
        f"{p['name']} {p['version']} needs Rust {p['rust_version']}, newer than our rust-version {limit}"
        f" (`cargo update -p {p['name']}` picks an older one if one fits, else raise rust-version)"
        for p in meta["packages"]
        if p["id"] in resolved and p.get("rust_version") and version(p["rust_version"]) > version(limit)
    ]


def main(argv):
    if len(argv) >= 2 and argv[0] == "--published":
        problems = published(json.load(sys.stdin), set(argv[1:]))
    elif argv == ["--msrv"]:
        problems = msrv(json.load(sys.stdin))
    else:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
