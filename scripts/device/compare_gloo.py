"""Side-by-side busbw table of Accord and Gloo from compare_gloo.sh's JSON files."""
import json
import pathlib
import sys


def load(path):
    try:
        for line in pathlib.Path(path).read_text().splitlines():
            line = line.strip()
            if line.startswith("{"):
                return json.loads(line)
    except (OSError, json.JSONDecodeError):
        pass
    return None


def main():
    out = pathlib.Path(sys.argv[1])
    print(
        f"{'collective':>12} {'ranks':>5} {'bytes':>10} {'accord_busbw':>12} {'accord_udp':>10} {'gloo_busbw':>10}"
        f" {'ratio':>6} {'udp_ratio':>9} {'#wrong':>6}"
    )
    for n in (4, 8):
        for c in ("all_reduce", "all_gather", "all_to_all"):
            a, g = load(out / f"accord_{c}_{n}.json"), load(out / f"gloo_{c}_{n}.json")
            u = load(out / f"accordudp_{c}_{n}.json")
            udp_by_bytes = {r["bytes"]: r for r in u["rows"]} if u else {}
            if not a or not g:
                print(f"{c:>12} {n:>5} missing: accord={'ok' if a else 'none'} gloo={'ok' if g else 'none'}")
                continue
            gloo_by_bytes = {r["bytes"]: r for r in g["rows"]}
            for r in a["rows"]:
                gr = gloo_by_bytes.get(r["bytes"])
                gb = gr["busbw_gbps"] if gr else float("nan")
                ratio = r["busbw_gbps"] / gb if gr and gb > 0 else float("nan")
                ur = udp_by_bytes.get(r["bytes"])
                ub = ur["busbw_gbps"] if ur else float("nan")
                udp_ratio = ub / gb if ur and gb > 0 else float("nan")
                wrong = r["wrong"] + (ur["wrong"] if ur else 0)
                print(
                    f"{c:>12} {n:>5} {r['bytes']:>10} {r['busbw_gbps']:>12.3f} {ub:>10.3f} {gb:>10.3f}"
                    f" {ratio:>6.2f} {udp_ratio:>9.2f} {wrong:>6}"
                )


if __name__ == "__main__":
    main()
