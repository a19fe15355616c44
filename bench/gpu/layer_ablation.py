#!/usr/bin/env python3
"""Writes timing-only variants of the decoder layer (kernels/programs/decoder_llama3_8b.toml)
with steps taken out, to see what each part adds to a whole call where the launches overlap
(bench/gpu/layer_ablation.sh runs them). A variant computes nothing meaningful: a step taken
out leaves its reader to read another buffer of the same shape, so every kernel left keeps
its shape and its tuning. Not for --check.

Usage: layer_ablation.py OUT_DIR   (writes OUT_DIR/ablate_<variant>.toml; OUT_DIR must be kernels/programs, whose relative kernel paths they keep, prints the variants' names)
"""
import re
import sys
import tomllib
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "kernels/programs/decoder_llama3_8b.toml"

# variant -> (steps taken out by launch name and index among the steps, {buffer read: buffer read instead})
VARIANTS = {
    "full": ([], {}),
    "no_attention": (["attention"], {"a": "q"}),
    "no_rope_attention": (["rope", "attention"], {"a": "n"}),
    "no_norm1_rope_attention": (["rmsnorm#0", "rope", "attention"], {"a": "x", "n": "x"}),
    "gemms_only": (["rmsnorm#0", "rope", "attention", "rmsnorm#5"], {"a": "x", "n": "x", "n2": "x2"}),
    "mlp_only": (["rmsnorm#0", "qkv_proj", "rope", "attention", "o_proj", "rmsnorm#5"],
                 {"n2": "x", "x2": "x"}),
}


def main():
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    text = SRC.read_text()
    head, _, _ = text.partition("[[steps]]")
    spec = tomllib.loads(text)
    steps = spec["steps"]
    for name, (drop, subst) in VARIANTS.items():
        kept = []
        for i, s in enumerate(steps):
            if s["launch"] in drop or f"{s['launch']}#{i}" in drop:
                continue
            kept.append({"launch": s["launch"], "args": [subst.get(a, a) for a in s["args"]]})
        used = {a for s in kept for a in s["args"]}
        body = head
        # buffers no step touches are taken out (a program refuses an unused buffer)
        for b in spec.get("buffers", []):
            if b["name"] not in used:
                body = re.sub(r'\[\[buffers\]\]\nname = "%s"\n(?:[^\[\n][^\n]*\n)*' % re.escape(b["name"]), "", body)
        # the reference and the check go: a variant is for timing only
        body = re.sub(r"\[check\]\n(?:[^\[\n][^\n]*\n)*", "", body)
        body = body.replace('name    = "decoder_llama3_8b"', f'name    = "ablate_{name}"')
        for s in kept:
            body += '[[steps]]\nlaunch = "%s"\nargs   = [%s]\n' % (s["launch"], ", ".join('"%s"' % a for a in s["args"]))
        (out / f"ablate_{name}.toml").write_text(body)
        print(name)


if __name__ == "__main__":
    main()
