"""`make bench`: runs every benchmark; the last line is one JSON object."""

from __future__ import annotations

import json

from bench import appends


def main() -> None:
    rows = appends.run()
    print(f"{'measure':<28}{'value':>14}")
    for k, v in rows.items():
        print(f"{k:<28}{v:>14.2f}")
    print(json.dumps({k: round(v, 3) for k, v in rows.items()}))


if __name__ == "__main__":
    main()
