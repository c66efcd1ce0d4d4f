import pytest

from pytest_gpubench.errors import Stage, UsageProblem
from pytest_gpubench.settings import DEFAULT_API, OPTIONS_BY_DEST, SANDBOX_TIME_SCALE, Settings, resolve


def no_ini(_name):
    return None


def test_defaults():
    settings = resolve({}, {}, no_ini)
    assert settings.api == DEFAULT_API
    assert settings.time_scale == 1.0
    assert settings.stage_timeout(Stage.PROVISION) == 600
    assert settings.stage_timeout(Stage.BENCHMARK, duration=300) == 900
    assert settings.poll_interval == 15
    assert str(settings.manifest) == "reports/manifest.db"
    assert str(resolve({"reports": "/tmp/r"}, {}, no_ini).manifest) == "/tmp/r/manifest.db"
    assert settings.run_id


def test_cli_beats_env_beats_ini():
    ini = {"gpubench_api": "http://ini:1", "gpubench_duration": "30"}.get
    env = {"GPUBENCH_API_BASE": "http://env:2"}
    assert resolve({}, {}, ini).api == "http://ini:1"
    assert resolve({}, env, ini).api == "http://env:2"
    assert resolve({"api": "http://cli:3"}, env, ini).api == "http://cli:3"
    assert resolve({}, env, ini).duration == 30.0


def test_sandbox_defaults_to_scaled_clock_with_floor():
    settings = resolve({"sandbox": True}, {}, no_ini)
    assert settings.time_scale == SANDBOX_TIME_SCALE
    assert settings.poll_interval == pytest.approx(15 * SANDBOX_TIME_SCALE)
    # No scaled timeout drops below the floor that protects a loaded CI machine.
    assert settings.stage_timeout(Stage.INVENTORY) == 15.0
    # Inference is never time-scaled, so neither is the benchmark's budget.
    assert settings.stage_timeout(Stage.BENCHMARK, duration=3) == 603


@pytest.mark.parametrize(
    ("cli", "env", "expected"),
    [
        ({"duration": "-5"}, {}, "--gpubench-duration: '-5' must be a number of seconds or a duration "
                                 "such as '90s', '5m', '1h30m' (more than 0, at most 24h)"),
        ({"duration": "100000"}, {}, "at most 24h"),
        ({}, {"GPUBENCH_MAX_PRICE": "cheap"}, "environment variable GPUBENCH_MAX_PRICE: 'cheap' must be a number"),
        ({}, {"GPUBENCH_SANDBOX": "maybe"}, "GPUBENCH_SANDBOX: 'maybe' must be true or false"),
        ({"run_id": "a b;rm"}, {}, "--gpubench-run-id"),
        ({"sandbox_ssh": "dropbear"}, {}, "--gpubench-sandbox-ssh: 'dropbear' must be one of: asyncssh, openssh"),
    ],
)
def test_bad_values_name_their_source(cli, env, expected):
    with pytest.raises(UsageProblem, match=expected.replace("(", r"\(").replace(")", r"\)")):
        resolve(cli, env, no_ini)


@pytest.mark.parametrize("run_id", [".", "..", "...", ".hidden", "a/b", "../x", "é", "x" * 65])
def test_a_run_id_that_would_leave_its_folder_is_refused(run_id):
    # Issue 21 item 14: the run id names the progress folder and a results repository's run folder;
    # "." and ".." put them beside it. The rule is the one for every id that becomes a path segment.
    with pytest.raises(UsageProblem, match="--gpubench-run-id: .* must be 1-64 letters, digits, '.', '_' or '-', "
                                           "not starting with '.'"):
        resolve({"run_id": run_id}, {}, no_ini)
    assert resolve({"run_id": "nightly.2026-01_a"}, {}, no_ini).run_id == "nightly.2026-01_a"


def test_token_only_from_environment():
    settings = resolve({}, {"GPUBENCH_API_TOKEN": "s3cret"}, no_ini)
    assert settings.api_token == "s3cret"


def test_repeatable_filters():
    settings = resolve({"gpu": ["RTX4090", " A100 80GB "], "model": []}, {}, no_ini)
    assert settings.gpu == ("RTX4090", "A100 80GB")
    assert settings.model == ()


DURATION_FLAGS = ("duration", "progress_interval", "stall_timeout", "telemetry_interval")


@pytest.mark.parametrize("dest", DURATION_FLAGS)
@pytest.mark.parametrize(("text", "seconds"), [("5m", 300.0), ("2s", 2.0), ("1h30m", 5400.0), ("90", 90.0),
                                               ("0.5", 0.5), ("1m 30s", 90.0)])
def test_duration_flags_take_what_the_matrix_takes(dest, text, seconds):
    from pytest_gpubench.options import parse_duration

    assert getattr(resolve({dest: text}, {}, lambda _: None), dest) == seconds == parse_duration(text)


@pytest.mark.parametrize("dest", DURATION_FLAGS)
@pytest.mark.parametrize("text", ["5x", "0", "-2s", "25h", "soon", "nan", "inf"])
def test_bad_durations_name_the_flag_and_what_is_allowed(dest, text):
    flag = OPTIONS_BY_DEST[dest].flag
    with pytest.raises(UsageProblem) as caught:
        resolve({dest: text}, {}, lambda _: None)
    assert str(caught.value) == (f"{flag}: {text!r} must be a number of seconds or a duration such as "
                                 "'90s', '5m', '1h30m' (more than 0, at most 24h)")


def test_duration_from_the_environment_and_ini_too():
    assert resolve({}, {"GPUBENCH_PROGRESS_INTERVAL": "2s"}, lambda _: None).progress_interval == 2.0
    assert resolve({}, {}, lambda key: "1m" if key == "gpubench_stall_timeout" else None).stall_timeout == 60.0
    with pytest.raises(UsageProblem, match="environment variable GPUBENCH_DURATION: '5 min' must be a number"):
        resolve({}, {"GPUBENCH_DURATION": "5 min"}, lambda _: None)


def test_stall_timeout_leaves_a_slow_model_its_first_token_at_the_cells_concurrency():
    """Issue 21 (soak): in the sandbox the 120 s stall timeout became 5 s while the model's first
    token stays real-time: deepseek-r1:32b on an RTX 3090 (2.4 s) at concurrency 20 had every
    request aborted as stalled and the cell failed at ``results``. The floor grows with the
    measured first-token time x concurrency, never above the configured value."""
    sandbox = Settings(time_scale=0.02)
    assert sandbox.stall_seconds(120, first_token_ms=2400, concurrency=20) == 120  # capped at the configured
    assert sandbox.stall_seconds(120, first_token_ms=400, concurrency=10) == pytest.approx(12.0)
    assert sandbox.stall_seconds(120, first_token_ms=40, concurrency=4) == 5.0  # a fast model keeps the floor
    assert sandbox.stall_seconds(120, first_token_ms=None, concurrency=20) == 5.0  # nothing measured: as before
    assert sandbox.stall_seconds(2, first_token_ms=2400, concurrency=20) == 2.0  # asked for less: as asked
    assert Settings(time_scale=1.0).stall_seconds(120, first_token_ms=2400, concurrency=28) == 120


def test_the_host_key_policy_is_pin_unless_strict_from_flag_environment_or_ini():
    """Issue 21 item 7: one option-table entry gives the flag, ``GPUBENCH_HOST_KEYS`` and ini
    ``gpubench_host_keys``; anything but pin/strict is a usage problem naming where it came from."""
    assert resolve({}, {}, lambda key: None).host_keys == "pin"
    assert resolve({"host_keys": "strict"}, {}, lambda key: None).host_keys == "strict"
    assert resolve({}, {"GPUBENCH_HOST_KEYS": "strict"}, lambda key: None).host_keys == "strict"
    assert resolve({}, {}, {"gpubench_host_keys": "strict"}.get).host_keys == "strict"
    with pytest.raises(UsageProblem,
                       match=r"environment variable GPUBENCH_HOST_KEYS: 'off' must be one of: pin, strict"):
        resolve({}, {"GPUBENCH_HOST_KEYS": "off"}, lambda key: None)
    assert OPTIONS_BY_DEST["host_keys"].flag == "--gpubench-host-keys"
