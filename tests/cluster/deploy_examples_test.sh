#!/usr/bin/env bash
# The deployment examples in deploy/ parse and say what the cluster test runs: the deployment
# scenario loads in `dcr keys`; the systemd unit passes `systemd-analyze verify` (when present)
# with its ExecStart pointed at the built dcr-node; the Slurm script passes `bash -n` and
# shellcheck (when present); the Kubernetes manifests parse as YAML and hold a StatefulSet with
# its restart policy, a /healthz readiness probe, RANK from the pod index and the keys from a
# Secret. Every example starts `dcr-node DEPLOYMENT --state DIR/state --result DIR/result.json`
# with the rank in RANK or SLURM_PROCID, as tests/cluster/cluster_test.sh starts its hosts.
# Usage: deploy_examples_test.sh DCR DCR_NODE SOURCE_DIR
set -uo pipefail
DCR=$1; NODE=$2; SRC=$3
D=$SRC/deploy
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail=0
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; fail=1; }

if "$DCR" keys "$D/deployment.yaml" -o "$tmp/keys" >"$tmp/keys.out" 2>&1; then
  ok "deploy/deployment.yaml loads (dcr keys made its credentials)"
else
  bad "deploy/deployment.yaml: $(tail -2 "$tmp/keys.out")"
fi

unit=$D/systemd/dcr-node@.service
if command -v systemd-analyze >/dev/null; then
  node_abs="$(cd "$(dirname "$NODE")" && pwd)/$(basename "$NODE")"
  sed "s#^ExecStart=/usr/local/bin/dcr-node #ExecStart=$node_abs #" "$unit" \
    > "$tmp/dcr-node@3.service"
  if out=$(systemd-analyze verify "$tmp/dcr-node@3.service" 2>&1) && [ -z "$out" ]; then
    ok "systemd-analyze verify: the unit (instance 3) has no complaint"
  else
    bad "systemd-analyze verify: $out"
  fi
else
  echo "skip systemd-analyze (not installed)"
fi

sbatch=$D/slurm/dcr-deployment.sbatch
bash -n "$sbatch" && ok "the Slurm script parses (bash -n)" || bad "bash -n $sbatch"
if command -v shellcheck >/dev/null; then
  shellcheck "$sbatch" && ok "shellcheck: the Slurm script" || bad "shellcheck $sbatch"
else
  echo "skip shellcheck (not installed)"
fi

/usr/bin/python3 - "$D" "$SRC/tests/cluster/cluster_test.sh" <<'PY' || fail=1
import configparser, re, shlex, sys
import yaml

d, cluster_test = sys.argv[1:3]
errors = []

def check(cond, what):
    if not cond:
        errors.append(what)

def flags(argv, where):
    """argv = [dcr-node, DEPLOYMENT, --state, DIR/state, --result, DIR/result.json]"""
    check(len(argv) == 6 and argv[0].endswith("dcr-node") and argv[2] == "--state" and
          argv[4] == "--result" and argv[3].endswith("/state") and
          argv[5].endswith("/result.json") and argv[1].endswith("deployment.yaml"),
          "%s: dcr-node is not started as DEPLOYMENT --state DIR/state --result "
          "DIR/result.json: %s" % (where, argv))

# systemd: the rank in RANK (the instance), stopped by SIGTERM, restarted on failure.
u = configparser.ConfigParser(strict=False, interpolation=None)
u.optionxform = str
u.read(d + "/systemd/dcr-node@.service")
svc = u["Service"]
flags(shlex.split(svc["ExecStart"].replace("\\\n", " ")), "systemd ExecStart")
check(svc.get("Environment") == "RANK=%i", "systemd: Environment is not RANK=%i")
check(svc.get("KillSignal") == "SIGTERM", "systemd: KillSignal is not SIGTERM")
check(svc.get("Restart") in ("on-failure", "always"), "systemd: no restart policy")

# Slurm: SLURM_PROCID is the rank; rank 0 the trainer, the others dcr-node.
s = open(d + "/slurm/dcr-deployment.sbatch").read()
m = re.search(r"exec (dcr-node [^\n']*)", s)
check(m is not None, "Slurm: no `exec dcr-node` line")
if m:
    argv = [a.replace('"$DCR_DEPLOYMENT"', "deployment.yaml") for a in m.group(1).split()]
    argv = [a.strip('"').replace("$DCR_DEPLOYMENT", "/etc/dcr/deployment.yaml")
            .replace("$DCR_DIR", "/var/lib/dcr") for a in argv]
    flags(argv, "Slurm")
check('"$SLURM_PROCID" = 0' in s and "DCR_TRAINER" in s, "Slurm: rank 0 is not the trainer")

# Kubernetes: a StatefulSet, the ordinal as RANK, /healthz readiness, keys from a Secret.
docs = list(yaml.safe_load_all(open(d + "/kubernetes/dcr-node.yaml")))
kinds = {x["kind"]: x for x in docs if x}
check(set(kinds) >= {"Service", "StatefulSet"}, "Kubernetes: kinds %s" % sorted(kinds))
if "StatefulSet" in kinds:
    pod = kinds["StatefulSet"]["spec"]["template"]["spec"]
    c = pod["containers"][0]
    flags(c["command"], "Kubernetes command")
    env = {e["name"]: e for e in c.get("env", [])}
    check("RANK" in env and "pod-index" in env["RANK"]["valueFrom"]["fieldRef"]["fieldPath"],
          "Kubernetes: RANK is not the pod index")
    check(pod.get("restartPolicy") == "Always", "Kubernetes: restartPolicy")
    check("/healthz" in " ".join(c["readinessProbe"]["exec"]["command"]),
          "Kubernetes: the readiness probe does not ask /healthz")
    check(any("secret" in v for v in pod["volumes"]), "Kubernetes: no Secret volume")
    check(kinds["StatefulSet"]["spec"].get("volumeClaimTemplates"),
          "Kubernetes: no volume for --state")

# The cluster test starts its hosts the same way.
t = open(cluster_test).read()
check(re.search(r'"\$NODE" "\$S" \\\s*\n\s*--state "\$W/h\$r/state" '
                r'--result "\$W/h\$r/result.json"', t) is not None,
      "cluster_test.sh: dcr-node not started with --state/--result")
check("var=RANK" in t and "var=SLURM_PROCID" in t,
      "cluster_test.sh: the rank not from RANK and SLURM_PROCID")
check("deploy/deployment.yaml" in t or "TEMPLATE" in t, "cluster_test.sh: not the example")

for e in errors:
    print("FAIL " + e)
if not errors:
    print("ok   systemd, Slurm and Kubernetes start dcr-node DEPLOYMENT --state DIR/state --result "
          "DIR/result.json with the rank in RANK / SLURM_PROCID, as cluster_test.sh does")
sys.exit(1 if errors else 0)
PY
exit $fail
