"""Build the small realistic checkpoints (GPT-2-, Qwen2- and Llama-like) into a folder or the cache.

    python scripts/make_realistic_checkpoints.py                      # every flavour, into the cache
    python scripts/make_realistic_checkpoints.py --out /tmp/real gpt2 # one flavour, into /tmp/real/gpt2
    python scripts/make_realistic_checkpoints.py --chat qwen2         # plus a few seconds of chat SFT

See ``workbench/modeling/realistic.py`` for what each flavour reproduces of its real counterpart.
"""

import argparse
import sys
import time
from pathlib import Path

from workbench.modeling import realistic
from workbench.trainers import realistic_chat


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("flavours", nargs="*", default=list(realistic.FLAVOURS), help=f"any of {', '.join(realistic.FLAVOURS)}")
    parser.add_argument("--out", default="", help="write <out>/<flavour> instead of the cache (random weights only)")
    parser.add_argument("--chat", action="store_true", help="cached chat-SFT version (flavours with a chat template)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    unknown = [f for f in args.flavours if f not in realistic.FLAVOURS]
    if unknown:
        print(f"error: unknown flavour(s) {unknown}; choose from {', '.join(realistic.FLAVOURS)}", file=sys.stderr)
        return 2
    if args.out and args.chat:
        print("error: --chat builds into the cache only; drop --out or --chat", file=sys.stderr)
        return 2
    for flavour in args.flavours:
        start = time.perf_counter()
        if args.out:
            folder = realistic.write_checkpoint(flavour, Path(args.out) / flavour, seed=args.seed)
        elif args.chat:
            folder = realistic_chat.chat_checkpoint(flavour, seed=args.seed)
        else:
            folder = realistic.checkpoint(flavour, seed=args.seed)
        print(f"{flavour}: {folder} ({time.perf_counter() - start:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
