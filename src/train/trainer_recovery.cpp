// The Trainer's reconfiguration: a new membership, new communicators, and the shards each
// changed replica needs, healed from live peers with the one reshard primitive, or, when no live
// replica holds every shard, a restore from the last checkpoint. With pipeline stages every stage
// heals from the same stage: within its TP group, or from that stage of a live replica.
#include <algorithm>
#include <array>
#include <chrono>
#include <stdexcept>

#include "fault.hpp"
#include "h5.hpp"
#include "reshard.hpp"
#include "trainer.hpp"

namespace ntp {

namespace {

using Clock = std::chrono::steady_clock;

// What a heal needs to know about the old and the new configuration, seen from this rank.
struct HealView {
  const Configuration& old_cfg;
  const Holders& old;                  // who holds the old configuration's state
  const Configuration& new_cfg;
  std::vector<int> live_rank;          // world rank -> rank in the live communicator (kNowhere: dead)
  int me;                              // world rank
  bool i_hold;                         // this rank holds current state (old layout)
  int new_q;                           // this rank's replica after (-1: none)
  std::vector<TensorSpec> specs;
  int stages;

  bool alive(int w) const { return new_cfg.alive[w] != 0; }
  // Rank w lives and still holds its old state (a process that took over a lost rank holds none).
  bool holds(int w) const { return alive(w) && old.holds(w); }
  bool current(int p) const { return old.valid[p] && old_cfg.replicas[p].active(); }
  // The world rank that held unit u of dimension d on stage s of old replica p.
  int old_owner(int p, int s, ShardDim d, int u) const {
    const auto& o = old_cfg.replicas[p];
    return o.ranks[std::size_t(s) * o.degree() + o.layout.map(d).owner(u)];
  }

  // The world rank to take unit u of dimension d from, for stage s of replica q: the replica's own
  // old owner if current and holding, else the owner in the first current replica that holds it.
  int source(int q, int s, ShardDim d, int u) const {
    if (current(q) && holds(old_owner(q, s, d, u))) return old_owner(q, s, d, u);
    for (int p = 0; p < static_cast<int>(old_cfg.replicas.size()); ++p)
      if (current(p) && holds(old_owner(p, s, d, u))) return old_owner(p, s, d, u);
    return kNowhere;
  }

  // The first live rank of stage s of a current replica: the donor of replicated tensors for
  // ranks that hold none.
  int replicated_donor(int s) const {
    for (int p = 0; p < static_cast<int>(old_cfg.replicas.size()); ++p)
      if (current(p))
        for (int w : old_cfg.replicas[p].stage_ranks(s))
          if (holds(w)) return w;
    return kNowhere;
  }
  bool on_stage(int s, int t) const { return StageRange::of(*model, s, stages).holds(specs[t]); }
  const ModelConfig* model;
};

// Tensor t's weights and both AdamW moments in a model's arena (all null without a model).
std::array<float*, 3> state_of(Model* model, AdamW* opt, int t) {
  if (!model) return {nullptr, nullptr, nullptr};
  const std::size_t off = model->layout().slot(t).offset;
  return {model->params() + off, opt->m() + off, opt->v() + off};
}

// The segments of one heal exchange toward replica q, and the tensors that ride in them.
struct HealExchange {
  std::vector<ReshardPlan> parts;
  std::vector<ReshardTensor> tensors;
};

// One segment per sharded dimension of stage s: every unit from its source to the target's owner.
void add_sharded_parts(const HealView& v, int q, int stage, Model* held, AdamW* held_opt, Model* fresh,
                       AdamW* fresh_opt, int live_me, int live_size, HealExchange& x) {
  const auto& target = v.new_cfg.replicas[q];
  const int my_old_q = v.old_cfg.replica_of(v.me);
  // This rank serves units of the segment only from the stage it held.
  const bool serves = v.i_hold && v.old_cfg.stage_of(v.me) == stage;
  for (ShardDim d : kShardDims) {
    const int units = target.layout.map(d).units();
    std::vector<int> src(units), dst(units);
    for (int u = 0; u < units; ++u) {
      src[u] = v.live_rank[v.source(q, stage, d, u)];
      dst[u] = v.live_rank[target.ranks[std::size_t(stage) * target.degree() + target.layout.map(d).owner(u)]];
    }
    std::vector<int> rows;
    if (serves) rows = v.old_cfg.replicas[my_old_q].layout.map(d).local_rows(v.old_cfg.tp_index_of(v.me));
    const int segment = static_cast<int>(x.parts.size());
    x.parts.emplace_back(src, dst, live_me, live_size, serves ? &rows : nullptr);
    for (int t = 0; t < static_cast<int>(v.specs.size()); ++t) {
      if (v.specs[t].dim != d || !v.on_stage(stage, t)) continue;
      const auto s = state_of(serves ? held : nullptr, held_opt, t);
      const auto o = state_of(v.new_q == q && v.new_cfg.stage_of(v.me) == stage ? fresh : nullptr, fresh_opt, t);
      for (int j = 0; j < 3; ++j) x.tensors.push_back({s[j], o[j], v.specs[t].unit_elems, segment});
    }
  }
}

// One segment for the replicated tensors of stage s: one copy per rank of the target stage, each
// from the rank itself when it holds a current copy, else from the donor.
void add_replicated_part(const HealView& v, int q, int stage, Model* held, AdamW* held_opt, Model* fresh,
                         AdamW* fresh_opt, int live_me, int live_size, HealExchange& x) {
  const auto& target = v.new_cfg.replicas[q];
  const int n = target.degree();
  const int donor = v.replicated_donor(stage);
  std::vector<int> src(n), dst(n), rows(n, -1);
  for (int j = 0; j < n; ++j) {
    const int w = target.ranks[std::size_t(stage) * n + j];
    const int oq = v.old_cfg.replica_of(w);
    const bool own = oq >= 0 && v.old.valid[oq] && v.old.holds(w);
    src[j] = v.live_rank[own ? w : donor];
    dst[j] = v.live_rank[w];
    if (src[j] == live_me) rows[j] = 0;  // every copy it serves comes from its one buffer
  }
  const int segment = static_cast<int>(x.parts.size());
  const bool serves = v.i_hold && v.old_cfg.stage_of(v.me) == stage;
  x.parts.emplace_back(src, dst, live_me, live_size, serves ? &rows : nullptr);
  for (int t = 0; t < static_cast<int>(v.specs.size()); ++t) {
    if (v.specs[t].dim != ShardDim::Replicated || !v.on_stage(stage, t)) continue;
    const auto s = state_of(serves ? held : nullptr, held_opt, t);
    const auto o = state_of(v.new_q == q && v.new_cfg.stage_of(v.me) == stage ? fresh : nullptr, fresh_opt, t);
    for (int j = 0; j < 3; ++j) x.tensors.push_back({s[j], o[j], v.specs[t].unit_elems, segment});
  }
}

// Replicas that must be (re)built: active now, and stale, newly active, with other ranks, with a
// rank whose state was lost, or with another layout than before.
std::vector<char> changed_replicas(const Configuration& old_cfg, const Holders& old, const Configuration& cfg) {
  std::vector<char> changed(cfg.replicas.size(), 0);
  for (std::size_t q = 0; q < cfg.replicas.size(); ++q) {
    const auto& n = cfg.replicas[q];
    const auto& o = old_cfg.replicas[q];
    const bool same_layout = n.layout == o.layout;
    const bool lost_one = std::any_of(n.ranks.begin(), n.ranks.end(), [&](int w) { return !old.holds(w); });
    changed[q] = n.active() && (!old.valid[q] || !o.active() || n.ranks != o.ranks || lost_one || !same_layout);
  }
  return changed;
}

}  // namespace

// Is every unit of every sharded dimension, on every pipeline stage, held by a live rank of a
// replica whose state is current (it trained the last step)? Replicated tensors then survive too.
bool Trainer::current_state_survives(const Configuration& old_cfg, const Holders& old,
                                     const std::vector<char>& alive) const {
  const ModelConfig& m = o_.model;
  bool any = false;
  for (int st = 0; st < topo_.stages; ++st) {
    std::vector<std::vector<char>> held;
    for (ShardDim d : kShardDims) held.emplace_back(shard_units(m, d), 0);
    for (int q = 0; q < topo_.replicas; ++q) {
      const auto& rp = old_cfg.replicas[q];
      if (!old.valid[q] || !rp.active()) continue;
      const std::vector<int> ranks = rp.stage_ranks(st);
      for (std::size_t k = 0; k < kShardDims.size(); ++k) {
        const auto& map = rp.layout.map(kShardDims[k]);
        for (int u = 0; u < map.units(); ++u)
          if (alive[ranks[map.owner(u)]] && old.holds(ranks[map.owner(u)])) held[k][u] = 1, any = true;
      }
    }
    for (const auto& h : held)
      if (!std::all_of(h.begin(), h.end(), [](char c) { return c != 0; })) return false;
  }
  return any;
}

Reconfiguration Trainer::reconfigure(const std::vector<char>& alive) {
  Reconfiguration rec;
  const int me = topo_.world_rank;
  PhaseScope phase(clock_, Phase::Recovery);
  // Detect: one agreement round in which every member of the group states its logical rank and
  // whether it is alive (after a barrier, so that it does not also time the skew left by the
  // previous step). Logical ranks outside the group (dead processes) must be dead.
  group_->barrier();
  auto t0 = Clock::now();
  const std::vector<int> stated = group_->allgather(2 * me + (alive[me] ? 1 : 0));
  std::vector<char> seen(topo_.world_size, 0);
  for (int s : stated) {
    seen[s / 2] = 1;
    if ((s % 2 != 0) != (alive[s / 2] != 0)) throw std::logic_error("ranks disagree about the membership");
  }
  for (int r = 0; r < topo_.world_size; ++r)
    if (!seen[r] && alive[r]) throw std::logic_error("a rank counted alive is not in the group");
  rec.detect = seconds_since(t0);

  t0 = Clock::now();
  const Configuration old_cfg = cfg_;
  const Holders old = held_;
  cfg_ = plan_for(o_, topo_, alive, rank_speed_);
  rec.before = old_cfg.degrees();
  rec.after = cfg_.degrees();
  rec.changed = true;
  std::unique_ptr<Comm> old_tp = std::move(groups_.tp);  // kept alive while old models may still reference it
  try {
    build_comms();
    rec.reconfigure = seconds_since(t0);

    t0 = Clock::now();
    if (cfg_.active_replicas() == 0) {
      // Nobody trains: every state goes stale and is dropped.
      shard_.sync.reset(), shard_.opt.reset(), shard_.model.reset();
      held_.valid.assign(topo_.replicas, 0);
    } else {
      const bool complete = current_state_survives(old_cfg, old, alive);
      if (complete)
        heal(old_cfg, old, rec);
      else
        restore(rec);
      held_.valid.assign(topo_.replicas, 0);
      for (int q = 0; q < topo_.replicas; ++q) held_.valid[q] = cfg_.replicas[q].active();
    }
    held_.lost.clear();
  } catch (const PeerFailure&) {
    // A peer failed in the middle (building the groups, or a heal's exchange). A heal replaces
    // this rank's model only once every shard has arrived, so its state is still the old
    // configuration's: back to it (and to the TP group its model talks over), and the repair that
    // follows plans from there. The other new groups are rebuilt by the next reconfiguration.
    cfg_ = old_cfg;
    held_ = old;
    groups_.tp = std::move(old_tp);
    shard_.sync.reset();  // re-made by the next reconfiguration, over its groups
    throw;
  }
  const int q = cfg_.replica_of(me);
  if (q >= 0)
    shard_.sync = std::make_unique<GradSync>(cfg_, q, cfg_.tp_index_of(me), *groups_.tp, groups_.slot.get(),
                                             shard_.model->layout(), *device_.backend, clock_, pacer_);
  else
    shard_.sync.reset();
  rec.heal = seconds_since(t0);
  old_tp.reset();
  group_->barrier();  // everyone starts the next step together
  return rec;
}

Reconfiguration Trainer::forget(const std::vector<char>& alive) {
  held_.lost.resize(topo_.world_size, 0);
  for (int r = 0; r < topo_.world_size; ++r)
    if (!alive[r]) held_.lost[r] = 1;
  Reconfiguration rec;
  rec.before = rec.after = cfg_.degrees();
  return rec;
}

// Moves every shard a changed replica needs from a live, current holder: its own old owner when
// that rank lives, otherwise the owner in the first current replica. One exchange per changed
// replica over the live ranks: a segment per sharded dimension and one for the replicated
// tensors, params and both AdamW moments together.
void Trainer::heal(const Configuration& old_cfg, const Holders& old, Reconfiguration& rec) {
  const int me = topo_.world_rank;
  if (!groups_.live) {  // this rank is dead: it frees everything and takes no part
    shard_.sync.reset(), shard_.opt.reset(), shard_.model.reset();
    return;
  }
  HealView v{old_cfg, old, cfg_, std::vector<int>(topo_.world_size, kNowhere), me, false, cfg_.replica_of(me),
             model_tensors(o_.model), topo_.stages, &o_.model};
  for (int r = 0, k = 0; r < topo_.world_size; ++r)  // groups_.live is split ordered by logical rank
    if (cfg_.alive[r]) v.live_rank[r] = k++;
  const int my_old_q = old_cfg.replica_of(me);
  v.i_hold = my_old_q >= 0 && old.valid[my_old_q] && cfg_.alive[me] && old.holds(me) && shard_.model;

  const std::vector<char> changed = changed_replicas(old_cfg, old, cfg_);
  std::unique_ptr<Model> fresh;
  std::unique_ptr<AdamW> fresh_opt;
  if (v.new_q >= 0 && changed[v.new_q]) {
    fresh = make_model(cfg_.replicas[v.new_q], cfg_.tp_index_of(me), cfg_.stage_of(me));
    fresh_opt = std::make_unique<AdamW>(*device_.backend, fresh->layout(), o_.opt);
    fresh_opt->set_steps_taken(progress_.steps);
  }
  for (int q = 0; q < topo_.replicas; ++q) {
    if (!changed[q]) continue;
    HealExchange x;
    for (int st = 0; st < topo_.stages; ++st) {
      add_sharded_parts(v, q, st, shard_.model.get(), shard_.opt.get(), fresh.get(), fresh_opt.get(), groups_.live->rank(),
                        groups_.live->size(), x);
      add_replicated_part(v, q, st, shard_.model.get(), shard_.opt.get(), fresh.get(), fresh_opt.get(), groups_.live->rank(),
                          groups_.live->size(), x);
    }
    const ReshardBytes moved = reshard(*groups_.live, ReshardPlan::combine(x.parts), x.tensors, device_.backend.get());
    rec.heal_bytes += moved.sent;
    rec.link_bytes += std::max(moved.sent, moved.received);
  }
  if (fresh) {
    shard_.sync.reset();
    shard_.model = std::move(fresh);
    shard_.opt = std::move(fresh_opt);
  } else if (v.new_q >= 0) {
    shard_.model->set_tp_comm(*groups_.tp);  // unchanged replica: same shards, new communicator
  } else {
    shard_.sync.reset(), shard_.opt.reset(), shard_.model.reset();  // dead, or in a replica that stopped
  }
}

// No live replica holds every shard: every active replica reloads the last checkpoint (or the
// initial state) and the steps since are lost.
void Trainer::restore(Reconfiguration& rec) {
  const int me = topo_.world_rank;
  shard_.sync.reset(), shard_.opt.reset(), shard_.model.reset();
  rec.restored = true;
  rec.restored_from = restart_point_.path.empty() ? "initial state" : restart_point_.path;
  const int q = cfg_.replica_of(me);
  long long cursor = restart_point_.initial.cursor;
  int steps = restart_point_.initial.steps;
  if (!restart_point_.path.empty()) {
    // Every rank agrees on the restore point from the file's attributes.
    h5::File f(restart_point_.path, h5::Mode::ReadOnly);
    steps = static_cast<int>(h5::get_attr_int(f.id(), "/", "step"));
    cursor = h5::get_attr_int(f.id(), "/", "samples_consumed");
  }
  if (q >= 0) {
    shard_.model = make_model(cfg_.replicas[q], cfg_.tp_index_of(me), cfg_.stage_of(me));
    shard_.opt = std::make_unique<AdamW>(*device_.backend, shard_.model->layout(), o_.opt);
    if (!restart_point_.path.empty()) {
      ntp::load_checkpoint(restart_point_.path, *shard_.model, shard_.opt.get());
      rec.heal_bytes = rec.link_bytes = double(shard_.model->param_count()) * 3 * sizeof(float);
    } else {
      shard_.model->init_params(o_.seed);
      if (!o_.init_from.empty()) ntp::load_checkpoint(o_.init_from, *shard_.model, o_.init_weights_only ? nullptr : shard_.opt.get());
      shard_.opt->set_steps_taken(restart_point_.initial.steps);
    }
  }
  progress_.cursor = cursor;
  progress_.steps = steps;
  rec.restored_step = steps;
}

}  // namespace ntp
