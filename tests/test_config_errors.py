"""Config checks in Python (the command line's one-line errors: tests/test_cli_errors.py)."""

import re

import pytest

from experiments import cartpole_ppo
from jaxrl import config as config_lib, mesh as mesh_lib
from jaxrl import algos


def _config(**overrides):
    config = cartpole_ppo.get_config()
    for key, value in overrides.items():
        section, _, name = key.rpartition(".")
        (config[section] if section else config)[name] = value
    return config


def test_unknown_key_in_python_is_an_error():
    config = _config()
    with pytest.raises(AttributeError, match="totl_steps"):
        config.totl_steps = 10


def test_wrong_type_in_python_is_an_error():
    config = _config()
    with pytest.raises(TypeError):
        config.num_envs = "four"


def test_minibatches_must_divide_the_batch():
    with pytest.raises(ValueError, match=r"num_envs \* num_steps = 3 \* 5 = 15 is not divisible by optim.num_minibatches = 4"):
        algos.validate(_config(num_envs=3, num_steps=5))


def test_unknown_environment_name_is_an_error():
    with pytest.raises(ValueError, match="unknown config.env.name 'CartPol'.*CartPole-v1"):
        algos.validate(_config(**{"env.name": "CartPol"}))


def test_non_positive_sizes_are_errors():
    with pytest.raises(ValueError, match="config.num_envs must be a positive integer"):
        algos.validate(_config(num_envs=0))
    with pytest.raises(ValueError, match="config.returns.gamma must lie in"):
        algos.validate(_config(**{"returns.gamma": 1.5}))


def test_experiment_without_argument_rejects_one():
    with pytest.raises(ValueError, match="takes no config argument"):
        cartpole_ppo.get_config("3m")


def test_envs_that_do_not_divide_over_devices_are_rejected_before_compiling():
    config = _config(num_envs=4)
    mesh = mesh_lib.make_mesh()
    if mesh.size == 1:
        with pytest.raises(ValueError, match="mesh.num_devices=2 but 1 devices"):
            mesh_lib.make_mesh(2)
    with pytest.raises(ValueError, match="num_envs=3 does not divide over the 2 devices of the data axis"):
        mesh_lib.check_divisible("num_envs", 3, type("FakeMesh", (), {"shape": {"data": 2}})())
    algos.build(config, mesh)  # divides: no error


def test_xla_options_are_parsed_and_reach_the_settings():
    config = _config(xla_options=" xla_cpu_enable_fast_math=false , xla_cpu_experimental_ynn_fusion_type=")
    algos.validate(config)
    options = (("xla_cpu_enable_fast_math", False), ("xla_cpu_experimental_ynn_fusion_type", ""))
    assert config_lib.xla_options(config) == options
    algo, _ = algos.build(config, mesh_lib.make_mesh())
    assert algo.settings.xla_options == options


def test_malformed_or_unknown_xla_options_are_errors_before_compiling():
    with pytest.raises(ValueError, match=r"config.xla_options: 'fast_math' is not name=value"):
        algos.validate(_config(xla_options="fast_math"))
    with pytest.raises(ValueError, match=r"config.xla_options .*No such compile option: 'xla_cpu_nope'"):
        algos.validate(_config(xla_options="xla_cpu_nope=1"))


def test_scale_num_envs_keeps_the_inner_loop_and_grows_the_minibatch_count():
    config = _config(**{"num_envs": 4, "optim.num_minibatches": 4, "optim.warmup_updates": 50, "scale.num_envs": 64})
    algos.validate(config)
    scaled = algos.resolve(config)
    assert (scaled.num_envs, scaled.optim.num_minibatches) == (64, 64)
    assert scaled.optim.warmup_updates == 4  # ceil(50 / 16): the warm-up keeps its length in env steps
    # the minibatch size (envs * steps / minibatches), learning rate, epochs and rollout length are kept
    assert scaled.num_envs * scaled.num_steps // scaled.optim.num_minibatches == 4 * config.num_steps // 4
    for key in ("optim.learning_rate", "optim.num_epochs", "num_steps", "total_steps"):
        assert config_lib.get_value(scaled, key) == config_lib.get_value(config, key), key
    assert algos.resolve(scaled) is scaled  # applying it again changes nothing (a resumed run's saved config)
    unscaled = _config()
    assert algos.resolve(unscaled) is unscaled  # scale.num_envs 0: the config as given


def test_scale_num_envs_that_gives_a_fractional_minibatch_count_is_an_error():
    with pytest.raises(ValueError, match=r"config.scale.num_envs=6: .*choose a multiple of 4"):
        algos.validate(_config(**{"num_envs": 16, "optim.num_minibatches": 4, "scale.num_envs": 6}))
    with pytest.raises(ValueError, match="config.scale.num_envs must be >= 0"):
        algos.validate(_config(**{"scale.num_envs": -1}))


def test_reset_ratio_must_be_positive_and_only_reaches_auto_resetting_learners():
    with pytest.raises(ValueError, match="config.env.reset_ratio must be a positive integer"):
        algos.validate(_config(**{"env.reset_ratio": 0}))
    from experiments import smax_grpo
    config = smax_grpo.get_config("3m")
    config.env.reset_ratio = 4
    with pytest.raises(ValueError, match="GRPO's groups roll out whole episodes"):
        algos.validate(config)


def test_unknown_std_transform_gae_values_advantage_and_obs_stats_are_errors():
    with pytest.raises(ValueError, match="config.network.std_transform.*'sofplus'.*exp, softplus"):
        algos.validate(_config(**{"network.std_transform": "sofplus"}))
    with pytest.raises(ValueError, match="config.returns.gae_values.*'fresh'.*rollout, current"):
        algos.validate(_config(**{"returns.gae_values": "fresh"}))
    with pytest.raises(ValueError, match="config.advantage.estimator 'grpo'.*gae, impala, vtrace"):
        algos.validate(_config(**{"advantage.estimator": "grpo"}))
    with pytest.raises(ValueError, match="config.normalize.obs_stats 'new'.*rollout, updated"):
        algos.validate(_config(**{"normalize.obs_stats": "new"}))


def test_kernel_init_is_checked_and_applies_to_mlp_networks():
    with pytest.raises(ValueError, match="config.network.kernel_init.*'lecun'.*orthogonal, lecun_uniform"):
        algos.validate(_config(**{"network.kernel_init": "lecun"}))
    with pytest.raises(ValueError, match="kernel_init='lecun_uniform' applies to mlp networks"):
        algos.validate(_config(**{"network.kernel_init": "lecun_uniform", "network.kind": "gru"}))


def test_a_ppo_teacher_is_a_feed_forward_ppo_run_of_the_same_env_and_action_space(tmp_path):
    """loss.teacher (RPD) is checked from the teacher run's config.json alone, before anything is restored or
    compiled: a missing directory, another env, another action space (a continuous one squashed there and not here),
    a recurrent teacher."""
    from helpers import load_experiment, set_keys

    def run_dir(name, config):  # (a run directory's config.json: all the check reads)
        (tmp_path / name).mkdir()
        config_lib.save(config, str(tmp_path / name / "config.json"))
        return str(tmp_path / name)

    pendulum = load_experiment("gymnax_ppo", "Pendulum-v1")
    teachers = {
        "is not a run directory (no config.json)": (_config(), str(tmp_path / "nowhere")),
        "acted in env gymnax {'env_id': 'Pendulum-v1'}, this run in CartPole-v1 {}": (
            _config(), run_dir("pendulum", pendulum)),
        "acts in another action space: network.squash=True there, False here": (
            pendulum, run_dir("squashed", set_keys(pendulum.copy_and_resolve_references(), {"network.squash": True}))),
        "is a recurrent policy (network.kind=gru)": (_config(), run_dir("gru", _config(**{"network.kind": "gru"}))),
    }
    for message, (student, teacher) in teachers.items():
        student = set_keys(student.copy_and_resolve_references(), {"loss.teacher": teacher})
        with pytest.raises(ValueError, match=re.escape(f"config.loss.teacher='{teacher}' {message}")) as error:
            algos.validate(student)
        assert "\n" not in str(error.value)
    algos.validate(set_keys(_config(), {"loss.teacher": run_dir("cartpole", _config())}))  # the same env: no error
