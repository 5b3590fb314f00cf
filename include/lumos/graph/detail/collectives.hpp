#pragma once
// Collectives: matching communication ops into instances across ranks, clock offsets from
// the joins, the transfer part of unmatched ops, and the joins themselves.

#include <lumos/graph/detail/builder.hpp>

namespace lumos::graph {

namespace detail {

/// Numbers names in the order they are first met: the id of a name, and each id's text.
struct name_numbers {
  std::unordered_map<std::string, std::uint32_t> ids;
  std::vector<std::string> text;

  /// The id of `name`, a new one when it was not met before.
  std::uint32_t operator()(std::string name) {
    const auto [it, fresh] = ids.try_emplace(std::move(name), static_cast<std::uint32_t>(text.size()));
    if (fresh) text.push_back(it->first);
    return it->second;
  }
};

/// Each id's position when the names `text` (indexed by id) are sorted.
[[nodiscard]] inline std::vector<std::uint32_t> text_order(const std::vector<std::string>& text) {
  std::vector<std::uint32_t> by_text(text.size()), rank(text.size());
  std::iota(by_text.begin(), by_text.end(), 0U);
  std::sort(by_text.begin(), by_text.end(), [&](std::uint32_t a, std::uint32_t b) { return text[a] < text[b]; });
  for (std::uint32_t i = 0; i < by_text.size(); ++i) rank[by_text[i]] = i;
  return rank;
}

}  // namespace detail

// A communication op's key: (group, type, sequence within group and type on its rank).
template <trace::CommClassifier Comm>
struct trace_graph_builder<Comm>::comm_key {
  std::uint32_t group, type;
  std::int64_t seq;
  participant member;
  event_index source;  // the op, or its record_param_comms op that carries the args
};

// One rank's keys, group and type numbered by the rank's own names.
template <trace::CommClassifier Comm>
struct trace_graph_builder<Comm>::rank_comm_keys {
  std::vector<comm_key> entries;              // group and type: indices into the two below
  std::vector<std::string> groups, types;     // this rank's names, as it met them
  bool any_args = false, any_fallback = false;
};

// The job's names of groups and types, by their numbers (in text order).
template <trace::CommClassifier Comm>
struct trace_graph_builder<Comm>::job_comm_names {
  std::vector<std::string> groups, types;
  bool any_args = false, any_fallback = false;  // some ops name their group; some do not
  std::size_t total = 0;                        // communication ops
};

// The instances: the keys of all of them, instance by instance, and each one's range.
template <trace::CommClassifier Comm>
struct trace_graph_builder<Comm>::instance_runs {
  std::vector<const comm_key*> members;
  std::vector<std::pair<std::size_t, std::size_t>> runs;
};

// Rank r's keys, under numbers of its own (its names in the order it met them): each name is
// looked up once, not once per op (a 512-rank job has 870 000 communication ops).
template <trace::CommClassifier Comm>
auto trace_graph_builder<Comm>::comm_keys(std::size_t r) const -> rank_comm_keys {
  const trace::rank_trace& t = job_.ranks[r];
  const rank_state& s = ranks_[r];
  rank_comm_keys k;
  detail::name_numbers group_id, type_id;
  std::unordered_map<string_id, std::uint32_t> group_of;             // the trace's group name → id
  std::map<std::pair<string_id, string_id>, std::uint32_t> type_of;  // (kernel name, Collective name) → id
  std::unordered_map<std::uint64_t, std::int64_t> counters;          // (group, type) → ops so far
  k.entries.reserve(s.comm_ops.size());
  for (const event_index o : s.comm_ops) {
    // Collective args live on the kernel (newer PyTorch) or on its record_param_comms op.
    event_index source = o;
    if (!t.arg(o, trace::arg_key::process_group_name) && t.events[o].external_id >= 0) {
      const event_index op = s.collective_op_by_external.first(t.events[o].external_id, no_event);
      if (op != no_event) source = op;
    }
    std::uint32_t group = 0;
    if (const auto g = t.arg(source, trace::arg_key::process_group_name)) {
      const auto id = static_cast<string_id>(*g);
      const auto it = group_of.find(id);
      group = it != group_of.end() ? it->second : group_of[id] = group_id(std::string(t.str(id)));
      k.any_args = true;
    } else {
      group = group_id(std::string());
      k.any_fallback = true;
    }
    // Point-to-point ops (send, recv, and both fused into one kernel) of a communicator are
    // issued in one order on both sides: the k-th of one rank pairs with the k-th of its
    // peer, whatever each side calls it.
    const auto name_arg = t.arg(source, trace::arg_key::collective_name);
    const std::pair<string_id, string_id> names{t.events[o].name, name_arg ? static_cast<string_id>(*name_arg) : no_string};
    auto ty = type_of.find(names);
    if (ty == type_of.end()) {
      std::string type = detail::collective_type(t.name(t.events[o]), t.arg_text(source, trace::arg_key::collective_name));
      if (type == "send" || type == "recv" || type == "sendrecv" || type == "coalesced") type = "sendrecv";
      ty = type_of.emplace(names, type_id(std::move(type))).first;
    }
    const std::int64_t seq = counters[(std::uint64_t{group} << 32) | ty->second]++;
    k.entries.push_back({group, ty->second, seq, {r, o, t.events[o].ts, t.events[o].dur}, source});
  }
  k.groups = std::move(group_id.text), k.types = std::move(type_id.text);
  return k;
}

// Puts every rank's keys under the job's numbers (every name once, then ids in text order, so
// that sorting keys as numbers orders them as their text would) and sorts them (a rank has each
// key once: its sequence counts its ops of one group and type). Returns the job's names.
template <trace::CommClassifier Comm>
auto trace_graph_builder<Comm>::number_comm_keys(std::vector<rank_comm_keys>& keys) const -> job_comm_names {
  detail::name_numbers group_id, type_id;
  std::vector<std::vector<std::uint32_t>> group_map(keys.size()), type_map(keys.size());
  job_comm_names out;
  for (std::size_t r = 0; r < keys.size(); ++r) {
    for (std::string& g : keys[r].groups) group_map[r].push_back(group_id(std::move(g)));
    for (std::string& ty : keys[r].types) type_map[r].push_back(type_id(std::move(ty)));
    out.any_args = out.any_args || keys[r].any_args;
    out.any_fallback = out.any_fallback || keys[r].any_fallback;
    out.total += keys[r].entries.size();
  }
  const std::vector<std::uint32_t> group_rank = detail::text_order(group_id.text), type_rank = detail::text_order(type_id.text);
  out.groups.resize(group_id.text.size()), out.types.resize(type_id.text.size());
  for (std::size_t i = 0; i < group_id.text.size(); ++i) out.groups[group_rank[i]] = group_id.text[i];
  for (std::size_t i = 0; i < type_id.text.size(); ++i) out.types[type_rank[i]] = type_id.text[i];
  for_each_rank([&](std::size_t r) {
    std::vector<comm_key>& rank_entries = keys[r].entries;
    for (comm_key& e : rank_entries) e.group = group_rank[group_map[r][e.group]], e.type = type_rank[type_map[r][e.type]];
    std::sort(rank_entries.begin(), rank_entries.end(),
              [](const comm_key& x, const comm_key& y) { return std::tie(x.group, x.type, x.seq) < std::tie(y.group, y.type, y.seq); });
  });
  return out;
}

// The instances, in key order, each one's members in rank order: the ops of one key on at
// least two ranks. A rank's ops of one group and type are numbered 0, 1, 2, ... in its sorted
// keys (`number_comm_keys`), so the k-th op of every rank that has that group and type forms the
// k-th instance, without sorting the job's keys together (a 512-rank job has 870 000).
template <trace::CommClassifier Comm>
auto trace_graph_builder<Comm>::form_instances(const std::vector<rank_comm_keys>& keys, std::size_t total) -> instance_runs {
  struct segment {
    std::uint32_t group, type;
    std::size_t rank, begin, count;  // keys[rank].entries[begin, begin + count)
  };
  std::vector<segment> segments;
  for (std::size_t r = 0; r < keys.size(); ++r) {
    const std::vector<comm_key>& rank_entries = keys[r].entries;
    for (std::size_t i = 0; i < rank_entries.size();) {
      std::size_t j = i + 1;
      while (j < rank_entries.size() && rank_entries[j].group == rank_entries[i].group && rank_entries[j].type == rank_entries[i].type) ++j;
      segments.push_back({rank_entries[i].group, rank_entries[i].type, r, i, j - i});
      i = j;
    }
  }
  std::sort(segments.begin(), segments.end(),
            [](const segment& x, const segment& y) { return std::tie(x.group, x.type, x.rank) < std::tie(y.group, y.type, y.rank); });
  instance_runs out;
  out.members.reserve(total);
  for (std::size_t i = 0; i < segments.size();) {
    std::size_t j = i + 1, most = segments[i].count;
    while (j < segments.size() && segments[j].group == segments[i].group && segments[j].type == segments[i].type) {
      most = std::max(most, segments[j].count);
      ++j;
    }
    for (std::size_t k = 0; k < most; ++k) {
      const std::size_t first = out.members.size();
      for (std::size_t g = i; g < j; ++g) {
        if (k < segments[g].count) out.members.push_back(&keys[segments[g].rank].entries[segments[g].begin + k]);
      }
      if (out.members.size() - first >= 2) {
        out.runs.emplace_back(first, out.members.size());
      } else {
        out.members.resize(first);
      }
    }
    i = j;
  }
  return out;
}

// A plan and a collective instance per run, each member's slot in its rank's `instance`: each
// instance's are its own, so they are made in parallel.
template <trace::CommClassifier Comm>
void trace_graph_builder<Comm>::add_instance_plans(const instance_runs& found, const job_comm_names& names) {
  const auto& members = found.members;
  const auto& runs = found.runs;
  const std::size_t first_id = plans_.size();
  plans_.resize(first_id + runs.size());
  instances_.resize(first_id + runs.size());
  constexpr std::size_t chunk = 1024;
  parallel_for((runs.size() + chunk - 1) / chunk, thread_count(), [&](std::size_t c) {
    for (std::size_t x = c * chunk; x < std::min(runs.size(), (c + 1) * chunk); ++x) {
      const auto [i, j] = runs[x];
      const std::string& group = names.groups[members[i]->group];
      instance_plan& plan = plans_[first_id + x];
      collective_instance& info = instances_[first_id + x];
      info.group = group.empty() ? "world" : group;
      info.kind = names.types[members[i]->type];
      info.sequence = members[i]->seq;
      // The first member that states them: the group's ranks, and the message size (elements
      // when only nelems is known; 0 if unknown).
      for (std::size_t k = i; k < j && info.group_ranks.empty(); ++k) {
        const trace::rank_trace& t = job_.ranks[members[k]->member.rank_index];
        info.group_ranks = detail::parse_rank_list(t.arg_text(members[k]->source, trace::arg_key::process_group_ranks));
      }
      for (std::size_t k = i; k < j && info.bytes == 0; ++k) {
        const trace::rank_trace& t = job_.ranks[members[k]->member.rank_index];
        if (const auto nel = t.arg(members[k]->source, trace::arg_key::in_msg_nelems)) info.bytes = *nel;
      }
      for (std::size_t k = i; k < j && info.element_bytes == 0; ++k) {
        const trace::rank_trace& t = job_.ranks[members[k]->member.rank_index];
        info.element_bytes = trace::dtype_bytes(t.arg_text(members[k]->source, trace::arg_key::dtype));
      }
      info.match = group.empty() ? "world group + order of same-type kernels" : "process group + sequence";
      const auto id = static_cast<std::int32_t>(first_id + x);
      plan.members.reserve(j - i);
      for (std::size_t k = i; k < j; ++k) {
        plan.members.push_back(members[k]->member);
        ranks_[members[k]->member.rank_index].instance[members[k]->member.op] = id;
      }
    }
  });
}

// Matches the communication ops into instances across ranks. Key per op: (group, type,
// sequence within group and type on its rank). Groups and types are numbered, per distinct
// name, in the order of their text, so that sorting the keys as numbers orders the instances as
// their text would (the plans, and the graph's collectives, keep that order). Each rank's keys
// are found in parallel, under numbers of its own, which one serial pass turns into the job's.
template <trace::CommClassifier Comm>
void trace_graph_builder<Comm>::match_collectives() {
  std::vector<rank_comm_keys> keys(job_.ranks.size());
  for_each_rank([&](std::size_t r) { keys[r] = comm_keys(r); });
  const job_comm_names names = number_comm_keys(keys);
  add_instance_plans(form_instances(keys, names.total), names);
  auto& st = out_.stats;
  st.collective_matching = names.any_args && names.any_fallback ? "process group + sequence where args exist, else world group + order"
                           : names.any_args                     ? "process group + sequence (collective args)"
                           : names.any_fallback                 ? "world group + order of same-type kernels (no collective args in the traces)"
                                                                : "no communication ops";
}

// Clock skew between hosts (docs/replay.md): difference constraints d_i − d_j ≤ end_j − start_i
// for every pair of participants of every matched collective, solved by Bellman-Ford-style
// relaxation from 0 — the largest solution ≤ 0, so ranks whose joins are already causal keep
// their clocks. A relaxation still changing after as many passes as ranks means the
// constraints have no solution (a negative cycle: collectives matched wrongly).
template <trace::CommClassifier Comm>
void trace_graph_builder<Comm>::estimate_clock_offsets() {
  const std::size_t n = job_.ranks.size();
  std::vector<time_ns> d(n, 0);
  bool changed = true;
  std::size_t pass = 0;
  for (; changed && pass <= n; ++pass) {
    changed = false;
    for (const instance_plan& plan : plans_) {
      time_ns earliest_end = std::numeric_limits<time_ns>::max();
      for (const participant& m : plan.members) earliest_end = std::min(earliest_end, d[m.rank_index] + end_of(m));
      for (const participant& m : plan.members) {
        const time_ns bound = earliest_end - start_of(m);
        if (bound < d[m.rank_index]) {
          d[m.rank_index] = bound;
          changed = true;
        }
      }
    }
  }
  auto& st = out_.stats;
  st.clock_offsets_consistent = !changed;
  st.clock_offsets = st.clock_offsets_consistent ? d : std::vector<time_ns>(n, 0);
  if (options_.align_clocks && st.clock_offsets_consistent) {
    for (std::size_t r = 0; r < n; ++r) ranks_[r].offset += d[r];
    st.clocks_aligned = true;
  }
}

// The transfer part of each communication op whose partners are absent (docs/replay.md, "Delays": overheads stay, waits move):
// the shortest observed instance of the same op — the same position among the
// communication ops of its stream and name in another profiler step — or, when the trace
// gives message sizes, the shortest op of the same name, size and group. Without a second
// observation the whole duration is taken as transfer, and the output says how often.
template <trace::CommClassifier Comm>
void trace_graph_builder<Comm>::unmatched_transfers(std::size_t r) {
  const trace::rank_trace& t = job_.ranks[r];
  rank_state& s = ranks_[r];
  s.transfer.clear();
  // The steps are found on the first unmatched op: a job whose collectives all matched has none.
  std::optional<std::vector<trace::profiler_step>> found;
  auto step_of = [&](time_ns enqueue) -> int {
    if (!found) found = trace::profiler_steps(t);
    const std::vector<trace::profiler_step>& steps = *found;
    for (std::size_t i = 0; i < steps.size(); ++i) {
      if (enqueue >= steps[i].start && enqueue < steps[i].start + steps[i].dur) return static_cast<int>(i);
    }
    return -1;
  };
  std::map<std::tuple<int, int, string_id, std::size_t>, std::vector<event_index>> same_op;  // device, stream, name, position
  std::map<std::tuple<string_id, std::int64_t, std::string>, std::vector<event_index>> same_size;
  for (const auto& [key, ops] : s.streams) {
    std::map<std::pair<int, string_id>, std::size_t> position;  // (step, name) → count
    for (const event_index o : ops) {
      if (!s.is_comm[o] || s.instance[o] >= 0) continue;
      const trace::event& e = t.events[o];
      const int step = step_of(s.enqueue[o]);
      if (step >= 0) same_op[{key.device, key.stream, e.name, position[{step, e.name}]++}].push_back(o);
      std::size_t source = o;
      if (!t.arg(o, trace::arg_key::in_msg_nelems) && e.external_id >= 0) {
        if (const event_index op = s.collective_op_by_external.first(e.external_id, no_event); op != no_event) source = op;
      }
      if (const auto nel = t.arg(source, trace::arg_key::in_msg_nelems)) {
        same_size[{e.name, *nel, std::string(t.arg_text(source, trace::arg_key::process_group_name))}].push_back(o);
      }
      s.transfer[o] = e.dur;
    }
  }
  std::unordered_map<event_index, int> rule;
  auto shortest = [&](const std::vector<event_index>& ops, int which) {
    if (ops.size() < 2) return;
    time_ns best = std::numeric_limits<time_ns>::max();
    for (const event_index o : ops) best = std::min(best, t.events[o].dur);
    for (const event_index o : ops) {
      if (rule[o] != 0 && s.transfer[o] <= best) continue;
      s.transfer[o] = best;
      rule[o] = which;
    }
  };
  for (const auto& [k, ops] : same_size) shortest(ops, 2);
  for (const auto& [k, ops] : same_op) shortest(ops, 1);
  for (const auto& [o, d] : s.transfer) {
    const auto it = rule.find(o);
    const int which = it == rule.end() ? 0 : it->second;
    ++(which == 1 ? s.counts.unmatched_transfer_same_op
       : which == 2 ? s.counts.unmatched_transfer_same_size
                    : s.counts.unmatched_kept_whole);
  }
}

// The joins, made in three passes so that the middle one, which reads and writes the
// participants' tasks all over the graph (a 512-rank job has a million participants), runs on
// every thread: first, in plan order, what fixes ids and string ids (each join's processor and
// task, each plan's first edge); then, per plan in parallel, the participants' edges, transfer
// times and the join's time; last, in plan order, the causality violations and the collectives.
template <trace::CommClassifier Comm>
void trace_graph_builder<Comm>::finish_collectives() {
  task_graph& g = out_.graph;
  const std::size_t n = plans_.size();
  if (n == 0) return;
  // A point-to-point transfer whose sender finished before its receiver started was sent
  // eagerly (NCCL buffers small messages): the receiver waits for the sender, the sender for
  // nobody. Joining them would make the traced order a deadlock (two ranks that each send
  // before they receive on one stream), so only the receiver depends on the sender.
  auto eager_sender = [&](std::size_t i) -> const participant* {
    const instance_plan& plan = plans_[i];
    if (instances_[i].kind != "sendrecv" || plan.members.size() != 2) return nullptr;
    const participant& x = plan.members[0];
    const participant& y = plan.members[1];
    if (end_of(x) <= start_of(y)) return &x;
    if (end_of(y) <= start_of(x)) return &y;
    return nullptr;
  };
  constexpr task_id eager = no_task;  // join_of: an eager transfer has none
  std::vector<task_id> join_of(n);
  std::vector<std::size_t> first_edge(n + 1);
  // At most one join processor a plan: grown one at a time, the list would move its strings
  // at each doubling (a 512-rank job has 130 000 instances).
  g.processors.reserve(g.processors.size() + n);
  const std::size_t first_collective = g.collectives.size();
  std::size_t edges = g.edges.size();
  string_id kind_name = no_string;
  for (std::size_t x = 0; x < n; ++x) {
    const instance_plan& plan = plans_[x];
    const collective_instance& info = instances_[x];
    first_edge[x] = edges;
    out_.stats.collective_participants += plan.members.size();
    ++out_.stats.collectives_matched;
    if (eager_sender(x) != nullptr) {
      join_of[x] = eager;
      ++edges;
      ++out_.stats.p2p_eager;
      continue;
    }
    // Each join gets a processor of its own: joins must not be ordered among themselves (the
    // participants' streams already order a group's collectives). Named in the parallel pass.
    const processor_id barrier =
        g.add_processor({processor_kind::barrier, -1, 0, static_cast<std::int64_t>(first_collective + x), {}});
    if (kind_name == no_string || g.strings[kind_name] != info.kind) kind_name = g.strings.intern(info.kind);
    join_of[x] = g.add_task({.kind = task_kind::join, .processor = barrier, .name_id = kind_name, .rank = -1});
    edges += 2 * plan.members.size();
  }
  first_edge[n] = edges;
  g.edges.resize(edges);

  struct late_end {  // a participant that ends before the last one arrives
    std::size_t plan;
    time_ns amount;
    std::string text;
  };
  constexpr std::size_t chunk = 1024;
  std::vector<std::vector<late_end>> late((n + chunk - 1) / chunk);
  parallel_for(late.size(), thread_count(), [&](std::size_t c) {
    for (std::size_t x = c * chunk; x < std::min(n, (c + 1) * chunk); ++x) {
      const instance_plan& plan = plans_[x];
      collective_instance& info = instances_[x];
      info.arrive.reserve(plan.members.size());
      info.complete.reserve(plan.members.size());
      for (const participant& m : plan.members) {
        info.arrive.push_back(ranks_[m.rank_index].arrive_of_event[m.op]);
        info.complete.push_back(ranks_[m.rank_index].task_of_event[m.op]);
      }
      edge* e = g.edges.data() + first_edge[x];
      const task_id join = join_of[x];
      if (join == eager) {
        const participant* sender = eager_sender(x);
        const participant& receiver = sender == &plan.members[0] ? plan.members[1] : plan.members[0];
        *e = {ranks_[sender->rank_index].task_of_event[sender->op], ranks_[receiver.rank_index].task_of_event[receiver.op], 0,
              edge_kind::collective, false, false};
        info.match += " (eager: the receiver waits for the sender)";
        continue;
      }
      info.join = join;
      g.processors[g.processor[join]].name = info.kind + " #" + std::to_string(info.sequence) + " of group " + info.group;
      // The transfer is the shortest participant: the last to arrive waited least.
      time_ns transfer = std::numeric_limits<time_ns>::max();
      for (const participant& m : plan.members) {
        transfer = std::min(transfer, scale_time(m.dur, ranks_[m.rank_index].factor(m.op)));
      }
      for (std::size_t k = 0; k < plan.members.size(); ++k) {
        g.duration[info.complete[k]] = transfer;
        *e++ = {info.arrive[k], join, 0, edge_kind::collective, false, false};
        *e++ = {join, info.complete[k], 0, edge_kind::collective, false, false};
      }
      // The join happens when the last participant arrives; no participant can end before it.
      time_ns last = std::numeric_limits<time_ns>::min();
      for (const task_id a : info.arrive) last = std::max(last, g.observed_start[a]);
      for (std::size_t k = 0; k < plan.members.size(); ++k) {
        const time_ns end = g.observed_end[info.complete[k]];
        if (end >= last) continue;
        late[c].push_back({x, last - end, where(plan.members[k]) + " (" + info.kind + " #" + std::to_string(info.sequence) +
                                              " of group " + info.group + ") ends " + std::to_string(last - end) +
                                              " ns before the last participant arrives (clock skew between hosts?)"});
      }
      g.observed_start[join] = g.observed_end[join] = last;
    }
  });
  for (std::vector<late_end>& in_chunk : late) {
    for (late_end& v : in_chunk) violation(out_.stats, v.amount, std::move(v.text));
  }
  if (g.collectives.empty()) {
    g.collectives = std::move(instances_);
  } else {
    g.collectives.insert(g.collectives.end(), std::make_move_iterator(instances_.begin()), std::make_move_iterator(instances_.end()));
  }
  instances_ = {};
}

}  // namespace lumos::graph
