set -e
cd /work/main
S=./target/release/sim
D=plots/results/2026-11-26-simulated-published
MEM="--num-gpu-blocks 65536 --workspace-tokens 8192 --max-model-len 8192"
for cal in h200:plots/results/2026-11-26-h200-calibration-3/calibration.json h100:plots/results/2026-11-26-h100-calibration-scrub/calibration.json; do
name=${cal%%:*}; file=${cal#*:}
CAL="--cost-model $file --cost-target deepseek-v3:8"
# SGLang (H200, TP 8): K 1 at about 1.9 accepted per verify (PR 3582), batch 1 and 32.
$S sweep --out $D/$name-sglang.csv --batch 1,32 --spec off,mtp1,mtp3 --acceptance 0.9,0.9/0.7/0.5 --prompt-len 512..1024 --max-new-tokens 128..128 $MEM $CAL 2>&1 | tail -1
# TensorRT-LLM (B200, batch 1, 1k in): K 1-3 at 1.92, 2.58, 2.82.
$S sweep --out $D/$name-trtllm.csv --batch 1 --spec off,mtp1,mtp2,mtp3 --acceptance 0.92/0.717/0.364 --prompt-len 1024..1024 --max-new-tokens 512..512 $MEM $CAL 2>&1 | tail -1
# LMSYS small scale (H200, 2 requests per rank): K 2 at 2.18, K 3 at 2.44.
$S sweep --out $D/$name-lmsys.csv --batch 2 --spec off,mtp2,mtp3 --acceptance 0.741/0.592 --prompt-len 4096..4096 --max-new-tokens 128..128 $MEM $CAL 2>&1 | tail -1
# LMSYS large scale (128 requests per rank, K 1, acceptance not published): 0.7 to 0.9.
$S sweep --out $D/$name-lmsys-large.csv --batch 128 --spec off,mtp1 --acceptance 0.7,0.9 --prompt-len 2000..2000 --max-new-tokens 100..100 $MEM $CAL 2>&1 | tail -1
done
