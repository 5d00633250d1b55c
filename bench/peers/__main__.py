"""``python -m bench.peers``: run the side-by-side benchmark."""

from bench.peers.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
