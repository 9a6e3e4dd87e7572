"""Failures say why in one line (runners.causes): the first real cause of a measurement's
error, found in what vLLM, transformers and the runner print (formats copied from real
runs on this machine: an uncached hub model with HF_HUB_OFFLINE=1, an engine core that
failed to start), and the next step."""

from __future__ import annotations

from pathlib import Path

from runners import causes

VENV = "/opt/venv/lib/python3.11/site-packages"

# The vLLM API server's log for a hub model that is not cached, downloads off (0.32).
SERVER_LOG_UNCACHED = f"""\
$ python -m vllm.entrypoints.openai.api_server --model Qwen/Qwen3-0.6B --port 53151
(APIServer pid=32029) INFO 11-30 13:55:54 [api_utils.py:286] non-default args: {{'port': 53151}}
(APIServer pid=32029) WARNING 11-30 13:55:54 [system_utils.py:255] Found ulimit of 20000 and \
failed to automatically increase with error current limit exceeds maximum limit. This can \
cause fd limit errors like `OSError: [Errno 24] Too many open files`. Consider increasing
Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
  File "{VENV}/vllm/engine/arg_utils.py", line 914, in __post_init__
    self.model = get_model_path(self.model, self.revision)
  File "{VENV}/huggingface_hub/_snapshot_download.py", line 382, in snapshot_download
    raise LocalEntryNotFoundError(
huggingface_hub.errors.LocalEntryNotFoundError: Cannot find an appropriate cached snapshot \
folder for the specified revision on the local disk and outgoing traffic has been disabled. \
To enable repo look-ups and downloads online, pass 'local_files_only=False' as input.
"""

# An engine core that failed: its traceback (the cause) first, then the API server's
# wrapper, which is all a 3-line tail would show.
SERVER_LOG_ENGINE = f"""\
(EngineCore_DP0 pid=41) ERROR 11-30 14:02:11 [core.py:866] EngineCore failed to start.
(EngineCore_DP0 pid=41) ERROR 11-30 14:02:11 [core.py:866] Traceback (most recent call last):
(EngineCore_DP0 pid=41) ERROR 11-30 14:02:11 [core.py:866]   File "{VENV}/vllm/v1/engine/core.py"
(EngineCore_DP0 pid=41) ERROR 11-30 14:02:11 [core.py:866] ValueError: Unsupported CPU attention \
configuration: head_size=16
Process EngineCore_DP0:
Traceback (most recent call last):
ValueError: Unsupported CPU attention configuration: head_size=16
(APIServer pid=1) Traceback (most recent call last):
(APIServer pid=1)   File "{VENV}/vllm/v1/engine/utils.py", line 1, in wait_for_engine_startup
(APIServer pid=1) RuntimeError: Engine core initialization failed. See root cause above. \
Failed core proc(s): {{}}
"""


def server_error(log: Path) -> str:
    """runners/vllm_server.py's message: a sentence, then the last lines of the log."""
    tail = "\n".join(log.read_text().splitlines()[-3:])
    return (
        "the vLLM server exited with code 1 before it was ready. "
        f"Last lines of its log ({log}):\n{tail}"
    )


def test_the_first_exception_of_the_whole_log_is_the_cause(tmp_path: Path) -> None:
    log = tmp_path / "server-vllm.log"
    log.write_text(SERVER_LOG_ENGINE)
    error = server_error(log)
    assert "RuntimeError: Engine core initialization failed" in error  # all the tail has
    cause = causes.first_cause(error, logs=True)
    assert cause == (
        "the vLLM server exited with code 1 before it was ready: ValueError: Unsupported CPU "
        "attention configuration: head_size=16"
    )
    assert causes.advice(error, logs=True).startswith("vLLM's CPU attention does not support")
    # Without the log (the portal never opens a path a runner reported): from the text alone,
    # the wrapper is all there is.
    assert "Engine core initialization failed" in causes.first_cause(error)
    assert causes.advice(error) is None


def test_warnings_mentioning_an_error_are_not_the_cause(tmp_path: Path) -> None:
    log = tmp_path / "server-vllm.log"
    log.write_text(SERVER_LOG_UNCACHED)
    cause = causes.first_cause(server_error(log), logs=True)
    assert "LocalEntryNotFoundError: Cannot find an appropriate cached snapshot" in cause
    assert "Errno 24" not in cause and "\n" not in cause


def test_a_sentence_that_names_its_exception_is_kept_as_it_is() -> None:
    hf = (
        "the HF baseline failed: OSError: We couldn't connect to 'https://huggingface.co' to "
        "load the files, and couldn't find them in the cached files.\nCheck your internet "
        "connection or see how to run the library in offline mode."
    )
    assert causes.first_cause(hf) == hf.splitlines()[0]
    assert "not in its Hugging Face cache" in causes.advice(hf)
    assert causes.first_cause("") == "no reason given"
    long = "x" * 2000
    assert len(causes.first_cause(long)) == causes.MAX_LINE


def test_explain_puts_the_cause_first_and_keeps_the_rest(tmp_path: Path) -> None:
    log = tmp_path / "server-vllm.log"
    log.write_text(SERVER_LOG_ENGINE)
    error = server_error(log)
    explained = causes.explain(error)
    first, rest = explained.split("\n", 1)
    assert first.endswith("ValueError: Unsupported CPU attention configuration: head_size=16")
    assert rest == error.strip()
    # Read later without the log (the portal, a partial run): the cause is still there.
    assert causes.first_cause(explained) == first
    assert causes.explain("4 of 4 requests failed; errors: Bad Request") == (
        "4 of 4 requests failed; errors: Bad Request"
    )


def test_the_headline_names_the_first_cause_the_next_step_and_the_count(tmp_path: Path) -> None:
    log = tmp_path / "server-vllm.log"
    log.write_text(SERVER_LOG_UNCACHED)
    hf = "the HF baseline failed: OSError: We couldn't connect to 'https://huggingface.co'"
    failures = [
        ("hf-sequential baseline", hf),
        ("vllm concurrency:max_concurrency=1", server_error(log)),
        ("vllm concurrency:max_concurrency=4", server_error(log)),
    ]
    text = causes.headline(failures, 3, model="Qwen/Qwen3-0.6B", logs=True)
    first, second, *items = text.splitlines()
    assert first.startswith("hf-sequential baseline: the HF baseline failed: OSError:")
    assert "Next: " in first and "huggingface-cli download Qwen/Qwen3-0.6B" in first
    assert "every measurement failed; see the errors" not in text
    assert second == "All 3 measurements failed, all for this reason."
    assert len(items) == 3 and "LocalEntryNotFoundError" in items[1]

    partial = causes.headline([("vllm c=4 (repeat 0)", "OOM")], 3, kept=2)
    assert partial.splitlines()[:2] == [
        "vllm c=4 (repeat 0): OOM",
        "1 of 3 measurements failed; the 2 that succeeded are kept. Fix what failed and "
        "submit again.",
    ]
    # Some never ran (a runner that stopped early): counted against the spec's total.
    assert (
        causes.headline([("a", "OOM")], 3).splitlines()[1].startswith("1 of 3 measurements failed.")
    )
    mixed = causes.headline([("a", "OOM"), ("b", "ValueError: bad")], 2)
    assert "2 different causes, listed below" in mixed


# The vLLM server's log for a local model directory that does not exist: its arguments
# (max_model_len among them) are printed before the error.
SERVER_LOG_NO_DIR = """\
(APIServer pid=7) INFO 11-30 13:55:54 [api_utils.py:286] non-default args: {'model': \
'/models/gone', 'max_model_len': 512, 'port': 53151}
Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
OSError: Repo id must be in the form 'repo_name' or 'namespace/repo_name': '/models/gone'. \
Use `repo_type` argument if needed.
"""


def test_a_missing_model_directory_is_named_not_a_context_too_long(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text(SERVER_LOG_NO_DIR)
    error = (
        f"vLLM server exited with code 1 before it was ready. Last lines of its log ({log}):\n"
        + SERVER_LOG_NO_DIR[-200:]
    )
    reason = causes.headline([("vllm", error)], 1, logs=True)
    assert "Next: the model's path does not exist" in reason
    assert "context" not in reason
    # A real context overflow still says so.
    too_long = "ValueError: This model's maximum context length is 512 tokens."
    assert "exceed the model's context" in (causes.advice(too_long) or "")


def test_an_empty_log_is_said_to_be_empty(tmp_path: Path) -> None:
    from runners import procs

    empty = tmp_path / "hf.log"
    empty.write_text("")
    section = procs.log_section(empty, procs.tail(empty))
    assert section == f"Its log ({empty}) is empty: it failed before writing anything."
    assert procs.log_section(tmp_path / "absent.log", procs.tail(tmp_path / "absent.log"))
    assert procs.log_section(None, "") == "It left no log."


def test_a_log_without_an_exception_never_leaves_an_empty_heading() -> None:
    text = (
        "the HF baseline exited with code 137. Last lines of its log (/work/hf.log):\n"
        "loading weights\nKilled\n"
    )
    cause = causes.first_cause(text)
    assert cause == "the HF baseline exited with code 137; the last line of its log: Killed"
    assert "Last lines of" not in causes.headline([("hf-sequential", text)], 1)
