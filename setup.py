"""jaxrl: a JAX-native research framework for reinforcement learning."""

from setuptools import find_packages, setup

CORE = [
    "jax>=0.6",
    "flax>=0.10",
    "optax>=0.2.4",
    "chex>=0.1.88",
    "orbax-checkpoint>=0.11",
    "ml-collections>=1.0",
    "tokenizers>=0.20",
    "einops>=0.8",
    "absl-py>=2.0",
    "numpy>=1.26",
    "scipy>=1.11",  # confidence intervals (scipy.stats); jax depends on it already
    "tqdm>=4.66",
    "matplotlib>=3.8",
    "pillow>=10",  # SMAX episode GIFs
]

EXTRAS = {
    # Tests, notebooks executed by the tests, the import contracts (.importlinter), and the environment
    # libraries the adapters and parity checks use (gymnax's CartPole and suites, jaxmarl's SMAX and MPE).
    "dev": ["pytest>=8", "pytest-xdist>=3.5", "nbclient>=0.10", "nbformat>=5.10", "ipykernel>=6.29",
            "import-linter>=2.1", "gymnax>=1.0", "six", "brax>=0.12", "craftax>=1.4", "xminigrid>=0.9", "jaxmarl==0.2.0",
            "tensorboardX>=2.6", "tensorboard", "wandb",  # the log backends; tensorboard reads their events back
            # the docs site (mkdocs.yml), built with --strict by tests/test_docs_site.py
            "mkdocs>=1.6.1", "mkdocs-material>=9.8.2", "mkdocstrings[python]>=1.0.8",
            "gguf>=0.10",  # the pretrained model the language-model tests load (the models extra)
            "gymnasium>=1.0", "ale-py>=0.9"],  # host environments (the gymnasium and atari extras)
    # Pretrained language models from GGUF files (jaxrl.models; Hugging Face directories need nothing more).
    "models": ["gguf>=0.10"],
    # Environment libraries, each reached through envs.make (envs/adapters).
    "gymnax": ["gymnax>=1.0", "six"],  # 1.x reports terminated and truncated apart; it imports six undeclared
    "brax": ["brax>=0.12"],
    "craftax": ["craftax>=1.4"],
    "xminigrid": ["xminigrid>=0.9"],
    # Environments stepped on the host, inside the compiled programs (envs.adapters.gymnasium); Atari's ROMs
    # come with ale-py.
    "gymnasium": ["gymnasium>=1.0"],
    "atari": ["gymnasium>=1.0", "ale-py>=0.9"],
    # Peer libraries, only for side-by-side benchmarks (never imported by jaxrl itself).
    # torch + trl: benchmarks/grpo_tokens.py (TRL's GRPOTrainer on CPU). Install a CPU build of torch first:
    # on Linux an unconstrained torch from PyPI is the CUDA build (GBs); torch>=2.6 is what transformers 5 needs.
    # distrax, flashbax, hydra-core, omegaconf, wandb: what JaxMARL's own MAPPO, IPPO and QMIX scripts import
    # (benchmarks/smax_mappo.py, smax_qmix.py and smax_suite.py run them from a checkout of the JaxMARL
    # repository; wandb never logs).
    # rejax, sbx-rl, gymnasium: benchmarks/off_policy.py (rejax gets gymnax 1.x's envs through a five-value-step
    # shim there; sbx is SB3's JAX port, on gymnasium's Pendulum).
    "bench": ["jaxmarl==0.2.0", "torch>=2.6", "trl==1.16.0", "distrax", "flashbax==0.1.3", "hydra-core>=1.3",
              "omegaconf>=2.3", "wandb", "rejax==0.1.3", "sbx-rl>=0.20", "gymnasium>=1.0",
              "accelerate", "gguf>=0.10"],
    # benchmarks/cartpole_ppo.py runs rejax 0.1.3 on gymnax < 1.0 (its five-value step), which the gymnax adapter
    # cannot use: install it in an environment of its own (python -m venv .venv-rejax; pip install -e
    # ".[bench-rejax]"). jaxrl itself never imports gymnax for its own CartPole, so it runs there unchanged.
    "bench-rejax": ["rejax==0.1.3", "gymnax<1.0", "six"],  # gymnax 0.0.9 imports six without declaring it
    # Optional logging backends (config.log.backends): TensorBoard event files and Weights & Biases runs.
    "log": ["tensorboardX>=2.6", "wandb"],
    # Accelerators: JAX's own wheels. For TPU follow JAX's install note (pip install "jax[tpu]").
    "cuda": ["jax[cuda12]"],
    "cuda13": ["jax[cuda13]"],
    "tpu": ["jax[tpu]"],
}

setup(
    name="jaxrl",
    version="0.1.0",
    description="JAX-native reinforcement learning: PPO, MAPPO, the GRPO family, sharded over device meshes",
    long_description=open("README.md").read() if __import__("os").path.exists("README.md") else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.11",
    packages=find_packages(include=["jaxrl", "jaxrl.*", "envs", "envs.*"]),
    install_requires=CORE,
    extras_require=EXTRAS,
)
