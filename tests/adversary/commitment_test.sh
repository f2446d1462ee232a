#!/usr/bin/env bash
# Adversarial suite, commitments: a base forged to the genuine additive content hash (Wagner's
# k-tree, dcr_collide) is not a signed version.
#   - dcr_collide zeroes 65,536 weights of the base (only weights the signed delta leaves
#     unchanged, so no chunk's base-change hash sees them) and adjusts 256 others until the
#     content hash is the genuine one; the forged base has that hash, and different bytes;
#   - `dcr apply --trust --verify` of the trainer's signed delta onto the genuine base commits and
#     prints "verified (commitment <prefix>)", the prefix of the root its final manifest signed;
#   - onto the forged base (the base hash and the target hash both match) it is refused (exit 14),
#     naming the first wrong range (tensor and bytes), with no output file; without --verify too;
#   commitment_test.sh DCR DCR_COLLIDE
set -u
source "$(dirname "$0")/../cli/cli_lib.sh" "$@"
collide=$2

"$dcr" synth --preset tiny --rate 3% --steps 2 --out "$tmp/ck" -q >/dev/null 2>&1; check synth 0 $?
base="$tmp/ck/step0.safetensors"; target="$tmp/ck/step1.safetensors"
"$dcr" keys -o "$tmp/keys" 2>/dev/null; check keys 0 $?
key="$tmp/keys/trainer.key"; pub="$tmp/keys/trainer.pub"
"$dcr" diff "$base" "$target" -o "$tmp/good.dcr" --sign "$key" -q; check diff-signed 0 $?

echo "== the collision"
"$collide" "$base" "$tmp/forged.safetensors" --tensor lm_head.weight --keep-unchanged "$target" \
  > "$tmp/collide.out"; check collide 0 $?
cat "$tmp/collide.out"
has collide-zeroed "$tmp/collide.out" "65536 weights zeroed, 256 adjusted"
has collide-same-hash "$tmp/collide.out" " == "
cmp -s "$base" "$tmp/forged.safetensors"; check forged-differs 1 $?

echo "== genuine base: committed, verified by the commitment"
"$dcr" apply "$base" "$tmp/good.dcr" -o "$tmp/out.st" --trust "$pub" --verify > "$tmp/ok.out" 2>/dev/null
check apply-genuine 0 $?
has apply-genuine-says "$tmp/ok.out" "verified (commitment "
"$dcr" verify "$tmp/out.st" "$target" >/dev/null; check genuine-output-is-target 0 $?

echo "== forged base: refused, naming the first wrong range"
for flags in "--verify" ""; do
  name=forged${flags:+-verify}
  rm -f "$tmp/out2.st"
  "$dcr" apply "$tmp/forged.safetensors" "$tmp/good.dcr" -o "$tmp/out2.st" --trust "$pub" $flags \
    -q 2>"$tmp/err"
  check "$name-exit-14" 14 $?
  has "$name-names-range" "$tmp/err" "first wrong range: tensor lm_head.weight bytes [0, 1048576)"
  has "$name-names-roots" "$tmp/err" "is not the signed"
  [ ! -e "$tmp/out2.st" ] && [ -z "$(ls "$tmp" | grep '^out2.st.tmp')" ]; check "$name-no-output" 0 $?
done

exit $fail
