#!/usr/bin/env bash
# Builds and runs a list of kernels/cuda/gemm_wgmma.cu configs with bench/gpu/gemm_wgmma_check.cu.
#
#   bench/gpu/gemm_wgmma_run.sh build DIR        # (any machine with nvcc + NVRTC) the checker and
#                                                # one NVRTC cubin a config into DIR, ptxas reports
#                                                # in DIR/ptxas.txt
#   bench/gpu/gemm_wgmma_run.sh run DIR OUTDIR   # (the GPU machine) cuBLAS, then every config:
#                                                # correctness (all modes) and timings (mode full),
#                                                # compute-sanitizer memcheck + synccheck on two
#                                                # (GEMM_WGMMA_SANITIZE="names"), a table last
#
# The build step is meant to run off the GPU machine; DIR then travels with the device run
# (it is under /build*, which git ignores). Each config runs in its own process under a
# time limit (a hang or a trap cannot take the others down); after 3 hangs the rest are
# skipped. OUTDIR gets all.log (every line of every run) and summary.txt (the table).
set -u
here=$(cd "$(dirname "$0")/../.." && pwd)

# name | -D list | mode (full: correctness + timings; q: correctness only). The union of the
# two device runs GEMM_WGMMA_NOTES.md reports (run 1: a01-a15, r01-r05, g01-g08, n01-n06,
# h01-h07, e01-e04; run 2: a01-a04, a06, a12, a15-a18, r01-r07, n01-n03, n06, n07, h08, h09,
# g01, g02, g04, z01). z01 repeats a01 last, to show the drift over a run. About 60 s on an
# H100; GEMM_WGMMA_CONFIGS=FILE (same format) replaces the list.
CONFIGS='
a01|-DBM=128 -DBN=256 -DSTAGES=4 -DSPLIT=1 -DGROUP_M=8 -DMINB=1 -DDT=0 -DBT=1 -DEPI=0|full
a02|-DBM=128 -DBN=256 -DSTAGES=3 -DSPLIT=1 -DGROUP_M=8 -DMINB=1 -DDT=0 -DBT=1 -DEPI=0|full
a03|-DBM=256 -DBN=128 -DSTAGES=4 -DSPLIT=1 -DGROUP_M=8 -DMINB=1 -DDT=0 -DBT=1 -DEPI=0|full
a04|-DBM=256 -DBN=128 -DSTAGES=3 -DSPLIT=1 -DGROUP_M=8 -DMINB=1 -DDT=0 -DBT=1 -DEPI=0|full
a05|-DBM=128 -DBN=128 -DSTAGES=5 -DSPLIT=1 -DGROUP_M=8 -DMINB=1 -DDT=0 -DBT=1 -DEPI=0|full
a06|-DBM=128 -DBN=128 -DSTAGES=4 -DSPLIT=2 -DGROUP_M=8 -DMINB=1 -DDT=0 -DBT=1 -DEPI=0|full
a07|-DBM=128 -DBN=256 -DSTAGES=4 -DSPLIT=2 -DGROUP_M=8 -DMINB=1 -DDT=0 -DBT=1 -DEPI=0|full
a08|-DBM=128 -DBN=256 -DSTAGES=3 -DSPLIT=4 -DGROUP_M=8 -DMINB=1 -DDT=0 -DBT=1 -DEPI=0|full
a09|-DBM=256 -DBN=128 -DSTAGES=4 -DSPLIT=2 -DGROUP_M=8 -DMINB=1 -DDT=0 -DBT=1 -DEPI=0|full
a10|-DBM=128 -DBN=128 -DSTAGES=4 -DSPLIT=4 -DGROUP_M=8 -DMINB=1 -DDT=0 -DBT=1 -DEPI=0|full
a11|-DBM=64 -DBN=256 -DSTAGES=4 -DSPLIT=1 -DGROUP_M=8 -DMINB=1 -DDT=0 -DBT=1 -DEPI=0|full
a12|-DBM=64 -DBN=128 -DSTAGES=4 -DSPLIT=1 -DGROUP_M=8 -DMINB=2 -DDT=0 -DBT=1 -DEPI=0|full
a13|-DBM=64 -DBN=128 -DSTAGES=6 -DSPLIT=1 -DGROUP_M=8 -DMINB=1 -DDT=0 -DBT=1 -DEPI=0|full
a14|-DBM=64 -DBN=64 -DSTAGES=6 -DSPLIT=1 -DGROUP_M=8 -DMINB=2 -DDT=0 -DBT=1 -DEPI=0|full
a15|-DBM=128 -DBN=256 -DSTAGES=4 -DSPLIT=1 -DGROUP_M=8 -DMINB=1 -DDT=0 -DBT=1 -DEPI=0 -DGEMM_WGMMA_NO_PROXY_FENCE|full
a16|-DBM=128 -DBN=256 -DSTAGES=3 -DSPLIT=1 -DGROUP_M=8 -DMINB=1 -DDT=0 -DBT=1 -DEPI=0 -DGEMM_WGMMA_NO_PROXY_FENCE|full
a17|-DBM=128 -DBN=256 -DSTAGES=3 -DSPLIT=1 -DGROUP_M=16 -DMINB=1 -DDT=0 -DBT=1 -DEPI=0|full
a18|-DBM=128 -DBN=256 -DSTAGES=3 -DSPLIT=1 -DGROUP_M=4 -DMINB=1 -DDT=0 -DBT=1 -DEPI=0|full
r01|-DBM=128 -DBN=256 -DSTAGES=4 -DSPLIT=1 -DGROUP_M=8 -DMINB=1 -DDT=0 -DBT=1 -DEPI=2|full
r06|-DBM=128 -DBN=256 -DSTAGES=3 -DSPLIT=1 -DGROUP_M=8 -DMINB=1 -DDT=0 -DBT=1 -DEPI=2|full
r02|-DBM=256 -DBN=128 -DSTAGES=4 -DSPLIT=1 -DGROUP_M=8 -DMINB=1 -DDT=0 -DBT=1 -DEPI=2|full
r07|-DBM=256 -DBN=128 -DSTAGES=3 -DSPLIT=1 -DGROUP_M=8 -DMINB=1 -DDT=0 -DBT=1 -DEPI=2|full
r03|-DBM=128 -DBN=128 -DSTAGES=4 -DSPLIT=2 -DGROUP_M=8 -DMINB=1 -DDT=0 -DBT=1 -DEPI=2|full
r04|-DBM=64 -DBN=128 -DSTAGES=4 -DSPLIT=1 -DGROUP_M=8 -DMINB=2 -DDT=0 -DBT=1 -DEPI=2|full
r05|-DBM=128 -DBN=256 -DSTAGES=3 -DSPLIT=4 -DGROUP_M=8 -DMINB=1 -DDT=0 -DBT=1 -DEPI=2|full
g01|-DBM=128 -DBN=128 -DSTAGES=4 -DSPLIT=1 -DGROUP_M=8 -DMINB=1 -DDT=0 -DBT=1 -DEPI=6|full
g02|-DBM=128 -DBN=128 -DSTAGES=3 -DSPLIT=1 -DGROUP_M=8 -DMINB=1 -DDT=0 -DBT=1 -DEPI=6|full
g03|-DBM=128 -DBN=64 -DSTAGES=5 -DSPLIT=1 -DGROUP_M=8 -DMINB=1 -DDT=0 -DBT=1 -DEPI=6|full
g04|-DBM=256 -DBN=64 -DSTAGES=4 -DSPLIT=1 -DGROUP_M=8 -DMINB=1 -DDT=0 -DBT=1 -DEPI=6|full
g05|-DBM=64 -DBN=128 -DSTAGES=4 -DSPLIT=1 -DGROUP_M=8 -DMINB=1 -DDT=0 -DBT=1 -DEPI=6|full
g06|-DBM=128 -DBN=128 -DSTAGES=4 -DSPLIT=2 -DGROUP_M=8 -DMINB=1 -DDT=0 -DBT=1 -DEPI=6|full
g07|-DBM=64 -DBN=64 -DSTAGES=4 -DSPLIT=1 -DGROUP_M=8 -DMINB=2 -DDT=0 -DBT=1 -DEPI=6|full
g08|-DBM=128 -DBN=64 -DSTAGES=4 -DSPLIT=4 -DGROUP_M=8 -DMINB=1 -DDT=0 -DBT=1 -DEPI=6|full
n01|-DBM=128 -DBN=256 -DSTAGES=4 -DSPLIT=1 -DGROUP_M=8 -DMINB=1 -DDT=0 -DBT=0 -DEPI=0|full
n02|-DBM=256 -DBN=128 -DSTAGES=4 -DSPLIT=1 -DGROUP_M=8 -DMINB=1 -DDT=0 -DBT=0 -DEPI=0|full
n03|-DBM=128 -DBN=128 -DSTAGES=4 -DSPLIT=2 -DGROUP_M=8 -DMINB=1 -DDT=0 -DBT=0 -DEPI=0|full
n04|-DBM=64 -DBN=64 -DSTAGES=6 -DSPLIT=1 -DGROUP_M=8 -DMINB=2 -DDT=0 -DBT=0 -DEPI=0|q
n05|-DBM=128 -DBN=128 -DSTAGES=4 -DSPLIT=1 -DGROUP_M=8 -DMINB=1 -DDT=0 -DBT=0 -DEPI=6|q
n06|-DBM=64 -DBN=128 -DSTAGES=4 -DSPLIT=1 -DGROUP_M=8 -DMINB=2 -DDT=0 -DBT=0 -DEPI=2|q
n07|-DBM=128 -DBN=256 -DSTAGES=4 -DSPLIT=1 -DGROUP_M=8 -DMINB=1 -DDT=0 -DBT=0 -DEPI=2|q
h01|-DBM=128 -DBN=256 -DSTAGES=4 -DSPLIT=1 -DGROUP_M=8 -DMINB=1 -DDT=1 -DBT=1 -DEPI=0|q
h02|-DBM=64 -DBN=64 -DSTAGES=4 -DSPLIT=1 -DGROUP_M=8 -DMINB=2 -DDT=1 -DBT=0 -DEPI=6|q
h03|-DBM=128 -DBN=128 -DSTAGES=4 -DSPLIT=2 -DGROUP_M=8 -DMINB=1 -DDT=1 -DBT=1 -DEPI=4|q
h04|-DBM=256 -DBN=128 -DSTAGES=3 -DSPLIT=1 -DGROUP_M=8 -DMINB=1 -DDT=1 -DBT=1 -DEPI=1|q
h05|-DBM=128 -DBN=256 -DSTAGES=3 -DSPLIT=1 -DGROUP_M=8 -DMINB=1 -DDT=1 -DBT=0 -DEPI=3|q
h06|-DBM=64 -DBN=128 -DSTAGES=4 -DSPLIT=1 -DGROUP_M=8 -DMINB=2 -DDT=1 -DBT=1 -DEPI=5|q
h07|-DBM=128 -DBN=128 -DSTAGES=4 -DSPLIT=4 -DGROUP_M=8 -DMINB=1 -DDT=1 -DBT=0 -DEPI=2|q
h08|-DBM=128 -DBN=128 -DSTAGES=3 -DSPLIT=1 -DGROUP_M=8 -DMINB=1 -DDT=1 -DBT=1 -DEPI=2|q
h09|-DBM=64 -DBN=64 -DSTAGES=6 -DSPLIT=1 -DGROUP_M=8 -DMINB=2 -DDT=1 -DBT=1 -DEPI=2|q
e01|-DBM=128 -DBN=256 -DSTAGES=4 -DSPLIT=1 -DGROUP_M=8 -DMINB=1 -DDT=0 -DBT=1 -DEPI=1|q
e02|-DBM=256 -DBN=128 -DSTAGES=4 -DSPLIT=2 -DGROUP_M=8 -DMINB=1 -DDT=0 -DBT=1 -DEPI=4|q
e03|-DBM=64 -DBN=256 -DSTAGES=4 -DSPLIT=1 -DGROUP_M=8 -DMINB=1 -DDT=0 -DBT=0 -DEPI=5|q
e04|-DBM=128 -DBN=64 -DSTAGES=5 -DSPLIT=1 -DGROUP_M=8 -DMINB=1 -DDT=0 -DBT=1 -DEPI=3|q
z01|-DBM=128 -DBN=256 -DSTAGES=4 -DSPLIT=1 -DGROUP_M=8 -DMINB=1 -DDT=0 -DBT=1 -DEPI=0|full
'
# compute-sanitizer memcheck and synccheck (tiny shapes) on these
SANITIZE="r01 r04"
[ -n "${GEMM_WGMMA_CONFIGS:-}" ] && CONFIGS=$(cat "$GEMM_WGMMA_CONFIGS")
[ -n "${GEMM_WGMMA_SANITIZE+x}" ] && SANITIZE=$GEMM_WGMMA_SANITIZE

cmd=${1:-}
dir=${2:-}
[ -z "$cmd" ] || [ -z "$dir" ] && { echo "usage: $0 build DIR | run DIR OUTDIR"; exit 2; }

if [ "$cmd" = build ]; then
  mkdir -p "$dir"
  nvcc -O2 -std=c++17 -gencode arch=compute_90a,code=sm_90a -o "$dir/gemm_wgmma_check" \
    "$here/bench/gpu/gemm_wgmma_check.cu" -ldl || exit 1
  : >"$dir/ptxas.txt"
  echo "$CONFIGS" | while IFS='|' read -r name defs mode; do
    [ -z "$name" ] && continue
    log=$("$dir/gemm_wgmma_check" --compile "$dir/$name.cubin" --src "$here/kernels/cuda/gemm_wgmma.cu" $defs 2>&1)
    rc=$?
    regs=$(echo "$log" | sed -n 's/.*Used \([0-9]*\) registers.*/\1/p')
    spill=$(echo "$log" | sed -n 's/.*\([0-9][0-9]*\) bytes spill stores.*/\1/p')
    warn=$(echo "$log" | grep -c "C75" || true)
    echo "$name rc=$rc regs=$regs spill_stores=$spill ptxas_warnings=$warn $defs" | tee -a "$dir/ptxas.txt"
    [ $rc -ne 0 ] && echo "$log"
  done
  exit 0
fi

[ "$cmd" = run ] || { echo "unknown command $cmd"; exit 2; }
out=${3:-/tmp/gemm_wgmma_out}
mkdir -p "$out"
all="$out/all.log"
: >"$all"
chk="$dir/gemm_wgmma_check"
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader >>"$all" 2>&1
timeout -s KILL 60 "$chk" --cublas 0 >>"$all" 2>&1 || echo "cublas run failed rc=$?" >>"$all"
hangs=0
echo "$CONFIGS" | while IFS='|' read -r name defs mode; do
  [ -z "$name" ] && continue
  if [ $hangs -ge 3 ]; then echo "=== $name skipped (3 hangs)" >>"$all"; continue; fi
  flag=""
  [ "$mode" = q ] && flag="-q"
  echo "=== $name $defs" >>"$all"
  t0=$(date +%s.%N)
  timeout -s KILL 25 "$chk" $flag "$dir/$name.cubin" $defs >>"$all" 2>&1
  rc=$?
  t1=$(date +%s.%N)
  echo "=== end $name rc=$rc wall=$(awk "BEGIN{printf \"%.1f\", $t1 - $t0}")" >>"$all"
  [ $rc -eq 137 ] && hangs=$((hangs + 1))
done
if command -v compute-sanitizer >/dev/null; then
  for name in $SANITIZE; do
    defs=$(echo "$CONFIGS" | awk -F'|' -v n="$name" '$1 == n {print $2}')
    echo "=== sanitizer $name" >>"$all"
    timeout -s KILL 60 compute-sanitizer --tool memcheck "$chk" -t "$dir/$name.cubin" $defs 2>&1 | tail -4 >>"$all"
    echo "=== synccheck $name" >>"$all"
    timeout -s KILL 60 compute-sanitizer --tool synccheck "$chk" -t "$dir/$name.cubin" $defs 2>&1 | tail -2 >>"$all"
  done
fi
python3 - "$all" >"$out/summary.txt" <<'PYEOF'
import sys, re, collections
lines = open(sys.argv[1]).read().splitlines()
cublas = {}
res = collections.OrderedDict()
cur = None
for l in lines:
    m = re.match(r'CUBLAS (NT|NN) (\d+) (\d+) (\d+) ([\d.]+) ([\d.]+)', l)
    if m:
        cublas[(m.group(1),) + tuple(int(x) for x in m.group(2, 3, 4))] = (float(m.group(5)), float(m.group(6)))
        continue
    if l.startswith('=== sanitizer') or l.startswith('=== synccheck'):
        cur = None
        continue
    m = re.match(r'=== (\w+) (-D.*)', l)
    if m:
        cur = m.group(1)
        d = dict(re.findall(r'-D(\w+)=(\d+)', m.group(2)))
        res[cur] = dict(defs=d, raw=m.group(2), result='?', regs='?', times={}, rc='?', wall='?')
        continue
    if cur is None:
        continue
    m = re.match(r'kernel: (\d+) registers', l)
    if m: res[cur]['regs'] = m.group(1)
    m = re.match(r'(\d+) passed, (\d+) failed, (\d+) skipped', l)
    if m: res[cur]['result'] = '%s/%s/%s' % m.groups()
    if 'FAIL' in l and res[cur]['result'] == '?': res[cur]['result'] = 'FAIL'
    m = re.match(r'TIME (\d+) (\d+) (\d+) ([\d.]+) ([\d.]+)', l)
    if m: res[cur]['times'][tuple(int(x) for x in m.group(1, 2, 3))] = (float(m.group(4)), float(m.group(5)))
    m = re.match(r'=== end (\w+) rc=(\d+) wall=([\d.]+)', l)
    if m: res[m.group(1)]['rc'] = m.group(2); res[m.group(1)]['wall'] = m.group(3)[:5]
print('configs (pass/fail/skip of the correctness shapes; rc 137 = killed: hang or time limit):')
for n, r in res.items():
    d = r['defs']
    tag = '%sx%s S%s SPLIT%s MINB%s DT%s BT%s EPI%s%s' % (d.get('BM'), d.get('BN'), d.get('STAGES'), d.get('SPLIT'), d.get('MINB'),
                                                     d.get('DT'), d.get('BT'), d.get('EPI'), ' noproxyfence' if 'NO_PROXY' in r['raw'] else '')
    print('  %-4s %-48s regs %-4s %-9s rc %-3s %5ss' % (n, tag, r['regs'], r['result'], r['rc'], r['wall']))
shapes = sorted({s for r in res.values() for s in r['times']}, key=lambda s: (s[1], s[2], s[0]))
print('\nTFLOP/s (best config of each group; cuBLAS bf16 cublasGemmEx fp32-compute; gated counts both products)')
groups = [('NT EPI0', lambda d: d.get('BT') == '1' and d.get('EPI') == '0', 'NT', 1),
          ('NT EPI2', lambda d: d.get('BT') == '1' and d.get('EPI') == '2', 'NT', 1),
          ('NT EPI6', lambda d: d.get('BT') == '1' and d.get('EPI') == '6', 'NT', 2),
          ('NN EPI0', lambda d: d.get('BT') == '0' and d.get('EPI') == '0', 'NN', 1)]
print('  %-20s %-8s %8s %8s %6s  %s' % ('shape MxNxK', 'group', 'cuBLAS', 'best', 'ratio', 'config (and the others)'))
for s in shapes:
    for gname, f, lay, nb in groups:
        cand = [(r['times'][s][1], n) for n, r in res.items() if f(r['defs']) and s in r['times'] and r['result'].split('/')[1:2] == ['0']]
        if not cand: continue
        cand.sort(reverse=True)
        cb = cublas.get((lay,) + s)
        ratio = cand[0][0] / cb[1] if cb else float('nan')
        print('  %-20s %-8s %8.1f %8.1f %6.2f  %s' % ('%dx%dx%d' % s, gname, cb[1] if cb else float('nan'), cand[0][0], ratio,
              ' '.join('%s:%.0f' % (n, t) for t, n in cand[:6])))
PYEOF
cat "$out/summary.txt"
grep -E "=== sanitizer|=== synccheck|ERROR SUMMARY" "$all"
