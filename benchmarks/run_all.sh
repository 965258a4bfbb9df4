#!/usr/bin/env bash
# Run every benchmark: benchmarks/run_all.sh [--quick] [--no-accelerate]
#
# Each script prints a table of medians and ratios to plain PyTorch measured in the same run.
# bench_gpu.py runs only where torch sees a CUDA GPU. Save the figures with
#   benchmarks/run_all.sh | tee bench-$(date +%Y%m%d).txt
# Use an otherwise idle machine: accel and PyTorch are measured side by side, interleaved,
# but a busy machine still widens the spread of every figure. PYTHON picks the interpreter.
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${PYTHON:-python}"
quick=0
for arg in "$@"; do [[ "$arg" == --quick ]] && quick=1; done

scripts=(bench_step.py bench_gather.py bench_fsdp.py bench_import.py bench_launch.py
         bench_checkpoint.py bench_sharded_checkpoint.py bench_horovod.py
         bench_horovod_elastic.py bench_big_model.py)
if "$python" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    scripts+=(bench_gpu.py)
else
    echo "no CUDA GPU visible: bench_gpu.py skipped"
fi

failed=()
for script in "${scripts[@]}"; do
    args=("$@")
    if [[ "$script" == bench_checkpoint.py ]]; then  # its own options
        args=()
        if (( quick )); then args=(--mb 10 --repeats 2); fi
    elif [[ "$script" == bench_sharded_checkpoint.py ]]; then
        args=()
        if (( quick )); then args=(--layers 2 --repeats 2); fi
    fi
    echo "== $script ${args[*]:-}"
    # the Accelerator's start-up line ("accel: CPU, 2 process(es), ...") is not a figure
    if ! "$python" "$here/$script" "${args[@]}" 2>&1 | grep -v '^accel: '; then
        failed+=("$script")
    fi
    echo
done
if (( ${#failed[@]} )); then
    echo "failed: ${failed[*]}" >&2
    exit 1
fi
