#!/usr/bin/env python3
"""Extracts the ECS field definitions storeguard uses into fields.json (beside this script).

Usage, from the repository root, with the elastic/ecs repository at the release tag to pin:

    git -C ECS show v9.4.0:generated/ecs/ecs_flat.yml > /tmp/ecs_flat.yml
    python3 audit/testdata/ecs/extract.py /tmp/ecs_flat.yml --version 9.4.0 \
        --commit "$(git -C ECS rev-list -n1 v9.4.0)" > audit/testdata/ecs/fields.json

The fields are every json tag of audit.Event (audit/event.go) outside storeguard.*, so a field
added to Event is picked up here, and one ECS lacks makes this script fail. The categorization
fields (event.kind, category, type, outcome) keep their allowed values, and event.category the
event types ECS expects with each category. audit/ecs_test.go checks the events against it.
"""
import argparse
import json
import os
import re
import sys

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
CATEGORIZATION = ("event.kind", "event.category", "event.type", "event.outcome")
KEEP = ("type", "normalize", "level", "ignore_above", "scaling_factor", "short")


def event_fields(event_go):
    tags = re.findall(r'`json:"([^",]+)', open(event_go).read())
    return sorted(t for t in set(tags) if not t.startswith("storeguard."))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("ecs_flat", help="generated/ecs/ecs_flat.yml of the pinned ECS release")
    ap.add_argument("--version", required=True, help="the release, e.g. 9.4.0")
    ap.add_argument("--commit", required=True, help="the elastic/ecs commit of that release tag")
    ap.add_argument("--event-go", default=os.path.join(HERE, "..", "..", "event.go"))
    args = ap.parse_args()

    flat = yaml.safe_load(open(args.ecs_flat))
    names = sorted(set(event_fields(args.event_go)) | set(CATEGORIZATION))
    missing = [n for n in names if n not in flat]
    if missing:
        sys.exit("extract.py: not ECS %s fields: %s" % (args.version, ", ".join(missing)))

    fields = {}
    for n in names:
        d = flat[n]
        f = {k: d[k] for k in KEEP if k in d}
        if n in CATEGORIZATION:
            f["allowed_values"] = [
                {"name": v["name"], **({"expected_event_types": v["expected_event_types"]}
                                       if "expected_event_types" in v else {})}
                for v in d["allowed_values"]
            ]
        fields[n] = f

    out = {
        "ecs_version": args.version,
        "source": {
            "repository": "github.com/elastic/ecs",
            "tag": "v" + args.version,
            "commit": args.commit,
            "path": "generated/ecs/ecs_flat.yml",
        },
        "generated_by": "audit/testdata/ecs/extract.py",
        "fields": fields,
    }
    json.dump(out, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
