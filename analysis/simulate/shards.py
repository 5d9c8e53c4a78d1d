"""What ntpbench's layouts hold and move, computed from the model's dimensions: the presets, the parameter
count, each rank's shard, the configuration a policy gives a membership, and the bytes a heal moves between
ranks. A port of the rules in src/model/model_config.cpp (presets, parameter_count), src/model/param_layout.cpp
(the tensors and how they shard), src/model/shard_map.cpp and src/parallel/ntp_layout.cpp (even and core/extra
splits), src/parallel/configuration.cpp (plan_configuration) and src/train/trainer_recovery.cpp (which replicas
heal, from whom). `analysis simulate --from-run` charges recoveries from these figures; a run's `heal` and
`restore` events hold the bytes ntpbench moved, summed over ranks, to check them against.

A rank's healed or restored state is 12 bytes per parameter: the fp32 parameter and AdamW's two moments
(gradients are recomputed, not moved).
"""
from __future__ import annotations

from dataclasses import dataclass, field

STATE_BYTES_PER_PARAM = 12          # fp32 parameter + AdamW m and v
NOWHERE = -1

# V, context, L, H, d (, family, KV heads, FFN): src/model/model_config.cpp kPresets.
PRESETS = {
    "tiny": (256, 32, 2, 4, 64),
    "small": (256, 128, 4, 8, 256),
    "gpt2": (50257, 1024, 12, 12, 768),
    "gpt2-medium": (50257, 1024, 24, 16, 1024),
    "gpt2-large": (50257, 1024, 36, 20, 1280),
    "gpt2-xl": (50257, 1024, 48, 25, 1600),
    "llama-tiny": (256, 32, 2, 8, 64, "llama", 4, 176),
    "llama-small": (256, 128, 4, 8, 256, "llama", 4, 688),
    "llama-8b": (128256, 8192, 32, 32, 4096, "llama", 8, 14336),
    # Mixtures of experts (docs/moe.md): ffn is one expert's; then experts and top-k.
    "moe-tiny": (256, 32, 2, 8, 64, "llama", 4, 64, 8, 2),
    "mixtral-8x7b": (32000, 32768, 32, 32, 4096, "llama", 8, 14336, 8, 2),
    "moe-fine-16b": (102400, 4096, 28, 16, 2048, "llama", 16, 1408, 64, 6),
}

DIMS = ("heads", "mlp", "vocab", "experts")  # the sharded dimensions, in ntpbench's order (kShardDims)


@dataclass(frozen=True)
class Model:
    vocab: int = 256
    context: int = 32
    layers: int = 2
    heads: int = 4
    hidden: int = 64
    family: str = "gpt2"
    kv_heads: int = 0
    ffn: int = 0
    experts: int = 0   # a mixture of experts: whole experts per rank, the MLP dimension then has no units
    top_k: int = 0

    @classmethod
    def preset(cls, name: str) -> "Model":
        if name not in PRESETS:
            raise ValueError(f"unknown preset '{name}' (known: {', '.join(PRESETS)})")
        return cls(*PRESETS[name])

    @classmethod
    def from_config(cls, cfg: dict) -> "Model":
        """The model of a run's resolved configuration (root attribute `config`, key `model`), else its preset."""
        m = cfg.get("model")
        if isinstance(m, dict) and m:
            return cls(vocab=int(m["vocab"]), context=int(m["context"]), layers=int(m["layers"]),
                       heads=int(m["heads"]), hidden=int(m["hidden"]), family=str(m.get("family", "gpt2")),
                       kv_heads=int(m.get("kv_heads", 0) or 0), ffn=int(m.get("ffn", 0) or 0),
                       experts=int(m.get("experts", 0) or 0), top_k=int(m.get("top_k", 0) or 0))
        return cls.preset(str(cfg.get("preset", "small")))

    @property
    def llama(self) -> bool:
        return self.family == "llama"

    @property
    def moe(self) -> bool:
        return self.llama and self.experts > 0

    @property
    def head_size(self) -> int:
        return self.hidden // self.heads

    @property
    def mlp(self) -> int:
        return self.ffn if self.llama and self.ffn > 0 else 4 * self.hidden

    @property
    def kv(self) -> int:
        return self.kv_heads if self.llama and self.kv_heads > 0 else self.heads

    @property
    def head_units(self) -> int:
        return self.kv if self.llama else self.heads

    def units(self, dim: str) -> int:
        return {"heads": self.head_units, "mlp": 0 if self.moe else self.mlp, "vocab": self.vocab,
                "experts": self.experts if self.moe else 0}[dim]


def parameter_count(m: Model) -> int:
    """The full model's parameters (GPT-2: LM head tied to the token embedding); parameter_count()."""
    d, V, S, L, f = m.hidden, m.vocab, m.context, m.layers, m.mlp
    if m.llama:
        q, kv = m.heads * m.head_size, m.kv * m.head_size
        mlp = m.experts * 3 * d * f + m.experts * d if m.moe else 3 * d * f  # every expert, and the router
        return 2 * V * d + L * (2 * d + d * q + 2 * d * kv + q * d + mlp) + d
    per_layer = 2 * d + 3 * d * d + 3 * d + d * d + d + 2 * d + 4 * d * d + 4 * d + 4 * d * d + d
    return V * d + S * d + L * per_layer + 2 * d


@dataclass(frozen=True)
class Tensor:
    dim: str           # "replicated" or one of DIMS
    unit_elems: int    # floats per unit (the whole tensor when replicated)
    layer: int = -1    # its transformer layer, -1 for the ends
    home: str = "layer"  # layer, input, output, both (GPT-2's tied wte)


def model_tensors(m: Model) -> list[Tensor]:
    """gpt2_tensors / llama_tensors: how each tensor shards."""
    d, hs, f = m.hidden, m.head_size, m.mlp
    t: list[Tensor] = []
    if m.llama:
        qg = (m.heads // m.kv) * hs
        t.append(Tensor("vocab", d, home="input"))
        for layer in range(m.layers):
            t += [Tensor("replicated", d, layer), Tensor("heads", qg * d, layer), Tensor("heads", hs * d, layer),
                  Tensor("heads", hs * d, layer), Tensor("heads", qg * d, layer), Tensor("replicated", d, layer)]
            if m.moe:  # each expert's gate, up and down projections, and the replicated router
                t += [Tensor("experts", f * d, layer)] * 3 + [Tensor("replicated", m.experts * d, layer)]
            else:
                t += [Tensor("mlp", d, layer), Tensor("mlp", d, layer), Tensor("mlp", d, layer)]
        t += [Tensor("replicated", d, home="output"), Tensor("vocab", d, home="output")]
        return t
    t += [Tensor("vocab", d, home="both"), Tensor("replicated", m.context * d, home="input")]
    for layer in range(m.layers):
        t += [Tensor("replicated", d, layer), Tensor("replicated", d, layer),          # ln_1
              Tensor("heads", 3 * hs * d, layer), Tensor("heads", 3 * hs, layer),      # c_attn
              Tensor("heads", hs * d, layer), Tensor("replicated", d, layer),          # attn.c_proj
              Tensor("replicated", d, layer), Tensor("replicated", d, layer),          # ln_2
              Tensor("mlp", d, layer), Tensor("mlp", 1, layer),                        # c_fc
              Tensor("mlp", d, layer), Tensor("replicated", d, layer)]                 # mlp.c_proj
    t += [Tensor("replicated", d, home="output"), Tensor("replicated", d, home="output")]
    return t


def stage_holds(m: Model, stage: int, stages: int, t: Tensor) -> bool:
    """StageRange::of(m, stage, stages).holds(t): layers split evenly, the earlier stages the smaller share."""
    first, end = stage * m.layers // stages, (stage + 1) * m.layers // stages
    if t.home == "layer":
        return first <= t.layer < end
    if t.home == "input":
        return stage == 0
    if t.home == "output":
        return stage == stages - 1
    return stage == 0 or stage == stages - 1


def even_owners(units: int, ranks: int) -> list[int]:
    """ShardMap::even: contiguous blocks, the first `units % ranks` ranks one unit more."""
    base, extra = divmod(units, ranks)
    out: list[int] = []
    for r in range(ranks):
        out += [r] * (base + (1 if r < extra else 0))
    return out


def core_extra_owners(units: int, n: int, n2: int) -> list[int]:
    """core_extra_map: chunk i of an even split over n2 on core rank i, the chunks' tails on the extra ranks. A
    dimension the model lacks (a dense model's experts, a mixture's MLP) has no units."""
    if not 1 <= n2 <= n or 0 < units < n:
        raise ValueError(f"NTP layout: {units} units over {n} ranks at sync degree {n2}")
    chunks, share = even_owners(units, n2), even_owners(units, n)
    count = [share.count(r) for r in range(n)]
    owner = [-1] * units
    tails: list[int] = []
    for i in range(n2):
        c = [u for u in range(units) if chunks[u] == i]
        for k, u in enumerate(c):
            if k < count[i]:
                owner[u] = i
            else:
                tails.append(u)
    nxt = 0
    for r in range(n2, n):
        for _ in range(count[r]):
            owner[tails[nxt]] = r
            nxt += 1
    return owner


HEALTHY, DEGRADED, DOWN = 0, 1, 2


@dataclass
class ReplicaPlan:
    ranks: list = field(default_factory=list)   # world ranks, stage-major (empty when down)
    layout: dict = field(default_factory=dict)  # dim -> owner (TP index) of each unit
    stages: int = 1
    batch: int = 0
    state: int = DOWN

    @property
    def active(self) -> bool:
        return self.state != DOWN

    @property
    def degree(self) -> int:
        return len(self.ranks) // self.stages

    def stage_ranks(self, s: int) -> list:
        return self.ranks[s * self.degree:(s + 1) * self.degree]


@dataclass
class Configuration:
    replicas: list
    alive: list

    @property
    def active_replicas(self) -> int:
        return sum(rp.active for rp in self.replicas)

    def degrees(self) -> tuple:
        return tuple(rp.degree if rp.active else 0 for rp in self.replicas)

    def batches(self) -> tuple:
        return tuple(rp.batch for rp in self.replicas)

    def states(self) -> tuple:
        return tuple(rp.state for rp in self.replicas)

    def replica_of(self, w: int) -> int:
        for q, rp in enumerate(self.replicas):
            if rp.active and w in rp.ranks:
                return q
        return -1

    def tp_index_of(self, w: int) -> int:
        q = self.replica_of(w)
        return -1 if q < 0 else self.replicas[q].ranks.index(w) % self.replicas[q].degree

    def stage_of(self, w: int) -> int:
        q = self.replica_of(w)
        return -1 if q < 0 else self.replicas[q].ranks.index(w) // self.replicas[q].degree


def plan_configuration(policy: str, m: Model, tp: int, pp: int, replicas: int, B: int, alive, M: int = 1) -> Configuration:
    """plan_configuration: who trains, at which degree, with which batch, for live ranks `alive`."""
    alive = [bool(a) for a in alive]
    everyone = all(alive)
    reps = []
    for r in range(replicas):
        rp = ReplicaPlan(stages=pp)
        base = r * tp * pp
        live = [[base + s * tp + j for j in range(tp) if alive[base + s * tp + j]] for s in range(pp)]
        n = min([tp] + [len(x) for x in live])
        for x in live:
            rp.ranks += x[:n]
        active = {"dp-drop": n == tp, "restart": everyone, "ntp": n > 0, "ntp-pw": n > 0}.get(policy, n == tp)
        if not active:
            rp.ranks = []
            reps.append(rp)
            continue
        rp.state = HEALTHY if n == tp else DEGRADED
        rp.batch = B
        if n < tp and policy == "ntp":
            rp.batch = max(1, B * n // tp) if M == 1 else B // M * max(1, M * n // tp)
        reps.append(rp)
    degrees = [rp.degree for rp in reps if rp.active]
    n2 = min(degrees) if degrees else 0
    for rp in reps:
        if rp.active:
            rp.layout = {d: core_extra_owners(m.units(d), rp.degree, n2) for d in DIMS}
    return Configuration(reps, alive)


def shard_params(m: Model, layout: dict, tp_index: int, stage: int = 0, stages: int = 1, padded: bool = True) -> int:
    """Floats one rank's model holds (Model::param_count(): each tensor padded to 16 floats, as its arena)."""
    total = 0
    for t in model_tensors(m):
        if not stage_holds(m, stage, stages, t):
            continue
        elems = t.unit_elems if t.dim == "replicated" else t.unit_elems * layout[t.dim].count(tp_index)
        total += (elems + 15) // 16 * 16 if padded else elems
    return total


def restore_rank_bytes(m: Model, cfg: Configuration) -> list:
    """Bytes each rank reads back from a checkpoint (Trainer::restore): its shard's state, 0 outside a replica."""
    out = [0] * len(cfg.alive)
    for rp in cfg.replicas:
        if not rp.active:
            continue
        for k, w in enumerate(rp.ranks):
            out[w] = STATE_BYTES_PER_PARAM * shard_params(m, rp.layout, k % rp.degree, k // rp.degree, rp.stages)
    return out


def state_survives(m: Model, old: Configuration, valid, alive, lost=None) -> bool:
    """Trainer::current_state_survives: every unit of every sharded dimension, on every stage, held by a live
    rank of a replica whose state is current."""
    holds = _holds(alive, lost)
    stages = old.replicas[0].stages if old.replicas else 1
    anything = False
    for st in range(stages):
        for d in DIMS:
            held = [False] * m.units(d)
            for q, rp in enumerate(old.replicas):
                if not valid[q] or not rp.active:
                    continue
                ranks = rp.stage_ranks(st)
                for u, owner in enumerate(rp.layout[d]):
                    if holds(ranks[owner]):
                        held[u] = anything = True
            if not all(held):
                return False
    return anything


def _holds(alive, lost):
    return lambda w: bool(alive[w]) and not (lost and lost[w])


def changed_replicas(old: Configuration, valid, new: Configuration, lost=None) -> list:
    """changed_replicas: active now, and stale, newly active, with other ranks, a rank that lost its state, or
    another layout."""
    out = []
    for q, n in enumerate(new.replicas):
        o = old.replicas[q]
        lost_one = any(lost and lost[w] for w in n.ranks)
        out.append(n.active and (not valid[q] or not o.active or n.ranks != o.ranks or lost_one
                                 or n.layout != o.layout))
    return out


def heal_traffic(m: Model, old: Configuration, valid, new: Configuration, lost=None):
    """Bytes each rank sends and receives in the heal from `old` (its replicas' state current where `valid`) to
    `new` (Trainer::heal): per changed replica and stage, every sharded unit from its own old owner when that
    rank lives and holds it, else from the owner in the first current replica; the replicated tensors from the
    rank itself when it holds a current copy, else from the first live rank of a current replica's stage.
    Returns (sent, received), lists over world ranks."""
    ranks = len(new.alive)
    sent, recv = [0] * ranks, [0] * ranks
    holds = _holds(new.alive, lost)
    tensors = model_tensors(m)

    def current(p):
        return bool(valid[p]) and old.replicas[p].active

    def old_owner(p, s, d, u):
        o = old.replicas[p]
        return o.ranks[s * o.degree + o.layout[d][u]]

    def source(q, s, d, u):
        if current(q) and holds(old_owner(q, s, d, u)):
            return old_owner(q, s, d, u)
        for p in range(len(old.replicas)):
            if current(p) and holds(old_owner(p, s, d, u)):
                return old_owner(p, s, d, u)
        return NOWHERE

    def donor(s):
        for p in range(len(old.replicas)):
            if current(p):
                for w in old.replicas[p].stage_ranks(s):
                    if holds(w):
                        return w
        return NOWHERE

    for q, changed in enumerate(changed_replicas(old, valid, new, lost)):
        if not changed:
            continue
        target = new.replicas[q]
        n = target.degree
        for s in range(target.stages):
            on_stage = [t for t in tensors if stage_holds(m, s, target.stages, t)]
            for d in DIMS:
                per_unit = STATE_BYTES_PER_PARAM * sum(t.unit_elems for t in on_stage if t.dim == d)
                for u, owner in enumerate(target.layout[d]):
                    src, dst = source(q, s, d, u), target.ranks[s * n + owner]
                    if src == NOWHERE:
                        raise ValueError(f"no live rank holds unit {u} of {d} (stage {s}): ntpbench restores instead")
                    if src != dst:
                        sent[src] += per_unit
                        recv[dst] += per_unit
            rep = STATE_BYTES_PER_PARAM * sum(t.unit_elems for t in on_stage if t.dim == "replicated")
            giver = donor(s)
            for w in target.stage_ranks(s):
                oq = old.replica_of(w)
                own = oq >= 0 and bool(valid[oq]) and not (lost and lost[w])
                src = w if own else giver
                if src != w:
                    sent[src] += rep
                    recv[w] += rep
    return sent, recv
