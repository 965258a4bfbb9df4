#!/usr/bin/env bash
# Run every benchmark and write the results:
#   benchmarks/run_all.sh [--quick] [--no-accelerate] [--out DIR]
#
# Each script prints its tables (medians, min/median/max, ratios to plain PyTorch measured in
# the same run) and appends one JSON record per figure to $ACCEL_BENCH_RESULTS, which this
# script points at a fresh DIR/records.jsonl. benchmarks/report.py then writes into DIR
# (default benchmarks/results; benchmarks/results/quick with --quick, whose figures mean
# nothing):
#   results.json  every record + the machine (CPU, cores, RAM, OS, versions, commit, load)
#   results.md    one table row per figure: accel, baseline, ratio, target, met, Accelerate
#   results.png   the chart (and results.svg); needs matplotlib: pip install -e .[benchmarks]
#   output.txt    everything the scripts printed
# BENCH_ONLY="bench_step.py bench_import.py" runs only those (names from the table below).
# bench_gpu.py runs only where torch sees a CUDA GPU. PYTHON picks the interpreter.
# Use an otherwise idle machine: accel and PyTorch are measured side by side, interleaved,
# but a busy machine still widens the spread of every figure.
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${PYTHON:-python}"

# The benchmarks, in the order they run. Columns (separated by "|"): the script; its options
# for a full run; its options with --quick; "cuda" if it needs a GPU. {flags} stands for
# run_all.sh's own pass-through flags (--no-accelerate), for scripts that take them. The
# minutes estimate a full run on an idle 2-core machine (about 17 min in all on the CPU).
BENCHMARKS='
bench_step.py               | {flags}  | --quick {flags}        |       # ~1 min
bench_gather.py             | {flags}  | --quick {flags}        |       # ~0.5 min
bench_eval.py               | {flags}  | --quick {flags}        |       # ~1 min
bench_fsdp.py               | {flags}  | --quick {flags}        |       # ~1.5 min
bench_import.py             | {flags}  | --quick {flags}        |       # ~1.5 min
bench_launch.py             | {flags}  | --quick {flags}        |       # ~1.5 min
bench_checkpoint.py         | {flags}  | --quick {flags}        |       # ~0.5 min
bench_sharded_checkpoint.py |          | --quick                |       # ~1 min
bench_async_checkpoint.py   | {flags}  | --quick {flags}        |       # ~0.5 min
bench_horovod.py            | {flags}  | --quick {flags}        |       # ~0.5 min
bench_horovod_elastic.py    | {flags}  | --quick {flags}        |       # ~1 min
bench_big_model.py          | {flags}  | --quick {flags}        |       # ~0.5 min
bench_ps.py                 | {flags}  | --quick {flags}        |       # ~1 min
chaos_drill.py              | --kills 10 --seed 1 | --quick        |       # ~2.5 min
soak.py                     | --steps 2000 | --quick             |       # ~2 min
bench_gpu.py                | {flags}  | --quick {flags}        | cuda  # ~3 min on a GPU
'

usage() { sed -n '2,17p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

quick=0
out=""
flags=()
while (( $# )); do
    case "$1" in
        --quick) quick=1 ;;
        --no-accelerate) flags+=(--no-accelerate) ;;
        --out) out="${2:?--out needs a directory}"; shift ;;
        --out=*) out="${1#--out=}" ;;
        -h|--help) usage; exit 0 ;;
        *) echo "run_all.sh: unknown option $1 (--quick, --no-accelerate, --out DIR)" >&2
           exit 2 ;;
    esac
    shift
done
if [[ -z "$out" ]]; then
    out="$here/results"
    (( quick )) && out="$here/results/quick"
fi

trim() { local s="$1"; s="${s#"${s%%[![:space:]]*}"}"; printf '%s' "${s%"${s##*[![:space:]]}"}"; }

known=()  # every script in the table
while IFS='|' read -r script _; do
    script="$(trim "$script")"
    [[ -z "$script" || "$script" == \#* ]] || known+=("$script")
done <<< "$BENCHMARKS"
wanted=("${known[@]}")
if [[ -n "${BENCH_ONLY:-}" ]]; then
    read -r -a wanted <<< "${BENCH_ONLY//,/ }"
    for name in "${wanted[@]}"; do
        if [[ " ${known[*]} " != *" $name "* ]]; then
            echo "run_all.sh: BENCH_ONLY names $name, which is not in the table in" \
                 "benchmarks/run_all.sh (known: ${known[*]})" >&2
            exit 2
        fi
    done
fi

has_cuda() { "$python" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' \
                 2>/dev/null; }
rows=()  # "script|options" for this run, in the table's order
skipped=()
while IFS='|' read -r script full quick_opts needs; do
    script="$(trim "$script")"
    [[ -z "$script" || "$script" == \#* || " ${wanted[*]} " != *" $script "* ]] && continue
    if [[ "$(trim "${needs%%#*}")" == cuda ]] && ! has_cuda; then
        skipped+=("$script")
        continue
    fi
    options="$full"
    (( quick )) && options="$quick_opts"
    options="${options//\{flags\}/${flags[*]:-}}"
    rows+=("$script|$(trim "$options")")
done <<< "$BENCHMARKS"

mkdir -p "$out" || exit 1
records="$out/records.jsonl"
runs="$out/runs.tsv"
: > "$records"
: > "$runs"
export ACCEL_BENCH_RESULTS="$records"

run() {
    (( ${#skipped[@]} )) && echo "no CUDA GPU visible: ${skipped[*]} skipped"
    local failed=() row script options start status
    for row in ${rows[@]+"${rows[@]}"}; do
        script="${row%%|*}"
        options="${row#*|}"
        read -r -a args <<< "$options"
        echo "== $script $options"
        start=$SECONDS
        status=ok
        # the Accelerator's start-up line ("accel: CPU, 2 process(es), ...") is not a figure
        if ! "$python" "$here/$script" ${args[@]+"${args[@]}"} 2>&1 | grep -v '^accel: '; then
            failed+=("$script")
            status=failed
        fi
        printf '%s\t%s\t%s\t%s\n' "$script" "$options" "$((SECONDS - start))" "$status" >> "$runs"
        echo "   ($script: $((SECONDS - start)) s)"
        echo
    done
    report_args=("$records" --out "$out" --runs "$runs")
    (( quick )) && report_args+=(--quick)
    "$python" "$here/report.py" "${report_args[@]}" || failed+=(report.py)
    if (( ${#failed[@]} )); then
        echo "failed: ${failed[*]}" >&2
        return 1
    fi
}

run 2>&1 | tee "$out/output.txt"
exit "${PIPESTATUS[0]}"
