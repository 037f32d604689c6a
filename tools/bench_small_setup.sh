# Sourced by the benchmarks of issue 13 (bench_dtfm_small.sh, bench_pipeline_diloco.sh): writes into $W the emulated
# cluster (devices $DEVICES of $SRC, ids shuffled with $SEED) and the workload the scheduler prices: the trained model
# as it sees it, 8 blocks of width 128, context 64, batch 8 per pipeline, fp32 on the wire, D_DP 2 x D_PP 4. (Until
# 2026-11-24 num_parameters said 1,739,008, the tied model's count; the runs untie the embeddings: 1,771,904.)
python3 tools/cluster_subset.py "$SRC" "$DEVICES" "$SEED" $W/cluster.json
cat > $W/workload.json <<JSON
{"name": "bench-small", "num_layers": 8, "width": 128, "seq_len": 64, "global_batch": 16, "num_parameters": 1771904,
 "bytes_per_parameter": 4, "bytes_per_activation": 4, "d_dp": 2, "d_pp": 4}
JSON
