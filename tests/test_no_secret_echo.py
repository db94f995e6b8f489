"""A file handed to migctl by mistake is not echoed back: root can read a private
key or a shadow file, and an error message reaches terminals, logs and tickets.  Errors name file,
line, column and the expected shape; they quote at most a short excerpt of a profile's own values,
and nothing that looks like a key, a token or a password hash."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from migd.yamlsrc import excerpt
from tests.helpers import MIGCTL

KEY_BODY = "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW"
NOT_PROFILES = {
    "private key": f"-----BEGIN OPENSSH PRIVATE KEY-----\n{KEY_BODY}\n-----END OPENSSH PRIVATE KEY-----\n",
    "shadow line": "root:$6$Zq0aXb1c$4fG7hJ2kL9mN3pQ5rS8tU1vW6xY0zA2bC4dE6fG8hI0jK2lM4nO6pQ8rS0tU2vW4xY6z"
                   ":19000:0:99999:7:::\n",
    "token file": "token: ghp_16C7e42F292c6912E7710c838347Ae178B4a\n",
    "env file": "AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY\n",
}
SECRETS = (KEY_BODY[:16], "4fG7hJ2kL9mN3pQ5", "ghp_16C7e42F292c", "wJalrXUtnFEMI", "EXAMPLEKEY", "Zq0aXb1c")


def _migctl(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*MIGCTL, "--sim", "single-a100", "--sim-state",
                           str(tmp / "sim.json"), "--state-dir", str(tmp / "state"), *args],
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("kind", sorted(NOT_PROFILES))
@pytest.mark.parametrize("command", [("apply", "--local"), ("plan",), ("validate",), ("apply", "--dry-run")])
@pytest.mark.integration
def test_a_file_that_is_not_a_profile_is_not_quoted(tmp_path: Path, kind: str, command: tuple[str, ...]) -> None:
    path = tmp_path / "secret"
    path.write_text(NOT_PROFILES[kind])
    path.chmod(0o600)
    r = _migctl(tmp_path, command[0], str(path), *command[1:])
    assert r.returncode == 2, r
    line, = r.stderr.splitlines()
    assert line == f"error: {path}:1:1: not a migd profile (apiVersion: migd/v1, kind: Profile) or a mig-parted " \
                   "config (version: v1, mig-configs: ...)", line
    assert not any(s in r.stdout + r.stderr for s in SECRETS)


@pytest.mark.integration
def test_a_hooks_file_that_is_a_key_is_not_quoted(tmp_path: Path) -> None:
    key = tmp_path / "id_ed25519"
    key.write_text(NOT_PROFILES["private key"])
    key.chmod(0o600)
    profile = Path(__file__).resolve().parents[1] / "profiles" / "day.yaml"
    r = _migctl(tmp_path, "apply", "--local", str(profile), "--hooks", str(key))
    assert r.returncode == 2 and "must be a mapping, not a value of" in r.stderr, r.stderr
    assert not any(s in r.stderr for s in SECRETS)


@pytest.mark.integration
def test_a_profile_value_that_looks_like_a_token_is_not_quoted(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("apiVersion: migd/v1\nkind: Profile\nname: p\ngpus:\n  - select: all\n    instances:\n"
                    "      - {profile: sk_live_51HqLyjWDarjtT1zdp7dc}\n")
    r = _migctl(tmp_path, "plan", str(path))
    assert r.returncode == 2 and "sk_live" not in r.stderr, r.stderr
    assert f"{path}:7:19: gpus[0].instances[0].profile: a value of 29 characters (not shown" in r.stderr, r.stderr


@pytest.mark.parametrize(("value", "shown"), [
    ("3g.40gbb", "'3g.40gbb'"),
    ("GPU-5e8ab3c1-4cf1-4f3b-9b5c-2f0b7f1e2a11", "'GPU-5e8ab3c1-4cf1-4f3b-9b5c-2f0b7f1e2a11'"),
    ("nvidia-mig-manager-service", "'nvidia-mig-manager-service'"),
    ("a" * 60, "'" + "a" * 37 + "...'"),
    ("two\nlines", "'two lines'"),
])
def test_ordinary_profile_values_are_still_quoted_short(value: str, shown: str) -> None:
    assert excerpt(value) == shown


@pytest.mark.parametrize("where", ["timezone", "hook"])
def test_a_configuration_value_that_looks_like_a_token_is_not_quoted(tmp_path: Path, where: str) -> None:
    """The time zone and a hook's command were quoted whole (a sexagesimal time zone, a line of 9 KB)."""
    from migd.config.migdyaml import load_config
    from migd.errors import ValidationError

    token = "AbCdEfGhIjKlMnOpQrStUvWxYz0123456789secretTOKEN"
    (tmp_path / "hooks.yaml").write_text(f"version: v1\nhooks:\n  apply-start:\n  - {{command: {token}}}\n")
    config = tmp_path / "migd.yaml"
    config.write_text("schedule:\n  - {profile: day, at: '08:00'}\nprofiles_dir: "
                      f"{Path(__file__).resolve().parents[1] / 'profiles'}\n"
                      + (f"timezone: {token}\n" if where == "timezone" else f"hooks: {tmp_path / 'hooks.yaml'}\n"))
    with pytest.raises(ValidationError) as e:
        load_config(config, config.read_text())
    assert "secretTOKEN" not in str(e.value) and "not shown" in str(e.value), str(e.value)


@pytest.mark.parametrize("at", ["'25:99'", "'" + "9" * 500 + "'"])
def test_a_schedule_time_is_quoted_short(tmp_path: Path, at: str) -> None:
    from migd.config.migdyaml import load_config
    from migd.errors import ValidationError

    config = tmp_path / "migd.yaml"
    config.write_text(f"schedule:\n  - {{profile: day, at: {at}}}\nprofiles_dir: "
                      f"{Path(__file__).resolve().parents[1] / 'profiles'}\n")
    with pytest.raises(ValidationError) as e:
        load_config(config, config.read_text())
    assert "is not a time of day HH:MM" in str(e.value) and len(str(e.value)) < 300, str(e.value)
