#!/usr/bin/env bash
# The installed library, as a consumer sees it: `cmake --install` of the build into a fresh
# prefix, moved elsewhere afterwards (every installed file must locate the rest relative to
# itself), then
#   * the tree: libdcr.so with its SONAME, include/dcr/*.h, dcr.pc and the CMake package, and no
#     path of the build or source tree in any installed file;
#   * the exported symbols: the C APIs (dcr_*) and namespace dcr only, nothing internal;
#   * a C program (consumer_c.c, C99) compiled with `pkg-config --cflags --libs dcr` only: the
#     sender of a one-version multi-host refit through the publisher C API, whose receiver is a
#     real dcr-node that verifies the version byte for byte against the target;
#   * a C++ program (project/, find_package(dcr), dcr::dcr): applies the committed golden delta
#     to its base through dcr/apply.h and compares the result with the target byte for byte.
#   consumer_test.sh CMAKE BUILD_DIR SOURCE_DIR CC DCR_NODE
set -uo pipefail
cmake=$1; build=$2; src=$3; cc=$4; node=$5
here="$(cd "$(dirname "$0")" && pwd)"
golden="$src/tests/golden"
tmp=$(mktemp -d); pids=()
trap 'kill ${pids[*]:-} 2>/dev/null; rm -rf "$tmp"' EXIT
fail=0
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; fail=1; }

"$cmake" --install "$build" --prefix "$tmp/stage" >"$tmp/install.log" 2>&1 \
  || { bad "cmake --install"; cat "$tmp/install.log"; exit 1; }
mv "$tmp/stage" "$tmp/prefix"
p="$tmp/prefix"
lib=$(ls -d "$p"/lib*/libdcr.so 2>/dev/null | head -1)
[ -n "$lib" ] && libdir=$(dirname "$lib") || { bad "no libdcr.so installed"; find "$p"; exit 1; }
soname=$(readelf -d "$lib" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
case "$soname" in
  libdcr.so.[0-9]*.[0-9]*) [ -e "$libdir/$soname" ] && ok "SONAME $soname" || bad "no $soname" ;;
  *) bad "SONAME '$soname'" ;;
esac
for f in include/dcr/dcr_c.h include/dcr/publisher_c.h include/dcr/delta.h include/dcr/apply.h; do
  [ -f "$p/$f" ] || bad "missing $f"
done
n_src=$(ls "$src"/core/include/dcr/*.h | wc -l); n_inst=$(ls "$p"/include/dcr/*.h | wc -l)
[ "$n_src" = "$n_inst" ] && ok "$n_inst public headers installed" || bad "$n_inst of $n_src headers"
[ -z "$(find "$p" -path '*testing*')" ] && ok "no testing files" || bad "testing files installed"
ls "$libdir"/*.a >/dev/null 2>&1 && bad "static archives installed"
[ -f "$libdir/pkgconfig/dcr.pc" ] && [ -f "$libdir/cmake/dcr/dcrConfig.cmake" ] \
  && [ -f "$libdir/cmake/dcr/dcrConfigVersion.cmake" ] && ok "dcr.pc and the CMake package" \
  || bad "dcr.pc or the CMake package missing"
if grep -rlIF -e "$build" -e "$src" -e "$tmp/stage" "$p" \
    || readelf -d "$lib" | grep -F -e "$build" -e "$src"; then
  bad "installed files name the build, source or staging tree (above)"
else
  ok "no installed text file or run path names the build or source tree"
fi

# Exported symbols: dcr_* (C) and dcr:: (C++), none of dcr::internal or dcr::cli.
nm -D --defined-only "$lib" | awk '{print $3}' | c++filt >"$tmp/syms"
sed -E 's/^((typeinfo( name)?|vtable|VTT|guard variable) for|(non-)?virtual thunk to) //' \
  "$tmp/syms" | grep -vE '^(dcr_|dcr::|_init$|_fini$)' | grep -v '^$' >"$tmp/other"
if [ -s "$tmp/other" ]; then
  bad "other exported symbols: $(head -5 "$tmp/other" | tr '\n' ';')"
else
  ok "exports: $(grep -c '^dcr_' "$tmp/syms") C, $(grep -vc '^dcr_' "$tmp/syms") C++ (dcr::)"
fi
grep -E '^dcr::(internal|cli)::' "$tmp/syms" | head -3 >"$tmp/internal"
[ -s "$tmp/internal" ] && bad "internal symbols exported: $(tr '\n' ';' <"$tmp/internal")"
for s in dcr_c_abi_version dcr_publisher_open_scenario dcr_recorder_begin; do
  grep -qx "$s" "$tmp/syms" || bad "$s not exported"
done

# The C program: flags from the installed dcr.pc only.
export PKG_CONFIG_PATH="$libdir/pkgconfig"
flags=$(pkg-config --cflags --libs dcr) || { bad "pkg-config dcr"; exit 1; }
case "$flags" in *"$src"*|*"$build"*) bad "pkg-config flags name the trees: $flags" ;; esac
"$cc" -std=c99 -Wall -Wextra -Werror -pedantic "$here/consumer_c.c" $flags -o "$tmp/consumer_c" \
  -Wl,-rpath,"$libdir" 2>"$tmp/cc.err" && ok "C program built with pkg-config ($flags)" \
  || { bad "C build"; cat "$tmp/cc.err"; }
ldd "$tmp/consumer_c" >"$tmp/ldd" 2>&1; grep -q "$libdir/libdcr.so" "$tmp/ldd" && ok "C program loads the installed libdcr" \
  || { bad "C program does not load $libdir/libdcr.so"; cat "$tmp/ldd"; }
port=$(( 20000 + RANDOM % 12000 ))
cat >"$tmp/s.yaml" <<YAML
name: consumer
model: {checkpoints: [$golden/base.safetensors, $golden/target.safetensors]}
transport: {relay_tree: {fan_out: 2, root_fan_out: 1}}
receivers: {count: 1}
network:
  hosts: ["127.0.0.1:$port", "127.0.0.1:$((port + 1))"]
  tls: false
timeout: 60s
YAML
mkdir -p "$tmp/h1"
(cd "$tmp/h1" && exec "$node" "$tmp/s.yaml" --rank 1 --result "$tmp/h1/result.json") \
  >"$tmp/h1/log" 2>&1 &
pids+=($!)
"$tmp/consumer_c" "$tmp/s.yaml" "$tmp/trainer" "$golden/target.safetensors" >"$tmp/c.out" 2>&1
rc=$?; cat "$tmp/c.out"
[ "$rc" = 0 ] && ok "C publisher sent version 1" || bad "C publisher exit $rc"
wait "${pids[0]}"; rc=$?; pids=()
[ "$rc" = 0 ] || { bad "receiver exit $rc"; tail -5 "$tmp/h1/log"; }
python3 - "$tmp/h1" <<'PY' && ok "receiver verified version 1 byte for byte" \
  || bad "receiver result"
import glob, json, sys
d = sys.argv[1]
for path in sorted(glob.glob(d + "/node-1-v1.json")) + [d + "/result.json"]:
    j = json.load(open(path))
    assert j["ok"] and j["verified"], (path, j.get("error"), j.get("verify_message"))
    assert j["verify_message"] == "byte-for-byte equal to the target", j["verify_message"]
PY

# The C++ program: the installed CMake package.
gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
"$cmake" -S "$here/project" -B "$tmp/cpp" "${gen[@]}" -DCMAKE_PREFIX_PATH="$p" \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS="-Wall -Werror" >"$tmp/cpp.log" 2>&1 \
  && "$cmake" --build "$tmp/cpp" >>"$tmp/cpp.log" 2>&1 \
  && ok "C++ program built with find_package(dcr)" || { bad "C++ build"; cat "$tmp/cpp.log"; }
grep -q "dcr_DIR:PATH=$libdir/cmake/dcr" "$tmp/cpp/CMakeCache.txt" \
  && ok "find_package(dcr) found the installed package" || bad "dcr_DIR is not the installed one"
if grep -qF -e "$src/core" -e "$build/" "$tmp/cpp/build.ninja" \
    "$tmp/cpp"/CMakeFiles/*.dir/flags.make 2>/dev/null; then
  bad "the C++ build uses the source or build tree"
fi
"$tmp/cpp/consumer_cpp" "$golden/base.safetensors" "$golden/v5_delta.dcr" "$tmp/out.safetensors" \
  "$golden/target.safetensors" && ok "C++ program applied the golden delta bit-exact" \
  || bad "C++ program"
cmp -s "$tmp/out.safetensors" "$golden/target.safetensors" && ok "cmp: output == target" \
  || bad "cmp: output differs from the target"
exit $fail
