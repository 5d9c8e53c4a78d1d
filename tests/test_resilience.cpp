// The resilience building blocks: the reshard primitive, NTP layouts, the NTP gradient sync with
// replicas at several TP degrees at once (on host and stand-in device memory), per-policy
// configurations, and the failure schedule's repair of unscheduled deaths. Run under mpiexec -n 8.
#include <numeric>
#include <set>

#include "arena.hpp"
#include "comm_counting.hpp"
#include "comm_staged.hpp"
#include "configuration.hpp"
#include "encoded_memory_backend.hpp"
#include "grad_sync.hpp"
#include "ntp_layout.hpp"
#include "param_layout.hpp"
#include "rebalance.hpp"
#include "reshard.hpp"
#include "schedule.hpp"
#include "test_util.hpp"

namespace ntp::test {
namespace {

// Random placements over random rank subsets: every unit lands where the target says, with its
// data; a unit already in place is never sent.
TEST(Reshard, RandomPlacementsLandWhereTheTargetSays) {
  auto world = world_comm();
  const int P = world->size(), me = world->rank();
  const std::uint64_t seed = shared_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 20; ++trial) {
    const int units = 1 + int(rng() % 40);
    const long ue = 1 + long(rng() % 5);
    // Source and target rank sets: random non-empty subsets of the world.
    auto subset = [&] {
      std::vector<int> s;
      for (int r = 0; r < P; ++r)
        if (rng() % 2) s.push_back(r);
      if (s.empty()) s.push_back(int(rng() % P));
      return s;
    };
    const auto src_ranks = subset(), dst_ranks = subset();
    std::vector<int> src(units), dst(units);
    for (int u = 0; u < units; ++u) {
      src[u] = src_ranks[rng() % src_ranks.size()];
      // Half the time keep a unit where it is (when that rank is a target), to exercise "in place".
      const bool stay = rng() % 2 && std::count(dst_ranks.begin(), dst_ranks.end(), src[u]);
      dst[u] = stay ? src[u] : dst_ranks[rng() % dst_ranks.size()];
    }
    const ReshardPlan plan(src, dst, me, P);
    // Each unit's value: 1000 * unit + element, so the receiver can check what it got.
    std::vector<float> mine;
    for (int u = 0; u < units; ++u)
      if (src[u] == me)
        for (long e = 0; e < ue; ++e) mine.push_back(1000.0f * u + e);
    std::vector<float> out(std::size_t(plan.dst_count()) * ue, -1.0f);
    reshard(*world, plan, {{mine.data(), out.data(), ue}});
    long k = 0;
    for (int u = 0; u < units; ++u)
      if (dst[u] == me) {
        for (long e = 0; e < ue; ++e, ++k) ASSERT_EQ(out[k], 1000.0f * u + e) << "trial " << trial << " unit " << u;
      }
    EXPECT_EQ(k, long(out.size()));
    for (int p = 0; p < P; ++p)
      for (int u : plan.sends()[p]) EXPECT_NE(src[u], dst[u]) << "unit " << u << " was already in place";
    for (int u : plan.kept()) EXPECT_TRUE(src[u] == me && dst[u] == me);
  }
}

// Several plans combined into one exchange move each segment's tensors as the separate plans would.
TEST(Reshard, CombinedPlansMoveEverySegment) {
  auto world = world_comm();
  const int P = world->size(), me = world->rank();
  const std::uint64_t seed = shared_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 10; ++trial) {
    std::vector<ReshardPlan> parts;
    std::vector<std::vector<int>> srcs, dsts;
    const int segments = 1 + int(rng() % 3);
    for (int k = 0; k < segments; ++k) {
      const int units = 1 + int(rng() % 20);
      std::vector<int> src(units), dst(units);
      for (int u = 0; u < units; ++u) src[u] = int(rng() % P), dst[u] = int(rng() % P);
      parts.emplace_back(src, dst, me, P);
      srcs.push_back(src), dsts.push_back(dst);
    }
    const ReshardPlan plan = ReshardPlan::combine(parts);
    ASSERT_EQ(plan.segments(), segments);
    // Two tensors per segment with different unit sizes; value = 1e4 * segment + 100 * unit + element.
    std::vector<std::vector<float>> in, out;
    std::vector<ReshardTensor> tensors;
    std::vector<long> ues;
    for (int k = 0; k < segments; ++k)
      for (long ue : {1L, 3L}) {
        std::vector<float> mine, got(std::size_t(parts[k].dst_count()) * ue, -1.0f);
        for (int u = 0; u < int(srcs[k].size()); ++u)
          if (srcs[k][u] == me)
            for (long e = 0; e < ue; ++e) mine.push_back(1e4f * k + 100.0f * u + e);
        in.push_back(std::move(mine)), out.push_back(std::move(got)), ues.push_back(ue);
      }
    for (std::size_t i = 0; i < in.size(); ++i) tensors.push_back({in[i].data(), out[i].data(), ues[i], int(i / 2)});
    reshard(*world, plan, tensors);
    for (std::size_t i = 0; i < out.size(); ++i) {
      const int k = int(i / 2);
      long j = 0;
      for (int u = 0; u < int(dsts[k].size()); ++u)
        if (dsts[k][u] == me) {
          for (long e = 0; e < ues[i]; ++e, ++j) EXPECT_EQ(out[i][j], 1e4f * k + 100.0f * u + e);
        }
    }
  }
}

TEST(NtpLayout, MatchesThePapersExample) {
  // 24 heads, TP 8 beside replicas at TP 6: core ranks {0,1,2}, {4,5,6}, ...; extras {3,7,11}, {15,19,23}.
  const ShardMap m = core_extra_map(24, 8, 6);
  EXPECT_EQ(m.units_of(0), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(m.units_of(1), (std::vector<int>{4, 5, 6}));
  EXPECT_EQ(m.units_of(5), (std::vector<int>{20, 21, 22}));
  EXPECT_EQ(m.units_of(6), (std::vector<int>{3, 7, 11}));
  EXPECT_EQ(m.units_of(7), (std::vector<int>{15, 19, 23}));
  // At its own degree the layout is Megatron's even split.
  EXPECT_EQ(core_extra_map(8, 3, 3), ShardMap::even(8, 3));
  // Every unit owned once, every rank an even share, core rank i inside chunk i.
  for (int units : {5, 8, 13, 24, 3072})
    for (int n = 1; n <= std::min(units, 8); ++n)
      for (int n2 = 1; n2 <= n; ++n2) {
        const ShardMap c = core_extra_map(units, n, n2), even = ShardMap::even(units, n);
        const ShardMap chunks = chunk_map(units, n, n2);
        for (int r = 0; r < n; ++r) EXPECT_EQ(c.count(r), even.count(r));
        for (int u = 0; u < units; ++u)
          if (c.owner(u) < n2) {
            EXPECT_EQ(chunks.owner(u), c.owner(u));
          }
      }
}

TEST(Configuration, EachPolicySetsDegreesAndBatches) {
  const ModelConfig m = preset("tiny");
  const Topology topo(8, 0, 4);
  std::vector<char> alive(8, 1);
  alive[3] = 0;
  const auto ntp = plan_configuration(Policy::Ntp, topo, m, 4, 1.3, alive);
  EXPECT_EQ(ntp.degrees(), (std::vector<int>{3, 4}));
  EXPECT_EQ(ntp.batches(), (std::vector<int>{3, 4}));  // max(1, floor(4 * 3 / 4))
  EXPECT_EQ(ntp.n2, 3);
  const auto pw = plan_configuration(Policy::NtpPw, topo, m, 4, 1.3, alive);
  EXPECT_EQ(pw.batches(), (std::vector<int>{4, 4}));
  EXPECT_DOUBLE_EQ(pw.replicas[0].speed, 1.3);
  EXPECT_DOUBLE_EQ(pw.replicas[1].speed, 1.0);
  const auto drop = plan_configuration(Policy::DpDrop, topo, m, 4, 1.3, alive);
  EXPECT_EQ(drop.degrees(), (std::vector<int>{0, 4}));
  EXPECT_EQ(drop.batches(), (std::vector<int>{0, 4}));
  const auto restart = plan_configuration(Policy::Restart, topo, m, 4, 1.3, alive);
  EXPECT_EQ(restart.active_replicas(), 0);
  // A replica with every rank dead drops out under ntp too; batch never falls below one.
  alive.assign(8, 1);
  alive[4] = alive[5] = alive[6] = 0;
  const auto one = plan_configuration(Policy::Ntp, topo, m, 2, 1.3, alive);
  EXPECT_EQ(one.batches(), (std::vector<int>{2, 1}));
  alive[7] = 0;
  EXPECT_EQ(plan_configuration(Policy::Ntp, topo, m, 2, 1.3, alive).degrees(), (std::vector<int>{4, 0}));
}

// With pipeline stages (rank = (replica * stages + stage) * tp + slot): a lost rank puts every
// stage of its replica at the least-staffed stage's degree; the first live ranks of the other
// stages train and the rest sit out; ntp cuts the micro-batches in proportion.
TEST(Configuration, StagesOfADamagedReplicaShareItsDegree) {
  ModelConfig m = preset("tiny");
  m.layers = 4;
  const Topology topo(16, 13, 4, 2);  // 2 replicas x 2 stages x TP 4
  EXPECT_EQ(topo.replicas, 2);
  EXPECT_EQ(topo.replica, 1);
  EXPECT_EQ(topo.stage, 1);
  EXPECT_EQ(topo.slot, 1);
  std::vector<char> alive(16, 1);
  alive[5] = 0;  // replica 0, stage 1, TP index 1
  const auto ntp = plan_configuration(Policy::Ntp, topo, m, 8, 1.3, alive, 4);  // 4 micro-batches of 2
  EXPECT_EQ(ntp.degrees(), (std::vector<int>{3, 4}));
  EXPECT_EQ(ntp.replicas[0].ranks, (std::vector<int>{0, 1, 2, 4, 6, 7}));  // rank 3 sits out
  EXPECT_EQ(ntp.replicas[0].stage_ranks(1), (std::vector<int>{4, 6, 7}));
  EXPECT_EQ(ntp.replicas[0].micro_batches, 3);  // max(1, floor(4 * 3 / 4))
  EXPECT_EQ(ntp.batches(), (std::vector<int>{6, 8}));
  EXPECT_EQ(ntp.replica_of(3), -1);
  EXPECT_EQ(ntp.stage_of(6), 1);
  EXPECT_EQ(ntp.tp_index_of(6), 1);
  EXPECT_EQ(ntp.stage_of(13), 1);
  EXPECT_EQ(ntp.tp_index_of(13), 1);
  EXPECT_EQ(ntp.n2, 3);
  const auto pw = plan_configuration(Policy::NtpPw, topo, m, 8, 1.3, alive, 4);
  EXPECT_EQ(pw.replicas[0].micro_batches, 4);
  EXPECT_EQ(pw.batches(), (std::vector<int>{8, 8}));
  EXPECT_EQ(plan_configuration(Policy::DpDrop, topo, m, 8, 1.3, alive, 4).degrees(), (std::vector<int>{0, 4}));
  // Without micro-batches ntp cuts the batch itself, as with one stage.
  EXPECT_EQ(plan_configuration(Policy::Ntp, topo, m, 8, 1.3, alive).batches(), (std::vector<int>{6, 8}));
  EXPECT_THROW(plan_configuration(Policy::Ntp, topo, m, 8, 1.3, alive, 3), std::invalid_argument);
  EXPECT_THROW(Topology(12, 0, 4, 2), std::invalid_argument);
}


// Rebalancing by speed (rebalance.hpp): equal speeds give Megatron's even split; a rank at half
// speed gets less, every rank keeps a whole unit of each dimension, and the replica's slowest rank
// finishes within 1% of the ideal (the load spread in proportion to speed: 4 / 3.5 of a healthy
// rank's time for one rank of four at half speed).
TEST(Rebalance, SharesFollowSpeed) {
  for (const std::string name : {"small", "tiny", "llama-tiny", "gpt2"}) {
    SCOPED_TRACE(name);
    const ModelConfig m = preset(name);
    const int T = std::min(m.context, 128);
    const TpLayout even = speed_layout(m, T, {1, 1, 1, 1});
    EXPECT_EQ(even.map(ShardDim::Heads), TpLayout::even(m, 4).map(ShardDim::Heads));
    EXPECT_EQ(even.map(ShardDim::Mlp), TpLayout::even(m, 4).map(ShardDim::Mlp));
    EXPECT_EQ(even.map(ShardDim::Vocab), TpLayout::even(m, 4).map(ShardDim::Vocab));
    EXPECT_DOUBLE_EQ(relative_step_time(m, T, even, {1, 1, 1, 1}, 4), 1.0);
    for (double slow : {0.5, 0.8, 0.1}) {
      const std::vector<double> speed = {1, 1, slow, 1};
      const TpLayout l = speed_layout(m, T, speed);
      for (const ShardMap* map : {&l.map(ShardDim::Heads), &l.map(ShardDim::Mlp), &l.map(ShardDim::Vocab)}) {
        for (int j = 0; j < 4; ++j) EXPECT_GE(map->count(j), 1);
        EXPECT_LE(map->count(2), map->count(0));
      }
      EXPECT_LT(l.map(ShardDim::Mlp).count(2), l.map(ShardDim::Mlp).count(0));
      // The ideal, up to the healthy split's own unevenness (gpt2's 50257 rows over 4 ranks).
      const double ideal = 4 / (3 + slow), got = relative_step_time(m, T, l, speed, 4);
      EXPECT_GE(got, ideal * (1 - 1e-4));
      if (slow >= 0.5) {
        EXPECT_LE(got, ideal * 1.01) << "speed " << slow;
      } else {
        // At 0.1 the head it must keep alone takes more than its ideal share: better than the
        // even split all the same.
        EXPECT_LT(got, 0.5 / slow) << "speed " << slow;
      }
      EXPECT_NEAR(relative_step_time(m, T, TpLayout::even(m, 4), speed, 4), 1 / slow, 1e-4 / slow);
    }
  }
}

// The replica holding a slow rank takes its speed layout and the batch that keeps pace with the
// healthy replica (within kRebalanceSlack, in whole sequences or micro-batches); the other replica
// keeps the even split, and the sync is no longer the uniform one.
TEST(Rebalance, TheSlowReplicaKeepsPace) {
  const ModelConfig m = preset("small");
  const Topology topo(8, 0, 4);
  const std::vector<char> alive(8, 1);
  std::vector<double> speed(8, 1.0);
  speed[3] = 0.5;
  Configuration c = plan_configuration(Policy::Ntp, topo, m, 8, 1.3, alive);
  ASSERT_TRUE(c.uniform());
  rebalance_by_speed(c, m, 128, 4, 8, 1, speed);
  EXPECT_EQ(c.batches(), (std::vector<int>{7, 8}));  // floor(8 x 1.02 / (8/7 + a little)) = 7
  EXPECT_EQ(c.degrees(), (std::vector<int>{4, 4}));
  EXPECT_FALSE(c.uniform());
  EXPECT_EQ(c.replicas[1].layout.map(ShardDim::Mlp), TpLayout::even(m, 4).map(ShardDim::Mlp));
  EXPECT_LT(c.replicas[0].layout.map(ShardDim::Mlp).count(3), c.replicas[0].layout.map(ShardDim::Mlp).count(0));
  // In micro-batches: 4 of 2 sequences become floor(4 x 1.02 x 7/8) = 3.
  Configuration mc = plan_configuration(Policy::Ntp, topo, m, 8, 1.3, alive, 4);
  rebalance_by_speed(mc, m, 128, 4, 8, 4, speed);
  EXPECT_EQ(mc.replicas[0].micro_batches, 3);
  EXPECT_EQ(mc.batches(), (std::vector<int>{6, 8}));
  // Nobody slow: nothing changes.
  Configuration same = plan_configuration(Policy::Ntp, topo, m, 8, 1.3, alive);
  rebalance_by_speed(same, m, 128, 4, 8, 1, std::vector<double>(8, 1.0));
  EXPECT_TRUE(same.uniform());
  EXPECT_EQ(same.batches(), (std::vector<int>{8, 8}));
}

// A deterministic gradient value for replica q, tensor t, canonical element e.
float grad_value(int q, int t, long e) {
  std::uint64_t x = (std::uint64_t(q) * 1315423911u) ^ (std::uint64_t(t) << 32) ^ std::uint64_t(e);
  x ^= x >> 33, x *= 0xff51afd7ed558ccdULL, x ^= x >> 33;
  return float(x % 2001) / 1000.0f - 1.0f;
}

class NtpSync : public ::testing::TestWithParam<std::vector<int>> {};

// After the sync every rank's gradient shard equals the sum over replicas computed without
// sharding; the global norm is that of the summed gradient and bitwise equal on every rank. Run
// twice with one GradSync: plainly (sync), then overlapped as in training (begin, the layers'
// ready calls in backward order, finish). All of it twice more: on host memory over MPI, and on
// the encoded stand-in for device memory over host-staged communicators (shared-GPU ranks).
TEST_P(NtpSync, EqualsTheUnshardedSum) {
  const auto degrees = GetParam();
  const int need = std::accumulate(degrees.begin(), degrees.end(), 0);
  if (need > world_size()) GTEST_SKIP() << "needs " << need << " ranks";
  // GPT-2: 3 layers, 12 heads, 96 MLP columns, 48 vocabulary rows. Llama: 12 query heads in 4 KV
  // groups (the attention units), 40 FFN columns, separate embedding and head.
  const ModelConfig gpt{48, 8, 3, 12, 24}, llama{48, 8, 3, 12, 24, Family::Llama, 4, 40, 10000.0f};
  for (const ModelConfig& m : {gpt, llama})
  for (const bool on_device : {false, true}) {
    SCOPED_TRACE(family_name(m.family));
    const Configuration cfg = configuration_for_degrees(m, degrees);
    SCOPED_TRACE(on_device ? "encoded device memory, host-staged communicators" : "host memory");
    std::unique_ptr<Backend> be;
    if (on_device)
      be = std::make_unique<EncodedMemoryBackend>();
    else
      be = make_cpu_backend();
    auto world = on_device ? make_host_staged_comm(world_comm(), *be) : world_comm();
    const int me = world->rank();
    const int q = me < need ? cfg.replica_of(me) : -1, idx = q >= 0 ? cfg.tp_index_of(me) : -1;
    auto tp = world->split(q, idx);
    auto slot = world->split(q >= 0 && idx < cfg.n2 ? idx : -1, q);
    if (q < 0) continue;
    const ParamLayout layout(m, cfg.replicas[q].layout, idx);
    PhaseClock clock;
    Pacer pacer(PacingConfig{});
    GradSync sync(cfg, q, idx, *tp, slot.get(), layout, *be, clock, pacer);
    // A replica already at the sync degree holds chunk i on rank i: it syncs without copies.
    if (!cfg.uniform()) {
      EXPECT_EQ(sync.chunks_in_place(), cfg.replicas[q].degree() == cfg.n2);
    }
    Arena grads(*be, layout.total());
    for (const bool overlapped : {false, true}) {
      SCOPED_TRACE(overlapped ? "overlapped" : "plain");
      std::vector<float> host(layout.total(), 0.0f);
      for (int t = 0; t < layout.tensor_count(); ++t) {
        const auto& s = layout.specs()[t];
        const auto& slot_t = layout.slot(t);
        long k = 0;
        for (int u : slot_t.units)
          for (long e = 0; e < s.unit_elems; ++e, ++k) host[slot_t.offset + k] = grad_value(q, t, long(u) * s.unit_elems + e);
      }
      be->from_host(grads.data(), host.data(), host.size());
      if (overlapped) {
        sync.begin(grads.data());
        for (int l = m.layers - 1; l >= 0; --l) sync.layer_gradients_ready(l);
        sync.finish();
      } else {
        sync.sync(grads.data());
      }
      be->to_host(host.data(), grads.data(), host.size());
      double expect_sq = 0;
      int wrong = 0;  // counted, not asserted: an early return would leave the other ranks in a collective
      std::string first_wrong;
      for (int t = 0; t < layout.tensor_count(); ++t) {
        const auto& s = layout.specs()[t];
        const auto& slot_t = layout.slot(t);
        long k = 0;
        for (int u : slot_t.units)
          for (long e = 0; e < s.unit_elems; ++e, ++k) {
            float sum = 0;
            for (int p = 0; p < static_cast<int>(degrees.size()); ++p) sum += grad_value(p, t, long(u) * s.unit_elems + e);
            if (!(std::fabs(host[slot_t.offset + k] - sum) <= 1e-5f * (1 + std::fabs(sum))) && !wrong++)  // NaN is wrong
              first_wrong = s.name + " unit " + std::to_string(u) + " element " + std::to_string(e) + ": got " +
                            std::to_string(host[slot_t.offset + k]) + ", want " + std::to_string(sum);
          }
        // The norm counts every element of the full tensor once.
        for (long e = 0; e < s.full_elems(m); ++e) {
          float sum = 0;
          for (int p = 0; p < static_cast<int>(degrees.size()); ++p) sum += grad_value(p, t, e);
          expect_sq += double(sum) * sum;
        }
      }
      EXPECT_EQ(wrong, 0) << "rank " << me << ": first wrong " << first_wrong;
      double norm = sync.global_norm(grads.data());
      EXPECT_NEAR(norm, std::sqrt(expect_sq), 1e-5 * std::sqrt(expect_sq));
      // Bitwise equal everywhere: compare against the max over the group.
      double hi = norm, lo = -norm;
      tp->allreduce_max(&hi, 1);
      tp->allreduce_max(&lo, 1);
      EXPECT_EQ(hi, norm);
      EXPECT_EQ(-lo, norm);
      if (slot) {
        double shi = norm;
        slot->allreduce_max(&shi, 1);
        EXPECT_EQ(shi, norm);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Degrees, NtpSync,
                         ::testing::Values(std::vector<int>{4, 4}, std::vector<int>{4, 3}, std::vector<int>{4, 3, 1},
                                           std::vector<int>{3, 3, 2}, std::vector<int>{2, 4, 2},
                                           std::vector<int>{4, 2, 1, 1}, std::vector<int>{1, 1, 1, 1}),
                         [](const auto& info) {
                           std::string n = "tp";
                           for (int d : info.param) n += std::to_string(d);
                           return n;
                         });

// A death with no kill event (signal mode) comes back after the generator's repair time, as a
// generated failure would; without a generator, or when the run ends first, it stays dead.
TEST(Schedule, AnUnscheduledDeathComesBackAfterTheGeneratorsRepairTime) {
  const std::string generator = "random: {mtbf_steps: 1.0e12, repair_steps: 5, seed: 1}\n";  // no failures of its own
  Schedule s = Schedule::parse(generator, "gen.yaml", 4, 50);
  ASSERT_EQ(s.repair_steps(), 5);
  ASSERT_EQ(s.revives(), 0);
  EXPECT_EQ(s.repair_unscheduled(10, 3, 50), 15);
  EXPECT_EQ(s.at(15).revive, std::vector<int>{3});
  EXPECT_TRUE(s.revival_after(14));
  EXPECT_EQ(s.repair_unscheduled(10, 3, 50), 0);  // every survivor may call it again: nothing more
  EXPECT_EQ(s.repair_unscheduled(12, 1, 50), 17);
  EXPECT_EQ(s.repair_unscheduled(12, 0, 50), 17);
  EXPECT_EQ(s.at(17).revive, (std::vector<int>{0, 1}));
  EXPECT_EQ(s.repair_unscheduled(46, 2, 50), 0);  // step 51 is past the run
  EXPECT_EQ(s.added(), (std::vector<std::pair<int, int>>{{15, 3}, {17, 1}, {17, 0}}));

  // A replacement process replays added() onto the schedule it loads: the same events.
  Schedule joined = Schedule::parse(generator, "gen.yaml", 4, 50);
  for (const auto& [step, rank] : s.added()) joined.add_revival(step, rank);
  EXPECT_EQ(joined.at(15).revive, s.at(15).revive);
  EXPECT_EQ(joined.at(17).revive, s.at(17).revive);
  EXPECT_EQ(joined.revives(), 3);

  // A revival already due by then (rank 1's own, at 13) is the repair.
  Schedule mixed = Schedule::parse("events:\n  - {step: 10, kill: [1]}\n  - {step: 13, revive: [1]}\n" + generator,
                                   "mixed.yaml", 4, 50);
  EXPECT_EQ(mixed.repair_unscheduled(9, 1, 50), 0);
  EXPECT_TRUE(mixed.added().empty());

  Schedule explicit_only = Schedule::parse("events:\n  - {step: 10, kill: [1]}\n", "explicit.yaml", 4, 50);
  EXPECT_EQ(explicit_only.repair_steps(), 0);
  EXPECT_EQ(explicit_only.repair_unscheduled(5, 2, 50), 0);
  EXPECT_FALSE(explicit_only.revival_after(0));
}

// Each of `bad` (4 ranks, 10 steps) is refused, with a message that names `word`.
void expect_refused(std::initializer_list<const char*> bad, const std::string& word) {
  for (const std::string text : bad) {
    try {
      Schedule::parse(text, "bad.yaml", 4, 10);
      ADD_FAILURE() << "accepted:\n" << text;
    } catch (const ScheduleError& e) {
      EXPECT_NE(std::string(e.what()).find(word), std::string::npos) << e.what();
    }
  }
}

// A kill `at: handover` strikes in the handover of a revival of its step (after the new processes
// joined, before their heal): one is needed; a hang cannot be placed there, nor does the generator.
TEST(Schedule, AKillInAHandoverNeedsARevivalInItsStep) {
  const Schedule s = Schedule::parse(
      "events:\n  - {step: 2, kill: [3]}\n  - {step: 5, revive: [3]}\n  - {step: 5, kill: [1], at: handover}\n",
      "handover.yaml", 4, 10);
  EXPECT_EQ(s.at(5).kill, (std::vector<int>{1}));
  EXPECT_EQ(s.at(5).kill_at, (std::vector<StepPoint>{StepPoint::Handover}));
  EXPECT_EQ(s.at(5).revive, (std::vector<int>{3}));
  EXPECT_STREQ(step_point_name(StepPoint::Handover), "handover");
  expect_refused({"events:\n  - {step: 3, kill: [2], at: handover}\n",
                  "events:\n  - {step: 2, kill: [3]}\n  - {step: 5, revive: [3]}\n  - {step: 6, kill: [1], at: handover}\n",
                  "events:\n  - {step: 2, kill: [3]}\n  - {step: 5, revive: [3]}\n  - {step: 5, hang: [1], at: handover}\n",
                  "random: {mtbf_steps: 20, repair_steps: 5, seed: 3, at: handover}\n"}, "handover");
}

// A kill `at: repair` strikes in the repair of another kill of its step: one is needed, and the
// generator's `at: any` never draws it; a hang cannot be placed there.
TEST(Schedule, AKillInARepairNeedsAnotherKillInItsStep) {
  const Schedule s = Schedule::parse("events:\n  - {step: 3, kill: [3], at: backward}\n  - {step: 3, kill: [1, 2], at: repair}\n",
                                     "cascade.yaml", 4, 10);
  EXPECT_EQ(s.at(3).kill, (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(s.at(3).kill_at, (std::vector<StepPoint>{StepPoint::Repair, StepPoint::Repair, StepPoint::Backward}));
  EXPECT_STREQ(step_point_name(StepPoint::Repair), "repair");
  expect_refused({"events:\n  - {step: 3, kill: [2], at: repair}\n",
                  "events:\n  - {step: 3, kill: [2], at: repair}\n  - {step: 4, kill: [1]}\n",
                  "events:\n  - {step: 3, kill: [3]}\n  - {step: 3, hang: [2], at: repair}\n",
                  "random: {mtbf_steps: 20, repair_steps: 5, seed: 3, at: repair}\n"}, "repair");
  // The generator's kills strike in their step's phases only.
  const Schedule gen = Schedule::parse("random: {mtbf_steps: 5, repair_steps: 2, seed: 9, at: any}\n", "any.yaml", 8, 200);
  int kills = 0;
  for (const auto& [step, e] : gen.events())
    for (StepPoint a : e.kill_at) {
      EXPECT_NE(a, StepPoint::Repair) << "step " << step;
      EXPECT_NE(a, StepPoint::Handover) << "step " << step;
      ++kills;
    }
  EXPECT_GT(kills, 50);
}

}  // namespace
}  // namespace ntp::test

namespace ntp {

// The control plane's counter (comm_counting.hpp): each call on the group once, with the payload
// this rank sends and receives; nothing for the groups split from it (the training's), which is
// its negative control: a counter that also counted those would show their calls.
TEST(ControlPlane, CountsCallsAndBytesOnTheGroupAlone) {
  auto world = world_comm();
  const int n = world->size(), me = world->rank();
  auto tally = std::make_shared<CommTally>();
  CountingComm group(*world, tally);

  float v[3] = {1, 2, 3};
  group.allreduce_sum(v, 3);  // 3 floats out, 3 back
  EXPECT_EQ(v[0], float(n));
  std::vector<double> all(me == 0 ? std::size_t(n) * 2 : 0);
  const double mine[2] = {double(me), 1};
  group.gather(mine, 2, all.data(), 0);  // 16 bytes out; the root also gets every member's 16
  const std::string said = group.post(me == 1 ? "hello" : "", 1);  // 5 bytes to each other member
  EXPECT_EQ(said, "hello");
  group.barrier();
  EXPECT_EQ(tally->calls, 4);
  const double expected = 24.0 + 16.0 * (me == 0 ? n : 1) + 5.0 * (me == 1 ? n - 1 : 1);
  EXPECT_DOUBLE_EQ(tally->bytes, expected);

  auto sub = group.split(me % 2, me);  // a training group: not counted
  ASSERT_NE(sub, nullptr);
  double w = 1;
  sub->allreduce_sum(&w, 1);
  sub->barrier();
  EXPECT_EQ(w, double((n + 1 - me % 2) / 2));
  EXPECT_EQ(tally->calls, 4);
  EXPECT_DOUBLE_EQ(tally->bytes, expected);
}

}  // namespace ntp
