-- A manifest as pytest-gpubench wrote it before schema version 1 (issue 9), dumped with
-- sqlite3's iterdump: tokens_per_second holds the per-request mean decode rate.
BEGIN TRANSACTION;
CREATE TABLE "attempts" (
   "manifest_id" TEXT NOT NULL REFERENCES "benchmark_manifest"("id"),
   "attempt" INTEGER NOT NULL,
   "run_id" TEXT NOT NULL,
   "status" TEXT NOT NULL,
   "offer_id" TEXT,
   "provider" TEXT,
   "gpu_type" TEXT,
   "location" TEXT,
   "machine_id" TEXT,
   "price_per_hour" REAL,
   "consumer_id" TEXT,
   "session_id" TEXT,
   "stage" TEXT,
   "error" TEXT,
   "started_at" TEXT NOT NULL,
   "session_started_at" TEXT,
   "ended_at" TEXT,
   "expected_seconds" REAL,
   "cost_usd" REAL,
   "api_cost_usd" REAL,
   "session_status" TEXT,
   "worker" TEXT,
   PRIMARY KEY ("manifest_id", "attempt")
);
CREATE TABLE "benchmark_manifest" (
   "id" TEXT PRIMARY KEY NOT NULL,
   "run_id" TEXT NOT NULL,
   "created_at" TEXT NOT NULL,
   "gpu_type" TEXT NOT NULL,
   "provider" TEXT NOT NULL,
   "model" TEXT NOT NULL,
   "session_id" TEXT,
   "instance_ip" TEXT,
   "ssh_port" INTEGER,
   "status" TEXT NOT NULL,
   "started_at" TEXT,
   "completed_at" TEXT,
   "benchmark_id" TEXT,
   "tokens_per_second" REAL,
   "total_requests" INTEGER,
   "error_count" INTEGER,
   "failure_reason" TEXT,
   "failure_stage" TEXT,
   "error_message" TEXT,
   "notes" TEXT,
   "cell_id" TEXT,
   "matrix_file" TEXT,
   "offer_id" TEXT,
   "price_per_hour" REAL,
   "cost_usd" REAL,
   "api_cost_usd" REAL,
   "session_status" TEXT,
   "session_started_at" TEXT,
   "consumer_id" TEXT,
   "worker" TEXT,
   "ttft_p50_ms" REAL,
   "cost_per_million_tokens" REAL,
   "progress_file" TEXT,
   "host_key_fingerprint" TEXT,
   "attempts" INTEGER,
   "released_by" TEXT,
   "session_released_at" TEXT,
   "reuse_group" TEXT,
   "session_turn" INTEGER,
   "session_owner" TEXT,
   "imported_from" TEXT,
   "stage_seconds" TEXT
);
INSERT INTO "benchmark_manifest" VALUES('20261120T100000Z-old/RTX_4090-vastai-qwen2:7b-c4','20261120T100000Z-old','2026-11-24T16:47:11.739+00:00','RTX 4090','vastai','qwen2:7b','s-1',NULL,NULL,'success',NULL,'2026-11-24T16:47:11.744+00:00','b-c4',178.9,8,0,NULL,NULL,NULL,NULL,'RTX_4090-vastai-qwen2:7b-c4','matrix/sweep.yaml','vastai-1',0.36,0.01,NULL,NULL,'2026-11-24T16:47:11.739+00:00','gpubench-x',NULL,44.5,0.15625,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL);
INSERT INTO "benchmark_manifest" VALUES('20261120T100000Z-old/RTX_3090-vastai-qwen2:7b','20261120T100000Z-old','2026-11-24T16:47:11.745+00:00','RTX 3090','vastai','qwen2:7b',NULL,NULL,NULL,'failed',NULL,'2026-11-24T16:47:11.746+00:00',NULL,NULL,NULL,NULL,NULL,'ssh_wait','SSH never came up',NULL,'RTX_3090-vastai-qwen2:7b','matrix/sweep.yaml',NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL);
CREATE TABLE "benchmark_runs" (
   "benchmark_id" TEXT NOT NULL REFERENCES "benchmarks"("id"),
   "run_index" INTEGER NOT NULL,
   "tokens_per_second" REAL,
   "ttft_p50_ms" REAL,
   "requests" INTEGER,
   "duration_seconds" REAL,
   "outlier" INTEGER,
   PRIMARY KEY ("benchmark_id", "run_index")
);
INSERT INTO "benchmark_runs" VALUES('b-c4',0,178.9,44.0,8,3.2,0);
CREATE TABLE "benchmarks" (
   "id" TEXT PRIMARY KEY NOT NULL,
   "manifest_id" TEXT NOT NULL REFERENCES "benchmark_manifest"("id"),
   "run_id" TEXT,
   "created_at" TEXT,
   "gpu_name" TEXT,
   "gpu_type" TEXT,
   "provider" TEXT,
   "location" TEXT,
   "model" TEXT,
   "price_per_hour" REAL,
   "tokens_per_second" REAL,
   "total_requests" INTEGER,
   "total_tokens" INTEGER,
   "total_prompt_tokens" INTEGER,
   "total_errors" INTEGER,
   "duration_seconds" REAL,
   "avg_tokens_per_second" REAL,
   "min_tokens_per_second" REAL,
   "max_tokens_per_second" REAL,
   "p50_tokens_per_second" REAL,
   "p95_tokens_per_second" REAL,
   "p99_tokens_per_second" REAL,
   "avg_latency_ms" REAL,
   "min_latency_ms" REAL,
   "max_latency_ms" REAL,
   "p50_latency_ms" REAL,
   "p95_latency_ms" REAL,
   "p99_latency_ms" REAL,
   "requests_per_minute" REAL,
   "avg_tokens_per_request" REAL,
   "error_rate" REAL,
   "avg_ttft_ms" REAL,
   "p50_ttft_ms" REAL,
   "p95_ttft_ms" REAL,
   "match_rate" REAL,
   "prompts_with_expected" INTEGER,
   "prompts_matching" INTEGER,
   "cost_per_million_tokens" REAL,
   "result_json" TEXT,
   "details_json" TEXT,
   "upload_status" TEXT,
   "upload_error" TEXT,
   "remote_id" TEXT,
   "uploaded_at" TEXT
);
INSERT INTO "benchmarks" VALUES('b-c4','20261120T100000Z-old/RTX_4090-vastai-qwen2:7b-c4','20261120T100000Z-old','2026-11-24T16:47:11.741+00:00','NVIDIA GeForce RTX 4090','RTX 4090','vastai','US','qwen2:7b',0.36,178.9,8,2048,160,0,3.2,178.9,178.2,179.6,178.9,179.53,1.79585999999999984316e+02,1445.0,1410.0,1480.0,1445.0,1476.5,1479.3,150.0,256.0,0.0,44.5,44.5,47.65,0.0,0,0,0.15625,'{"id":"b-c4","timestamp":"2026-11-24T16:47:11.711815Z","hardware":{"gpu_name":"NVIDIA GeForce RTX 4090","gpu_memory_mib":24564,"gpu_count":1,"driver_version":"","cuda_version":"","cpu_model":"","cpu_cores":0,"ram_gib":0},"model":{"name":"qwen2:7b","family":"","parameter_count":"","quantization":"","size_gb":0.0,"runtime":"ollama","runtime_version":""},"test_config":{"duration_minutes":0,"max_tokens":0,"prompt_types":[],"concurrent_reqs":4,"warmup_requests":0},"results":{"total_requests":8,"total_tokens":2048,"total_prompt_tokens":160,"total_errors":0,"duration_seconds":3.2,"avg_tokens_per_second":178.9,"min_tokens_per_second":178.2,"max_tokens_per_second":179.6,"p50_tokens_per_second":178.9,"p95_tokens_per_second":179.53,"p99_tokens_per_second":179.58599999999998,"avg_latency_ms":1445.0,"min_latency_ms":1410.0,"max_latency_ms":1480.0,"p50_latency_ms":1445.0,"p95_latency_ms":1476.5,"p99_latency_ms":1479.3,"requests_per_minute":150.0,"avg_tokens_per_request":256.0,"error_rate":0.0,"avg_ttft_ms":44.5,"p50_ttft_ms":44.5,"p95_ttft_ms":47.65,"match_rate":0.0,"prompts_with_expected":0,"prompts_matching":0},"gpu_stats":{"avg_utilization_pct":0.0,"max_utilization_pct":0.0,"avg_memory_used_mib":0,"max_memory_used_mib":0,"avg_temperature_c":0.0,"max_temperature_c":0.0,"avg_power_draw_w":0.0,"max_power_draw_w":0.0},"provider":"vastai","location":"US","price_per_hour":0.36}','{"metrics": {"ttft_p99_ms": 48.9, "itl_p50_ms": 5.5, "itl_p99_ms": 7.0, "tpot_p50_ms": 5.6, "e2e_p99_ms": 1480.0}, "load": {"concurrency": 4, "rate": null}, "runs": [{"run_index": 0, "tokens_per_second": 178.9}], "validity": {"valid": true, "reasons": []}}',NULL,NULL,NULL,NULL);
CREATE TABLE "gpu_samples" (
   "benchmark_id" TEXT,
   "manifest_id" TEXT NOT NULL REFERENCES "benchmark_manifest"("id"),
   "t" REAL NOT NULL,
   "gpu" INTEGER NOT NULL,
   "utilization_pct" REAL,
   "memory_used_mib" INTEGER,
   "temperature_c" REAL,
   "power_draw_w" REAL
);
CREATE TABLE "requests" (
   "benchmark_id" TEXT NOT NULL REFERENCES "benchmarks"("id"),
   "manifest_id" TEXT,
   "index" INTEGER,
   "warmup" INTEGER,
   "prompt_index" INTEGER,
   "started_at" REAL,
   "ttft_ms" REAL,
   "latency_ms" REAL,
   "output_tokens" INTEGER,
   "eval_count" INTEGER,
   "eval_duration_ns" INTEGER,
   "prompt_tokens" INTEGER,
   "tokens_per_second" REAL,
   "error" TEXT,
   "scheduled_at" REAL,
   "send_lag_ms" REAL,
   "itl_mean_ms" REAL,
   "itl_max_ms" REAL,
   "tpot_ms" REAL,
   "server_tokens_per_second" REAL,
   "prompt_eval_duration_ns" INTEGER,
   "load_duration_ns" INTEGER,
   "total_duration_ns" INTEGER,
   "done_reason" TEXT,
   "matched" INTEGER
);
INSERT INTO "requests" VALUES('b-c4','20261120T100000Z-old/RTX_4090-vastai-qwen2:7b-c4',0,1,0,1.0,90.0,900.0,50,NULL,NULL,NULL,60.0,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL);
INSERT INTO "requests" VALUES('b-c4','20261120T100000Z-old/RTX_4090-vastai-qwen2:7b-c4',1,0,1,2.0,41.0,1410.0,256,256,NULL,20,178.2,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL);
INSERT INTO "requests" VALUES('b-c4','20261120T100000Z-old/RTX_4090-vastai-qwen2:7b-c4',2,0,0,3.0,42.0,1420.0,256,256,NULL,20,178.4,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL);
INSERT INTO "requests" VALUES('b-c4','20261120T100000Z-old/RTX_4090-vastai-qwen2:7b-c4',3,0,1,4.0,43.0,1430.0,256,256,NULL,20,178.6,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL);
INSERT INTO "requests" VALUES('b-c4','20261120T100000Z-old/RTX_4090-vastai-qwen2:7b-c4',4,0,0,5.0,44.0,1440.0,256,256,NULL,20,178.8,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL);
INSERT INTO "requests" VALUES('b-c4','20261120T100000Z-old/RTX_4090-vastai-qwen2:7b-c4',5,0,1,6.0,45.0,1450.0,256,256,NULL,20,179.0,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL);
INSERT INTO "requests" VALUES('b-c4','20261120T100000Z-old/RTX_4090-vastai-qwen2:7b-c4',6,0,0,7.0,46.0,1460.0,256,256,NULL,20,179.2,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL);
INSERT INTO "requests" VALUES('b-c4','20261120T100000Z-old/RTX_4090-vastai-qwen2:7b-c4',7,0,1,8.0,47.0,1470.0,256,256,NULL,20,179.4,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL);
INSERT INTO "requests" VALUES('b-c4','20261120T100000Z-old/RTX_4090-vastai-qwen2:7b-c4',8,0,0,9.0,48.0,1480.0,256,256,NULL,20,179.6,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL);
CREATE TABLE "runs" (
   "run_id" TEXT PRIMARY KEY NOT NULL,
   "started_at" TEXT,
   "finished_at" TEXT,
   "argv" TEXT,
   "matrix_files" TEXT,
   "host" TEXT,
   "status" TEXT,
   "pid" INTEGER,
   "pid_start" TEXT,
   "api" TEXT,
   "sandbox" INTEGER,
   "resumed_at" TEXT
);
INSERT INTO "runs" VALUES('20261120T100000Z-old','2026-11-24T16:47:11.738+00:00','2026-11-24T16:47:11.747+00:00','["pytest", "matrix/"]','["matrix/sweep.yaml"]','vm','failed',NULL,NULL,NULL,NULL,NULL);
CREATE INDEX "idx_benchmark_manifest_run_id"
    ON "benchmark_manifest" ("run_id");
CREATE INDEX "idx_benchmark_manifest_status"
    ON "benchmark_manifest" ("status");
CREATE INDEX "idx_benchmark_manifest_session_id"
    ON "benchmark_manifest" ("session_id");
CREATE INDEX "idx_benchmarks_run_id"
    ON "benchmarks" ("run_id");
CREATE INDEX "idx_benchmark_manifest_cell_id"
    ON "benchmark_manifest" ("cell_id");
CREATE INDEX "idx_benchmarks_manifest_id"
    ON "benchmarks" ("manifest_id");
CREATE INDEX "idx_benchmarks_upload_status"
    ON "benchmarks" ("upload_status");
CREATE INDEX "idx_requests_benchmark_id"
    ON "requests" ("benchmark_id");
CREATE INDEX "idx_gpu_samples_benchmark_id"
    ON "gpu_samples" ("benchmark_id");
CREATE INDEX "idx_gpu_samples_manifest_id"
    ON "gpu_samples" ("manifest_id");
CREATE INDEX "idx_attempts_run_id"
    ON "attempts" ("run_id");
CREATE INDEX "idx_attempts_session_id"
    ON "attempts" ("session_id");
COMMIT;
