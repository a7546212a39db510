"""Turn the thesis's result tables 1-15 into the CSV files under src/guide_utils/results/source_data/.

Run once by hand; its one argument is the path of the thesis's plain-text version, which is
not part of this repository. The CSVs are committed, so nothing else needs that file. Tables are numbered as the thesis's
captions number them (Table 10 is experiment 4); its list of tables, and its text from
experiment 4 on, number the quality tables one higher. Each table in the text is a caption
line "Table N. ...", a tab-separated header, and tab-separated rows up to the next blank line.
Columns are renamed to the guide's vocabulary; "16 (4 * 4)" becomes gpus=16, nodes=4;
"73.286% / 91.558%" becomes top1_acc=73.286, top5_acc=91.558; "0 days 6 hours 34 min" becomes
wall_hours.

    python scripts/extract_source_tables.py THESIS.txt
"""

from __future__ import annotations

import csv
import re
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "src" / "guide_utils" / "results" / "source_data"
COLUMNS = {
    "Deep learning framework": "framework",
    "Batch size per GPU": "per_worker_batch",
    "Number of nodes": "nodes",
    "Number of GPUs": "gpus",
    "Throughput (images per second)": "images_per_second",
    "Learning rate": "lr",
    "Linearly scaled learning rate": "lr",
    "Global batch size": "global_batch",
}
SECTIONS = {1: "5.1", 2: "5.1", 3: "5.1", 4: "5.2", 5: "5.2", 6: "5.2", 7: "5.3", 8: "5.3", 9: "5.3",
            10: "5.4", 11: "5.5", 12: "5.6", 13: "5.7", 14: "5.8", 15: "5.9"}
EXPERIMENT = {1: 1, 2: 1, 3: 1, 4: 2, 5: 2, 6: 2, 7: 3, 8: 3, 9: 3, 10: 4, 11: 5, 12: 6, 13: 7, 14: 8, 15: 9}


def hours(text: str) -> float:
    parts = dict((unit[:3], int(n)) for n, unit in re.findall(r"(\d+)\s*(day|hour|min)", text))
    return round(parts.get("day", 0) * 24 + parts.get("hou", 0) + parts.get("min", 0) / 60, 4)


def convert(header: list[str], row: list[str]) -> dict[str, object]:
    out: dict[str, object] = {}
    for name, value in zip(header, row):
        value = value.replace("<code>", "").replace("</code>", "").strip()
        if name.startswith("Best Top-1/Top-5"):
            top1, top5 = re.findall(r"([\d.]+)%", value)
            out["top1_acc"], out["top5_acc"] = float(top1), float(top5)
        elif name.startswith("Wall clock time"):
            out["wall_hours"] = hours(value)
        elif name == "Number of GPUs":
            m = re.match(r"(\d+)(?:\s*\((\d+)\s*\*\s*(\d+)\))?", value)
            out["gpus"] = int(m.group(1))
            out.setdefault("nodes", int(m.group(2)) if m.group(2) else 1)
        elif name == "Deep learning framework":
            out["baseline"] = "(baseline)" in value
            out["framework"] = value.replace("(baseline)", "").strip()
        else:
            key = COLUMNS[name]
            number = value.replace(" ", "")
            out[key] = float(number) if "." in number else int(number)
    return out


def main(path: str) -> None:
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    seen = set()
    for i, line in enumerate(lines):
        m = re.match(r"Table (\d+)\. (.*)", line)
        # The list of tables at the top ends in page numbers after a tab; skip it.
        if not m or "\t" in line or int(m.group(1)) in seen:
            continue
        n, caption = int(m.group(1)), m.group(2).strip()
        j = i + 1
        while not lines[j].strip():
            j += 1
        header = lines[j].split("\t")
        rows = []
        for row in lines[j + 1:]:
            if not row.strip():
                break
            rows.append(convert(header, row.split("\t")))
        seen.add(n)
        fields = list(dict.fromkeys(k for r in rows for k in r))
        target = OUT / f"thesis_table_{n:02d}.csv"
        with target.open("w", newline="", encoding="utf-8") as fh:
            fh.write(f"# thesis Table {n} (section {SECTIONS[n]}, experiment {EXPERIMENT[n]}): {caption}\n")
            writer = csv.DictWriter(fh, fieldnames=fields, lineterminator="\n")
            writer.writeheader()
            writer.writerows(rows)
        print(f"{target.name}: {len(rows)} rows")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python scripts/extract_source_tables.py THESIS.txt (the thesis as plain text)")
    main(sys.argv[1])
