set -e
cd /work/main
S=./target/release/sim
D=plots/results/2026-11-26-simulated-published
MEM="--num-gpu-blocks 65536 --workspace-tokens 8192 --max-model-len 8192"
CAL="--cost-model plots/results/2026-11-26-h200-calibration-3/calibration.json --cost-target deepseek-v3-fp8:8"
$S sweep --out $D/h200-fp8-sglang.csv --batch 1,32 --spec off,mtp1 --acceptance 0.9 --prompt-len 512..1024 --max-new-tokens 128..128 $MEM $CAL 2>&1 | tail -1
$S sweep --out $D/h200-fp8-trtllm.csv --batch 1 --spec off,mtp1,mtp2,mtp3 --acceptance 0.92/0.717/0.364 --prompt-len 1024..1024 --max-new-tokens 512..512 $MEM $CAL 2>&1 | tail -1
$S sweep --out $D/h200-fp8-lmsys.csv --batch 2 --spec off,mtp2,mtp3 --acceptance 0.741/0.592 --prompt-len 4096..4096 --max-new-tokens 128..128 $MEM $CAL 2>&1 | tail -1
