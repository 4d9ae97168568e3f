"""Outside-checkpoint loaders: files built with torch in each format (the real key names and shapes) load
as Policies whose actions equal a direct forward pass on the adapted observations; mismatches are errors."""
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict
from torch import nn

from quadforge.layout import LEGGED_GYM_48, LEGGED_GYM_235, TERM_DIMS
from quadforge.experts.actor_policy import JointOrder
from quadforge.experts.loaders import WTW_COMMAND_SCALES, detect_kind, load_expert, wtw_layout
from quadforge.experts.registry import load_policy
from quadforge.experts.policy import check_policy

torch.set_num_threads(1)
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")
N = 4
# Isaac Gym's FL, FR, RL, RR <-> our FR, FL, RR, RL: swap the legs of each pair (an involution).
ISAAC = [3, 4, 5, 0, 1, 2, 9, 10, 11, 6, 7, 8]
JOINT_TERMS = ("dof_pos", "dof_vel", "last_action", "last_last_action", "dof_pos_sin", "dof_pos_cos")


def _terms(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {name: torch.randn(N, dim, generator=g) for name, dim in TERM_DIMS.items()}


def _isaac(terms):
    out = {k: (v[:, ISAAC] if k in JOINT_TERMS else v) for k, v in terms.items()}
    out["gait_clock"] = terms["gait_clock"][:, [1, 0, 3, 2]]
    out["foot_contacts"] = terms["foot_contacts"][:, [1, 0, 3, 2]]
    return out


def _mlp(sizes, seed=0):
    torch.manual_seed(seed)
    layers = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers += [nn.Linear(a, b)] + ([nn.ELU()] if i < len(sizes) - 2 else [])
    return nn.Sequential(*layers)


def _save_v1(path, actor, critic, extra=None):
    sd = {"std": torch.ones(12)}
    sd.update({f"actor.{k}": v for k, v in actor.state_dict().items()})
    sd.update({f"critic.{k}": v for k, v in critic.state_dict().items()})
    torch.save({"model_state_dict": sd, "optimizer_state_dict": {}, "iter": 1500, "infos": None, **(extra or {})}, path)


def test_rsl_rl_v1_legged_gym_48(tmp_path):
    actor, critic = _mlp([48, 64, 32, 12]), _mlp([48, 64, 32, 1], seed=1)
    _save_v1(tmp_path / "model_1500.pt", actor, critic)
    assert detect_kind(tmp_path / "model_1500.pt") == detect_kind(str(tmp_path / "model_1500.pt")) == "rsl_rl"
    policy = check_policy(load_expert(tmp_path / "model_1500.pt", num_envs=N))
    assert policy.layout.name == "legged_gym_48" and policy.obs_terms == LEGGED_GYM_48.term_names
    terms = _terms()
    with torch.no_grad():
        expected = actor(LEGGED_GYM_48.build(_isaac(terms)))[:, ISAAC]
    torch.testing.assert_close(policy.act(terms), expected)
    # the run directory resolves to its latest model_<it>.pt
    torch.testing.assert_close(load_expert(tmp_path, num_envs=N).act(terms), expected)


def test_rsl_rl_v1_with_obs_normalizer_and_235_layout(tmp_path):
    actor, critic = _mlp([235, 32, 12]), _mlp([235, 32, 1])
    mean, std = torch.randn(1, 235), torch.rand(1, 235) + 0.5
    _save_v1(tmp_path / "m.pt", actor, critic,
             {"obs_norm_state_dict": {"_mean": mean, "_var": std**2, "_std": std, "count": torch.tensor(10)}})
    policy = load_expert(tmp_path / "m.pt", kind="rsl_rl", num_envs=N)
    assert policy.layout.name == "legged_gym_235"
    terms = _terms(1)
    with torch.no_grad():
        x = (LEGGED_GYM_235.build(_isaac(terms)) - mean) / (std + 1e-2)
        expected = actor(x)[:, ISAAC]
    torch.testing.assert_close(policy.act(terms), expected)


def _rsl_rl5_actor(obs_dim=48, normalization=True):
    from rsl_rl.models import MLPModel
    obs = TensorDict({"policy": torch.zeros(1, obs_dim)}, batch_size=[1])
    torch.manual_seed(3)
    model = MLPModel(obs, {"actor": ["policy"]}, "actor", 12, hidden_dims=[32, 16], activation="elu",
                     obs_normalization=normalization,
                     distribution_cfg={"class_name": "rsl_rl.modules.GaussianDistribution", "init_std": 1.0})
    if normalization:
        model.train()
        model.update_normalization(TensorDict({"policy": 3 * torch.randn(64, obs_dim) + 1}, batch_size=[64]))
    return model.eval()


def test_rsl_rl_v5_matches_the_real_mlp_model(tmp_path):
    actor = _rsl_rl5_actor()
    assert "obs_normalizer._mean" in actor.state_dict() and "mlp.0.weight" in actor.state_dict()
    torch.save({"actor_state_dict": actor.state_dict(), "critic_state_dict": {}, "optimizer_state_dict": {},
                "iter": 7, "infos": None}, tmp_path / "model_7.pt")
    policy = load_expert(tmp_path / "model_7.pt", num_envs=N)
    terms = _terms(2)
    with torch.no_grad():
        obs = TensorDict({"policy": LEGGED_GYM_48.build(_isaac(terms))}, batch_size=[N])
        expected = actor(obs)[:, ISAAC]        # rsl_rl's own deterministic forward
    torch.testing.assert_close(policy.act(terms), expected)


def test_rsl_rl_v5_trained_here_uses_its_recorded_layout_and_our_joint_order(tmp_path):
    actor = _rsl_rl5_actor(normalization=False)
    meta = {"robot": "go1", "policy_layout": LEGGED_GYM_48.to_dict(), "action_scale": 0.25,
            "preset_config": {"activation": "elu"}}
    torch.save({"actor_state_dict": actor.state_dict(), "iter": 0, "infos": {"quadforge": meta}}, tmp_path / "m.pt")
    policy = load_expert(tmp_path / "m.pt", num_envs=N)
    terms = _terms(3)
    with torch.no_grad():
        expected = actor(TensorDict({"policy": LEGGED_GYM_48.build(terms)}, batch_size=[N]))
    torch.testing.assert_close(policy.act(terms), expected)
    with pytest.raises(ValueError, match="trained on layout 'legged_gym_48'"):
        load_expert(tmp_path / "m.pt", layout="fcnet", num_envs=N)


def test_torchscript_policy(tmp_path):
    actor = _mlp([48, 32, 12], seed=5)
    torch.jit.script(actor).save(str(tmp_path / "policy_1.pt"))
    assert detect_kind(tmp_path / "policy_1.pt") == "torchscript"
    policy = load_expert(tmp_path / "policy_1.pt", num_envs=N)
    terms = _terms(4)
    with torch.no_grad():
        expected = actor(LEGGED_GYM_48.build(_isaac(terms)))[:, ISAAC]
    torch.testing.assert_close(policy.act(terms), expected)
    # an explicit joint order (ours) and source action scale (0.5 -> doubled for go1's 0.25)
    policy = load_expert(tmp_path / "policy_1.pt", kind="torchscript", num_envs=N,
                         joint_order="FR,FL,RR,RL", source_action_scale=0.5)
    with torch.no_grad():   # the env's previous actions go back in at the source's scale (halved)
        own = {**terms, "last_action": terms["last_action"] / 2}
        torch.testing.assert_close(policy.act(terms), 2 * actor(LEGGED_GYM_48.build(own)))


def _wtw_files(folder, latent=2, history=30, frame=70):
    folder.mkdir(parents=True, exist_ok=True)
    adaptation = _mlp([history * frame, 64, latent], seed=6)
    body = _mlp([history * frame + latent, 64, 12], seed=7)
    torch.jit.script(adaptation).save(str(folder / "adaptation_module_latest.jit"))
    torch.jit.script(body).save(str(folder / "body_latest.jit"))
    return body, adaptation


def test_wtw_history_stacking_reset_and_action_conventions(tmp_path):
    body, adaptation = _wtw_files(tmp_path / "run" / "checkpoints")
    assert detect_kind(tmp_path / "run") == "wtw"
    policy = check_policy(load_expert(tmp_path / "run", num_envs=N))
    layout = wtw_layout()
    assert layout.dim == 70
    hist = torch.zeros(N, 30, 70)
    gain = torch.ones(12)
    gain[[0, 3, 6, 9]] = 0.5                 # walk-these-ways' hip_scale_reduction
    for t in range(4):
        if t == 2:
            policy.reset(torch.tensor([1]))
            hist[1] = 0.0
        terms = _terms(10 + t)
        terms["commands"] = terms["commands"].abs()
        source = _isaac(terms)
        for name in ("last_action", "last_last_action"):    # the env's actions back in the network's units
            source[name] = source[name] / gain
        frame = layout.build(source)
        hist = torch.cat([hist[:, 1:], frame[:, None]], dim=1)
        flat = hist.reshape(N, -1)
        with torch.no_grad():
            a = body(torch.cat([flat, adaptation(flat)], dim=-1)).clamp(-10, 10) * gain
        torch.testing.assert_close(policy.act(terms), a[:, ISAAC])
    # the command term is scaled as walk-these-ways does (lin vel 2, yaw 0.25, footswing 0.15, ...)
    cmd = torch.ones(1, 15)
    scaled = layout.build({**{n: torch.zeros(1, TERM_DIMS[n]) for n in layout.term_names}, "commands": cmd})
    torch.testing.assert_close(scaled[0, 3:18], torch.tensor(WTW_COMMAND_SCALES))
    # the body file alone also works (its adaptation module is found next to it)
    assert load_expert(tmp_path / "run" / "checkpoints" / "body_latest.jit", num_envs=N).action_dim == 12


def test_a_network_reads_back_its_own_actions_not_the_gained_ones(tmp_path):
    """The env holds ``clip(net) * action_gain`` as its action; the network's ``last_action`` input must be
    its own clipped output again (walk-these-ways applies the hip reduction to the targets only)."""
    from quadforge.experts.actor_policy import ActorPolicy, FrameObs
    from quadforge.layout import ObsLayout, LayoutTerm
    layout = ObsLayout("fb", (LayoutTerm("last_action"),))
    seen = []
    outputs = torch.linspace(-0.6, 0.6, 12).repeat(N, 1)

    def net(x):
        seen.append(x.clone())
        return outputs

    gain = torch.ones(12)
    gain[[0, 3, 6, 9]] = 0.5
    policy = ActorPolicy(net, FrameObs(layout, N, torch.device("cpu")), N, action_gain=gain, clip_actions=0.5,
                         joint_order=JointOrder(("FL", "FR", "RL", "RR")))
    actions = policy.act({"last_action": torch.zeros(N, 12)})
    policy.act({"last_action": actions})          # what the env gives back after applying them
    torch.testing.assert_close(seen[1], outputs.clamp(-0.5, 0.5))
    with pytest.raises(ValueError, match="action_gain"):
        ActorPolicy(net, FrameObs(layout, N, torch.device("cpu")), N, action_gain=[1.0] * 11 + [0.0])


def test_joint_order_accepts_twelve_names():
    names = tuple(f"{leg}_{p}" for p in ("hip", "thigh", "calf") for leg in ("FL", "FR", "RL", "RR"))
    order = JointOrder(names)   # IsaacLab-style joint-type-major order
    x = torch.arange(12.0)[None]
    back = order.actions_from_source(order.terms_to_source({"dof_pos": x})["dof_pos"])
    torch.testing.assert_close(back, x)
    assert order.terms_to_source({"dof_pos": x})["dof_pos"][0, :4].tolist() == [3.0, 0.0, 9.0, 6.0]
    with pytest.raises(ValueError, match="joint_order"):
        JointOrder(("FR", "FL", "RR"))


# --- errors ------------------------------------------------------------------------------------------
def test_observation_width_mismatch_names_both(tmp_path):
    _save_v1(tmp_path / "m.pt", _mlp([48, 16, 12]), _mlp([48, 16, 1]))
    with pytest.raises(ValueError, match=r"reads 48-D.*'legged_gym_235' gives 235-D"):
        load_expert(tmp_path / "m.pt", layout="legged_gym_235", num_envs=N)
    torch.jit.script(_mlp([50, 16, 12])).save(str(tmp_path / "p.pt"))
    with pytest.raises(ValueError, match=r"cannot infer the layout of a 50-D actor"):
        load_expert(tmp_path / "p.pt", num_envs=N)
    with pytest.raises(ValueError, match=r"reads 50-D.*gives 48-D"):
        load_expert(tmp_path / "p.pt", layout="legged_gym_48", num_envs=N)


def test_action_width_mismatch(tmp_path):
    _save_v1(tmp_path / "m.pt", _mlp([48, 16, 8]), _mlp([48, 16, 1]))
    with pytest.raises(ValueError, match="outputs 8 actions; expected 12"):
        load_expert(tmp_path / "m.pt", num_envs=N)


def test_missing_keys(tmp_path):
    torch.save({"optimizer_state_dict": {}, "iter": 3}, tmp_path / "a.pt")
    with pytest.raises(ValueError, match="actor_state_dict"):
        load_expert(tmp_path / "a.pt", kind="rsl_rl", num_envs=N)
    with pytest.raises(ValueError, match="not a known expert checkpoint"):
        load_expert(tmp_path / "a.pt", num_envs=N)
    torch.save({"model_state_dict": {"std": torch.ones(12), "critic.0.weight": torch.ones(1, 48)}}, tmp_path / "b.pt")
    with pytest.raises(ValueError, match=r"missing actor weights actor\.0\.weight"):
        load_expert(tmp_path / "b.pt", num_envs=N)
    sd = {f"actor.{k}": v for k, v in _mlp([48, 16, 12]).state_dict().items() if k != "2.bias"}
    torch.save({"model_state_dict": sd}, tmp_path / "c.pt")
    with pytest.raises(ValueError, match=r"missing key actor\.2\.bias"):
        load_expert(tmp_path / "c.pt", num_envs=N)


def test_bad_names_and_files(tmp_path):
    _save_v1(tmp_path / "m.pt", _mlp([48, 16, 12]), _mlp([48, 16, 1]))
    with pytest.raises(ValueError, match="unknown observation layout 'legged_gym_47'; allowed"):
        load_expert(tmp_path / "m.pt", layout="legged_gym_47", num_envs=N)
    with pytest.raises(ValueError, match="kind='onnx' is invalid"):
        load_expert(tmp_path / "m.pt", kind="onnx", num_envs=N)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_expert(tmp_path / "nope.pt", num_envs=N)
    (tmp_path / "wtw").mkdir()
    torch.jit.script(_mlp([2102, 12])).save(str(tmp_path / "wtw" / "body_latest.jit"))
    with pytest.raises(FileNotFoundError, match="adaptation_module_latest.jit"):
        load_expert(tmp_path / "wtw", num_envs=N)
    (tmp_path / "junk.pt").write_text("not a checkpoint")
    with pytest.raises(ValueError, match=r"junk.pt: not a quadforge/rsl_rl checkpoint \(a text file\)"):
        load_expert(tmp_path / "junk.pt", num_envs=N)


def test_a_device_this_machine_lacks_and_a_fractional_batch_are_named(tmp_path):
    from quadforge.models.checkpoint import load_checkpoint
    with pytest.raises(ValueError, match="device 'gpu' is unknown; allowed: cpu, cuda, cuda:N"):
        load_policy("gait", 2, device="gpu")
    with pytest.raises(ValueError, match="num_envs=2.7 is invalid; allowed: an integer >= 1"):
        load_policy("gait", 2.7)                       # was a policy for 2 envs
    ckpt = Path(__file__).resolve().parents[2] / "experts" / "checkpoints" / "vla_rt1.pt"
    with pytest.raises(ValueError, match="map_location 'gpu' is unknown"):   # was "truncated or damaged"
        load_checkpoint(ckpt, map_location="gpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="device 'cuda': this machine has no CUDA GPU"):
            load_policy("gait", 2, device="cuda")   # was torch's "Torch not compiled with CUDA enabled"


def test_wtw_body_width_mismatch(tmp_path):
    folder = tmp_path / "w"
    folder.mkdir()
    torch.jit.script(_mlp([2100, 8, 2])).save(str(folder / "adaptation_module_latest.jit"))
    torch.jit.script(_mlp([2100 + 3, 8, 12])).save(str(folder / "body_latest.jit"))
    with pytest.raises(ValueError, match=r"body reads 2103-D inputs; expected history 30 x 70 \+ latent 2"):
        load_expert(folder, num_envs=N)
    torch.jit.script(_mlp([2101, 8, 2])).save(str(folder / "adaptation_module_latest.jit"))
    with pytest.raises(ValueError, match="not a whole number of 70-D"):
        load_expert(folder, num_envs=N)


def test_term_shape_checked_at_act(tmp_path):
    _save_v1(tmp_path / "m.pt", _mlp([48, 16, 12]), _mlp([48, 16, 1]))
    policy = load_expert(tmp_path / "m.pt", num_envs=N)
    terms = _terms()
    terms["dof_pos"] = torch.zeros(N, 11)
    with pytest.raises(ValueError, match=r"'dof_pos' has shape \(4, 11\)"):
        policy.act(terms)
    del terms["dof_pos"]
    with pytest.raises(ValueError, match="needs observation term 'dof_pos'"):
        policy.act(terms)


def test_the_envs_rsl_rl_observation_given_to_a_policy_says_to_pass_its_terms(tmp_path):
    """env.step's first value is rsl_rl's TensorDict of flat vectors; torch refuses its truth value, so
    sorting it for the error message used to raise an unrelated RuntimeError."""
    from tensordict import TensorDict
    obs = TensorDict({"policy": torch.zeros(N, 48), "critic": torch.zeros(N, 48)}, batch_size=[N])
    _save_v1(tmp_path / "m.pt", _mlp([48, 16, 12]), _mlp([48, 16, 1]))
    hint = r"got \['critic', 'policy'\]: the env's flat rsl_rl observation; policies act on its named terms \(`env.terms`\)"
    with pytest.raises(ValueError, match=hint):
        load_expert(tmp_path / "m.pt", num_envs=N).act(obs)
    with pytest.raises(KeyError, match=hint):
        load_policy("gait", num_envs=N).act(obs)


def test_load_policy_routes_experts_and_refuses_trained_models_in_load_expert(tmp_path):
    _save_v1(tmp_path / "m.pt", _mlp([48, 16, 12]), _mlp([48, 16, 1]))
    assert load_policy(tmp_path / "m.pt", num_envs=N).policy_id.startswith("rsl_rl_v1:")
    torch.save({"kind": "quadforge-policy", "format": 1}, tmp_path / "q.pt")
    assert detect_kind(tmp_path / "q.pt") == "quadforge"
    with pytest.raises(ValueError, match="quadforge.experts.registry.load_policy"):
        load_expert(tmp_path / "q.pt", num_envs=N)


def test_training_deploy_routes_expert_checkpoints_here(tmp_path):
    from quadforge.experts.registry import load_policy as deploy_load_policy
    actor = _mlp([48, 16, 12])
    _save_v1(tmp_path / "m.pt", actor, _mlp([48, 16, 1]))
    policy = deploy_load_policy(tmp_path / "m.pt", num_envs=N)
    terms = _terms(7)
    with torch.no_grad():
        torch.testing.assert_close(policy.act(terms), actor(LEGGED_GYM_48.build(_isaac(terms)))[:, ISAAC])


def test_robot_mismatch_with_a_checkpoint_trained_here(tmp_path):
    actor = _rsl_rl5_actor(normalization=False)
    meta = {"robot": "go1", "policy_layout": LEGGED_GYM_48.to_dict(), "action_scale": 0.25}
    torch.save({"actor_state_dict": actor.state_dict(), "infos": {"quadforge": meta}}, tmp_path / "m.pt")
    with pytest.raises(ValueError, match="trained on robot 'go1', got robot 'aliengo'"):
        load_expert(tmp_path / "m.pt", robot="aliengo", num_envs=N)


def test_policy_id_follows_the_files_bytes_not_its_place_or_time(tmp_path):
    """A copy, a fresh clone's checkpoint or a same-seed rerun's identical file keeps its id; other weights
    in the same place get a new one."""
    import os
    import shutil

    from quadforge.experts.policy import checkpoint_policy_id

    a = tmp_path / "a" / "model.pt"
    a.parent.mkdir()
    a.write_bytes(b"weights one")
    b = tmp_path / "b" / "model.pt"
    b.parent.mkdir()
    shutil.copyfile(a, b)
    os.utime(b, ns=(1, 1))
    assert checkpoint_policy_id("mlp", a) == checkpoint_policy_id("mlp", b)
    a.write_bytes(b"weights two")
    assert checkpoint_policy_id("mlp", a) != checkpoint_policy_id("mlp", b)
    assert checkpoint_policy_id("mlp", a).startswith("mlp:model.pt:")


def test_a_checkpoint_written_here_is_known_by_its_weights_not_its_recorded_paths(tmp_path):
    """A same-seed rerun into another folder records other paths (provenance: the store's) in its file: the
    same weights keep one id; other weights or another model config get another."""
    from quadforge.experts.registry import load_policy
    from quadforge.models.checkpoint import load_checkpoint, save_checkpoint
    src = Path(__file__).resolve().parents[2] / "experts" / "checkpoints" / "vla_rt1.pt"
    ckpt = load_checkpoint(src)
    ckpt.provenance = {**(ckpt.provenance or {}), "store": str(tmp_path / "elsewhere" / "store")}
    moved = save_checkpoint(tmp_path / "b" / "vla_rt1.pt", ckpt)
    assert moved.read_bytes() != src.read_bytes()
    ids = [load_policy(p, 1, task="quard:go_to").policy_id for p in (src, moved)]
    assert ids[0] == ids[1]
    name = next(iter(ckpt.state_dict))
    ckpt.state_dict[name] = ckpt.state_dict[name] + 1
    assert load_policy(save_checkpoint(tmp_path / "c" / "vla_rt1.pt", ckpt), 1, task="quard:go_to").policy_id != ids[0]
