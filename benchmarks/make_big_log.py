"""Write a realistic, large vLLM container log for benchmarking `vllm-oncall diagnose`.

The file is what `kubectl logs --previous` prints for a long-running V1 server (vLLM 0.10.x) that
ran under a restart loop: a real start-up (engine config, weights, torch.compile, KV-cache size, CUDA
graph capture), then many MB of runtime noise (request logs, uvicorn access lines, periodic metrics,
tqdm bars written with carriage returns), then a restart with a longer --max-model-len that dies in
the V1 KV-cache check (ValueError with the estimated maximum model length). Numbers are consistent:
Llama-3.1-8B (128 KiB of KV per token) on a 24 GB L4 at gpu_memory_utilization 0.90: 16384 tokens
of context fit, 131072 do not.

The request lines quote prompts made of everyday words, some of which vLLM's own messages hold too
('version', 'memory', 'cache', 'model'): a reader that gated on a bare word would check most of the
log line by line (the version line's gate once did: 27,000 lines per 100 MB instead of 600).

Deterministic for a given --seed; written in a streaming way (bounded memory).

    python benchmarks/make_big_log.py OUT.log [--size-mb 100] [--seed 0]
"""

from __future__ import annotations

import argparse
import random
from datetime import datetime, timedelta
from pathlib import Path

GIB = 2 ** 30
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
SITE = "/usr/local/lib/python3.12/dist-packages"
API = "(APIServer pid=1) "
CORE = "(EngineCore_0 pid=262) "

TOTAL = 23_655_874_560  # what torch reports for an NVIDIA L4 (22.03 GiB)
UTIL = 0.90
WEIGHTS = 14.9889 * GIB
ACTIVATION = 1.13 * GIB
NON_TORCH = 0.09 * GIB
PER_TOKEN = 2 * 8 * 128 * 2 * 32  # K+V x kv_heads x head_dim x bf16 x layers = 131072 bytes

WORDS = ("the of and to in is that for it as with was on be by this are from at or an which one have "
         "summarize translate explain cluster kubernetes pod memory cache tensor parallel model token "
         "request latency throughput gpu scheduler batch prompt answer question context window policy "
         "incident node label version release upgrade rollback config value flag default").split()


class Clock:
    def __init__(self, start: datetime) -> None:
        self.t = start

    def step(self, seconds: float) -> str:
        self.t += timedelta(seconds=seconds)
        return self.t.strftime("%m-%d %H:%M:%S")

    def now(self) -> str:
        return self.t.strftime("%m-%d %H:%M:%S")


def engine_config(max_len: int) -> str:
    return (f"Initializing a V1 LLM engine (v0.10.1.1) with config: model='{MODEL}', speculative_config=None, "
            f"tokenizer='{MODEL}', skip_tokenizer_init=False, tokenizer_mode=auto, revision=None, "
            f"override_neuron_config={{}}, tokenizer_revision=None, trust_remote_code=False, dtype=torch.bfloat16, "
            f"max_seq_len={max_len}, download_dir=None, load_format=auto, tensor_parallel_size=1, "
            f"pipeline_parallel_size=1, disable_custom_all_reduce=False, quantization=None, enforce_eager=False, "
            f"kv_cache_dtype=auto, device_config=cuda, decoding_config=DecodingConfig(backend='auto', "
            f"disable_fallback=False, disable_any_whitespace=False, disable_additional_properties=False, "
            f"reasoning_backend=''), observability_config=ObservabilityConfig(show_hidden_metrics_for_version=None, "
            f"otlp_traces_endpoint=None, collect_detailed_traces=None), seed=0, served_model_name={MODEL}, "
            f"enable_prefix_caching=True, chunked_prefill_enabled=True, use_async_output_proc=True, "
            f"pooler_config=None, compilation_config={{\"level\":3,\"debug_dump_path\":\"\",\"cache_dir\":\"\","
            f"\"backend\":\"\",\"custom_ops\":[],\"splitting_ops\":[\"vllm.unified_attention\","
            f"\"vllm.unified_attention_with_output\",\"vllm.mamba_mixer2\"],\"use_inductor\":true,"
            f"\"compile_sizes\":[],\"use_cudagraph\":true,\"cudagraph_num_of_warmups\":1,"
            f"\"cudagraph_capture_sizes\":[512,504,496,488,480,472,464,456,448,440,432,424,416,408,400,392,384,376,"
            f"368,360,352,344,336,328,320,312,304,296,288,280,272,264,256,248,240,232,224,216,208,200,192,184,176,168,"
            f"160,152,144,136,128,120,112,104,96,88,80,72,64,56,48,40,32,24,16,8,4,2,1],\"cudagraph_copy_inputs\":false,"
            f"\"full_cuda_graph\":false,\"max_capture_size\":512,\"local_cache_dir\":null}}")


def available_kv() -> float:
    return TOTAL * UTIL - WEIGHTS - ACTIVATION - NON_TORCH


def startup(clock: Clock, max_len: int, rng: random.Random) -> list[str]:
    """Start-up lines up to (and including) the KV-cache sizing."""
    out = [
        f"INFO {clock.step(0)} [__init__.py:241] Automatically detected platform cuda.",
        f"{API}INFO {clock.step(2.3)} [api_server.py:1805] vLLM API server version 0.10.1.1",
        f"{API}INFO {clock.now()} [utils.py:326] non-default args: {{'model_tag': '{MODEL}', 'host': '0.0.0.0', "
        f"'model': '{MODEL}', 'max_model_len': {max_len}, 'enable_prefix_caching': True}}",
        f"{API}INFO {clock.step(6.1)} [__init__.py:711] Resolved architecture: LlamaForCausalLM",
        f"{API}INFO {clock.now()} [__init__.py:1750] Using max model len {max_len}",
        f"{API}INFO {clock.step(0.3)} [config.py:2273] Chunked prefill is enabled with max_num_batched_tokens=2048.",
        f"INFO {clock.step(5.0)} [__init__.py:241] Automatically detected platform cuda.",
        f"{CORE}INFO {clock.step(1.4)} [core.py:636] Waiting for init message from front-end.",
        f"{CORE}INFO {clock.now()} [core.py:74] {engine_config(max_len)}",
        f"{CORE}INFO {clock.step(1.8)} [parallel_state.py:1134] rank 0 in world size 1 is assigned as DP rank 0, "
        f"PP rank 0, TP rank 0, EP rank 0",
        f"{CORE}INFO {clock.step(0.2)} [gpu_model_runner.py:1953] Starting to load model {MODEL}...",
        f"{CORE}INFO {clock.now()} [gpu_model_runner.py:1985] Loading model from scratch...",
        f"{CORE}INFO {clock.step(0.1)} [cuda.py:328] Using Flash Attention backend on V1 engine.",
        f"{CORE}INFO {clock.step(0.5)} [weight_utils.py:296] Using model weights format ['*.safetensors']",
        f"{CORE}Loading safetensors checkpoint shards:   0% Completed | 0/4 [00:00<?, ?it/s]",
    ]
    elapsed = 0.0
    for i in range(1, 5):
        elapsed += 0.7 + 0.3 * rng.random()
        out.append(f"{CORE}Loading safetensors checkpoint shards: {25 * i:3d}% Completed | {i}/4 "
                   f"[00:{int(elapsed):02d}<00:{int((4 - i) * elapsed / i):02d},  {elapsed / i:.2f}s/it]")
    out += [
        f"{CORE}",
        f"{CORE}INFO {clock.step(elapsed)} [default_loader.py:262] Loading weights took {elapsed:.2f} seconds",
        f"{CORE}INFO {clock.step(0.6)} [gpu_model_runner.py:2007] Model loading took {WEIGHTS / GIB:.4f} GiB "
        f"and {elapsed + 0.63:.6f} seconds",
        f"{CORE}INFO {clock.step(6.9)} [backends.py:548] Using cache directory: "
        f"/root/.cache/vllm/torch_compile_cache/5c1d7e93a2/rank_0_0/backbone for vLLM's torch.compile",
        f"{CORE}INFO {clock.now()} [backends.py:559] Dynamo bytecode transform time: 6.88 s",
        f"{CORE}INFO {clock.step(1.9)} [backends.py:164] Directly load the compiled graph(s) for dynamic shape from "
        f"the cache, took 1.902 s",
        f"{CORE}INFO {clock.step(0.1)} [monitor.py:34] torch.compile takes 8.78 s in total",
        f"{CORE}INFO {clock.step(1.3)} [gpu_worker.py:276] Available KV cache memory: {available_kv() / GIB:.2f} GiB",
    ]
    return out


def serving_ready(clock: Clock, max_len: int) -> list[str]:
    tokens = int(available_kv() // (16 * PER_TOKEN)) * 16
    bar = "\r".join(f"Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): {p:3d}%|{'█' * (p // 10):<10}| "
                    f"{n}/67 [00:{n // 16:02d}<00:{(67 - n) // 16:02d}, 16.{n % 10}it/s]"
                    for p, n in ((0, 0), (25, 17), (51, 34), (76, 51), (100, 67)))
    return [
        f"{CORE}INFO {clock.step(0.2)} [kv_cache_utils.py:849] GPU KV cache size: {tokens:,} tokens",
        f"{CORE}INFO {clock.now()} [kv_cache_utils.py:853] Maximum concurrency for {max_len:,} tokens per request: "
        f"{tokens / max_len:.2f}x",
        f"{CORE}{bar}",
        f"{CORE}INFO {clock.step(4.3)} [gpu_model_runner.py:2708] Graph capturing finished in 5 secs, took 0.61 GiB",
        f"{CORE}INFO {clock.step(0.1)} [core.py:214] init engine (profile, create kv cache, warmup model) took "
        f"21.77 seconds",
        f"{API}INFO {clock.step(0.4)} [loggers.py:142] Engine 000: vllm cache_config_info with initialization after "
        f"num_gpu_blocks is: {tokens // 16}",
        f"{API}INFO {clock.now()} [api_server.py:1611] Supported_tasks: ['generate']",
        f"{API}WARNING {clock.now()} [__init__.py:1695] Default sampling parameters have been overridden by the "
        f"model's Hugging Face generation config recommended from the model creator. If this is not intended, "
        f"please relaunch vLLM instance with `--generation-config vllm`.",
        f"{API}INFO {clock.now()} [serving_responses.py:120] Using default chat sampling params from model: "
        f"{{'temperature': 0.6, 'top_p': 0.9}}",
        f"{API}INFO {clock.step(0.2)} [api_server.py:1880] Starting vLLM API server 0 on http://0.0.0.0:8000",
        f"{API}INFO {clock.now()} [launcher.py:29] Available routes are:",
        *(f"{API}INFO {clock.now()} [launcher.py:37] Route: {r}, Methods: {m}" for r, m in (
            ("/openapi.json", "HEAD, GET"), ("/docs", "HEAD, GET"), ("/health", "GET"), ("/load", "GET"),
            ("/tokenize", "POST"), ("/detokenize", "POST"), ("/v1/models", "GET"), ("/version", "GET"),
            ("/v1/chat/completions", "POST"), ("/v1/completions", "POST"), ("/metrics", "GET"))),
        f"{API}INFO:     Started server process [1]",
        f"{API}INFO:     Waiting for application startup.",
        f"{API}INFO:     Application startup complete.",
    ]


def runtime_chunk(clock: Clock, rng: random.Random, state: dict) -> str:
    """About a second of server traffic."""
    lines: list[str] = []
    for _ in range(rng.randint(1, 6)):
        rid = f"cmpl-{rng.getrandbits(128):032x}-0"
        n_words = rng.randint(4, 40)
        prompt = " ".join(rng.choice(WORDS) for _ in range(n_words)).replace("'", "")
        ids = [128000] + [rng.randint(220, 128000) for _ in range(min(n_words + 2, 24))]
        max_tokens = rng.choice((64, 128, 256, 512, 1024))
        ts = clock.step(rng.random() * 0.2)
        lines.append(
            f"{API}INFO {ts} [logger.py:41] Received request {rid}: prompt: '{prompt}', params: SamplingParams("
            f"n=1, presence_penalty=0.0, frequency_penalty=0.0, repetition_penalty=1.0, "
            f"temperature={rng.choice((0.0, 0.6, 0.7, 1.0))}, top_p={rng.choice((0.9, 0.95, 1.0))}, top_k=0, "
            f"min_p=0.0, seed=None, stop=[], stop_token_ids=[], bad_words=[], include_stop_str_in_output=False, "
            f"ignore_eos=False, max_tokens={max_tokens}, min_tokens=0, logprobs=None, prompt_logprobs=None, "
            f"skip_special_tokens=True, spaces_between_special_tokens=True, truncate_prompt_tokens=None, "
            f"guided_decoding=None, extra_args=None), prompt_token_ids: {ids}, prompt_embeds shape: None, "
            f"lora_request: None.")
        lines.append(f"{API}INFO {ts} [async_llm.py:269] Added request {rid}.")
        port = rng.randint(32768, 60999)
        path = rng.choice(("/v1/completions", "/v1/chat/completions", "/v1/chat/completions"))
        lines.append(f"{API}INFO:     10.0.{rng.randint(0, 3)}.{rng.randint(2, 250)}:{port} - \"POST {path} "
                     f"HTTP/1.1\" 200 OK")
    if rng.random() < 0.15:
        lines.append(f"{API}INFO:     10.0.0.17:{rng.randint(32768, 60999)} - \"GET /health HTTP/1.1\" 200 OK")
    if rng.random() < 0.05:
        lines.append(f"{API}INFO:     10.0.0.9:{rng.randint(32768, 60999)} - \"GET /metrics HTTP/1.1\" 200 OK")
    state["since_metrics"] += 1
    if state["since_metrics"] >= 10:
        state["since_metrics"] = 0
        running = rng.randint(0, 48)
        lines.append(
            f"{API}INFO {clock.step(0.0)} [loggers.py:123] Engine 000: Avg prompt throughput: "
            f"{rng.uniform(50, 4000):.1f} tokens/s, Avg generation throughput: {rng.uniform(20, 1500):.1f} tokens/s, "
            f"Running: {running} reqs, Waiting: {rng.choice((0, 0, 0, 1, 3))} reqs, GPU KV cache usage: "
            f"{rng.uniform(0, 60):.1f}%, Prefix cache hit rate: {rng.uniform(5, 80):.1f}%")
    if rng.random() < 0.002:
        # a client-side batch job printing its tqdm bar into the same stream, carriage returns and all
        total = rng.choice((100, 250, 500))
        steps = [0] + sorted(rng.sample(range(1, total), 6)) + [total]
        lines.append("\r".join(f"Processed prompts: {100 * s // total:3d}%|{'█' * (10 * s // total):<10}| "
                               f"{s}/{total} [00:{min(59, s // 9):02d}<00:{min(59, (total - s) // 9):02d}, "
                               f"{rng.uniform(5, 12):.2f}it/s, est. speed input: {rng.uniform(500, 2000):.2f} toks/s]"
                               for s in steps))
    if rng.random() < 0.001:
        lines.append(f"{API}WARNING {clock.now()} [protocol.py:81] The following fields were present in the "
                     f"request but ignored: {{'stream_options'}}")
    clock.step(rng.uniform(0.5, 1.0))
    return "\n".join(lines) + "\n"


def crash_tail(clock: Clock, rng: random.Random) -> list[str]:
    """The restart loop brings vLLM up again with a longer context, and the KV check refuses it."""
    max_len = 131072  # someone raised --max-model-len to the model's full context
    avail = available_kv()
    needed = max_len * PER_TOKEN
    estimate = int(avail // (16 * PER_TOKEN)) * 16
    out = [f"{API}INFO:     Shutting down", f"{API}INFO:     Waiting for application shutdown.",
           f"{API}INFO:     Application shutdown complete.",
           f"{API}INFO:     Finished server process [1]",
           f"+ vllm serve {MODEL} --host 0.0.0.0 --max-model-len {max_len} --enable-prefix-caching"]
    clock.step(3.0)
    out += startup(clock, max_len, rng)
    msg = (f"ValueError: To serve at least one request with the models's max seq len ({max_len}), "
           f"({needed / GIB:.2f} GiB KV cache is needed, which is larger than the available KV cache memory "
           f"({avail / GIB:.2f} GiB). Based on the available memory, the estimated maximum model length is "
           f"{estimate}. Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing "
           f"the engine.")
    frames = [
        ("vllm/v1/engine/core.py", 687, "run_engine_core", "engine_core = EngineCoreProc(*args, **kwargs)"),
        ("vllm/v1/engine/core.py", 488, "__init__", "super().__init__(vllm_config, executor_class, log_stats,"),
        ("vllm/v1/engine/core.py", 86, "__init__", "self._initialize_kv_caches(vllm_config)"),
        ("vllm/v1/engine/core.py", 170, "_initialize_kv_caches", "get_kv_cache_config(vllm_config, kv_cache_spec_one_worker,"),
        ("vllm/v1/core/kv_cache_utils.py", 1095, "get_kv_cache_config", "check_enough_kv_cache_memory(vllm_config, kv_cache_spec, available_memory)"),
        ("vllm/v1/core/kv_cache_utils.py", 700, "check_enough_kv_cache_memory", "raise ValueError("),
    ]
    tb = ["Traceback (most recent call last):"]
    for path, line, func, code in frames:
        tb += [f'  File "{SITE}/{path}", line {line}, in {func}', f"    {code}"]
    tb.append(msg)
    ts = clock.step(0.4)
    out.append(f"{CORE}ERROR {ts} [core.py:700] EngineCore failed to start.")
    out += [f"{CORE}ERROR {ts} [core.py:700] {t}" for t in tb]
    out.append(f"{CORE}Process EngineCore_0:")
    out += [f"{CORE}{t}" for t in tb]
    out += [
        "Traceback (most recent call last):",
        '  File "/usr/local/bin/vllm", line 10, in <module>',
        "    sys.exit(main())",
        f'  File "{SITE}/vllm/entrypoints/cli/main.py", line 54, in main',
        "    args.dispatch_function(args)",
        f'  File "{SITE}/vllm/v1/engine/utils.py", line 782, in wait_for_engine_startup',
        '    raise RuntimeError("Engine core initialization failed. "',
        "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
    ]
    return out


def write_log(path: Path, size_mb: float = 100, seed: int = 0) -> int:
    """Write the log; returns the number of bytes written."""
    rng = random.Random(seed)
    clock = Clock(datetime(2025, 8, 21, 9, 14, 2))
    target = int(size_mb * 2 ** 20)
    first_len = 16384
    state = {"since_metrics": 0}
    written = 0
    with path.open("w", encoding="utf-8", newline="\n", buffering=1 << 20) as fh:
        head = "\n".join(startup(clock, first_len, rng) + serving_ready(clock, first_len)) + "\n"
        fh.write(head)
        written += len(head.encode())
        tail_budget = 24 * 1024  # room left for the crash tail
        buf: list[str] = []
        buf_len = 0
        while written + buf_len < target - tail_budget:
            chunk = runtime_chunk(clock, rng, state)
            buf.append(chunk)
            buf_len += len(chunk.encode())
            if buf_len >= 1 << 20:
                fh.write("".join(buf))
                written += buf_len
                buf, buf_len = [], 0
        fh.write("".join(buf))
        written += buf_len
        tail = "\n".join(crash_tail(clock, rng)) + "\n"
        fh.write(tail)
        written += len(tail.encode())
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("path", type=Path, help="where to write the log")
    parser.add_argument("--size-mb", type=float, default=100, help="approximate size in MiB (default 100)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (same seed, same file)")
    args = parser.parse_args()
    args.path.parent.mkdir(parents=True, exist_ok=True)
    n = write_log(args.path, args.size_mb, args.seed)
    print(f"wrote {n / 2 ** 20:.1f} MiB to {args.path}")


if __name__ == "__main__":
    main()
