# Shared by the deployment tests of tests/train (sourced): result lines and the checkpoints a C
# trainer (publisher_c_test.c) hands in.
#   ok / bad NAME: print a result line; bad sets fail=1.
#   synth_trainer_checkpoints DCR DIR: four tiny checkpoints at 3% change (DIR/step{0..3}), and
#     for steps 1-3 a manifest of their tensors as the trainer holds them (DIR/step<k>.manifest:
#     "meta KEY VALUE" and "tensor NAME DTYPE OFFSET BYTES RANK DIMS..." lines). Exit 1 on error.
fail=0
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; fail=1; }

synth_trainer_checkpoints() {
  "$1" synth --preset tiny --rate 3% --steps 4 --out "$2" -q >/dev/null 2>&1 || { bad synth; exit 1; }
  python3 - "$2" <<'PY' || exit 1
import json, struct, sys
ck = sys.argv[1]
for step in (1, 2, 3):
    f = open("%s/step%d.safetensors" % (ck, step), "rb")
    n = struct.unpack("<Q", f.read(8))[0]
    h = json.loads(f.read(n))
    with open("%s/step%d.manifest" % (ck, step), "w") as m:
        for k, v in h.get("__metadata__", {}).items():
            m.write("meta %s %s\n" % (k, v))
        ts = sorted((t for t in h if t != "__metadata__"), key=lambda t: h[t]["data_offsets"][0])
        for t in ts:
            b, e = h[t]["data_offsets"]
            m.write("tensor %s %s %d %d %d %s\n" % (t, h[t]["dtype"], 8 + n + b, e - b,
                    len(h[t]["shape"]), " ".join(str(d) for d in h[t]["shape"])))
PY
}
