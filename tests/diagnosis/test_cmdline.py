"""bot/cmdline.py: read and rewrite a vLLM container's command line in every manifest shape.

Shapes: `command: [vllm, serve]` + args, `command: [vllm, serve, MODEL, ...]` + args, image
entrypoint with `args` only (`--model` or a positional model), one `/bin/sh -c` string (in command or
as the first arg, with the rest of the script around it), `python3 -m
vllm.entrypoints.openai.api_server`, `--flag=value`, `--flag_with_underscores`, duplicates (last wins).
"""

from __future__ import annotations

import shlex

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bot.diagnosis.cmdline import apply_flag_changes, canonical, is_boolean, parse
from bot.diagnosis.models import Change

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def flag(name: str, before: str | None = None, after: str | None = None) -> Change:
    return Change(kind="flag", name=name, before=before, after=after)


def reparse(parsed, changes):
    command, args = apply_flag_changes(parsed, changes)
    return command, args, parse(command, args)


# ---------------------------------------------------------------- reading each shape

def test_vllm_serve_in_command_with_args():
    p = parse(["vllm", "serve"], [MODEL, "--max-model-len", "32768", "--gpu-memory-utilization", "0.9"])
    assert p.entrypoint == "vllm serve"
    assert p.model == MODEL
    assert p.get("--max-model-len") == "32768"
    assert p.get("--gpu-memory-utilization") == "0.9"
    assert p.get("--tensor-parallel-size") is None
    assert [f.name for f in p.flags] == ["--max-model-len", "--gpu-memory-utilization"]


def test_vllm_serve_with_model_and_flags_in_command_and_more_in_args():
    p = parse(["vllm", "serve", MODEL, "--max-model-len", "8192"], ["--enable-prefix-caching", "--max-num-seqs", "64"])
    assert p.entrypoint == "vllm serve"
    assert p.model == MODEL
    assert p.get("--max-model-len") == "8192"
    assert p.get("--max-num-seqs") == "64"
    assert p.get("--enable-prefix-caching") == "true"


def test_full_path_to_vllm_binary():
    p = parse(["/opt/venv/bin/vllm", "serve", MODEL, "--port", "8000"], None)
    assert p.entrypoint == "vllm serve" and p.model == MODEL and p.get("--port") == "8000"


def test_args_only_with_model_flag():
    p = parse(None, ["--model", MODEL, "--max-model-len", "4096"])
    assert p.entrypoint == "image entrypoint"
    assert p.model == MODEL
    assert p.get("--model") == MODEL
    assert p.get("--max-model-len") == "4096"


def test_args_only_with_positional_model():
    p = parse(None, [MODEL, "--gpu-memory-utilization", "0.85"])
    assert p.entrypoint == "image entrypoint"
    assert p.model == MODEL
    assert p.get("--gpu-memory-utilization") == "0.85"


def test_python_module_api_server():
    p = parse(["python3", "-m", "vllm.entrypoints.openai.api_server"],
              ["--model", MODEL, "--tensor-parallel-size", "2"])
    assert p.entrypoint == "api_server"
    assert p.model == MODEL
    assert p.get("--tensor-parallel-size") == "2"


def test_python_module_api_server_with_interpreter_options():
    p = parse(["/usr/bin/python3", "-u", "-m", "vllm.entrypoints.openai.api_server", "--model", MODEL], None)
    assert p.entrypoint == "api_server"
    assert p.model == MODEL


def test_api_server_ignores_a_positional_model():
    # vLLM >= 0.10 silently ignores a positional model on the api_server module: it is not "the model".
    p = parse(["python3", "-m", "vllm.entrypoints.openai.api_server"], [MODEL, "--max-model-len", "2048"])
    assert p.model is None
    assert p.get("--max-model-len") == "2048"


def test_equals_form():
    p = parse(["vllm", "serve", MODEL], ["--max-model-len=16384", "--gpu-memory-utilization=0.95"])
    assert p.get("--max-model-len") == "16384"
    assert p.get("--gpu-memory-utilization") == "0.95"


def test_underscore_flags_read_by_dash_name():
    p = parse(None, ["--model", MODEL, "--max_model_len", "8192", "--gpu_memory_utilization=0.8"])
    assert p.get("--max-model-len") == "8192"
    assert p.get("--gpu-memory-utilization") == "0.8"
    assert p.get("--max_model_len") == "8192"  # asking in underscore form works too


def test_dotted_subkeys_keep_their_underscores():
    assert canonical("--max_num_seqs") == "--max-num-seqs"
    assert canonical("--compilation-config.cudagraph_capture_sizes") == "--compilation-config.cudagraph_capture_sizes"
    assert canonical("--compilation_config.cudagraph_mode") == "--compilation-config.cudagraph_mode"


def test_duplicates_last_wins_across_forms_and_lists():
    p = parse(["vllm", "serve", MODEL, "--gpu_memory_utilization", "0.9"],
              ["--max-model-len", "8192", "--gpu-memory-utilization=0.95", "--max_model_len", "4096"])
    assert p.get("--gpu-memory-utilization") == "0.95"
    assert p.get("--max-model-len") == "4096"


def test_boolean_flags_do_not_eat_the_next_word():
    p = parse(["vllm", "serve"], ["--enforce-eager", MODEL, "--trust-remote-code", "--max-model-len", "1024"])
    assert p.model == MODEL
    assert p.get("--enforce-eager") == "true"
    assert p.get("--trust-remote-code") == "true"
    assert p.get("--max-model-len") == "1024"
    assert is_boolean("--enforce_eager") and is_boolean("--no-enable-prefix-caching")


def test_negated_boolean_reads_false_and_last_wins():
    p = parse(["vllm", "serve", MODEL], ["--enable-prefix-caching", "--no-enable-prefix-caching"])
    assert p.get("--enable-prefix-caching") == "false"
    p = parse(["vllm", "serve", MODEL], ["--no-enable-prefix-caching", "--enable-prefix-caching"])
    assert p.get("--enable-prefix-caching") == "true"


def test_negative_number_is_a_value():
    p = parse(["vllm", "serve", MODEL], ["--max-model-len", "-1", "--max-num-seqs", "8"])
    assert p.get("--max-model-len") == "-1"
    assert p.get("--max-num-seqs") == "8"


def test_short_aliases():
    p = parse(["vllm", "serve", MODEL], ["-tp", "4", "-q", "fp8"])
    assert p.get("--tensor-parallel-size") == "4"
    assert p.get("--quantization") == "fp8"


def test_shell_string_in_args():
    script = f"vllm serve {MODEL} --max-model-len 8192 --gpu-memory-utilization=0.9 --enforce-eager"
    p = parse(["/bin/sh", "-c"], [script])
    assert p.shell == ("args", 0)
    assert p.entrypoint == "vllm serve" and p.model == MODEL
    assert p.get("--max-model-len") == "8192"
    assert p.get("--gpu-memory-utilization") == "0.9"
    assert p.get("--enforce-eager") == "true"


def test_shell_string_in_command():
    script = f"exec vllm serve {MODEL} --max_num_seqs 128"
    p = parse(["bash", "-c", script], None)
    assert p.shell == ("command", 2)
    assert p.model == MODEL
    assert p.get("--max-num-seqs") == "128"


def test_shell_script_with_other_commands_around_vllm():
    script = (f"pip install -q some-plugin && vllm serve {MODEL} --max-model-len 4096 --port 8000 "
              f"&& echo done --max-model-len 1")
    p = parse(["/bin/sh", "-c"], [script])
    assert p.model == MODEL
    assert p.get("--max-model-len") == "4096"  # flags of `echo` after && are not vLLM's
    assert p.get("--port") == "8000"


def test_shell_multiline_script_with_continuations_and_quotes():
    script = ("set -e\n"
              "export HF_HOME=/data/hf\n"
              f"exec vllm serve {MODEL} \\\n"
              "  --served-model-name 'my model' \\\n"
              "  --max-model-len \"16384\" \\\n"
              "  --gpu-memory-utilization 0.92\n")
    p = parse(["/bin/bash", "-lc"], [script])
    assert p.model == MODEL
    assert p.get("--served-model-name") == "my model"
    assert p.get("--max-model-len") == "16384"
    assert p.get("--gpu-memory-utilization") == "0.92"


def test_shell_running_python_module():
    script = f"python3 -m vllm.entrypoints.openai.api_server --model {MODEL} --tensor-parallel-size=4"
    p = parse(["/bin/sh", "-c", script], None)
    assert p.entrypoint == "api_server"
    assert p.model == MODEL
    assert p.get("--tensor-parallel-size") == "4"


def test_not_vllm():
    p = parse(["python3", "server.py"], ["--port", "8000"])
    assert p.found_vllm is False
    assert p.entrypoint == "unknown"
    assert p.model is None


# ---------------------------------------------------------------- rewriting each shape

def test_edit_keeps_space_form():
    p = parse(["vllm", "serve"], [MODEL, "--max-model-len", "32768", "--gpu-memory-utilization", "0.9"])
    command, args = apply_flag_changes(p, [flag("--max-model-len", "32768", "16384")])
    assert command == ["vllm", "serve"]
    assert args == [MODEL, "--max-model-len", "16384", "--gpu-memory-utilization", "0.9"]


def test_edit_keeps_equals_form_and_underscores():
    p = parse(None, ["--model", MODEL, "--max_model_len=32768", "--gpu_memory_utilization", "0.9"])
    command, args = apply_flag_changes(p, [flag("--max-model-len", after="8192"),
                                           flag("--gpu-memory-utilization", after="0.95")])
    assert command is None
    assert args == ["--model", MODEL, "--max_model_len=8192", "--gpu_memory_utilization", "0.95"]


def test_edit_in_command_list_stays_in_command():
    p = parse(["vllm", "serve", MODEL, "--max-model-len", "8192"], ["--enable-prefix-caching"])
    command, args = apply_flag_changes(p, [flag("--max-model-len", after="4096")])
    assert command == ["vllm", "serve", MODEL, "--max-model-len", "4096"]
    assert args == ["--enable-prefix-caching"]


def test_edit_short_alias_value():
    p = parse(["vllm", "serve", MODEL], ["-tp", "4"])
    command, args = apply_flag_changes(p, [flag("--tensor-parallel-size", after="2")])
    assert args == ["-tp", "2"]


def test_duplicates_collapse_to_the_last_occurrence():
    p = parse(["vllm", "serve", MODEL, "--gpu_memory_utilization", "0.9"],
              ["--max-model-len", "8192", "--gpu-memory-utilization=0.95", "--port", "8000"])
    command, args = apply_flag_changes(p, [flag("--gpu-memory-utilization", "0.95", "0.85")])
    assert command == ["vllm", "serve", MODEL]
    assert args == ["--max-model-len", "8192", "--gpu-memory-utilization=0.85", "--port", "8000"]
    assert parse(command, args).get("--gpu-memory-utilization") == "0.85"


def test_boolean_added_once_after_true():
    p = parse(["vllm", "serve", MODEL], ["--max-model-len", "8192"])
    command, args = apply_flag_changes(p, [flag("--enforce-eager", None, "true")])
    assert args == ["--max-model-len", "8192", "--enforce-eager"]
    assert command == ["vllm", "serve", MODEL]
    # applying it again to the result does not add a second one
    command2, args2 = apply_flag_changes(parse(command, args), [flag("--enforce-eager", "true", "true")])
    assert args2.count("--enforce-eager") == 1


def test_boolean_true_replaces_a_negated_duplicate_set():
    p = parse(["vllm", "serve", MODEL], ["--no-enforce-eager", "--enforce-eager", "--no-enforce-eager"])
    command, args = apply_flag_changes(p, [flag("--enforce-eager", "false", "true")])
    assert args == ["--enforce-eager"]


def test_removing_a_flag_removes_its_value():
    p = parse(["vllm", "serve", MODEL], ["--swap-space", "16", "--max-model-len", "8192"])
    command, args = apply_flag_changes(p, [flag("--swap-space", "16", None)])
    assert args == ["--max-model-len", "8192"]
    p = parse(None, ["--model", MODEL, "--cpu_offload_gb=24", "--enforce-eager"])
    command, args = apply_flag_changes(p, [flag("--cpu-offload-gb", "24", None)])
    assert args == ["--model", MODEL, "--enforce-eager"]


def test_removing_an_absent_flag_changes_nothing():
    p = parse(["vllm", "serve", MODEL], ["--max-model-len", "8192"])
    assert apply_flag_changes(p, [flag("--swap-space", None, None)]) == (["vllm", "serve", MODEL], ["--max-model-len", "8192"])


def test_added_flag_goes_to_args_when_args_exist():
    p = parse(["vllm", "serve", MODEL, "--max-model-len", "8192"], [])
    command, args = apply_flag_changes(p, [flag("--max-num-seqs", None, "64")])
    assert command == ["vllm", "serve", MODEL, "--max-model-len", "8192"]
    assert args == ["--max-num-seqs", "64"]


def test_added_flag_goes_to_command_when_there_are_no_args():
    p = parse(["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", MODEL], None)
    command, args = apply_flag_changes(p, [flag("--tensor-parallel-size", None, "2")])
    assert args is None
    assert command[-2:] == ["--tensor-parallel-size", "2"]


def test_added_flag_in_args_only_manifest():
    p = parse(None, ["--model", MODEL])
    command, args = apply_flag_changes(p, [flag("--kv-cache-dtype", None, "fp8")])
    assert command is None
    assert args == ["--model", MODEL, "--kv-cache-dtype", "fp8"]


def test_non_flag_changes_are_ignored():
    p = parse(["vllm", "serve", MODEL], ["--max-model-len", "8192"])
    out = apply_flag_changes(p, [Change(kind="env", name="PYTORCH_CUDA_ALLOC_CONF", after="expandable_segments:True"),
                                 Change(kind="volume", name="/dev/shm", after="8Gi")])
    assert out == (["vllm", "serve", MODEL], ["--max-model-len", "8192"])


def test_apply_does_not_mutate_the_manifest_lists():
    command, args = ["vllm", "serve", MODEL], ["--max-model-len", "8192"]
    p = parse(command, args)
    apply_flag_changes(p, [flag("--max-model-len", after="4096"), flag("--enforce-eager", after="true")])
    assert command == ["vllm", "serve", MODEL] and args == ["--max-model-len", "8192"]


# ---------------------------------------------------------------- rewriting shell strings

def test_shell_edit_keeps_one_string_and_the_rest_of_the_script():
    script = f"vllm serve {MODEL} --max-model-len 32768 --gpu-memory-utilization=0.9 && echo done"
    p = parse(["/bin/sh", "-c"], [script])
    command, args = apply_flag_changes(p, [flag("--max-model-len", "32768", "16384"),
                                           flag("--gpu-memory-utilization", "0.9", "0.95")])
    assert command == ["/bin/sh", "-c"]
    assert args == [f"vllm serve {MODEL} --max-model-len 16384 --gpu-memory-utilization=0.95 && echo done"]


def test_shell_exec_prefix_and_setup_lines_survive():
    script = "set -e\nexport HF_HOME=/data\nexec vllm serve " + MODEL + " --max_num_seqs 256 --port 8000\n"
    p = parse(["/bin/bash", "-c", script], None)
    command, args = apply_flag_changes(p, [flag("--max-num-seqs", "256", "128")])
    assert args is None
    assert command == ["/bin/bash", "-c", "set -e\nexport HF_HOME=/data\nexec vllm serve " + MODEL
                       + " --max_num_seqs 128 --port 8000\n"]


def test_shell_add_boolean_goes_before_the_rest_of_the_script():
    script = f"vllm serve {MODEL} --max-model-len 8192 && echo done"
    p = parse(["/bin/sh", "-c"], [script])
    command, args = apply_flag_changes(p, [flag("--enforce-eager", None, "true")])
    assert args == [f"vllm serve {MODEL} --max-model-len 8192 --enforce-eager && echo done"]
    again = apply_flag_changes(parse(command, args), [flag("--enforce-eager", "true", "true")])
    assert again[1][0].count("--enforce-eager") == 1


def test_shell_remove_flag_and_value_without_double_spaces():
    script = f"vllm serve {MODEL} --swap-space 16 --max-model-len 8192"
    p = parse(["sh", "-c"], [script])
    command, args = apply_flag_changes(p, [flag("--swap-space", "16", None)])
    assert args == [f"vllm serve {MODEL} --max-model-len 8192"]


def test_shell_duplicates_collapse():
    script = f"vllm serve {MODEL} --max-model-len 8192 --port 8000 --max_model_len=16384"
    p = parse(["/bin/sh", "-c"], [script])
    assert p.get("--max-model-len") == "16384"
    command, args = apply_flag_changes(p, [flag("--max-model-len", "16384", "12288")])
    assert args == [f"vllm serve {MODEL} --port 8000 --max_model_len=12288"]


def test_shell_multiline_edit_keeps_layout():
    script = ("exec vllm serve " + MODEL + " \\\n"
              "  --max-model-len 32768 \\\n"
              "  --gpu-memory-utilization 0.90\n")
    p = parse(["/bin/sh", "-c"], [script])
    command, args = apply_flag_changes(p, [flag("--max-model-len", after="16384")])
    assert args == [script.replace("32768", "16384")]


def test_shell_value_with_space_is_quoted():
    script = f"vllm serve {MODEL} --served-model-name old"
    p = parse(["/bin/sh", "-c"], [script])
    command, args = apply_flag_changes(p, [flag("--served-model-name", after="new name")])
    assert parse(command, args).get("--served-model-name") == "new name"
    assert args == [f"vllm serve {MODEL} --served-model-name 'new name'"]


def test_shell_edited_value_with_quotes_survives_the_shell():
    script = f"vllm serve {MODEL} --compilation-config '{{\"level\":3}}'"
    p = parse(["/bin/sh", "-c"], [script])
    assert p.get("--compilation-config") == '{"level":3}'
    command, args = apply_flag_changes(p, [flag("--compilation-config", after='{"cudagraph_mode":"PIECEWISE"}')])
    assert parse(command, args).get("--compilation-config") == '{"cudagraph_mode":"PIECEWISE"}'
    assert shlex.split(args[0])[-1] == '{"cudagraph_mode":"PIECEWISE"}'


def test_shell_edited_equals_value_with_space_is_quoted():
    script = f"vllm serve {MODEL} --served-model-name=old --port 8000"
    p = parse(["/bin/sh", "-c"], [script])
    command, args = apply_flag_changes(p, [flag("--served-model-name", after="new name")])
    assert shlex.split(args[0]) == ["vllm", "serve", MODEL, "--served-model-name=new name", "--port", "8000"]


def test_shell_add_flag_before_a_stderr_redirect_and_pipe():
    script = f"vllm serve {MODEL} --max-model-len 8192 2>&1 | tee /tmp/vllm.log"
    p = parse(["/bin/sh", "-c"], [script])
    command, args = apply_flag_changes(p, [flag("--enforce-eager", None, "true")])
    assert args == [f"vllm serve {MODEL} --max-model-len 8192 --enforce-eager 2>&1 | tee /tmp/vllm.log"]


def test_shell_comment_line_after_vllm_is_not_part_of_the_command():
    script = f"vllm serve {MODEL} --max-model-len 8192\n# --max-model-len 4096 was too small\n"
    p = parse(["/bin/sh", "-c"], [script])
    assert p.get("--max-model-len") == "8192"
    command, args = apply_flag_changes(p, [flag("--enforce-eager", None, "true")])
    assert args[0].splitlines()[0] == f"vllm serve {MODEL} --max-model-len 8192 --enforce-eager"


def test_shell_escaped_quote_inside_double_quotes():
    script = f'vllm serve {MODEL} --served-model-name "say \\"hi\\"" --port 8000'
    assert shlex.split(script)[4] == 'say "hi"'
    p = parse(["/bin/sh", "-c"], [script])
    assert p.get("--served-model-name") == 'say "hi"'
    assert p.get("--port") == "8000"


def test_short_alias_with_equals():
    p = parse(["vllm", "serve", MODEL], ["-tp=4"])
    assert p.get("--tensor-parallel-size") == "4"
    command, args = apply_flag_changes(p, [flag("--tensor-parallel-size", "4", "2")])
    assert args == ["-tp=2"]


def test_unlisted_boolean_flag_before_the_model():
    p = parse(["vllm", "serve"], ["--enable-request-id-headers", MODEL, "--port", "8000"])
    assert p.model == MODEL


def test_shell_appended_value_with_quotes_survives_the_shell():
    script = f"vllm serve {MODEL}"
    p = parse(["/bin/sh", "-c"], [script])
    command, args = apply_flag_changes(p, [flag("--compilation-config", after='{"cudagraph_mode":"PIECEWISE"}')])
    assert shlex.split(args[0])[-1] == '{"cudagraph_mode":"PIECEWISE"}'
    assert parse(command, args).get("--compilation-config") == '{"cudagraph_mode":"PIECEWISE"}'


# ---------------------------------------------------------------- property tests

VALUE_FLAGS = ["--max-model-len", "--gpu-memory-utilization", "--max-num-seqs", "--max-num-batched-tokens",
               "--tensor-parallel-size", "--kv-cache-dtype", "--swap-space", "--cpu-offload-gb", "--dtype",
               "--quantization", "--served-model-name", "--block-size", "--port"]
BOOL_FLAGS = ["--enforce-eager", "--trust-remote-code", "--enable-prefix-caching", "--disable-log-requests"]
MODELS = [MODEL, "Qwen/Qwen2.5-7B-Instruct", "/models/served-model", "mistralai/Mistral-7B-Instruct-v0.3"]

values = st.one_of(
    st.integers(min_value=1, max_value=10 ** 6).map(str),
    st.floats(min_value=0.05, max_value=1.0, allow_nan=False).map(lambda f: f"{f:.2f}"),
    st.sampled_from(["auto", "fp8", "bfloat16", "awq", "my-model", "0", "-1"]),
)


@st.composite
def occurrences(draw):
    """A list of (flag, value, spelling) written in order; value None = a boolean flag."""
    n = draw(st.integers(min_value=0, max_value=8))
    out = []
    for _ in range(n):
        if draw(st.booleans()) or not BOOL_FLAGS:
            name = draw(st.sampled_from(VALUE_FLAGS))
            value = draw(values)
        else:
            name = draw(st.sampled_from(BOOL_FLAGS))
            value = None
        underscores = draw(st.booleans())
        equals = draw(st.booleans()) and value is not None
        out.append((name, value, underscores, equals))
    return out


def groups_for(occ) -> list[list[str]]:
    """The words of each occurrence, kept together so a shape never splits a flag from its value."""
    groups: list[list[str]] = []
    for name, value, underscores, equals in occ:
        spelled = "--" + name[2:].replace("-", "_") if underscores else name
        if value is None:
            groups.append([spelled])
        elif equals:
            groups.append([f"{spelled}={value}"])
        else:
            groups.append([spelled, value])
    return groups


def words_for(occ) -> list[str]:
    return [w for g in groups_for(occ) for w in g]


SHAPES = ["serve-command+args", "serve-model-in-command", "args-only-model-flag", "args-only-positional",
          "api-server", "sh-c-args", "sh-c-command", "sh-c-exec-and-more"]


def render(shape: str, model: str, groups: list[list[str]], split: int) -> tuple[list[str] | None, list[str] | None]:
    """The same invocation in one of the manifest shapes; split = how many flag groups go first."""
    words = [w for g in groups for w in g]
    head = [w for g in groups[:split] for w in g]
    tail = [w for g in groups[split:] for w in g]
    if shape == "serve-command+args":
        return ["vllm", "serve"], [model] + words
    if shape == "serve-model-in-command":
        return ["vllm", "serve", model] + head, tail
    if shape == "args-only-model-flag":
        return None, head + ["--model", model] + tail
    if shape == "args-only-positional":
        return None, [model] + words
    if shape == "api-server":
        return ["python3", "-m", "vllm.entrypoints.openai.api_server"], ["--model", model] + words
    script = " ".join(shlex.quote(w) for w in ["vllm", "serve", model] + words)
    if shape == "sh-c-args":
        return ["/bin/sh", "-c"], [script]
    if shape == "sh-c-command":
        return ["/bin/sh", "-c", script], None
    return ["/bin/bash", "-c"], ["set -e; exec " + script + " && echo done"]


def expected_values(occ) -> dict[str, str]:
    last: dict[str, str] = {}
    for name, value, _u, _e in occ:
        last[name] = "true" if value is None else value
    return last


PROPERTY = settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(occ=occurrences(), shape=st.sampled_from(SHAPES), model=st.sampled_from(MODELS),
       split=st.integers(min_value=0, max_value=20))
def test_property_parse_reads_the_last_value_written(occ, shape, model, split):
    command, args = render(shape, model, groups_for(occ), split)
    p = parse(command, args)
    assert p.found_vllm
    assert p.model == model
    want = expected_values(occ)
    for name in VALUE_FLAGS + BOOL_FLAGS:
        assert p.get(name) == want.get(name), (name, command, args)


@PROPERTY
@given(occ=occurrences(), shape=st.sampled_from(SHAPES), model=st.sampled_from(MODELS),
       split=st.integers(min_value=0, max_value=20), target=st.sampled_from(VALUE_FLAGS + BOOL_FLAGS),
       new=values, remove=st.booleans())
def test_property_apply_then_parse_reads_the_new_value_and_nothing_else_moves(occ, shape, model, split, target,
                                                                            new, remove):
    command, args = render(shape, model, groups_for(occ), split)
    p = parse(command, args)
    before = expected_values(occ)
    if target in BOOL_FLAGS:
        after = None if remove else "true"
    else:
        after = None if remove else new
    new_command, new_args, q = reparse(p, [flag(target, before.get(target), after)])
    assert q.model == model
    assert q.get(target) == after
    for name in VALUE_FLAGS + BOOL_FLAGS:
        if name != target:
            assert q.get(name) == before.get(name), (name, new_command, new_args)
    # the edited flag appears at most once, and the manifest keeps its shape
    assert sum(1 for f in q.flags if f.name == target) <= 1
    if p.shell:
        assert q.shell == p.shell
        where, idx = p.shell
        assert len((new_command if where == "command" else new_args) or []) == len((command if where == "command" else args) or [])
    if shape == "sh-c-exec-and-more":
        assert new_args[0].startswith("set -e; exec vllm serve ") and new_args[0].endswith(" && echo done")
    assert (new_command is None) == (command is None)
    assert (new_args is None) == (args is None)


@PROPERTY
@given(occ=occurrences(), shape=st.sampled_from(SHAPES), model=st.sampled_from(MODELS),
       split=st.integers(min_value=0, max_value=20))
def test_property_untouched_spelling_is_preserved(occ, shape, model, split):
    """An edit rewrites only the edited flag: with no change at all the manifest comes back identical."""
    command, args = render(shape, model, groups_for(occ), split)
    assert apply_flag_changes(parse(command, args), []) == (command, args)


@PROPERTY
@given(occ=occurrences(), model=st.sampled_from(MODELS), target=st.sampled_from(VALUE_FLAGS), old=values, new=values,
       underscores=st.booleans(), equals=st.booleans(), where=st.integers(min_value=0, max_value=8))
def test_property_edit_keeps_the_form_of_the_last_occurrence(occ, model, target, old, new, underscores, equals, where):
    occ = list(occ)
    occ.insert(min(where, len(occ)), (target, old, underscores, equals))
    _name, _value, underscores, equals = [o for o in occ if o[0] == target][-1]
    command, args = render("serve-command+args", model, groups_for(occ), 0)
    _c, new_args, q = reparse(parse(command, args), [flag(target, after=new)])
    spelled = "--" + target[2:].replace("-", "_") if underscores else target
    if equals:
        assert f"{spelled}={new}" in new_args
    else:
        i = new_args.index(spelled)
        assert new_args[i + 1] == new
    assert q.get(target) == new


# Flags in the container's environment, expanded by the shell (${NAME}, $NAME) or the kubelet ($(NAME)).

ENV_ARGS = {"VLLM_ARGS": "--model=/models/m --gpu-memory-utilization=0.4 --max-model-len=512 --enforce-eager"}
SCRIPT = "python3 -m vllm.entrypoints.openai.api_server --port=5000 ${VLLM_ARGS}"


def test_flags_in_a_variable_a_shell_script_expands_are_read():
    for reference in ("${VLLM_ARGS}", "$VLLM_ARGS"):
        p = parse(["/bin/sh", "-c"], [SCRIPT.replace("${VLLM_ARGS}", reference)], ENV_ARGS)
        assert (p.get("--gpu-memory-utilization"), p.get("--max-model-len"), p.get("--enforce-eager")) == ("0.4", "512", "true")
        assert p.model == "/models/m" and p.get("--port") == "5000"


def test_without_the_environment_the_variable_reads_as_nothing_known():
    p = parse(["/bin/sh", "-c"], [SCRIPT])
    assert p.get("--gpu-memory-utilization") is None and p.get("--port") == "5000"


def test_a_quoted_reference_stays_one_word_as_the_shell_keeps_it():
    p = parse(["/bin/sh", "-c"], ['python3 -m vllm.entrypoints.openai.api_server "${VLLM_ARGS}"'], ENV_ARGS)
    assert p.get("--gpu-memory-utilization") is None


def test_an_unset_or_empty_variable_is_left_as_written():
    p = parse(["/bin/sh", "-c"], [SCRIPT], {"OTHER": "--max-model-len 1"})
    assert p.get("--max-model-len") is None
    assert parse(["/bin/sh", "-c"], [SCRIPT], {"VLLM_ARGS": ""}).get("--port") == "5000"


def test_a_change_to_a_flag_from_a_variable_goes_last_and_leaves_the_variable_alone():
    p = parse(["/bin/sh", "-c"], [SCRIPT + " && echo done"], ENV_ARGS)
    command, args = apply_flag_changes(p, [Change(kind="flag", name="--gpu-memory-utilization", before="0.4", after="0.6")])
    assert command == ["/bin/sh", "-c"]
    assert args == [SCRIPT + " --gpu-memory-utilization 0.6 && echo done"]
    assert parse(command, args, ENV_ARGS).get("--gpu-memory-utilization") == "0.6"  # last wins, as in argparse


def test_a_written_duplicate_before_the_variable_goes_and_the_new_value_still_wins():
    script = "vllm serve /models/m --max-model-len 4096 ${VLLM_ARGS}"
    p = parse(["/bin/sh", "-c"], [script], ENV_ARGS)
    assert p.get("--max-model-len") == "512"
    _, args = apply_flag_changes(p, [Change(kind="flag", name="--max-model-len", before="512", after="256")])
    assert args == ["vllm serve /models/m ${VLLM_ARGS} --max-model-len 256"]


def test_a_removal_cannot_reach_into_a_variable():
    p = parse(["/bin/sh", "-c"], [SCRIPT], ENV_ARGS)
    assert apply_flag_changes(p, [Change(kind="flag", name="--enforce-eager", before="true", after=None)])[1] == [SCRIPT]


def test_a_kubernetes_variable_reference_is_one_word_in_args():
    p = parse(None, ["--model", "m", "--max-model-len", "$(MAX_LEN)"], {"MAX_LEN": "8192"})
    assert p.get("--max-model-len") == "8192"
    _, args = apply_flag_changes(p, [Change(kind="flag", name="--max-model-len", before="8192", after="4096")])
    assert args == ["--model", "m", "--max-model-len", "4096"]
    assert parse(None, ["--model", "m", "--max-model-len", "${MAX_LEN}"], {"MAX_LEN": "8192"}).get("--max-model-len") == "${MAX_LEN}"
