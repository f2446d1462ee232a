#!/usr/bin/env bash
# dcr inspect: per tensor dense and payload bytes and their ratio, a totals row, --sort and
# --top, unchanged tensors named as such; the JSON carries the same rows.
source "$(dirname "$0")/cli_lib.sh" "$@"
"$dcr" synth --preset tiny --rate 3% --steps 2 --out "$tmp/ck" -q >/dev/null; check synth 0 $?
s0="$tmp/ck/step0.safetensors"; s1="$tmp/ck/step1.safetensors"
"$dcr" diff "$s0" "$s1" -o "$tmp/d.dcr" -q; check diff 0 $?

"$dcr" inspect "$tmp/d.dcr" --json > "$tmp/all.json"; check inspect-json 0 $?
"$dcr" inspect "$tmp/d.dcr" --json --sort payload --top 3 > "$tmp/top.json"; check inspect-top-json 0 $?
"$dcr" inspect "$tmp/d.dcr" --json --sort ratio > "$tmp/ratio.json"; check inspect-ratio-json 0 $?
"$dcr" inspect "$tmp/d.dcr" --json --sort changed > "$tmp/changed.json"; check inspect-changed-json 0 $?
python3 - "$tmp" "$(stat -c %s "$tmp/d.dcr")" <<'PY'; check inspect-json-rows 0 $?
import json, sys
d = sys.argv[1]
load = lambda n: json.load(open(f"{d}/{n}.json"))
a, top, ratio, changed = load("all"), load("top"), load("ratio"), load("changed")
rows = a["tensors"]
assert a["sort"] == "name" and a["tensor_count"] == len(rows) > 10, (a["sort"], a["tensor_count"])
assert [r["name"] for r in rows] == sorted(r["name"] for r in rows)
unchanged = [r for r in rows if r["unchanged"]]
assert unchanged, "the tiny preset's norms do not change at 3%"
for r in rows:
    assert r["unchanged"] == (r["changed"] == 0), r
    assert r["dense_bytes"] > 0, r
    if r["unchanged"]:
        assert r["payload_bytes"] == 0 and r["ratio"] is None, r
    else:
        assert abs(r["ratio"] - r["dense_bytes"] / r["payload_bytes"]) < 0.01 * r["ratio"], r
t = a["total"]
assert t["dense_bytes"] == sum(r["dense_bytes"] for r in rows), t
assert t["payload_bytes"] == int(sys.argv[2]), t  # the whole delta file
assert t["changed"] == sum(r["changed"] for r in rows), t
# --sort payload --top 3: the three largest payloads, totals still of every tensor.
want = sorted(rows, key=lambda r: -r["payload_bytes"])[:3]
assert [r["payload_bytes"] for r in top["tensors"]] == [r["payload_bytes"] for r in want], top["tensors"]
assert top["tensor_count"] == len(rows) and top["total"] == t and top["sort"] == "payload"
# --sort ratio: smallest ratio first, unchanged (no ratio) last.
rs = [r["ratio"] for r in ratio["tensors"]]
known = [x for x in rs if x is not None]
assert known == sorted(known) and rs[len(known):] == [None] * (len(rs) - len(known)), rs
assert len(rs) == len(rows)
cs = [r["changed"] for r in changed["tensors"]]
assert cs == sorted(cs, reverse=True), cs
PY

# The table: a dense and a payload column, unchanged rows say so, TOTAL, --top limits the rows.
"$dcr" inspect "$tmp/d.dcr" > "$tmp/t.txt"; check inspect-table 0 $?
head -2 "$tmp/t.txt" | tail -1 | grep -Eq "dense +payload +ratio"; check table-columns 0 $?
grep -E "layernorm" "$tmp/t.txt" | head -1 | grep -Eq " unchanged +- +512 +0 +- +- *\$"; check table-unchanged 0 $?
grep -q "^TOTAL " "$tmp/t.txt"; check table-total 0 $?
lacks table-all-no-note "$tmp/t.txt" "tensors shown"
"$dcr" inspect "$tmp/d.dcr" --sort payload --top 5 > "$tmp/t5.txt"; check inspect-top 0 $?
n=$(python3 - "$tmp/all.json" <<'PY'
import json, sys; print(len(json.load(open(sys.argv[1]))["tensors"]))
PY
)
[ "$(sed -n '3,/^TOTAL /p' "$tmp/t5.txt" | grep -vc '^TOTAL ')" = 5 ]; check table-top-rows 0 $?
has table-top-note "$tmp/t5.txt" "5 of $n tensors shown, sorted by payload"
[ "$(grep '^TOTAL ' "$tmp/t5.txt")" = "$(grep '^TOTAL ' "$tmp/t.txt")" ]; check table-top-same-total 0 $?
"$dcr" inspect "$tmp/d.dcr" --sort size 2>/dev/null; check inspect-bad-sort 2 $?
exit $fail
