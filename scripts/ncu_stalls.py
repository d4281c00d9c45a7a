"""Stall samples of an Nsight Compute source export, by reason and by SASS instruction.

Usage:  ncu -i REP.ncu-rep --page source --csv --print-source sass > SRC.csv
        python3 scripts/ncu_stalls.py SRC.csv [TOP]
"""

import collections
import csv
import sys


def main() -> None:
    with open(sys.argv[1]) as f:
        rows = list(csv.reader(f))
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 45
    header, data = rows[1], rows[2:]
    ix = {h: i for i, h in enumerate(header)}
    reasons = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    totals = collections.Counter()
    per = []
    for r in data:
        by_reason = {c: int(r[ix[c]] or 0) for c in reasons}
        totals.update(by_reason)
        per.append((int(r[ix["Warp Stall Sampling (All Samples)"]] or 0), int(r[0], 16),
                    r[ix["Source"]].strip(), int(r[ix["Instructions Executed"]] or 0),
                    by_reason))
    total = sum(totals.values())
    print("total samples", total)
    for c, v in totals.most_common():
        print(f"  {c:28s} {v:7d} {100 * v / total:5.1f}%")
    print("top instructions (offset from the kernel's first):")
    base = per[0][1]
    for samples, addr, src, executed, by_reason in sorted(per, key=lambda x: -x[0])[:top]:
        main_reasons = ", ".join(f"{k[6:]}:{v}" for k, v in
                                 sorted(by_reason.items(), key=lambda kv: -kv[1])[:3] if v)
        print(f"{addr - base:6x} {samples:6d} {100 * samples / total:4.1f}% ex={executed:6d} "
              f"{src[:60]:60s} {main_reasons}")


if __name__ == "__main__":
    main()
