"""The emulated machines' profiles (jobs/machines/*.yaml, jobs/machines/README.md), read with PyYAML: the one
reader of them on the Python side. ntpbench embeds the same files when it is built; every recovery figure the
simulator or `--from-run` charges comes from here, never from a constant of its own.

    p = load_profile("dgx-a100")
    p.recovery["replace"]      # 20.0 (s), p.sources["replace"] its source
    p.scale_out_gbps           # 25.0 (GB/s per GPU), what a heal crosses

`custom` (ntpbench's `--machine custom`, rates from the command line) charges dgx-a100's recovery, as ntpbench
does (`kCustomRecoveryMachine`, src/timing/machine_profile.hpp); its rates are the run's own.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import yaml

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MACHINES_DIR = os.path.join(REPO, "jobs", "machines")
# The machine whose recovery a `custom` machine is charged (src/timing/machine_profile.hpp).
CUSTOM_RECOVERY_MACHINE = "dgx-a100"
# Seconds, except checkpoint_gbps (GB/s per GPU); jobs/machines/README.md.
RECOVERY_PARTS = ("detect", "repair", "reinit", "reconfigure", "replace", "takeover", "restart", "checkpoint_gbps")
RATES = ("bf16_tflops", "tf32_tflops", "fp32_tflops", "memory_gbps", "scale_up_gbps", "scale_out_gbps")


class ProfileError(ValueError):
    """A profile that is missing or malformed (the message names the file and the field)."""


@dataclass(frozen=True)
class Profile:
    name: str
    path: str
    source: str
    bf16_tflops: float
    tf32_tflops: float
    fp32_tflops: float
    memory_gbps: float
    scale_up_gbps: float     # per GPU, each way (the scale-up domain)
    scale_out_gbps: float    # per GPU (its NIC): heals cross it
    latency_us: float        # one message, either link
    gpus_per_domain: int
    recovery: dict = field(default_factory=dict)   # part -> value (RECOVERY_PARTS)
    sources: dict = field(default_factory=dict)    # part -> its source

    def heal_seconds(self, rank_bytes: float) -> float:
        """A heal whose most loaded rank moves `rank_bytes` over the scale-out link (0 bytes: no heal, 0 s)."""
        return 0.0 if rank_bytes <= 0 else self.latency_us * 1e-6 + rank_bytes / (self.scale_out_gbps * 1e9)

    def storage_seconds(self, rank_bytes: float) -> float:
        """`rank_bytes` written to or read from checkpoint storage by one GPU."""
        return rank_bytes / (self.recovery["checkpoint_gbps"] * 1e9)


def machines_dir(where: str | None = None) -> str:
    return where or MACHINES_DIR


def profile_names(where: str | None = None) -> list[str]:
    """The profiles in the directory (their `name` fields), then `custom`."""
    d = machines_dir(where)
    try:
        files = sorted(f for f in os.listdir(d) if f.endswith((".yaml", ".yml")))
    except OSError as e:
        raise ProfileError(f"{d}: {e}") from e
    return [_load_file(os.path.join(d, f)).name for f in files] + ["custom"]


def _need(node: dict, key: str, what: str):
    if not isinstance(node, dict) or key not in node or node[key] is None:
        raise ProfileError(f"{what}: no '{key}'")
    return node[key]


def _positive(node: dict, key: str, what: str) -> float:
    try:
        v = float(_need(node, key, what))
    except (TypeError, ValueError) as e:
        raise ProfileError(f"{what}: '{key}' is not a number") from e
    if not v > 0:
        raise ProfileError(f"{what}: '{key}' must be above 0")
    return v


def _load_file(path: str) -> Profile:
    """One profile, checked as ntpbench's parser checks it (parse_machine_profile)."""
    try:
        with open(path) as f:
            n = yaml.safe_load(f)
    except (OSError, yaml.YAMLError) as e:
        raise ProfileError(f"{path}: {e}") from e
    rec = _need(n, "recovery", path)
    values, sources = {}, {}
    for part in RECOVERY_PARTS:
        fig = _need(rec, part, path)
        where = f"{path}: recovery.{part}"
        try:
            v = float(fig.get("value", -1)) if isinstance(fig, dict) else -1.0
        except (TypeError, ValueError):
            v = -1.0
        if not v >= 0:
            raise ProfileError(f"{where} needs a value of 0 or more")
        if not isinstance(fig, dict) or not fig.get("source"):
            raise ProfileError(f"{where} needs a source")
        values[part], sources[part] = v, str(fig["source"])
    if not values["checkpoint_gbps"] > 0:
        raise ProfileError(f"{path}: recovery.checkpoint_gbps must be above 0")
    try:
        latency = float(_need(n, "latency_us", path))
        domain = int(_need(n, "gpus_per_domain", path))
    except (TypeError, ValueError) as e:
        raise ProfileError(f"{path}: {e}") from e
    return Profile(name=str(_need(n, "name", path)), path=path, source=str(_need(n, "source", path)),
                   **{k: _positive(n, k, path) for k in RATES}, latency_us=latency, gpus_per_domain=domain,
                   recovery=values, sources=sources)


def load_profile(name: str, where: str | None = None) -> Profile:
    """The profile named `name` (its file's `name` field; the file is normally jobs/machines/<name>.yaml).
    `custom`: dgx-a100's profile (its recovery is what ntpbench charges a custom machine)."""
    d = machines_dir(where)
    wanted = CUSTOM_RECOVERY_MACHINE if name == "custom" else name
    direct = os.path.join(d, f"{wanted}.yaml")
    if os.path.exists(direct):
        p = _load_file(direct)
        if p.name == wanted:
            return p
    try:
        files = sorted(f for f in os.listdir(d) if f.endswith((".yaml", ".yml")))
    except OSError as e:
        raise ProfileError(f"{d}: {e}") from e
    for f in files:
        p = _load_file(os.path.join(d, f))
        if p.name == wanted:
            return p
    known = ", ".join(_load_file(os.path.join(d, f)).name for f in files)
    raise ProfileError(f"unknown machine '{name}' in {d} ({known}, or custom)")
