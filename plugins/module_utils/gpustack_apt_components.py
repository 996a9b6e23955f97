# -*- coding: utf-8 -*-
"""Archive components (e.g. non-free) added to, or taken back from, the host's existing APT
sources, structurally: gpustack_apt_components' work, also done by gpustack_apt_lists before its
refresh (the driver role's one call for the components, the lists and madison)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import glob
import json
import os

from ansible_collections.gpustack.gpustack.plugins.module_utils.gpustack_apt_commit import (
    commit_components,
    components_pending_path,
    write_components_record,
)

STATE_FILE = "/var/lib/gpustack/apt-components.json"
ARGUMENT_SPEC = dict(
    components=dict(type="list", elements="str", required=True),
    suites=dict(type="list", elements="str", required=True),
    state=dict(type="str", default="present", choices=["present", "absent", "commit", "rollback"]),
    state_file=dict(type="path", default=STATE_FILE),
    backup=dict(type="bool", default=True),
    sources_dir=dict(type="path", default="/etc/apt"),
)


def source_files(root):
    files = []
    main = os.path.join(root, "sources.list")
    if os.path.isfile(main):
        files.append(main)
    files += sorted(glob.glob(os.path.join(root, "sources.list.d", "*.list")))
    files += sorted(glob.glob(os.path.join(root, "sources.list.d", "*.sources")))
    return files


def edit_one_line(text, suites, wanted, remove):
    """Returns (new_text, touched) for a one-line-style file."""
    out, touched = [], []
    for line in text.splitlines(True):
        body = line.rstrip("\n")
        stripped = body.strip()
        words = stripped.split()
        if not words or words[0] not in ("deb", "deb-src"):
            out.append(line)
            continue
        idx = 1
        if words[1].startswith("["):
            while idx < len(words) and not words[idx].endswith("]"):
                idx += 1
            idx += 1
        if len(words) < idx + 3:
            out.append(line)
            continue
        uri, suite, comps = words[idx], words[idx + 1], words[idx + 2 :]
        if suite not in suites or "main" not in comps:
            out.append(line)
            continue
        names = wanted(uri, suite) if callable(wanted) else wanted
        if remove:
            new = [c for c in comps if c not in names]
        else:
            new = comps + [c for c in names if c not in comps]
        if new != comps:
            touched.append(
                {"uris": uri, "suites": suite, "added": [c for c in new if c not in comps]}
            )
            indent = body[: len(body) - len(body.lstrip())]
            line = indent + " ".join(words[: idx + 2] + new) + ("\n" if line.endswith("\n") else "")
        out.append(line)
    return "".join(out), touched


def edit_deb822(text, suites, wanted, remove):
    """Returns (new_text, touched) for a deb822 .sources file, stanza by stanza."""
    stanzas = text.split("\n\n")
    touched = []
    for i, stanza in enumerate(stanzas):
        fields, order = {}, []
        for n, line in enumerate(stanza.split("\n")):
            if line and not line[0].isspace() and not line.startswith("#") and ":" in line:
                key = line.split(":", 1)[0].strip().lower()
                fields[key] = (n, line.split(":", 1)[1].strip())
                order.append(key)
        types = fields.get("types", (0, ""))[1].split()
        stanza_suites = fields.get("suites", (0, ""))[1].split()
        if "components" not in fields or "deb" not in types:
            continue
        if fields.get("enabled", (0, "yes"))[1].lower() == "no":
            continue
        comps = fields["components"][1].split()
        if not set(stanza_suites) & set(suites) or "main" not in comps:
            continue
        names = (
            wanted(fields.get("uris", (0, ""))[1], " ".join(stanza_suites))
            if callable(wanted)
            else wanted
        )
        if remove:
            new = [c for c in comps if c not in names]
        else:
            new = comps + [c for c in names if c not in comps]
        if new == comps:
            continue
        lines = stanza.split("\n")
        n = fields["components"][0]
        name = lines[n].split(":", 1)[0]
        lines[n] = "%s: %s" % (name, " ".join(new))
        stanzas[i] = "\n".join(lines)
        touched.append(
            {
                "uris": fields.get("uris", (0, ""))[1],
                "suites": " ".join(stanza_suites),
                "added": [c for c in new if c not in comps],
            }
        )
    return "\n\n".join(stanzas), touched


def backup(module, path, state_dir):
    """Keep backups out of sources.list.d, where apt would complain about them."""
    import shutil
    import time

    target_dir = os.path.join(state_dir, "backups")
    if not os.path.isdir(target_dir):
        os.makedirs(target_dir, 0o700)
    target = os.path.join(
        target_dir, "%s.%s" % (os.path.basename(path), time.strftime("%Y%m%dT%H%M%S"))
    )
    shutil.copy2(path, target)
    return target


def matching_sources(files, suites):
    found = 0
    for path in files:
        with open(path) as fh:
            text = fh.read()
        for word in suites:
            if word in text.split():
                found += 1
    return found


def mark_pending(path):
    directory = os.path.dirname(path)
    if not os.path.isdir(directory):
        os.makedirs(directory, 0o700)
    with open(path, "w") as fh:
        fh.write("archive components changed; package lists not refreshed yet\n")
        fh.flush()
        os.fsync(fh.fileno())


def merged(entries, more):
    """Entries (what was added where) with `more` folded in: one per source and suites, the
    components added there over all runs."""
    out = [dict(e, added=list(e["added"])) for e in entries]
    for entry in more:
        same = [e for e in out if (e["uris"], e["suites"]) == (entry["uris"], entry["suites"])]
        if same:
            same[0]["added"] += [c for c in entry["added"] if c not in same[0]["added"]]
        else:
            out.append(dict(entry, added=list(entry["added"])))
    return out


def unmerged(entries, undo):
    """Entries less what `undo` takes back (entries left with nothing added are dropped)."""
    taken = dict(((e["uris"], e["suites"]), e["added"]) for e in undo)
    out = []
    for entry in entries:
        left = [
            c for c in entry["added"] if c not in taken.get((entry["uris"], entry["suites"]), [])
        ]
        if left:
            out.append(dict(entry, added=left))
    return out


def apply(module, p):
    """Does what the parameters `p` (ARGUMENT_SPEC's) ask, honouring check mode; returns the
    result (changed, files, entries, backups, diff, pending). Fails the module (fail_json) where
    no source serves the suites."""
    marker = components_pending_path(p["state_file"])
    record = {}
    if os.path.exists(p["state_file"]):
        with open(p["state_file"]) as fh:
            record = json.load(fh)
    if p["state"] == "commit":  # what this change added is now the host's, kept
        if not module.check_mode:
            commit_components(p["state_file"])
        return dict(changed=False, pending=False)
    pending = os.path.exists(marker)
    remove = p["state"] in ("absent", "rollback")
    wanted = p["components"]
    suites = p["suites"]
    # What a removal takes back: everything gpustack added (absent, the uninstall), or what no
    # commit has ended (rollback). A record of an older gpustack has no "uncommitted" list: with
    # its pending mark, all it names is taken back, as then.
    undo = record.get("entries") or []
    if p["state"] == "rollback" and ("uncommitted" in record or not pending):
        undo = record.get("uncommitted") or []
        if not undo:
            wanted = []
    if remove:
        # Only what gpustack added is taken away again, on the suites it added them to.
        wanted = [c for c in wanted if c in record.get("added", [])]
        suites = record.get("suites") or suites
        if undo:  # what was added where: take back only that
            per_entry = dict(
                ((e["uris"], e["suites"]), [c for c in e["added"] if c in wanted]) for e in undo
            )

            def wanted(uris, suite, per_entry=per_entry):
                return per_entry.get((uris, suite), [])

    files = source_files(p["sources_dir"])
    if not remove and not matching_sources(files, suites):
        hint = "configure the distribution's archive, or use nvidia_driver_source=mirror"
        module.fail_json(
            msg="no APT source for suites %s found under %s. Hint: %s"
            % (", ".join(p["suites"]), p["sources_dir"], hint),
            hint=hint,
        )
    edits, diffs, touched_all, backups = [], [], [], {}
    for path in files:
        with open(path) as fh:
            before = fh.read()
        edit = edit_deb822 if path.endswith(".sources") else edit_one_line
        after, touched = edit(before, suites, wanted, remove)
        if after == before:
            continue
        edits.append((path, after))
        touched_all += [dict(t, file=path) for t in touched]
        diffs.append(
            {"before": before, "after": after, "before_header": path, "after_header": path}
        )
    changed_files = [path for path, _ in edits]
    if not module.check_mode:
        if not remove and edits:
            # Intent first: the record and the pending mark exist before any source changes.
            added = set(record.get("added", []))
            for entry in touched_all:
                added |= set(entry["added"])
            now = [
                {"uris": t["uris"], "suites": t["suites"], "added": t["added"]} for t in touched_all
            ]
            write_components_record(p["state_file"], {
                "added": sorted(added), "suites": suites,
                "entries": merged(record.get("entries", []), now),
                "uncommitted": merged(record.get("uncommitted", []), now),
            })  # fmt: skip
            mark_pending(marker)
        for path, after in edits:
            if p["backup"]:
                backups[path] = backup(module, path, os.path.dirname(p["state_file"]))
            tmp = path + ".gpustack-tmp"
            with open(tmp, "w") as fh:
                fh.write(after)
            os.chmod(tmp, os.stat(path).st_mode & 0o7777)
            module.atomic_move(tmp, path)
        kept = [] if p["state"] == "absent" else unmerged(record.get("entries", []), undo)
        if remove and kept:  # a rollback: what committed runs added stays recorded
            write_components_record(p["state_file"], {
                "added": sorted(set(c for e in kept for c in e["added"])),
                "suites": record.get("suites") or suites, "entries": kept,
            })  # fmt: skip
        elif remove and os.path.exists(p["state_file"]):
            os.remove(p["state_file"])
        if remove and os.path.exists(marker):
            os.remove(marker)
    return dict(
        changed=bool(changed_files),
        files=changed_files,
        entries=touched_all,
        backups=backups,
        diff=diffs,
        pending=(pending or bool(edits)) and not remove,
    )
