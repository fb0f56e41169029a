"""A Runs' settings from the TOML file `vfsd mount --config` reads (`config=` or
VFSD_CONFIG), checked by `vfsd config check` before any thread runs.

The file's options reach every shard (seen in a thread's `stats()["config"]`,
the shard daemon's own), keyword options win over it, its `[runs]` table sets
`shards`; a bad key or value fails the Runs where it is made, naming the key
(and the file), with nothing mounted; `vfsd mount` reads the same file, its
`[runs]` table skipped.
"""

from __future__ import annotations

import json

import pytest
from conftest import daemons_under, mounts_under, vfsd_cli

import mount_tool
from mount_tool import RunsConfigError

pytestmark = pytest.mark.timeout(300)

SETTINGS = """\
# every thread's files: a week of steps for done files, 64 MiB each
done_retention_steps = 7
quota_bytes = "64M"
snapshot_keep_last = 4
eviction_rules = [{path = "tool_outputs/**", max_age_steps = 5}]

[runs]
shards = 2
"""


@pytest.fixture
def settings(tmp_path):
    path = tmp_path / "vfsd.toml"
    path.write_text(SETTINGS)
    return path


@pytest.mark.fuse
def test_the_file_sets_every_shards_options_and_keywords_win(tmp_path, settings):
    root = tmp_path / "runs"
    with mount_tool.runs(root, config=settings, max_age_steps=11) as runs:
        assert runs.shard_count == 2 and runs.config_path == settings
        config = runs.get("a thread").stats()["config"]
        assert config["done_retention_steps"] == 7
        assert config["quota_bytes"] == 64 << 20
        assert config["max_age_steps"] == 11  # the keyword option
        assert config["snapshot_keep_last"] == 4  # the file's, over the Runs' default (0)
        assert config["snapshot_keep_steps"] == 0  # the Runs' default, the file says nothing
        assert config["eviction_rules"] == [{"path": "tool_outputs/**", "max_age_steps": 5}]
    assert mounts_under(root) == [] and daemons_under(root) == []
    # `shards=` wins over the file's [runs] table.
    assert mount_tool.runs(root, config=settings, shards=3).shard_count == 3


def test_vfsd_config_is_read_when_no_config_is_given(tmp_path, settings, monkeypatch):
    monkeypatch.setenv("VFSD_CONFIG", str(settings))
    runs = mount_tool.runs(tmp_path / "runs")
    assert runs.config_path == settings and runs.shard_count == 2
    assert runs.mount_options["done_retention_steps"] == 7
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("VFSD_CONFIG", "vfsd.toml")  # relative: to the working directory
    assert mount_tool.runs(tmp_path / "runs").config_path == settings


BAD = [
    ("quota = 3\n", ["'quota'", "did you mean 'quota_bytes'"]),
    ("max_age_steps = -2\n", ["max_age_steps", "non-negative integer"]),
    ('quota_bytes = "lots"\n', ["quota_bytes", "'lots'"]),
    ('eviction_rules = [{path = "x/**", evict_after = 3}]\n', ["evict_after"]),
    ("durability = \"always\"\n", ["durability", "'always'"]),
    ("[runs]\nshard = 2\n", ["[runs]", "'shard'", "did you mean 'shards'"]),
    ("[runs]\nshards = 0\n", ["[runs] shards", "1 to 4096", "0"]),
    ("[runs]\nidle_timeout = 60\n", ["idle_timeout", "no longer used"]),
    ("runs = 3\n", ["runs", "must be a table"]),
    ("done_retention_steps = \n", ["not valid TOML"]),
    ("metrics_port = 9100\n", ["metrics_port", "not an option of a Runs", "one port"]),
]


@pytest.mark.parametrize("text,named", BAD, ids=[b[1][0] for b in BAD])
def test_a_bad_key_or_value_fails_at_open_naming_it(tmp_path, text, named):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    root = tmp_path / "runs"
    with pytest.raises(RunsConfigError) as caught:
        mount_tool.runs(root, config=path)
    message = str(caught.value)
    assert str(path) in message and all(n in message for n in named), message
    assert not root.exists()  # nothing made, nothing mounted


def test_the_file_names_the_bucket_the_replicas_share_and_a_keyword_wins(tmp_path):
    path = tmp_path / "vfsd.toml"
    path.write_text('remote_url = "s3://shared/threads"\nremote_lease_wait = 7\n')
    runs = mount_tool.runs(tmp_path / "runs", config=path)
    # The Runs serves its threads from that bucket (a lease per run), as with remote=.
    assert runs.remote == "s3://shared/threads" == runs.mount_options["remote"]
    assert "remote_url" not in runs.mount_options and runs.lease_wait == 7
    runs = mount_tool.runs(tmp_path / "runs", config=path, remote="s3://other/p")
    assert runs.remote == "s3://other/p"
    with pytest.raises(ValueError, match="metrics_port= is not an option of a Runs"):
        mount_tool.runs(tmp_path / "runs", metrics_port=9100)


def test_a_bad_keyword_option_is_named_too_and_a_missing_file_is_said(tmp_path, settings):
    with pytest.raises(RunsConfigError, match="quota_bytes.*'12X'"):
        mount_tool.runs(tmp_path / "runs", config=settings, quota_bytes="12X")
    with pytest.raises(RunsConfigError, match="does not exist"):
        mount_tool.runs(tmp_path / "runs", config=tmp_path / "nope.toml")
    with pytest.raises(RunsConfigError, match="path of a TOML file"):
        mount_tool.runs(tmp_path / "runs", config="")


def test_vfsd_config_check(tmp_path, settings):
    out = vfsd_cli("config", "check", str(settings), "--json").stdout
    doc = json.loads(out)
    assert doc["file"] == str(settings) and doc["runs"] == {"shards": 2}
    assert doc["options"]["quota_bytes"] == 64 << 20
    assert doc["config"]["done_retention_steps"] == 7 and doc["config"]["max_age_steps"] == 20
    text = vfsd_cli("config", "check", str(settings), "--max-age-steps", "9").stdout
    assert text.startswith(f"{settings}: valid") and "shards" in text
    bad = tmp_path / "bad.toml"
    bad.write_text("quota = 3\n")
    proc = vfsd_cli("config", "check", str(bad), check=False)
    assert proc.returncode == 2 and "did you mean 'quota_bytes'" in proc.stderr
    assert proc.stdout == ""


@pytest.mark.fuse
def test_vfsd_mount_reads_the_same_file_and_skips_its_runs_table(tmp_path, settings):
    run_dir = tmp_path / "r1"
    vfsd_cli("mount", str(run_dir), "--config", str(settings))
    try:
        status = json.loads(vfsd_cli("status", str(run_dir), "--json").stdout)
        assert status["config"]["done_retention_steps"] == 7
    finally:
        vfsd_cli("umount", str(run_dir))
