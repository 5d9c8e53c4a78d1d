"""Load one ntpbench results file (HDF5 schema v1, results/README.md) into pandas / numpy.

    run = load_run("results/demo/ntp.h5")
    run.attrs            # root attributes, bytes decoded to str, numpy scalars to Python
    run.steps            # DataFrame, one row per executed step (all /steps fields)
    run.replicas         # dict name -> ndarray [steps, replicas] (tp_degree, batch, state)
    run.phase_times      # ndarray [steps, ranks, phases] seconds, names in run.phases
    run.compute_share    # ndarray [steps, ranks]: each rank's share of its replica's compute (or None)
    run.tokens_per_expert  # ndarray [steps, experts]: a mixture of experts' kept assignments (or None)
    run.events           # DataFrame (empty, with the documented columns, when /events is absent)
    run.summary          # dict of /summary attributes, or None when the run was cut short

A file whose `schema_version` is not one this module knows is refused with SchemaError; so is a
schema-1 file that lacks a required dataset or /steps field.
"""
from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import h5py
import numpy as np
import pandas as pd

# Schema 2: under paced timing /steps and /events are on the emulated machine's clock, with this
# host's run clock beside them (host_t_start, host_t_end; host_time, host_duration). A schema-1 file
# has only the run clock: its host columns are its own.
SUPPORTED_SCHEMAS = ("1", "2")

STEP_FIELDS = (
    "step", "t_start", "t_end", "sample_begin", "samples", "tokens", "tokens_committed", "loss",
    "grad_norm", "lr", "flops", "mfu", "live_ranks", "active_replicas", "recovery_seconds",
    "idle_seconds", "paced_overrun",
)
REPLICA_DATASETS = ("tp_degree", "batch", "state")
EVENT_FIELDS = ("time", "step", "kind", "rank", "replica", "bytes", "duration", "detail")
EVENT_DTYPES = {"time": "float64", "step": "int64", "kind": "object", "rank": "int32",
                "replica": "int32", "bytes": "float64", "duration": "float64", "detail": "object",
                "host_time": "float64", "host_duration": "float64"}
PHASES = ("forward", "backward", "tp_comm", "dp_comm", "pp_comm", "reshard", "optimizer", "recovery", "revival",
          "idle", "other")
SUMMARY_KEYS = (
    "steps", "tokens", "tokens_committed", "wall_seconds", "step_seconds", "productive_seconds",
    "recovery_seconds", "idle_seconds", "throughput_tokens_per_s", "goodput_tokens_per_s", "ettr",
    "healthy_throughput_tokens_per_s", "goodput_ratio", "mfu", "failures", "revivals",
    "recovery_detect_seconds", "recovery_reconfigure_seconds", "recovery_heal_seconds",
    "recovery_recompute_seconds", "recovery_lost_seconds", "recovery_repair_seconds", "heal_bytes",
    "paced_overrun_steps", "final_loss", "recovery_spawn_seconds", "recovery_spare_seconds", "spares_used",
    "training_steps", "paced_overrun_share", "paced_link_overrun_share", "host_wall_seconds",
)
# Figures files written before them lack: not recomputed against those files' /summary.
LATER_SUMMARY_KEYS = ("recovery_spawn_seconds", "recovery_spare_seconds", "spares_used", "training_steps",
                      "paced_overrun_share", "paced_link_overrun_share", "host_wall_seconds")
# Replica states in /replicas/state.
HEALTHY, DEGRADED, DOWN = 0, 1, 2


def paced_status(run) -> str:
    """`overran` when a paced run's real time ran past its emulated time beyond the limit (/summary
    `status`, results/README.md), else `ok` (wall timing, and files from before the verdict)."""
    status = (run.summary or {}).get("status", "ok")
    return status.decode() if isinstance(status, bytes) else str(status)


class SchemaError(ValueError):
    """The file is not an ntpbench results file this package can read."""


def _plain(value: Any) -> Any:
    """HDF5 attribute value -> plain Python (bytes -> str, numpy scalar -> int/float)."""
    if isinstance(value, (bytes, np.bytes_)):
        return value.decode("utf-8", "replace")
    if isinstance(value, np.ndarray):
        if value.dtype.kind in "SO":
            return [_plain(v) for v in value.tolist()]
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


def _decode_column(col: np.ndarray) -> np.ndarray:
    if col.dtype.kind == "S":
        return np.array([v.decode("utf-8", "replace").rstrip("\x00") for v in col], dtype=object)
    if col.dtype.kind == "O":
        return np.array([_plain(v) for v in col], dtype=object)
    return col


@dataclass
class Run:
    path: str
    attrs: dict
    steps: pd.DataFrame
    replicas: dict
    phase_times: np.ndarray
    phases: list
    events: pd.DataFrame
    summary: dict | None
    notes: list = field(default_factory=list)
    # [steps, ranks]: each rank's share of its replica's compute (/ranks/compute_share; None in
    # files written before it).
    compute_share: np.ndarray | None = None
    # [steps, experts]: the assignments each expert kept (/moe/tokens_per_expert; -1 in a row whose
    # reports were not gathered; None for a dense model and in files written before it).
    tokens_per_expert: np.ndarray | None = None

    @property
    def name(self) -> str:
        return os.path.basename(self.path)

    @property
    def complete(self) -> bool:
        return self.summary is not None

    @property
    def policy(self) -> str:
        return str(self.attrs.get("policy", "?"))

    @property
    def tp(self) -> int:
        return int(self.attrs.get("tp", 0))

    @property
    def pp(self) -> int:
        """Pipeline stages (runs recorded before pipeline parallelism have none: 1)."""
        return int(self.attrs.get("pp", 1))

    @property
    def dp(self) -> int:
        return int(self.attrs.get("replicas", 0))

    @property
    def ranks(self) -> int:
        return int(self.attrs.get("ranks", 0))

    @property
    def config(self) -> dict:
        try:
            return json.loads(self.attrs.get("config", "{}"))
        except (TypeError, ValueError):
            return {}

    def step_seconds(self) -> np.ndarray:
        return (self.steps["t_end"] - self.steps["t_start"]).to_numpy(dtype=float)


def paced_machine(run) -> dict:
    """The root attribute `paced_machine` as a dict ({} for a run under wall timing)."""
    pm = run.attrs.get("paced_machine")
    return json.loads(pm) if isinstance(pm, str) and pm else dict(pm or {})


def _read_table(f: h5py.File, path: Any, name: str, required: tuple | list, why: str = "") -> pd.DataFrame:
    """A compound dataset as a DataFrame; SchemaError naming the fields it lacks."""
    raw = f[name][()]
    names = raw.dtype.names or ()
    lacking = [n for n in required if n not in names]
    if lacking:
        raise SchemaError(f"{path}: /{name} lacks field(s) {', '.join(lacking)}{why}")
    return pd.DataFrame({n: _decode_column(raw[n]) for n in names})


def empty_events() -> pd.DataFrame:
    return pd.DataFrame({k: pd.Series(dtype=t) for k, t in EVENT_DTYPES.items()})


# A running job's file can be read while it is written (ntpbench's writer takes no file lock,
# results/README.md); a read that lands in the middle of a write fails, and is tried once more.
RETRY_DELAY_S = 0.3


def load_or_say(path: str | os.PathLike) -> Run | None:
    """load_run, or None after printing why the file cannot be read (the commands then exit 1)."""
    try:
        return load_run(path)
    except (SchemaError, OSError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return None


def load_run(path: str | os.PathLike) -> Run:
    path = os.fspath(path)
    for attempt in (1, 2):
        try:
            return _load_once(path)
        except SchemaError:
            raise
        except (OSError, KeyError, ValueError, RuntimeError) as e:
            if attempt == 2 or not os.path.exists(path):
                what = "open" if isinstance(e, _OpenError) else "read"
                raise SchemaError(f"{path}: cannot {what} as HDF5 ({e.__cause__ or e})") from e
            time.sleep(RETRY_DELAY_S)
    raise AssertionError("not reached")


class _OpenError(OSError):
    pass


def _load_once(path: str) -> Run:
    try:
        f = h5py.File(path, "r")
    except OSError as e:
        raise _OpenError(str(e)) from e
    with f:
        attrs = {k: _plain(v) for k, v in f.attrs.items()}
        version = attrs.get("schema_version")
        if version is None:
            raise SchemaError(f"{path}: no root attribute 'schema_version'; not an ntpbench results file")
        version = str(version)
        if version not in SUPPORTED_SCHEMAS:
            raise SchemaError(
                f"{path}: schema_version {version!r} is not supported (this analysis reads schema "
                f"{', '.join(SUPPORTED_SCHEMAS)} as documented in results/README.md); re-run with an "
                f"ntpbench that writes schema 2")
        notes: list[str] = []

        missing = [d for d in ("steps", "replicas", "ranks/phase_times") if d not in f]
        if missing:
            raise SchemaError(f"{path}: required dataset(s) missing: {', '.join('/' + m for m in missing)}")
        steps = _read_table(f, path, "steps", STEP_FIELDS, " required by schema 1")
        for col, of in (("host_t_start", "t_start"), ("host_t_end", "t_end")):
            if col not in steps:
                steps[col] = steps[of]

        replicas = {}
        for name in REPLICA_DATASETS:
            if name not in f["replicas"]:
                raise SchemaError(f"{path}: /replicas/{name} missing")
            replicas[name] = np.asarray(f["replicas"][name][()])
        nrows = len(steps)
        for name, arr in replicas.items():
            if arr.ndim != 2 or arr.shape[0] != nrows:
                # A job killed between two appends can leave datasets one row apart: keep the common rows.
                notes.append(f"/replicas/{name} has shape {arr.shape}, /steps {nrows} rows")

        ds = f["ranks/phase_times"]
        phase_times = np.asarray(ds[()], dtype=float)
        phases_attr = _plain(ds.attrs.get("phases", ",".join(PHASES)))
        phases = ([p.strip() for p in phases_attr.split(",")] if isinstance(phases_attr, str)
                  else [str(p) for p in phases_attr])
        if phase_times.ndim != 3 or phase_times.shape[2] != len(phases):
            raise SchemaError(f"{path}: /ranks/phase_times shape {phase_times.shape} does not match "
                              f"{len(phases)} phase names")

        compute_share = (np.asarray(f["ranks/compute_share"][()], dtype=float)
                         if "ranks/compute_share" in f else None)
        tokens_per_expert = (np.asarray(f["moe/tokens_per_expert"][()], dtype=np.int64)
                             if "moe/tokens_per_expert" in f else None)

        if "events" in f:
            events = _read_table(f, path, "events", EVENT_FIELDS)
            if len(events) == 0:
                events = empty_events()
            for col, of in (("host_time", "time"), ("host_duration", "duration")):
                if col not in events:
                    events[col] = events[of]
        else:
            events = empty_events()
            notes.append("no /events (no kills, revivals or recovery recorded)")

        summary = None
        if "summary" in f:
            summary = {k: _plain(v) for k, v in f["summary"].attrs.items()}
        else:
            notes.append("no /summary: the run was cut short; figures are recomputed from the rows")

    # Keep the rows every per-step dataset holds (a crash can leave them a row apart).
    n = min([len(steps), phase_times.shape[0]] + [a.shape[0] for a in replicas.values()]
            + [a.shape[0] for a in (compute_share, tokens_per_expert) if a is not None])
    if n < len(steps):
        steps = steps.iloc[:n].reset_index(drop=True)
    replicas = {k: v[:n] for k, v in replicas.items()}
    phase_times = phase_times[:n]
    if compute_share is not None:
        compute_share = compute_share[:n]
    if tokens_per_expert is not None:
        tokens_per_expert = tokens_per_expert[:n]
    return Run(path=path, attrs=attrs, steps=steps, replicas=replicas, phase_times=phase_times,
               phases=phases, events=events, summary=summary, notes=notes, compute_share=compute_share,
               tokens_per_expert=tokens_per_expert)
