#!/usr/bin/env bash
# A check of the whole system on a GPU, in one command and under ten minutes (docs/benchmarks.md,
# "A GPU check"): greedy identity against Hugging Face, drafting speed on the host's CPU,
# `bench cost` curves, `bench generate`, and `speculant up` under `speculant load` at
# concurrency 1, 8 and 32, for SmolLM2 (--smollm) and for a random-weights model of Llama-3-8B's
# shape; JSON figures in one folder (--out), a line per step, summary.json at the end (exit
# status 1 when a step failed).
#
#   scripts/gpu_check.sh [--out DIR] [--smollm PATH] [--wheels DIR] [--budget S]
#   scripts/gpu_check.sh --smoke [--out DIR] [--smollm PATH]   # every step, tiny, on a CPU
#   scripts/gpu_check.sh --fetch-wheels DIR   # where pip works: wheels for an offline machine
set -euo pipefail

usage() {
    cat <<'EOF'
usage: scripts/gpu_check.sh [--smoke] [--out DIR] [--smollm PATH] [--wheels DIR] [--work DIR]
                            [--budget SECONDS] [--keep-work]
       scripts/gpu_check.sh --fetch-wheels DIR

  --smoke          every step at tiny sizes on the CPU (a 2-layer model of Llama-3-8B's
                   architecture instead of the 8B one); checks the script, not the GPU
  --out DIR        where the JSON figures go (default: ./gpu-check-MODE-DATE)
  --smollm PATH    SmolLM2-135M-Instruct's folder (default on a GPU: ../shared/models/
                   smollm2-135m-instruct when it is there; --smoke: none); without it the
                   SmolLM2 steps are skipped
  --wheels DIR     install these wheels first (pip --no-index, into the work folder): the
                   project's dependencies on a machine without network (default: .whl/ if any)
  --work DIR       graphs, the random model (16 GB on a GPU) and logs of services (default: a
                   temporary folder, removed at the end)
  --budget S       skip the steps that would start after S seconds (default 540 on a GPU, none
                   with --smoke)
  --keep-work      keep the work folder
  --fetch-wheels DIR  download the wheels of the dependencies a bare PyTorch image lacks, at
                   the versions of constraints.txt, for CPython ${WHEEL_PYTHON:-3.12} on x86-64
                   Linux, into DIR; then exit

Environment: PYTHON (default .venv/bin/python, else python3).
EOF
}

CALLER=$PWD
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
absolute() { if [[ $1 == /* ]]; then realpath -m -- "$1"; else realpath -m -- "$CALLER/$1"; fi; }

SMOKE=0 OUT="" SMOLLM="" SMOLLM_GIVEN=0 WHEELS="" WORK="" BUDGET="" KEEP=0 FETCH=""
while (($#)); do
    case $1 in
        --smoke) SMOKE=1 ;;
        --out) OUT=$(absolute "${2:?--out needs a folder}") && shift ;;
        --smollm) SMOLLM=$(absolute "${2:?--smollm needs a folder}") SMOLLM_GIVEN=1 && shift ;;
        --wheels) WHEELS=$(absolute "${2:?--wheels needs a folder}") && shift ;;
        --work) WORK=$(absolute "${2:?--work needs a folder}") && shift ;;
        --budget) BUDGET=${2:?--budget needs seconds} && shift ;;
        --keep-work) KEEP=1 ;;
        --fetch-wheels) FETCH=$(absolute "${2:?--fetch-wheels needs a folder}") && shift ;;
        -h | --help) usage && exit 0 ;;
        *) echo "gpu_check: unknown argument $1" >&2 && usage >&2 && exit 2 ;;
    esac
    shift
done

if [[ -z ${PYTHON:-} ]]; then
    if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
PY=$PYTHON
HELPER=$ROOT/scripts/gpu_check.py

# What a bare PyTorch image (python, torch, transformers, numba, ...) lacks, by their names in
# constraints.txt; grpcio and protobuf too, as the stubs in speculant/v1 need their versions.
CARRIED=(annotated-types grpcio grpcio-health-checking grpcio-reflection llguidance lmdb protobuf
    pydantic pydantic-settings pydantic_core python-dotenv starlette typing-inspection
    typing_extensions uvicorn)

if [[ -n $FETCH ]]; then
    pins=() platforms=(--platform manylinux2014_x86_64)
    for name in "${CARRIED[@]}"; do
        pins+=("$(grep -i -E "^${name}==" constraints.txt)") || {
            echo "gpu_check: constraints.txt pins no $name" >&2 && exit 1
        }
    done
    for n in 17 24 27 28 31 34 35 39; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
    "$PY" -m pip download --no-deps --only-binary=:all: --python-version "${WHEEL_PYTHON:-3.12}" \
        --implementation cp "${platforms[@]}" -d "$FETCH" "${pins[@]}"
    echo "wheels in $FETCH ($(du -sh "$FETCH" | cut -f1)); run: scripts/gpu_check.sh --wheels DIR"
    exit 0
fi

if ((SMOKE)); then MODE=smoke; else MODE=gpu; fi
OUT=${OUT:-$CALLER/gpu-check-$MODE-$(date +%Y%m%d-%H%M%S)}
LOGS=$OUT/logs
mkdir -p "$LOGS"
rm -f "$OUT"/{env,cost,random-model,summary}.json "$OUT"/{build,identity,generate,load}-*.json \
    "$OUT/steps.jsonl" # an earlier run's figures, by name (OUT may hold other files)
CREATED_WORK=0
if [[ -z $WORK ]]; then
    WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX") && CREATED_WORK=1
fi
mkdir -p "$WORK"
[[ -z $WHEELS && -d .whl ]] && WHEELS=$ROOT/.whl
if ((!SMOLLM_GIVEN && !SMOKE)) && [[ -d ../shared/models/smollm2-135m-instruct ]]; then
    SMOLLM=$(cd ../shared/models/smollm2-135m-instruct && pwd)
fi

UP_PID=""
stop_up() {
    if [[ -n $UP_PID ]]; then
        kill -TERM "$UP_PID" 2>/dev/null || true
        wait "$UP_PID" 2>/dev/null || true
        UP_PID=""
    fi
}
cleanup() {
    stop_up
    if ((CREATED_WORK && !KEEP)); then rm -rf "$WORK"; fi
}
trap cleanup EXIT

if ((SMOKE)); then
    DEVICE=cpu DTYPE=float32 SHAPE=tiny CORPUS_BYTES=400000
    ID_PROMPTS=2 ID_TOKENS=16 GEN_PROMPTS=2 GEN_TOKENS=8 BIG_PROMPTS=2 BIG_TOKENS=8
    COST_TOKENS=1,2,4,8 COST_REPEATS=3 LOAD_SECONDS=1 LOAD_TOKENS=8 DRAFT_CALLS=100
    BUDGET=${BUDGET:-0}
else
    DEVICE=cuda DTYPE=bfloat16 SHAPE=llama3-8b CORPUS_BYTES=0
    ID_PROMPTS=8 ID_TOKENS=128 GEN_PROMPTS=8 GEN_TOKENS=128 BIG_PROMPTS=4 BIG_TOKENS=64
    COST_TOKENS=1-17,24,32,48,64 COST_REPEATS=20 LOAD_SECONDS=10 LOAD_TOKENS=64 DRAFT_CALLS=1000
    BUDGET=${BUDGET:-540}
fi
CONCURRENCY=(1 8 32)
PROMPTS=$ROOT/demo/prompts.jsonl
STORIES=$ROOT/demo/stories260K
BIG=$WORK/llama3-8b-random
SYSTEMS=hf,plain,embedded,services
FAILED=0

export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
if [[ -n $WHEELS ]]; then
    echo "== installing the wheels of $WHEELS into $WORK/site"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$WORK/site" "$WHEELS"/*.whl
    export PYTHONPATH=$ROOT:$WORK/site${PYTHONPATH:+:$PYTHONPATH}
else
    export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
fi

report() { "$PY" "$HELPER" report --out "$OUT" "$@" || FAILED=1; }

# step NAME KIND FILE... -- COMMAND...: run COMMAND (output in logs/NAME.log), then print the
# step's line from its JSON files; a step that would start past the budget is skipped
step() {
    local name=$1 kind=$2 files=()
    shift 2
    while [[ $1 != -- ]]; do files+=("$1") && shift; done
    shift
    if [[ $BUDGET != 0 ]] && ((SECONDS > BUDGET)); then
        report --step "$name" --skip "not started: past the time budget (--budget $BUDGET s)"
        return 0
    fi
    echo "== $name"
    local start=$SECONDS rc=0
    "$@" >"$LOGS/$name.log" 2>&1 || rc=$?
    report --step "$name" --kind "$kind" --rc "$rc" --seconds $((SECONDS - start)) \
        --log "$LOGS/$name.log" "${files[@]}"
}

speculant() { "$PY" -m launcher.cli "$@"; }

build_graphs() {
    local corpus=$ROOT/demo/tinystories-slice.txt
    if ((CORPUS_BYTES)); then
        head -c "$CORPUS_BYTES" "$corpus" >"$WORK/corpus.txt" && corpus=$WORK/corpus.txt
    fi
    speculant bench build --corpus "$corpus" --doc-separator '\n\n\n' --tokenizer "$STORIES" \
        --out "$WORK/graph-stories260k" --json "$OUT/build-stories260k.json" || return 1
    if [[ -n $SMOLLM ]]; then
        speculant bench build --corpus "$corpus" --doc-separator '\n\n\n' --tokenizer "$SMOLLM" \
            --out "$WORK/graph-smollm2" --json "$OUT/build-smollm2.json" || return 1
    fi
}

# draft_speed GRAPH: bench draft of the default tree and of chains of 16 on this host's CPU,
# one client (issue 37's bars: 0.5 ms a tree, 0.1 ms a chain, 1.0 ms over a gRPC stream)
draft_speed() {
    local graph=$1
    speculant bench draft --graph "$graph" --concurrency 1 --requests "$DRAFT_CALLS" \
        --json "$OUT/draft-tree.json" || return 1
    speculant bench draft --graph "$graph" --concurrency 1 --requests "$DRAFT_CALLS" \
        --tree-nodes 0 --json "$OUT/draft-chain.json"
}

# generate MODEL GRAPH JSON [FLAG...]: bench generate of the demo prompts on DEVICE
generate() {
    local model=$1 graph=$2 json=$3
    shift 3
    speculant bench generate --model "$model" --graph "$graph" --prompts "$PROMPTS" \
        --device "$DEVICE" --systems "$SYSTEMS" --temperature 0 --json "$json" "$@"
}

# load_series LABEL MODEL GRAPH [UP_FLAG...]: speculant up, then speculant load at each
# concurrency of CONCURRENCY
load_series() {
    local label=$1 model=$2 graph=$3 ports gateway draft verifier c
    shift 3
    ports=$("$PY" "$HELPER" ports 3) || return 1
    read -r gateway draft verifier <<<"$ports"
    # not through speculant(): $! must be up's own pid, which stops its children on SIGTERM
    "$PY" -m launcher.cli up --graph "$graph" --model "$model" --device "$DEVICE" --http-port 0 \
        --catalog none --gateway-port "$gateway" --draft-port "$draft" \
        --verifier-port "$verifier" "$@" >"$LOGS/up-$label.log" 2>&1 3>&- 4>&- &
    UP_PID=$!
    "$PY" "$HELPER" wait --address "127.0.0.1:$gateway" --pid "$UP_PID" --timeout 600 || {
        stop_up && tail -20 "$LOGS/up-$label.log" && return 1
    }
    for c in "${CONCURRENCY[@]}"; do
        speculant load --gateway "127.0.0.1:$gateway" --verifier "127.0.0.1:$verifier" \
            --concurrency "$c" --duration "$LOAD_SECONDS" --max-tokens "$LOAD_TOKENS" \
            --prompts "$PROMPTS" --json "$OUT/load-$label-c$c.json" || { stop_up && return 1; }
    done
    stop_up
}

load_files() { for c in "${CONCURRENCY[@]}"; do echo "$OUT/load-$1-c$c.json"; done; }

# batching MODEL GRAPH: trees against chains verified in batches, both priced flat (issue 37:
# at concurrency 8 the trees' aggregate tokens/s should be at least the chains')
batching() {
    local CONCURRENCY=(8)
    load_series trees "$1" "$2" --verify-cost flat || return 1
    load_series chains "$1" "$2" --verify-cost flat --tree-nodes 0
}

# the terminal's stdout and stderr, for a trap that fires while a step's output goes to its log
exec 3>&1 4>&2
interrupted() {
    trap - TERM INT
    echo "gpu_check: interrupted" >&3
    "$PY" "$HELPER" finish --out "$OUT" --mode "$MODE" --seconds "$SECONDS" --interrupted \
        >&3 2>&4 || true
    exit 143
}
trap interrupted TERM INT

echo "gpu_check $MODE: figures in $OUT, work in $WORK"
if ! "$PY" "$HELPER" preflight --mode "$MODE" --json "$OUT/env.json"; then
    report --step env --rc 1 --seconds "$SECONDS"
    "$PY" "$HELPER" finish --out "$OUT" --mode "$MODE" --seconds "$SECONDS" || true
    exit 1
fi
report --step env --kind env --seconds "$SECONDS" "$OUT/env.json"

builds=("$OUT/build-stories260k.json")
[[ -n $SMOLLM ]] && builds+=("$OUT/build-smollm2.json")
if [[ -n $SMOLLM && ! -f $SMOLLM/config.json ]]; then
    echo "gpu_check: no model at --smollm $SMOLLM: the SmolLM2 steps are skipped"
    SMOLLM=""
    builds=("$OUT/build-stories260k.json")
fi
step build build "${builds[@]}" -- build_graphs
# the model and graph of the drafting and batching steps: SmolLM2's where given (a real model's
# 49k vocabulary), else stories260K's
speed_model=$STORIES speed_graph=$WORK/graph-stories260k
if [[ -n $SMOLLM ]]; then speed_model=$SMOLLM speed_graph=$WORK/graph-smollm2; fi
step draft draft "$OUT/draft-tree.json" "$OUT/draft-chain.json" -- draft_speed "$speed_graph"

# greedy identity: every system's output against Hugging Face generate, token for token, in
# float32 (in bfloat16 a forward over several tokens may round differently from one over one)
step identity-stories260k identity "$OUT/identity-stories260k.json" -- \
    generate "$STORIES" "$WORK/graph-stories260k" "$OUT/identity-stories260k.json" \
    --dtype float32 --limit "$ID_PROMPTS" --max-tokens "$ID_TOKENS"
if [[ -n $SMOLLM ]]; then
    step identity-smollm2 identity "$OUT/identity-smollm2.json" -- \
        generate "$SMOLLM" "$WORK/graph-smollm2" "$OUT/identity-smollm2.json" \
        --dtype float32 --limit "$ID_PROMPTS" --max-tokens "$ID_TOKENS"
else
    report --step identity-smollm2 --skip "no SmolLM2 folder (--smollm PATH)"
fi

step random-model model "$OUT/random-model.json" -- \
    "$PY" "$HELPER" random-model --shape "$SHAPE" --tokenizer "$STORIES" --out "$BIG" \
    --device "$DEVICE" --dtype "$DTYPE" --json "$OUT/random-model.json"

cost_models=$STORIES${SMOLLM:+,$SMOLLM},$BIG
step cost cost "$OUT/cost.json" -- \
    speculant bench cost --models "$cost_models" --device "$DEVICE" --dtype "$DTYPE" \
    --new-tokens "$COST_TOKENS" --repeats "$COST_REPEATS" --json "$OUT/cost.json"

# speed in the GPU's own dtype (the checkpoint's: bfloat16; float32 on a CPU)
if [[ -n $SMOLLM ]]; then
    step generate-smollm2 generate "$OUT/generate-smollm2.json" -- \
        generate "$SMOLLM" "$WORK/graph-smollm2" "$OUT/generate-smollm2.json" \
        --limit "$GEN_PROMPTS" --max-tokens "$GEN_TOKENS" --verify-cost measured,flat
else
    report --step generate-smollm2 --skip "no SmolLM2 folder (--smollm PATH)"
fi
step generate-llama3-8b-random generate "$OUT/generate-llama3-8b-random.json" -- \
    generate "$BIG" "$WORK/graph-stories260k" "$OUT/generate-llama3-8b-random.json" \
    --limit "$BIG_PROMPTS" --max-tokens "$BIG_TOKENS"

if [[ -n $SMOLLM ]]; then
    mapfile -t files < <(load_files smollm2)
    step load-smollm2 load "${files[@]}" -- load_series smollm2 "$SMOLLM" "$WORK/graph-smollm2"
else
    report --step load-smollm2 --skip "no SmolLM2 folder (--smollm PATH)"
fi
step batching batching "$OUT/load-trees-c8.json" "$OUT/load-chains-c8.json" -- \
    batching "$speed_model" "$speed_graph"
mapfile -t files < <(load_files llama3-8b-random)
step load-llama3-8b-random load "${files[@]}" -- \
    load_series llama3-8b-random "$BIG" "$WORK/graph-stories260k"

"$PY" "$HELPER" finish --out "$OUT" --mode "$MODE" --seconds "$SECONDS" || FAILED=1
exit "$FAILED"
