"""Launcher detection from the environment: torchrun, RANK/WORLD_SIZE (Kubeflow), srun, none; SLURM host
lists; half-configured environments are errors naming the variables."""

import os
import stat

import pytest

from yolox_fast.core.cluster_env import (
    LaunchEnvError,
    detect_cluster_env,
    expand_hostlist,
    first_host,
    slurm_default_port,
)

TORCHRUN = {
    "TORCHELASTIC_RUN_ID": "abc",
    "RANK": "3",
    "WORLD_SIZE": "4",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "2",
    "MASTER_ADDR": "node01",
    "MASTER_PORT": "29500",
}
SRUN = {
    "SLURM_JOB_ID": "123456",
    "SLURM_STEP_ID": "0",
    "SLURM_PROCID": "2",
    "SLURM_NTASKS": "4",
    "SLURM_LOCALID": "0",
    "SLURM_NODELIST": "gpu[07-08,11],cpu1",
}


def detect(env):
    return detect_cluster_env(env, scontrol=None)


def test_nothing_set_is_a_plain_run():
    assert detect({}).launcher == "none"
    assert detect({}).world_size == 1


def test_torchrun_variables_are_read_and_win_inside_srun():
    env = detect({**SRUN, **TORCHRUN})
    assert (env.launcher, env.rank, env.world_size, env.local_rank) == ("torchrun", 3, 4, 1)
    assert (env.master_addr, env.master_port, env.local_world_size) == ("node01", 29500, 2)


def test_kubeflow_style_environment_is_one_process_per_machine():
    env = detect({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456"})
    assert (env.launcher, env.rank, env.world_size, env.local_rank) == ("env", 1, 2, 0)
    assert (env.master_addr, env.master_port) == ("job-master-0", 23456)
    assert "one process per machine" in env.describe() and env.local_rank_assumed


def test_local_rank_comes_from_local_rank_then_local_world_size():
    base = {"RANK": "5", "WORLD_SIZE": "8", "MASTER_ADDR": "h", "MASTER_PORT": "1234"}
    assert detect({**base, "LOCAL_WORLD_SIZE": "4"}).local_rank == 1
    assert detect({**base, "LOCAL_WORLD_SIZE": "4", "LOCAL_RANK": "3"}).local_rank == 3
    assert not detect({**base, "LOCAL_RANK": "0"}).local_rank_assumed


def test_world_size_one_is_a_single_process():
    assert detect({"RANK": "0", "WORLD_SIZE": "1"}).world_size == 1


@pytest.mark.parametrize(
    "env, names",
    [
        ({"RANK": "0"}, ["RANK", "WORLD_SIZE"]),
        ({"WORLD_SIZE": "2"}, ["WORLD_SIZE", "RANK"]),
        ({"LOCAL_RANK": "0"}, ["LOCAL_RANK", "RANK and WORLD_SIZE"]),
        ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h"}, ["MASTER_PORT"]),
        ({"RANK": "0", "WORLD_SIZE": "2"}, ["MASTER_ADDR, MASTER_PORT"]),
        (
            {"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"},
            ["RANK=2", "WORLD_SIZE=2"],
        ),
        ({"RANK": "x", "WORLD_SIZE": "2"}, ["RANK='x'"]),
        ({"RANK": "0", "WORLD_SIZE": "0"}, ["WORLD_SIZE=0"]),
        ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "70000"}, ["MASTER_PORT=70000"]),
        ({"TORCHELASTIC_RUN_ID": "x", "RANK": "0", "WORLD_SIZE": "2"}, ["torchrun", "LOCAL_RANK"]),
        ({**SRUN, "SLURM_PROCID": "4"}, ["SLURM_PROCID=4", "SLURM_NTASKS=4"]),
        ({k: v for k, v in SRUN.items() if k != "SLURM_LOCALID"}, ["SLURM_LOCALID"]),
        ({k: v for k, v in SRUN.items() if k != "SLURM_JOB_ID"}, ["SLURM_JOB_ID", "MASTER_PORT"]),
        ({k: v for k, v in SRUN.items() if k != "SLURM_NODELIST"}, ["SLURM_STEP_NODELIST", "MASTER_ADDR"]),
    ],
)
def test_half_configured_environment_is_an_error_naming_the_variables(env, names):
    with pytest.raises(LaunchEnvError) as err:
        detect(env)
    for name in names:
        assert name in str(err.value)


def test_srun_step_reads_slurm_variables():
    env = detect(SRUN)
    assert (env.launcher, env.rank, env.world_size, env.local_rank) == ("slurm", 2, 4, 0)
    assert env.master_addr == "gpu07"
    assert env.master_port == slurm_default_port("123456") == 12000 + 123456 % 20000
    assert "first host of SLURM_NODELIST" in env.describe() and not env.local_rank_assumed


def test_srun_prefers_the_step_variables_and_explicit_master():
    env = detect(
        {
            **SRUN,
            "SLURM_STEP_NUM_TASKS": "2",
            "SLURM_PROCID": "1",
            "SLURM_STEP_NODELIST": "b[3-4]",
            "MASTER_PORT": "4242",
        }
    )
    assert (env.world_size, env.master_addr, env.master_port) == (2, "b3", 4242)
    assert detect({**SRUN, "MASTER_ADDR": "10.0.0.1"}).master_addr == "10.0.0.1"


def test_the_sbatch_script_itself_is_not_rank_0_of_n():
    """sbatch sets SLURM_PROCID=0 and SLURM_NTASKS=N in the batch script too; only srun sets a step."""
    batch = {k: v for k, v in SRUN.items() if k != "SLURM_STEP_ID"} | {"SLURM_PROCID": "0"}
    env = detect(batch)
    assert env.launcher == "none" and env.world_size == 1 and "batch script" in env.describe()


def test_explicit_rank_variables_win_over_slurm():
    env = detect({**SRUN, "RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "5000"})
    assert (env.launcher, env.rank, env.world_size) == ("env", 0, 2)


def test_slurm_port_default_is_stable_and_below_the_ephemeral_range():
    ports = {slurm_default_port(str(job)) for job in (1, 19999, 20000, 987654321)}
    assert all(12000 <= p < 32000 for p in ports)
    assert slurm_default_port("42") == slurm_default_port("42") == 12042
    assert 12000 <= slurm_default_port("42_7") < 32000  # non-numeric ids hash


@pytest.mark.parametrize(
    "text, hosts",
    [
        ("localhost", ["localhost"]),
        ("node[01-04,07]", ["node01", "node02", "node03", "node04", "node07"]),
        ("node[08-10]", ["node08", "node09", "node10"]),
        ("n[1-3]", ["n1", "n2", "n3"]),
        ("a1,b[2-3],c", ["a1", "b2", "b3", "c"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
        ("gpu-[1,3]-ib", ["gpu-1-ib", "gpu-3-ib"]),
        ("x[007]", ["x007"]),
    ],
)
def test_expand_hostlist(text, hosts):
    assert expand_hostlist(text) == hosts


@pytest.mark.parametrize("text", ["node[1-", "node]1[", "n[a-b]", "n[3-1]", "a,,b", "", "n[[1]]"])
def test_malformed_hostlist_is_an_error_naming_it(text):
    with pytest.raises(ValueError, match="SLURM host list"):
        expand_hostlist(text)


def test_first_host_uses_scontrol_when_there_is_one(tmp_path):
    fake = tmp_path / "scontrol"
    fake.write_text('#!/bin/sh\n[ "$1 $2" = "show hostnames" ] && printf "from-scontrol\\nother\\n"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    assert first_host("node[1-2]", str(fake)) == "from-scontrol"
    failing = tmp_path / "broken"
    failing.write_text("#!/bin/sh\nexit 1\n")
    failing.chmod(failing.stat().st_mode | stat.S_IEXEC)
    assert first_host("node[1-2]", str(failing)) == "node1"  # falls back to the parser
    assert first_host("node[1-2]", os.path.join(str(tmp_path), "missing")) == "node1"
